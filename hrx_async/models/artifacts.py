"""Model weights from safetensors files into resident runtime buffers.

    lease = await load_safetensors(rt, residency, "mlp", "weights.safetensors",
                                   placement=hrx.GPU_LOCAL, expect={"w1": ("f32", (48, 64))})
    with lease as weights:
        w1 = weights["w1"]                     # a Tensor over its own device buffer

The file format (read here with numpy, no extra package): an 8-byte little-endian header
length N, N bytes of JSON mapping each tensor name to `{"dtype", "shape",
"data_offsets": [begin, end]}` (offsets relative to the data after the header; an
optional `__metadata__` of strings), then the raw little-endian bytes. Everything is
checked before anything is allocated: a file shorter than its header or its data says
(`TruncatedArtifact`), a tensor whose byte count disagrees with its dtype and shape, or
whose dtype, shape or name differs from `expect` (`MislabeledArtifact`), and a header
or tensor table larger than allowed or overlapping ranges (`OversizedArtifact`); all
are `ArtifactError`, a `ContractError`. Loading goes through a `Residency`: it reserves
the device bytes plus one staging buffer at peak and keeps the device bytes resident.
"""

from __future__ import annotations

import itertools
import json
import os
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import numpy as np

from ..errors import ContractError
from ..memory import GPU_LOCAL, HOST_VISIBLE, Buffer, Placement
from ..runtime import Runtime
from . import _check
from .residency import Lease, Residency, free_buffers
from .tensor import DType, Tensor, TensorDesc

MAX_HEADER_BYTES = 100 * 1024 * 1024
"""The largest JSON header accepted (the format's own limit)."""

_FILE_DTYPES = {
    "U8": DType.U8,
    "F16": DType.F16,
    "BF16": DType.BF16,
    "I32": DType.I32,
    "U32": DType.U32,
    "F32": DType.F32,
    "I64": DType.I64,
}
_FILE_NAMES = {v: k for k, v in _FILE_DTYPES.items()}


class ArtifactError(ContractError):
    """A model artifact breaks its format or disagrees with what was expected."""


class TruncatedArtifact(ArtifactError):
    """The file ends before its header or its tensor data does."""


class MislabeledArtifact(ArtifactError):
    """A tensor's dtype, shape or byte count is not what the header or the caller says."""


class OversizedArtifact(ArtifactError):
    """The header, or the data it describes, is larger than the file or the allowed size."""


@dataclass(frozen=True, slots=True)
class TensorEntry:
    """One tensor of a safetensors file: its descriptor and byte range in the file."""

    name: str
    desc: TensorDesc
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class SafetensorsHeader:
    path: Path
    entries: dict[str, TensorEntry]
    metadata: dict[str, str]
    data_start: int

    @property
    def nbytes(self) -> int:
        return sum(e.end - e.start for e in self.entries.values())


def read_safetensors_header(
    path: str | os.PathLike[str], max_header_bytes: int = MAX_HEADER_BYTES
) -> SafetensorsHeader:
    """Read and check a safetensors file's header (not its data); raises `ArtifactError`."""
    path = Path(path)
    size = path.stat().st_size
    with path.open("rb") as file:
        prefix = file.read(8)
        if len(prefix) < 8:
            raise TruncatedArtifact(f"{path}: {size} bytes, shorter than the 8-byte header length")
        (length,) = struct.unpack("<Q", prefix)
        if length > max_header_bytes:
            raise OversizedArtifact(f"{path}: a {length}-byte header exceeds {max_header_bytes}")
        if 8 + length > size:
            raise TruncatedArtifact(
                f"{path}: the header needs {length} bytes, the file has {size - 8}"
            )
        raw = file.read(length)
    try:
        table = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MislabeledArtifact(f"{path}: the header is not JSON ({exc})") from None
    if not isinstance(table, dict):
        raise MislabeledArtifact(f"{path}: the header is not a JSON object")
    metadata = table.pop("__metadata__", {}) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise MislabeledArtifact(f"{path}: __metadata__ must map strings to strings")
    data = size - 8 - length
    entries: dict[str, TensorEntry] = {}
    for name, info in table.items():
        entries[name] = _entry(path, name, info, data)
    ranges = sorted((e.start, e.end, e.name) for e in entries.values() if e.end > e.start)
    for (_, end, first), (start, _, second) in itertools.pairwise(ranges):
        if start < end:
            raise OversizedArtifact(f"{path}: tensors {first!r} and {second!r} overlap")
    return SafetensorsHeader(path, entries, dict(metadata), 8 + length)


def _entry(path: Path, name: str, info: object, data: int) -> TensorEntry:
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        raise MislabeledArtifact(f"{path}: {name!r} needs exactly dtype, shape, data_offsets")
    dtype = _FILE_DTYPES.get(info["dtype"]) if isinstance(info["dtype"], str) else None
    if dtype is None:
        allowed = ", ".join(_FILE_DTYPES)
        raise MislabeledArtifact(
            f"{path}: {name!r} has dtype {info['dtype']!r}; allowed: {allowed}"
        )
    shape, offsets = info["shape"], info["data_offsets"]
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
        raise MislabeledArtifact(f"{path}: {name!r} has shape {shape!r}")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(type(o) is int and o >= 0 for o in offsets)
        and offsets[0] <= offsets[1]
    ):
        raise MislabeledArtifact(f"{path}: {name!r} has data_offsets {offsets!r}")
    desc = TensorDesc(dtype, shape)
    start, end = offsets
    if end - start != desc.nbytes:
        raise MislabeledArtifact(
            f"{path}: {name!r} is {desc} ({desc.nbytes} bytes) but spans {end - start} bytes"
        )
    if end > data:
        raise TruncatedArtifact(
            f"{path}: {name!r} ends at data byte {end}; the file holds {data} data bytes"
        )
    return TensorEntry(name, desc, start, end)


def write_safetensors(
    path: str | os.PathLike[str],
    tensors: Mapping[str, Any],
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write numpy arrays (bf16 as `(uint16 bits, "bf16")` pairs) as a safetensors file."""
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    blobs: list[bytes] = []
    offset = 0
    for name, value in tensors.items():
        array, dtype = value if isinstance(value, tuple) else (value, None)
        array = np.ascontiguousarray(array)
        kind = DType.of(dtype) if dtype is not None else DType.of(array.dtype)
        blob = array.astype(kind.numpy.newbyteorder("<"), copy=False).tobytes()
        header[name] = {
            "dtype": _FILE_NAMES[kind],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with Path(path).open("wb") as file:
        file.write(struct.pack("<Q", len(raw)))
        file.write(raw)
        for blob in blobs:
            file.write(blob)


class Weights(Mapping[str, Tensor]):
    """Tensors by name, each over its own runtime buffer (`buffers`); freed on eviction."""

    def __init__(self, tensors: dict[str, Tensor], metadata: dict[str, str]) -> None:
        self.tensors = tensors
        self.metadata = metadata

    @property
    def buffers(self) -> list[Buffer]:
        return [t.view.buffer for t in self.tensors.values()]

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers)

    def __getitem__(self, name: str) -> Tensor:
        return self.tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)


def _check_expected(header: SafetensorsHeader, expect: Mapping[str, Any] | None) -> None:
    if expect is None:
        return
    missing = sorted(set(expect) - set(header.entries))
    extra = sorted(set(header.entries) - set(expect))
    if missing or extra:
        raise MislabeledArtifact(f"{header.path}: missing tensors {missing}, unexpected {extra}")
    for name, (dtype, shape) in expect.items():
        desc = header.entries[name].desc
        if desc.dtype is not DType.of(dtype) or desc.shape != tuple(shape):
            raise MislabeledArtifact(
                f"{header.path}: {name!r} is {desc}, expected {DType.of(dtype).value}{list(shape)}"
            )


async def load_safetensors(
    runtime: Runtime,
    residency: Residency[Any],
    key: Any,
    path: str | os.PathLike[str],
    placement: Placement = GPU_LOCAL,
    expect: Mapping[str, tuple[Any, Any]] | None = None,
    *,
    wait: bool = False,
    timeout: float | None = None,
) -> Lease[Weights]:
    """A lease on the file's tensors resident in `placement` buffers, loaded when missing.

    `expect` maps each tensor name to (dtype, shape); the file must match it exactly.
    Empty tensors are refused (a buffer holds at least one byte)."""
    if not isinstance(placement, Placement):
        raise ContractError(f"placement must be a Placement, got {_check.shown(placement)}")
    header = await anyio.to_thread.run_sync(read_safetensors_header, path)
    _check_expected(header, expect)
    if not header.entries:
        raise MislabeledArtifact(f"{header.path}: holds no tensors")
    empty = [e.name for e in header.entries.values() if e.end == e.start]
    if empty:
        raise MislabeledArtifact(f"{header.path}: empty tensors {empty} cannot be resident")
    staged = not placement.host_mappable
    largest = max(e.end - e.start for e in header.entries.values())
    peak = header.nbytes + (largest if staged else 0)

    async def loader() -> tuple[Weights, int]:
        tensors: dict[str, Tensor] = {}
        try:
            for entry in header.entries.values():
                nbytes = entry.end - entry.start
                data = await anyio.to_thread.run_sync(_read_range, header, entry)
                buffer = runtime.allocate(nbytes, placement, f"{key}:{entry.name}")
                tensors[entry.name] = Tensor(entry.desc, buffer.view())
                await _upload(runtime, buffer, data, staged)
        except BaseException:
            with anyio.CancelScope(shield=True):
                for tensor in tensors.values():
                    await free_buffers(tensor.view.buffer)
            raise
        weights = Weights(tensors, header.metadata)
        return weights, weights.nbytes

    return await residency.load(key, peak, loader, wait=wait, timeout=timeout)


def _read_range(header: SafetensorsHeader, entry: TensorEntry) -> bytes:
    with header.path.open("rb") as file:
        file.seek(header.data_start + entry.start)
        data = file.read(entry.end - entry.start)
    if len(data) != entry.end - entry.start:
        raise TruncatedArtifact(f"{header.path}: {entry.name!r} was cut short while reading")
    return data


async def _upload(runtime: Runtime, buffer: Buffer, data: bytes, staged: bool) -> None:
    if not staged:
        async with buffer.map_write() as memory:
            memory[:] = data
        return
    staging = runtime.allocate(len(data), HOST_VISIBLE, "staging")
    try:
        async with staging.map_write() as memory:
            memory[:] = data
        graph = runtime.graph("upload-weights")
        graph.copy(buffer.view(), staging.view())
        await graph.prepare().submit()
    finally:
        with anyio.CancelScope(shield=True):
            await free_buffers(staging)


__all__ = [
    "ArtifactError",
    "MislabeledArtifact",
    "OversizedArtifact",
    "SafetensorsHeader",
    "TensorEntry",
    "TruncatedArtifact",
    "Weights",
    "load_safetensors",
    "read_safetensors_header",
    "write_safetensors",
]
