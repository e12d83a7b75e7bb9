"""The one argument block every image kernel takes, and the image view of a tensor.

Each kernel gets its bound tensors as pointers and then one `ImageArgs` struct by
value. The struct is declared once, here, as a field list: `CXX_STRUCT` is the C++
declaration generated from it (the device kernels include it), `pack` writes the
bytes the contract carries, and `unpack` reads them back for the host kernels. So
the device and the host read the same values from the same bytes.

Field meanings (unused fields are zero):

* `sy`, `sx` (double): nearest-neighbour source steps, `1 / (dst / src)` per axis.
* `m[6]` (float): the affine matrix, destination pixel → source position, row-major.
* `fill` (float): the constant border value. `scale` (float): normalize's input
  scale, composite's alpha scale (1/255 for u8).
* `total`: output elements (one thread each). `n`, `c`: batch and channels of the
  output; `sh`, `sw` source and `dh`, `dw` destination height and width.
* `ss`, `ds`, `bs` (4 each): element strides (batch, channel, row, column) of the
  source, the destination and the second input (composite's background).
* `mode`: resize 0 nearest / 1 bilinear; affine 0 constant / 1 replicate border;
  composite 1 when the background has alpha. `k`: patch size, or composite's
  foreground alpha channel.
* `region[4]`: resize_rgb's region of the canvas (left, top, width, height).
* `bits[2]`: resize_rgb's fixed-point precision of its vertical and horizontal pass.
* `mean[16]`, `stdv[16]`: normalize's per-channel mean and standard deviation; the
  RGB operations' other float parameters.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from ..errors import ContractError
from ..models import Layout, Tensor

MAX_CHANNELS = 16
MAX_ELEMENTS = (1 << 31) - 1
"""Kernels index with 32-bit integers: every tensor's extent stays below 2**31 elements."""

FIELDS: tuple[tuple[str, str, int], ...] = (
    ("sy", "d", 1),
    ("sx", "d", 1),
    ("m", "f", 6),
    ("fill", "f", 1),
    ("scale", "f", 1),
    ("total", "I", 1),
    ("n", "I", 1),
    ("c", "I", 1),
    ("sh", "I", 1),
    ("sw", "I", 1),
    ("dh", "I", 1),
    ("dw", "I", 1),
    ("ss", "I", 4),
    ("ds", "I", 4),
    ("bs", "I", 4),
    ("mode", "I", 1),
    ("k", "I", 1),
    ("region", "I", 4),
    ("bits", "I", 2),
    ("mean", "f", MAX_CHANNELS),
    ("stdv", "f", MAX_CHANNELS),
)
_CTYPES = {"d": "double", "f": "float", "I": "unsigned"}
_SIZES = {"d": 8, "f": 4, "I": 4}


def _layout() -> tuple[str, int]:
    fmt = "<" + "".join(f"{count}{code}" for _, code, count in FIELDS)
    size = struct.calcsize(fmt)
    pad = -size % 8  # the struct holds doubles: its size is a multiple of 8
    return fmt + "x" * pad, size + pad


FORMAT, NBYTES = _layout()


def _cxx_struct() -> str:
    lines = ["struct ImageArgs {"]
    offset = 0
    for name, code, count in FIELDS:
        suffix = f"[{count}]" if count > 1 else ""
        lines.append(f"  {_CTYPES[code]} {name}{suffix};")
        offset += _SIZES[code] * count
    if offset != NBYTES:
        lines.append(f"  unsigned pad_[{(NBYTES - offset) // 4}];")
    lines.append("};")
    return "\n".join(lines) + "\n"


CXX_STRUCT = _cxx_struct()


def pack(**values: Any) -> bytes:
    """The struct's bytes: each field from `values` (a number, or a sequence for arrays,
    zero-padded), zero when absent."""
    unknown = set(values) - {name for name, _, _ in FIELDS}
    if unknown:
        raise ContractError(f"unknown image argument(s) {sorted(unknown)}")
    flat: list[float | int] = []
    for name, code, count in FIELDS:
        value = values.get(name, 0 if count == 1 else ())
        items = list(value) if count > 1 else [value]
        if len(items) > count:
            raise ContractError(f"image argument {name} takes at most {count} values")
        items += [0] * (count - len(items))
        flat.extend(float(v) if code != "I" else int(v) for v in items)
    try:
        return struct.pack(FORMAT, *flat)
    except struct.error as exc:
        raise ContractError(f"image arguments do not fit their fields: {exc}") from None


@dataclass(frozen=True, slots=True)
class Args:
    """`unpack`'s result: the fields by name (arrays as tuples)."""

    values: dict[str, Any]

    def __getattr__(self, name: str) -> Any:
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None


def unpack(constants: bytes) -> Args:
    if len(constants) != NBYTES:
        raise ContractError(f"image kernels take {NBYTES} constant bytes, got {len(constants)}")
    flat = struct.unpack(FORMAT, constants)
    values: dict[str, Any] = {}
    index = 0
    for name, _, count in FIELDS:
        chunk = flat[index : index + count]
        values[name] = chunk if count > 1 else chunk[0]
        index += count
    return Args(values)


# -- tensors as images ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Image:
    """A rank-4 NCHW or NHWC tensor seen as (batch, channels, height, width), with the
    element strides of those four axes whatever the layout."""

    n: int
    c: int
    h: int
    w: int
    strides: tuple[int, int, int, int]

    @property
    def dims(self) -> tuple[int, int, int, int]:
        return (self.n, self.c, self.h, self.w)


def image_of(tensor: object, what: str) -> Image:
    """The image axes of a tensor declared NCHW or NHWC, with no zero dimension."""
    if not isinstance(tensor, Tensor):
        raise ContractError(f"{what} must be a Tensor, got {type(tensor).__name__}")
    desc = tensor.desc
    if desc.layout not in (Layout.NCHW, Layout.NHWC):
        raise ContractError(
            f"{what} ({desc}, layout {desc.layout.value}) must be a rank-4 tensor declared "
            'layout="nchw" or layout="nhwc"'
        )
    if desc.empty:
        raise ContractError(f"{what} {desc} is empty: images need every dimension >= 1")
    check_extent(tensor, what)
    s = desc.strides
    if desc.layout is Layout.NCHW:
        n, c, h, w = desc.shape
        return Image(n, c, h, w, (s[0], s[1], s[2], s[3]))
    n, h, w, c = desc.shape
    return Image(n, c, h, w, (s[0], s[3], s[1], s[2]))


def check_extent(tensor: Tensor, what: str) -> None:
    elements = tensor.desc.nbytes // tensor.desc.dtype.itemsize
    if elements > MAX_ELEMENTS:
        raise ContractError(
            f"{what} {tensor.desc} spans {elements} elements; image kernels take fewer than 2**31"
        )


__all__ = [
    "CXX_STRUCT",
    "FIELDS",
    "MAX_CHANNELS",
    "MAX_ELEMENTS",
    "NBYTES",
    "Args",
    "Image",
    "check_extent",
    "image_of",
    "pack",
    "unpack",
]
