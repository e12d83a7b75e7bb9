"""Model weights from safetensors files into resident runtime buffers.

    lease = await load_safetensors(rt, residency, "mlp", "weights.safetensors",
                                   placement=hrx.GPU_LOCAL, expect={"w1": ("f32", (48, 64))})
    with lease as weights:
        w1 = weights["w1"]                     # a Tensor over its own device buffer

The file format: an 8-byte little-endian header length N, N bytes of JSON mapping each
tensor name to `{"dtype", "shape", "data_offsets": [begin, end]}` (offsets relative to the
data after the header, the tensors covering it exactly; an optional `__metadata__` of
strings), then the raw little-endian bytes. Files are read and written by the
`safetensors` package, the format's reference implementation (the `models` extra:
`pip install "hrx-async[models]"`; without it `BackendUnavailable`). It is imported only
when a file is read or written, so `import hrx_async` needs only numpy and anyio.

A file must satisfy both safetensors and the stricter rules kept here: no key appears
twice, a tensor has exactly dtype, shape and data_offsets, its dtype is one the runtime
holds, and the header stays within `max_header_bytes` and what `max_tensors` tensors
need. Everything is checked before anything is allocated: a file shorter than its header
or its data says so (`TruncatedArtifact`); a tensor whose byte count disagrees with its
dtype and shape, or whose dtype, shape or name differs from `expect`, or a header that
breaks the format (`MislabeledArtifact`); a header or tensor table larger than allowed,
or overlapping tensors (`OversizedArtifact`); a path that is missing, unreadable or not a
regular file (`UnreadableArtifact`, raised before the file is read, so a FIFO never
blocks). All are `ArtifactError`, a `ContractError`. The file is read on worker threads;
cancelling a load returns at once. Loading goes through a `Residency`: it reserves the
device bytes plus one staging buffer at peak and keeps the device bytes resident.
"""

from __future__ import annotations

import functools
import os
import secrets
import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import numpy as np

from .._core.memory import GPU_LOCAL, HOST_VISIBLE, Buffer, Placement
from ..errors import ContractError
from ..runtime import Runtime
from . import _check
from ._format import (
    DELIMITERS_PER_TENSOR,
    FILE_NAMES,
    INSTALL,
    MAX_HEADER_BYTES,
    MAX_TENSORS,
    METADATA,
    ArtifactError,
    MislabeledArtifact,
    OversizedArtifact,
    TensorEntry,
    TruncatedArtifact,
    UnreadableArtifact,
    check_delimiters,
    check_table,
    descriptor_name,
    file_path,
    identity,
    limits,
    open_regular,
    pread,
    safetensors_package,
)
from .residency import Lease, Residency, free_buffers
from .tensor import DType, Tensor, TensorDesc

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class SafetensorsHeader:
    path: Path
    entries: dict[str, TensorEntry]
    metadata: dict[str, str]
    data_start: int
    identity: tuple[int, ...] = ()
    """(device, inode, size, mtime) of the file the header was read from; data reads check
    that they see the same file."""

    @property
    def nbytes(self) -> int:
        return sum(e.end - e.start for e in self.entries.values())


def read_safetensors_header(
    path: str | os.PathLike[str],
    max_header_bytes: int = MAX_HEADER_BYTES,
    *,
    max_tensors: int = MAX_TENSORS,
    expect: Mapping[str, tuple[Any, Any]] | None = None,
) -> SafetensorsHeader:
    """Read and check a safetensors file's header (not its data); raises `ArtifactError`.

    `expect`, as for `load_safetensors`, maps each tensor name to (dtype, shape).
    Blocking: from async code use `load_safetensors`, or call this on a worker thread."""
    where = file_path(path)
    limit, most = limits(max_header_bytes, max_tensors)
    wanted = _expected(expect)
    package = safetensors_package()
    fd, info = open_regular(where)
    try:
        header = _read_header(package, fd, info, where, limit, most)
    finally:
        os.close(fd)
    _check_expected(header, wanted)
    return header


def _read_header(
    package: Any, fd: int, info: os.stat_result, path: Path, limit: int, most: int
) -> SafetensorsHeader:
    size = info.st_size
    prefix = pread(fd, 8, 0, path)
    if len(prefix) < 8:
        raise TruncatedArtifact(f"{path}: {size} bytes, shorter than the 8-byte header length")
    (length,) = struct.unpack("<Q", prefix)
    if length > limit:
        raise OversizedArtifact(f"{path}: a {length}-byte header exceeds {limit} bytes")
    if 8 + length > size:
        raise TruncatedArtifact(f"{path}: the header needs {length} bytes, the file has {size - 8}")
    raw = pread(fd, length, 8, path)
    if len(raw) < length:
        raise TruncatedArtifact(f"{path}: the file was cut short while its header was read")
    # Parsing costs time and memory for every JSON value, safetensors' parser too.
    check_delimiters(raw, path, most)
    data_bytes = size - 8 - length
    try:
        with package.safe_open(descriptor_name(fd, path), framework="numpy") as file:
            slices = {name: file.get_slice(name) for name in file.keys()}  # noqa: SIM118
            seen = {name: (s.get_dtype(), tuple(s.get_shape())) for name, s in slices.items()}
    except OSError as exc:
        raise UnreadableArtifact(f"{path}: safetensors cannot open it: {exc}") from None
    except Exception as exc:
        # The reference refused the file: the checks below say why in our terms, or else
        # in its own words.
        check_table(raw, path, data_bytes, most)
        raise MislabeledArtifact(f"{path}: not a valid safetensors file: {exc}") from None
    if len(seen) > most:
        raise OversizedArtifact(f"{path}: {len(seen)} tensors, more than max_tensors={most}")
    entries, metadata = check_table(raw, path, data_bytes, most)
    ours = {name: (FILE_NAMES[e.desc.dtype], e.desc.shape) for name, e in entries.items()}
    if ours != seen:
        raise MislabeledArtifact(f"{path}: the header reads differently in safetensors")
    return SafetensorsHeader(path, entries, metadata, 8 + length, identity(info))


def write_safetensors(
    path: str | os.PathLike[str],
    tensors: Mapping[str, Any],
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write numpy arrays (bf16 as `(uint16 bits, "bf16")` pairs) as a safetensors file.

    Whatever `read_safetensors_header` would refuse is refused here (`ContractError`),
    and the file appears whole or not at all (written beside it, then renamed)."""
    where = file_path(path)
    if not isinstance(tensors, Mapping):
        raise ContractError(f"tensors must map names to arrays, got {_check.shown(tensors)}")
    meta = _checked_metadata(metadata)
    arrays = {name: _file_array(name, value) for name, value in tensors.items()}
    if len(arrays) > MAX_TENSORS:
        raise ContractError(f"{len(arrays)} tensors, more than a reader takes ({MAX_TENSORS})")
    if where.is_dir() or (where.exists() and not where.is_file()):
        raise ContractError(f"{where} exists and is not a regular file")
    if not where.parent.is_dir():
        raise ContractError(f"{where}: no such directory {str(where.parent)!r}")
    package = safetensors_package()
    specs = {name: _spec(package, kind, array) for name, (kind, array) in arrays.items()}
    # Created with the usual permissions (the umask's), unlike a tempfile.mkstemp file.
    partial = where.with_name(f".{where.name}.{secrets.token_hex(6)}.partial")
    os.close(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        package.serialize_file(specs, os.fspath(partial), metadata=meta)
        try:
            read_safetensors_header(partial)
        except ArtifactError as exc:
            raise ContractError(f"{where}: the file would not be readable: {exc}") from None
        os.replace(partial, where)
    finally:
        partial.unlink(missing_ok=True)


def _checked_metadata(metadata: object) -> dict[str, str] | None:
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping):
        raise ContractError(f"metadata must map strings to strings, got {_check.shown(metadata)}")
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ContractError(
                f"metadata must map strings to strings; {_check.shown(key)}: "
                f"{_check.shown(value)} is not (convert numbers with str())"
            )
        _utf8(key, "a metadata key")
        _utf8(value, "a metadata value")
    return dict(metadata) or None


def _utf8(text: str, what: str) -> None:
    # The header is UTF-8 JSON; a lone surrogate has no UTF-8 form.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ContractError(f"{what} {_check.shown(text)} is not valid Unicode text") from None


def _file_array(name: object, value: object) -> tuple[DType, np.ndarray[Any, Any]]:
    if not isinstance(name, str):
        raise ContractError(f"a tensor name must be a str, got {_check.shown(name)}")
    if name == METADATA:
        raise ContractError(f"{METADATA!r} names the header's metadata, not a tensor")
    _utf8(name, "a tensor name")
    if isinstance(value, tuple):
        if len(value) != 2:
            raise ContractError(
                f"{name!r}: give an array or (array, dtype), got a {len(value)}-tuple"
            )
        array, dtype = value
    else:
        array, dtype = value, None
    try:
        array = np.asarray(array)
    except (ValueError, TypeError) as exc:
        raise ContractError(f"{name!r} is not an array: {exc}") from None
    kind = DType.of(dtype if dtype is not None else array.dtype)
    if kind is DType.BF16 and array.dtype != np.uint16:
        raise ContractError(
            f"{name!r}: bf16 values are given as their uint16 bits (bf16_from_f32), "
            f"not {array.dtype}"
        )
    return kind, _cast(name, array, kind.numpy)


def _cast(name: str, array: np.ndarray[Any, Any], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """`array` as little-endian `dtype`, refusing casts that would change its values' kind
    (floats into integers) or wrap integers that do not fit."""
    integral = "biu"
    fits = array.dtype.kind in integral or (array.dtype.kind == "f" and dtype.kind == "f")
    if not fits:
        raise ContractError(f"{name!r}: {array.dtype} values cannot be stored as {dtype}")
    if dtype.kind in "iu" and array.size and array.dtype != dtype:
        bounds = np.iinfo(dtype)
        if array.min() < bounds.min or array.max() > bounds.max:
            raise ContractError(
                f"{name!r}: values outside {dtype}'s range {bounds.min}..{bounds.max}"
            )
    little = dtype.newbyteorder("<")
    return np.ascontiguousarray(array.astype(little, copy=False))


def _spec(package: Any, kind: DType, array: np.ndarray[Any, Any]) -> Any:
    dtype = "bfloat16" if kind is DType.BF16 else array.dtype.name
    shape = list(array.shape)
    spec = getattr(package, "TensorSpec", None)
    if spec is None:  # safetensors before 0.8 takes the bytes themselves
        return {"dtype": dtype, "shape": shape, "data": array.tobytes()}
    # `array` outlives the call: the caller keeps it in `arrays`.
    return spec(dtype=dtype, shape=shape, data_ptr=array.ctypes.data, data_len=array.nbytes)


class Weights(Mapping[str, Tensor]):
    """Tensors by name, each over its own runtime buffer (`buffers`); freed on eviction."""

    def __init__(self, tensors: dict[str, Tensor], metadata: dict[str, str]) -> None:
        self.tensors = tensors
        self.metadata = metadata

    @property
    def buffers(self) -> list[Buffer]:
        """The runtime buffer of each tensor, in the tensors' order."""
        return [t.view.buffer for t in self.tensors.values()]

    @property
    def nbytes(self) -> int:
        """The bytes all the buffers take together (what the weights charge to a budget)."""
        return sum(b.nbytes for b in self.buffers)

    def __getitem__(self, name: str) -> Tensor:
        return self.tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)


def _expected(expect: object) -> dict[str, tuple[DType, tuple[int, ...]]] | None:
    """`expect` as {name: (DType, shape)}; ContractError naming what is wrong with it."""
    if expect is None:
        return None
    if not isinstance(expect, Mapping):
        raise ContractError(f"expect must map names to (dtype, shape), got {_check.shown(expect)}")
    wanted: dict[str, tuple[DType, tuple[int, ...]]] = {}
    for name, item in expect.items():
        if not isinstance(name, str) or not isinstance(item, tuple | list) or len(item) != 2:
            raise ContractError(
                f"expect maps each name to (dtype, shape), got {_check.shown(name)}: "
                f"{_check.shown(item)}"
            )
        desc = TensorDesc(item[0], item[1])  # checks the dtype and the shape
        wanted[name] = (desc.dtype, desc.shape)
    return wanted


def _check_expected(
    header: SafetensorsHeader, expect: Mapping[str, tuple[DType, tuple[int, ...]]] | None
) -> None:
    if expect is None:
        return
    missing = sorted(set(expect) - set(header.entries))
    extra = sorted(set(header.entries) - set(expect))
    if missing or extra:
        raise MislabeledArtifact(f"{header.path}: missing tensors {missing}, unexpected {extra}")
    for name, (dtype, shape) in expect.items():
        desc = header.entries[name].desc
        if desc.dtype is not dtype or desc.shape != shape:
            raise MislabeledArtifact(
                f"{header.path}: {name!r} is {desc}, expected {dtype.value}{list(shape)}"
            )


async def _in_thread(function: Callable[..., R], *args: Any, **kwargs: Any) -> R:
    # Abandoned on cancellation: the call closes what it opened whenever it ends, and a
    # timeout around the load does not wait for a slow disk.
    call = functools.partial(function, *args, **kwargs)
    return await anyio.to_thread.run_sync(call, abandon_on_cancel=True)


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
    max_header_bytes: int = MAX_HEADER_BYTES,
    max_tensors: int = MAX_TENSORS,
) -> Lease[Weights]:
    """A lease on the file's tensors resident in `placement` buffers, loaded when missing.

    `expect` maps each tensor name to (dtype, shape); the file must match it exactly.
    Empty tensors are refused (a buffer holds at least one byte). Bad arguments raise
    `ContractError` before the file is touched."""
    if not isinstance(runtime, Runtime):
        raise ContractError(f"runtime must be a Runtime, got {_check.shown(runtime)}")
    if not isinstance(residency, Residency):
        raise ContractError(f"residency must be a Residency, got {_check.shown(residency)}")
    key = _check.key(key, "weights key")
    where = file_path(path)
    if not isinstance(placement, Placement):
        raise ContractError(f"placement must be a Placement, got {_check.shown(placement)}")
    wanted = _expected(expect)
    if not isinstance(wait, bool):
        raise ContractError(f"wait must be True or False, got {_check.shown(wait)}")
    timeout = _check.timeout(timeout)
    limit, most = limits(max_header_bytes, max_tensors)
    safetensors_package()
    header = await _in_thread(
        read_safetensors_header, where, limit, max_tensors=most, expect=wanted
    )
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
                data = await _in_thread(_read_range, header, entry)
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
    fd, info = open_regular(header.path)
    try:
        if header.identity and identity(info) != header.identity:
            raise UnreadableArtifact(f"{header.path}: the file changed since its header was read")
        size = entry.end - entry.start
        data = pread(fd, size, header.data_start + entry.start, header.path)
    finally:
        os.close(fd)
    if len(data) != size:
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
    "DELIMITERS_PER_TENSOR",
    "INSTALL",
    "MAX_HEADER_BYTES",
    "MAX_TENSORS",
    "ArtifactError",
    "MislabeledArtifact",
    "OversizedArtifact",
    "SafetensorsHeader",
    "TensorEntry",
    "TruncatedArtifact",
    "UnreadableArtifact",
    "Weights",
    "load_safetensors",
    "read_safetensors_header",
    "safetensors_package",
    "write_safetensors",
]
