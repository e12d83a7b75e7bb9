"""The safetensors rules kept on top of the `safetensors` package, and safe file access.

The package is the format's reference; it is lenient where this runtime is not (a key
given twice keeps its last value, a tensor may carry unknown keys, any dtype passes), and
it parses whatever header it is given, so limits and the checks here come first or last.
Files are opened without blocking and checked to be regular files by their descriptor.
"""

from __future__ import annotations

import collections
import importlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from .. import files
from .._core.install import install_hint
from ..errors import BackendUnavailable, ContractError
from . import _check
from .tensor import DType, TensorDesc

MAX_HEADER_BYTES = 100_000_000
"""The largest JSON header accepted: the format's own limit (safetensors refuses more)."""

MAX_TENSORS = 65_536
"""The most tensors a file may hold unless the caller allows more (each gets its own buffer)."""

DELIMITERS_PER_TENSOR = 32
"""JSON delimiters (`{ [ , :`) a header may hold per allowed tensor, beyond
`SPARE_DELIMITERS`, counted before it is parsed: a tensor of rank r takes r + 10, which
leaves room for names and metadata, while a header far bigger than the tensors it may
describe is refused without parsing it."""

SPARE_DELIMITERS = 4096
"""Delimiters allowed whatever max_tensors is: metadata entries take two each."""

INSTALL = install_hint("models")

FILE_DTYPES = {
    "U8": DType.U8,
    "F16": DType.F16,
    "BF16": DType.BF16,
    "I32": DType.I32,
    "U32": DType.U32,
    "F32": DType.F32,
    "I64": DType.I64,
}
FILE_NAMES = {v: k for k, v in FILE_DTYPES.items()}
METADATA = "__metadata__"
_FIELDS = frozenset({"dtype", "shape", "data_offsets"})
_LARGEST_DIGITS = len(str(2**64))  # a number with more digits cannot be a u64


class ArtifactError(ContractError):
    """A model artifact breaks its format or disagrees with what was expected."""


class TruncatedArtifact(ArtifactError):
    """The file ends before its header or its tensor data does."""


class MislabeledArtifact(ArtifactError):
    """A tensor's dtype, shape or byte count is not what the header or the caller says, or
    the header breaks the format."""


class OversizedArtifact(ArtifactError):
    """The header, or the data it describes, is larger than the file or the allowed size."""


class UnreadableArtifact(ArtifactError):
    """The path names no file, one that cannot be read, or something other than a regular
    file (a directory, FIFO, device or socket); or the file changed while it was loaded."""


@dataclass(frozen=True, slots=True)
class TensorEntry:
    """One tensor of a safetensors file: its descriptor and byte range in the file."""

    name: str
    desc: TensorDesc
    start: int
    end: int


def safetensors_package() -> ModuleType:
    """The `safetensors` package; `BackendUnavailable` naming the extra when it is missing."""
    try:
        return importlib.import_module("safetensors")
    except ImportError as exc:
        raise BackendUnavailable(
            "safetensors",
            f"reading and writing safetensors files needs the safetensors package ({exc})",
            INSTALL,
        ) from exc


def file_path(value: object, what: str = "path") -> Path:
    """`value` as a Path; ContractError unless it is a non-empty str or str os.PathLike."""
    # An int would be taken as a file descriptor by open(), bytes would need decoding.
    text = os.fspath(value) if isinstance(value, str | os.PathLike) else None
    if not isinstance(text, str) or not text or "\0" in text:
        raise ContractError(
            f"{what} must be a file name (a non-empty str or os.PathLike), "
            f"got {_check.shown(value)}"
        )
    return Path(text)


def limits(max_header_bytes: object, max_tensors: object) -> tuple[int, int]:
    limit = _check.integer(max_header_bytes, "max_header_bytes", 2, MAX_HEADER_BYTES)
    return limit, _check.integer(max_tensors, "max_tensors", 1)


def identity(info: os.stat_result) -> tuple[int, ...]:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def open_regular(path: Path) -> tuple[int, os.stat_result]:
    """A descriptor on `path`, checked to be a regular file before a byte is read
    (`files.open_regular`), failures as `UnreadableArtifact`."""
    try:
        fd, info = files.open_regular(path)
    except FileNotFoundError:
        raise UnreadableArtifact(f"{path}: no such file") from None
    except files.NotRegularFile as exc:
        raise UnreadableArtifact(f"{path} is {exc.kind}, not a regular file") from None
    except OSError as exc:
        raise UnreadableArtifact(f"{path}: cannot be opened: {exc.strerror or exc}") from None
    return fd, info


def pread(fd: int, size: int, offset: int, path: Path) -> bytes:
    """Up to `size` bytes at `offset` (fewer only at the end of the file)."""
    parts: list[bytes] = []
    while size > 0:
        try:
            part = os.pread(fd, min(size, 1 << 24), offset)
        except OSError as exc:
            raise UnreadableArtifact(f"{path}: reading failed: {exc.strerror or exc}") from None
        if not part:
            break
        parts.append(part)
        size -= len(part)
        offset += len(part)
    return b"".join(parts)


def descriptor_name(fd: int, path: Path) -> str:
    """A name that opens the file `fd` is open on: the descriptor's own one on Linux."""
    # safetensors opens files by name; this one makes it read the very file checked,
    # whatever has been put at `path` since.
    proc = f"/proc/self/fd/{fd}"
    return proc if os.path.exists(proc) else os.fspath(path)


def check_delimiters(raw: bytes, path: Path, most: int) -> None:
    """OversizedArtifact when the header has more delimiters than `most` tensors allow."""
    # Counted in strings too, so never fewer than the JSON structure has; bytes.count
    # takes no memory, where a parser takes some for every value.
    found = sum(raw.count(mark) for mark in (b"{", b"[", b",", b":"))
    allowed = DELIMITERS_PER_TENSOR * most + SPARE_DELIMITERS
    if found > allowed:
        raise OversizedArtifact(
            f"{path}: the header holds {found} JSON delimiters ({{[,:), more than the "
            f"{allowed} that {most} tensors (max_tensors) may take"
        )


class _RepeatedKey(ValueError):
    pass


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json keeps the last of repeated keys; a file that says two things is refused instead.
    table = dict(pairs)
    if len(table) != len(pairs):
        counts = collections.Counter(key for key, _ in pairs)
        repeated = next(key for key, count in counts.items() if count > 1)
        raise _RepeatedKey(f"the key {_check.shown(repeated)} appears more than once")
    return table


def _integer(text: str) -> int:
    # Python refuses to convert very long integers (a ValueError deep in json); refuse first.
    if len(text.lstrip("-")) > _LARGEST_DIGITS:
        raise ValueError(f"a number of {len(text)} digits")
    return int(text)


def _constant(text: str) -> float:
    raise ValueError(f"{text} is not JSON")


def check_table(
    raw: bytes, path: Path, data_bytes: int, most: int
) -> tuple[dict[str, TensorEntry], dict[str, str]]:
    """The header's tensors and metadata under the rules kept here; `ArtifactError` else.

    `raw` is the header, `data_bytes` how many bytes follow it; at most `most` tensors."""
    try:
        table = json.loads(
            raw.decode("utf-8"),
            object_pairs_hook=_unique,
            parse_int=_integer,
            parse_constant=_constant,
        )
    except _RepeatedKey as exc:
        raise MislabeledArtifact(f"{path}: the header is ambiguous: {exc}") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        detail = "it nests too deep" if isinstance(exc, RecursionError) else str(exc)
        raise MislabeledArtifact(f"{path}: the header is not valid JSON ({detail})") from None
    if not isinstance(table, dict):
        raise MislabeledArtifact(f"{path}: the header is not a JSON object")
    metadata = table.pop(METADATA, None)
    if metadata is None:  # as in safetensors, null is no metadata
        metadata = {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise MislabeledArtifact(
            f"{path}: __metadata__ must be an object of strings, got {_check.shown(metadata)}"
        )
    if len(table) > most:
        raise OversizedArtifact(f"{path}: {len(table)} tensors, more than max_tensors={most}")
    entries = {name: _entry(path, name, info, data_bytes) for name, info in table.items()}
    _check_coverage(path, entries, data_bytes)
    return entries, metadata


def _entry(path: Path, name: str, info: object, data: int) -> TensorEntry:
    shown = _check.shown(name)
    if not isinstance(info, dict) or set(info) != _FIELDS:
        raise MislabeledArtifact(f"{path}: {shown} needs exactly dtype, shape and data_offsets")
    dtype = FILE_DTYPES.get(info["dtype"]) if isinstance(info["dtype"], str) else None
    if dtype is None:
        allowed = ", ".join(FILE_DTYPES)
        raise MislabeledArtifact(
            f"{path}: {shown} has dtype {_check.shown(info['dtype'])}; allowed: {allowed}"
        )
    shape, offsets = info["shape"], info["data_offsets"]
    if not (isinstance(shape, list) and all(_u64(d) for d in shape)):
        raise MislabeledArtifact(f"{path}: {shown} has shape {_check.shown(shape)}")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(_u64(o) for o in offsets)
        and offsets[0] <= offsets[1]
    ):
        raise MislabeledArtifact(f"{path}: {shown} has data_offsets {_check.shown(offsets)}")
    try:
        desc = TensorDesc(dtype, shape)
    except ContractError as exc:
        raise MislabeledArtifact(f"{path}: {shown}: {exc}") from None
    start, end = offsets
    if end - start != desc.nbytes:
        raise MislabeledArtifact(
            f"{path}: {shown} is {desc} ({desc.nbytes} bytes) but spans {end - start} bytes"
        )
    if end > data:
        raise TruncatedArtifact(
            f"{path}: {shown} ends at data byte {end}; the file holds {data} data bytes"
        )
    return TensorEntry(name, desc, start, end)


def _u64(value: object) -> bool:
    return type(value) is int and 0 <= value < 2**64


def _check_coverage(path: Path, entries: Mapping[str, TensorEntry], data: int) -> None:
    """The tensors must cover the data exactly: no overlap, no gap, nothing after them."""
    covered = 0
    for entry in sorted(entries.values(), key=lambda e: (e.start, e.end)):
        if entry.start < covered:
            raise OversizedArtifact(f"{path}: {_check.shown(entry.name)} overlaps another tensor")
        if entry.start > covered:
            raise MislabeledArtifact(
                f"{path}: data bytes {covered}..{entry.start} belong to no tensor"
            )
        covered = entry.end
    if covered != data:
        raise MislabeledArtifact(
            f"{path}: {data - covered} bytes after the last tensor belong to no tensor"
        )
