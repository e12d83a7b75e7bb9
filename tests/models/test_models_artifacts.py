"""safetensors files into resident runtime buffers, with typed errors for bad files."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hrx_async as hrx
import hrx_async.models

pytestmark = pytest.mark.anyio

W = np.arange(12, dtype=np.float32).reshape(3, 4)
B = np.array([1, 2, 3], dtype=np.int64)


def write(tmp_path: Path) -> Path:
    path = tmp_path / "w.safetensors"
    hrx.models.write_safetensors(
        path,
        {"w": W, "b": B, "h": (hrx.models.bf16_from_f32(W[0]), "bf16")},
        metadata={"format": "np"},
    )
    return path


def raw_file(
    tmp_path: Path, header: dict[str, Any], data: bytes, length: int | None = None
) -> Path:
    raw = json.dumps(header).encode()
    path = tmp_path / f"bad{len(list(tmp_path.iterdir()))}.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


async def test_round_trip_into_gpu_and_host_buffers(tmp_path: Path) -> None:
    path = write(tmp_path)
    header = hrx.models.read_safetensors_header(path)
    assert {n: str(e.desc) for n, e in header.entries.items()} == {
        "w": "f32[3, 4]",
        "b": "i64[3]",
        "h": "bf16[4]",
    }
    assert header.metadata == {"format": "np"}
    async with hrx.Runtime("sim") as rt:
        residency: hrx.models.Residency[Any] = hrx.models.Residency(1 << 20)
        for placement in (hrx.GPU_LOCAL, hrx.HOST_VISIBLE):
            lease = await hrx.models.load_safetensors(
                rt,
                residency,
                placement,
                path,
                placement,
                expect={"w": ("f32", (3, 4)), "b": ("i64", (3,)), "h": ("bf16", (4,))},
            )
            weights = lease.value
            assert lease.resident_bytes == 48 + 24 + 8 == weights.nbytes
            out = rt.allocate(48, hrx.HOST_VISIBLE)
            g = rt.graph()
            g.copy(out.view(), weights["w"].view)
            await g.prepare().submit()
            got = hrx.models.Tensor(weights["w"].desc, out.view())
            assert (await got.read() == W).all()
            out.free()
            lease.release()
        assert rt.statistics().live_bytes == 2 * 80  # both resident, staging freed
        await residency.clear()
        assert residency.reserved_bytes == 0


async def test_bad_files_are_refused_with_typed_errors(tmp_path: Path) -> None:
    good = write(tmp_path)
    async with hrx.Runtime("sim") as rt:
        residency: hrx.models.Residency[Any] = hrx.models.Residency(1 << 20)
        cases: list[tuple[Path, type[Exception]]] = [
            (
                raw_file(
                    tmp_path,
                    {"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}},
                    b"\0" * 8,
                ),
                hrx.models.TruncatedArtifact,
            ),
            (
                raw_file(
                    tmp_path,
                    {"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}},
                    b"\0" * 12,
                ),
                hrx.models.MislabeledArtifact,
            ),
            (
                raw_file(
                    tmp_path,
                    {"x": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}},
                    b"\0" * 8,
                ),
                hrx.models.MislabeledArtifact,
            ),
            (raw_file(tmp_path, {}, b"", length=1 << 40), hrx.models.OversizedArtifact),
            (raw_file(tmp_path, {}, b"", length=1000), hrx.models.TruncatedArtifact),
            (
                raw_file(
                    tmp_path,
                    {
                        "x": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                        "y": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]},
                    },
                    b"\0" * 6,
                ),
                hrx.models.OversizedArtifact,
            ),
        ]
        short = tmp_path / "short.safetensors"
        short.write_bytes(b"\1\0")
        cases.append((short, hrx.models.TruncatedArtifact))
        cut = tmp_path / "cut.safetensors"
        cut.write_bytes(good.read_bytes()[:-3])
        cases.append((cut, hrx.models.TruncatedArtifact))
        for path, error in cases:
            with pytest.raises(error):
                await hrx.models.load_safetensors(rt, residency, path.name, path)
            assert isinstance(error("x"), hrx.ContractError)
        with pytest.raises(hrx.models.MislabeledArtifact):
            await hrx.models.load_safetensors(
                rt, residency, "k", good, expect={"w": ("f32", (4, 3))}
            )
        with pytest.raises(hrx.BudgetExceeded):
            await hrx.models.load_safetensors(rt, hrx.models.Residency(100), "k", good)
        assert residency.stats().resources == 0 and rt.statistics().live_bytes == 0
        assert rt.statistics().allocations == 0
