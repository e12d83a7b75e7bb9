"""safetensors files through the safetensors package: what it refuses, what is refused on
top of it, limits that hold before a header is parsed, and files that are not files."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

import hrx_async as hrx
import hrx_async.models
from hrx_async._core.install import install_hint
from hrx_async.models import artifacts
from hrx_async.models.artifacts import UnreadableArtifact
from tests.helpers import fifo_with_a_late_writer

safetensors = pytest.importorskip("safetensors")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

pytestmark = pytest.mark.anyio


def tensor(dtype: str, shape: list[Any], offsets: list[Any]) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": offsets}


def raw_file(path: Path, header: bytes | dict[str, Any], data: bytes) -> Path:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def safetensors_reads(path: Path) -> bool:
    try:
        with safetensors.safe_open(str(path), framework="numpy") as file:
            for name in file.keys():  # noqa: SIM118
                file.get_slice(name).get_shape()
    except Exception:
        return False
    return True


X2 = tensor("U8", [2], [0, 2])
# name: (header, data, error, whether the safetensors package itself reads the file)
CASES: dict[str, tuple[bytes | dict[str, Any], bytes, type[Exception], bool]] = {
    "a hole between tensors": (
        {"x": X2, "y": tensor("U8", [2], [4, 6])},
        b"\0" * 6,
        hrx.models.MislabeledArtifact,
        False,
    ),
    "bytes after the last tensor": ({"x": X2}, b"\0" * 4, hrx.models.MislabeledArtifact, False),
    "data not starting at 0": (
        {"x": tensor("U8", [2], [2, 4])},
        b"\0" * 4,
        hrx.models.MislabeledArtifact,
        False,
    ),
    "dtype twice": (
        b'{"x":{"dtype":"F32","dtype":"U8","shape":[2],"data_offsets":[0,2]}}',
        b"\0" * 2,
        hrx.models.MislabeledArtifact,
        False,
    ),
    "data_offsets twice": (
        b'{"x":{"dtype":"U8","shape":[2],"data_offsets":[0,4],"data_offsets":[0,2]}}',
        b"\0" * 2,
        hrx.models.MislabeledArtifact,
        False,
    ),
    "metadata []": ({"__metadata__": [], "x": X2}, b"\0" * 2, hrx.models.MislabeledArtifact, False),
    "metadata 0": ({"__metadata__": 0, "x": X2}, b"\0" * 2, hrx.models.MislabeledArtifact, False),
    "metadata false": (
        {"__metadata__": False, "x": X2},
        b"\0" * 2,
        hrx.models.MislabeledArtifact,
        False,
    ),
    'metadata ""': ({"__metadata__": "", "x": X2}, b"\0" * 2, hrx.models.MislabeledArtifact, False),
    "a number as metadata value": (
        {"__metadata__": {"epoch": 3}, "x": X2},
        b"\0" * 2,
        hrx.models.MislabeledArtifact,
        False,
    ),
    "a tensor named __metadata__": (
        {"__metadata__": X2},
        b"\0" * 2,
        hrx.models.MislabeledArtifact,
        False,
    ),
    "a dimension of 2**64": (
        {"x": tensor("U8", [2**64, 0], [0, 0]), "y": X2},
        b"\0" * 2,
        hrx.models.MislabeledArtifact,
        False,
    ),
    "a 5000-digit dimension": (
        b'{"x":{"dtype":"U8","shape":[' + b"9" * 5000 + b'],"data_offsets":[0,2]}}',
        b"\0" * 2,
        hrx.models.MislabeledArtifact,
        False,
    ),
    "100000 nested arrays": (b"[" * 100_000, b"", hrx.models.MislabeledArtifact, False),
    "a shape product past 2**64": (
        {"x": tensor("F32", [2**62, 2**62], [0, 0])},
        b"",
        hrx.models.MislabeledArtifact,
        False,
    ),
    "overlapping tensors": (
        {"x": tensor("U8", [4], [0, 4]), "y": tensor("U8", [4], [2, 6])},
        b"\0" * 6,
        hrx.models.OversizedArtifact,
        False,
    ),
    "data shorter than the tensors": (
        {"x": tensor("F32", [4], [0, 16])},
        b"\0" * 8,
        hrx.models.TruncatedArtifact,
        False,
    ),
    # Where the package is lenient, the runtime is not:
    "a tensor name twice": (
        b'{"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},'
        b'"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}',
        b"\0" * 2,
        hrx.models.MislabeledArtifact,
        True,
    ),
    "a metadata key twice": (
        b'{"__metadata__":{"a":"1","a":"2"},"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}',
        b"\0" * 2,
        hrx.models.MislabeledArtifact,
        True,
    ),
    "an unknown tensor key": (
        {"x": {**X2, "scale": [[1, 2], [3]]}},
        b"\0" * 2,
        hrx.models.MislabeledArtifact,
        True,
    ),
    "a dtype the runtime does not hold": (
        {"x": tensor("F64", [1], [0, 8])},
        b"\0" * 8,
        hrx.models.MislabeledArtifact,
        True,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_a_bad_file_is_refused_with_a_typed_error(tmp_path: Path, case: str) -> None:
    header, data, error, lenient = CASES[case]
    path = raw_file(tmp_path / "w.safetensors", header, data)
    assert safetensors_reads(path) is lenient
    with pytest.raises(error):
        hrx.models.read_safetensors_header(path)
    async with hrx.Runtime("sim") as rt:
        residency: hrx.models.Residency[Any] = hrx.models.Residency(1 << 20)
        with pytest.raises(error) as caught:
            await hrx.models.load_safetensors(rt, residency, "k", path)
        assert str(path) in str(caught.value)
        assert residency.stats().resources == 0 and rt.statistics().allocations == 0


async def test_null_metadata_reads_as_none_as_in_safetensors(tmp_path: Path) -> None:
    path = raw_file(tmp_path / "w.safetensors", {"__metadata__": None, "x": X2}, b"\1\2")
    assert safetensors_reads(path)
    async with hrx.Runtime("sim") as rt:
        lease = await hrx.models.load_safetensors(
            rt, hrx.models.Residency(1 << 20), "k", path, hrx.HOST_VISIBLE
        )
        with lease as weights:
            assert weights.metadata == {} and (await weights["x"].read()).tolist() == [1, 2]


def test_files_written_by_either_side_read_the_same(tmp_path: Path) -> None:
    arrays = {
        "w": np.arange(12, dtype=np.float32).reshape(3, 4),
        "b": np.array([1, -2], np.int64),
        "u": np.arange(5, dtype=np.uint8),
    }
    theirs = tmp_path / "theirs.safetensors"
    safetensors_numpy.save_file(arrays, str(theirs), metadata={"by": "safetensors"})
    header = hrx.models.read_safetensors_header(theirs)
    assert {n: str(e.desc) for n, e in header.entries.items()} == {
        "w": "f32[3, 4]",
        "b": "i64[2]",
        "u": "u8[5]",
    }
    assert header.metadata == {"by": "safetensors"}
    ours = tmp_path / "ours.safetensors"
    hrx.models.write_safetensors(
        ours, {**arrays, "h": (hrx.models.bf16_from_f32(arrays["w"][0]), "bf16")}
    )
    with safetensors.safe_open(str(ours), framework="numpy") as file:
        assert file.get_slice("h").get_dtype() == "BF16"
        for name, array in arrays.items():
            np.testing.assert_array_equal(file.get_tensor(name), array)


def test_the_header_limit_is_the_formats(tmp_path: Path) -> None:
    assert artifacts.MAX_HEADER_BYTES == 100_000_000
    path = tmp_path / "big.safetensors"
    path.write_bytes(struct.pack("<Q", 100_000_001) + b"{}")
    with pytest.raises(
        hrx.models.OversizedArtifact, match="100000001-byte header exceeds 100000000"
    ):
        hrx.models.read_safetensors_header(path)
    with pytest.raises(hrx.models.OversizedArtifact, match="exceeds 8 bytes"):
        hrx.models.read_safetensors_header(raw_file(path, {"x": X2}, b"\0\0"), max_header_bytes=8)


def many_tensors(count: int) -> bytes:
    parts = [
        f'"t{i}":{{"dtype":"U8","shape":[1],"data_offsets":[{i},{i + 1}]}}' for i in range(count)
    ]
    return ("{" + ",".join(parts) + "}").encode()


def test_more_tensors_than_allowed_are_refused(tmp_path: Path) -> None:
    count = artifacts.MAX_TENSORS + 1
    path = raw_file(tmp_path / "many.safetensors", many_tensors(count), b"\0" * count)
    with pytest.raises(
        hrx.models.OversizedArtifact, match=f"{count} tensors, more than max_tensors"
    ):
        hrx.models.read_safetensors_header(path)
    header = hrx.models.read_safetensors_header(path, max_tensors=count)
    assert len(header.entries) == count


def test_a_huge_tensor_table_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    raw = many_tensors(300_000)
    path = raw_file(tmp_path / "huge.safetensors", raw, b"\0" * 300_000)
    del raw
    tracemalloc.start()
    try:
        with pytest.raises(hrx.models.OversizedArtifact, match="JSON delimiters"):
            hrx.models.read_safetensors_header(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The header's bytes are read, but no JSON value of it is made.
    assert peak < 2 * path.stat().st_size


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
async def test_a_fifo_is_refused_at_once_not_waited_on(tmp_path: Path) -> None:
    with fifo_with_a_late_writer(tmp_path / "w.safetensors") as fifo:
        async with hrx.Runtime("sim") as rt:
            residency: hrx.models.Residency[Any] = hrx.models.Residency(1 << 20)
            with anyio.fail_after(30), pytest.raises(UnreadableArtifact, match="FIFO"):
                await hrx.models.load_safetensors(rt, residency, "k", fifo)
            assert rt.statistics().allocations == 0
    with pytest.raises(UnreadableArtifact, match="FIFO"):
        hrx.models.read_safetensors_header(fifo)


async def test_a_cancelled_load_leaves_nothing_behind(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    hrx.models.write_safetensors(path, {f"w{i}": np.full(256, i, np.float32) for i in range(8)})
    async with hrx.Runtime("sim") as rt:
        residency: hrx.models.Residency[Any] = hrx.models.Residency(1 << 20)
        outcomes: set[str] = set()
        # Cancelled at points from before the header is read to after the tensors are
        # loaded; whichever it is, nothing stays allocated or reserved.
        for tenths_of_ms in range(0, 400, 10):
            leases: list[hrx.models.Lease[Any]] = []

            async def load(into: list[hrx.models.Lease[Any]] = leases) -> None:
                into.append(await hrx.models.load_safetensors(rt, residency, "k", path))

            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(load)
                    await anyio.sleep(tenths_of_ms / 10_000)
                    scope.cancel()
            outcomes.add("loaded" if leases else "cancelled")
            for lease in leases:
                lease.release()
            await residency.clear()
            assert residency.stats().reserved_bytes == 0 and residency.stats().resources == 0
            assert rt.statistics().live_bytes == 0
        assert "cancelled" in outcomes


def test_what_is_no_regular_file_is_refused_by_kind(tmp_path: Path) -> None:
    with pytest.raises(UnreadableArtifact, match="is a directory, not a regular file"):
        hrx.models.read_safetensors_header(tmp_path)
    with pytest.raises(UnreadableArtifact, match="no such file"):
        hrx.models.read_safetensors_header(tmp_path / "missing" / "w.safetensors")
    if Path("/dev/zero").exists():
        with pytest.raises(UnreadableArtifact, match="character device"):
            hrx.models.read_safetensors_header("/dev/zero")
    assert issubclass(UnreadableArtifact, hrx.models.ArtifactError)


async def test_bad_arguments_are_contract_errors_and_change_nothing(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    hrx.models.write_safetensors(path, {"w": np.ones((2, 3), np.float32)})
    before = path.read_bytes()
    async with hrx.Runtime("sim") as rt:
        residency: hrx.models.Residency[Any] = hrx.models.Residency(1 << 20)
        calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
            ((rt, residency, "k", None), {}),
            ((rt, residency, "k", 3), {}),
            ((rt, residency, "k", b"w.safetensors"), {}),
            ((rt, residency, "k", ""), {}),
            ((rt, None, "k", path), {}),
            ((None, residency, "k", path), {}),
            ((rt, residency, ["unhashable"], path), {}),
            ((rt, residency, "k", path, "gpu"), {}),
            ((rt, residency, "k", path), {"expect": {"w": ("f32", None)}}),
            ((rt, residency, "k", path), {"expect": {"w": ("f99", (2, 3))}}),
            ((rt, residency, "k", path), {"expect": {"w": "f32"}}),
            ((rt, residency, "k", path), {"expect": ["w"]}),
            ((rt, residency, "k", path), {"max_header_bytes": "1000"}),
            ((rt, residency, "k", path), {"max_header_bytes": 1}),
            ((rt, residency, "k", path), {"max_tensors": 0}),
            ((rt, residency, "k", path), {"wait": "yes"}),
            ((rt, residency, "k", path), {"timeout": -1}),
        ]
        for args, kwargs in calls:
            with pytest.raises(hrx.ContractError):
                await hrx.models.load_safetensors(*args, **kwargs)
        assert residency.stats().resources == 0 and residency.stats().misses == 0
        assert rt.statistics().allocations == 0
        lease = await hrx.models.load_safetensors(
            rt, residency, "k", path, expect={"w": ("f32", [2, 3])}
        )
        lease.release()
    for bad in (None, 3, ""):
        with pytest.raises(hrx.ContractError):
            hrx.models.read_safetensors_header(bad)  # type: ignore[arg-type]
    with pytest.raises(hrx.ContractError):
        hrx.models.read_safetensors_header(path, "1000")  # type: ignore[arg-type]
    with pytest.raises(hrx.ContractError):
        hrx.models.read_safetensors_header(path, expect={"w": ("f32", None)})
    with pytest.raises(
        hrx.models.MislabeledArtifact, match=r"'w' is f32\[2, 3\], expected f32\[3, 2\]"
    ):
        hrx.models.read_safetensors_header(path, expect={"w": ("f32", (3, 2))})
    assert hrx.models.read_safetensors_header(path, expect={"w": (np.float32, [2, 3])}).entries
    assert path.read_bytes() == before


def test_write_refuses_what_the_reader_would_refuse(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    w = np.ones(2, np.float32)
    bad: list[tuple[dict[Any, Any], Any]] = [
        ({"w": w}, {"epoch": 3}),
        ({"w": w}, {"ok": "yes", 1: "one"}),
        ({"w": w}, ["not", "a", "mapping"]),
        ({"__metadata__": w}, None),
        ({3: w}, None),
        ({"\ud800": w}, None),
        ({"w": (w, "bf16")}, None),  # bf16 comes as its uint16 bits
        ({"w": (w, "i32")}, None),  # floats are not stored as integers
        ({"w": (np.array([300], np.int64), "u8")}, None),  # 300 does not fit
        ({"w": (w, "f32", "extra")}, None),
        ({"w": np.array(["text"])}, None),
        ({"w": np.ones(2, np.float64)}, None),
    ]
    for tensors, metadata in bad:
        with pytest.raises(hrx.ContractError):
            hrx.models.write_safetensors(path, tensors, metadata)
        assert list(tmp_path.iterdir()) == []
    with pytest.raises(hrx.ContractError):
        hrx.models.write_safetensors(None, {"w": w})  # type: ignore[arg-type]
    with pytest.raises(hrx.ContractError, match="not a regular file"):
        hrx.models.write_safetensors(tmp_path, {"w": w})
    hrx.models.write_safetensors(path, {"w": (np.array([7], np.int64), "u8")}, {"epoch": "3"})
    header = hrx.models.read_safetensors_header(path)
    assert str(header.entries["w"].desc) == "u8[1]" and header.metadata == {"epoch": "3"}
    assert [p.name for p in tmp_path.iterdir()] == ["w.safetensors"]


async def test_without_the_package_the_error_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "w.safetensors"
    hrx.models.write_safetensors(path, {"w": np.ones(2, np.float32)})
    monkeypatch.setitem(sys.modules, "safetensors", None)  # as if it were not installed
    with pytest.raises(hrx.BackendUnavailable, match=r'pip install "hrx-async\[models\]"'):
        hrx.models.read_safetensors_header(path)
    with pytest.raises(hrx.BackendUnavailable, match="safetensors"):
        hrx.models.write_safetensors(tmp_path / "other.safetensors", {"w": np.ones(2, np.float32)})
    assert not (tmp_path / "other.safetensors").exists()
    async with hrx.Runtime("sim") as rt:
        with pytest.raises(hrx.BackendUnavailable) as caught:
            await hrx.models.load_safetensors(rt, hrx.models.Residency(1 << 20), "k", path)
        assert caught.value.install == install_hint("models")


def test_importing_hrx_async_needs_no_safetensors() -> None:
    code = (
        "import sys; sys.modules['safetensors'] = None\n"
        "import hrx_async, hrx_async.models\n"
        "print(sorted(m for m in sys.modules if m.startswith('safetensors.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
