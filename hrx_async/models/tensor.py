"""Checked tensor descriptors, and tensors over views of runtime buffers.

    desc = TensorDesc(DType.F32, (2, 3), strides=(4, 1))   # nbytes == 28: the full extent
    t = Tensor(desc, buffer.view())                         # the view must hold desc.nbytes
    await t.write(np.ones((2, 3), np.float32))             # host-mappable placements
    array = await t.read()

Rules (the original's): dtypes u8 (1 byte), f16 and bf16 (2), i32, u32 and f32 (4),
i64 (8); layouts general (rank 0 to 64, numpy's limit), NCHW and NHWC (rank 4) and rows
(rank 2); strides are in elements, row-major by default, each > 0, and no two elements
overlap (no two distinct indices reach the same offset); an empty shape is a scalar (one
element); a zero dimension makes the tensor empty (0 bytes); `nbytes` is the full extent
from the first to the last element. Sizes fit a signed 64-bit integer: `nbytes`, every
byte stride, and the dense size of the dimensions (zero ones skipped). Bad input raises
`ContractError` and makes nothing. bf16 values are held in numpy as their uint16 bits
(`bf16_from_f32`, `f32_from_bf16`).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._core.memory import View
from ..errors import ContractError
from . import _check


class DType(enum.Enum):
    """An element type of tensors; `itemsize` and `numpy` give its size and numpy dtype."""
    U8 = "u8"
    F16 = "f16"
    BF16 = "bf16"
    I32 = "i32"
    U32 = "u32"
    F32 = "f32"
    I64 = "i64"

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def numpy(self) -> np.dtype[Any]:
        """The numpy dtype holding it (bf16: its uint16 bits)."""
        return np.dtype(_NUMPY[self])

    @classmethod
    def of(cls, value: object) -> DType:
        """A DType from a DType, its name ("f32"), a numpy dtype, or a torch/cupy dtype."""
        if isinstance(value, DType):
            return value
        if isinstance(value, str) and value.lower() in _BY_NAME:
            return _BY_NAME[value.lower()]
        text = str(value).removeprefix("torch.")
        if text in _BY_NAME:
            return _BY_NAME[text]
        try:
            found = np.dtype(value)  # type: ignore[call-overload]
        except Exception:  # numpy raises several kinds for what it cannot read as a dtype
            found = None
        if found is not None and found.str.lstrip("<=|") in _BY_NUMPY:
            return _BY_NUMPY[found.str.lstrip("<=|")]
        names = ", ".join(d.value for d in cls)
        raise ContractError(f"unsupported dtype {_check.shown(value)}; supported: {names}")


_ITEMSIZE = {
    DType.U8: 1,
    DType.F16: 2,
    DType.BF16: 2,
    DType.I32: 4,
    DType.U32: 4,
    DType.F32: 4,
    DType.I64: 8,
}
_NUMPY = {
    DType.U8: "u1",
    DType.F16: "f2",
    DType.BF16: "u2",
    DType.I32: "i4",
    DType.U32: "u4",
    DType.F32: "f4",
    DType.I64: "i8",
}
_BY_NUMPY = {v: k for k, v in _NUMPY.items() if k is not DType.BF16}
_BY_NAME = {d.value: d for d in DType} | {
    "uint8": DType.U8,
    "float16": DType.F16,
    "bfloat16": DType.BF16,
    "int32": DType.I32,
    "uint32": DType.U32,
    "float32": DType.F32,
    "int64": DType.I64,
}


class Layout(enum.Enum):
    """How a tensor's dimensions are meant: `GENERAL`, `NCHW` or `NHWC` (rank 4), `ROWS` (rank
    2)."""
    GENERAL = "general"
    NCHW = "nchw"
    NHWC = "nhwc"
    ROWS = "rows"


_RANK = {Layout.NCHW: 4, Layout.NHWC: 4, Layout.ROWS: 2}
MAX_RANK = 64
"""numpy's most dimensions: a tensor of more could be described but never read."""
MAX_BYTES = 2**63 - 1
"""The largest signed 64-bit size: byte offsets and strides past it have no native type."""
OVERLAP_SEARCH_STEPS = 50_000
"""How many steps the exact overlap search of interleaved strides may take (see
`_check_no_overlap`)."""


def row_major(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides, in elements, of `shape`."""
    strides: list[int] = []
    step = 1
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))


@dataclass(frozen=True, slots=True, init=False)
class TensorDesc:
    """dtype, shape, strides (elements) and layout, checked when made."""

    dtype: DType
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    layout: Layout

    def __init__(
        self,
        dtype: DType | str,
        shape: Sequence[int],
        strides: Sequence[int] | None = None,
        layout: Layout | str = Layout.GENERAL,
    ) -> None:
        dtype = DType.of(dtype)
        if not isinstance(shape, Sequence) or isinstance(shape, str | bytes):
            raise ContractError(f"a shape is a sequence of integers, got {_check.shown(shape)}")
        if len(shape) > MAX_RANK:
            raise ContractError(f"a tensor has rank 0..{MAX_RANK}, got rank {len(shape)}")
        dims = tuple(
            _check.integer(d, f"dimension {i} of shape {shape!r}") for i, d in enumerate(shape)
        )
        try:
            layout = Layout(layout.lower() if isinstance(layout, str) else layout)
        except ValueError:
            names = ", ".join(x.value for x in Layout)
            raise ContractError(f"unknown layout {layout!r}; allowed: {names}") from None
        rank = _RANK.get(layout)
        if rank is not None and len(dims) != rank:
            raise ContractError(f"a {layout.value} tensor has rank {rank}, got shape {dims}")
        if strides is None:
            steps = row_major(dims)
        else:
            if not isinstance(strides, Sequence) or len(strides) != len(dims):
                raise ContractError(
                    f"strides must be {len(dims)} integers for shape {dims}, got "
                    f"{_check.shown(strides)}"
                )
            steps = tuple(
                _check.integer(s, f"stride {i} of {strides!r}", 1) for i, s in enumerate(strides)
            )
        _check_sizes(dtype, dims, steps)
        if strides is not None:
            _check_no_overlap(dims, steps)
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "shape", dims)
        object.__setattr__(self, "strides", steps)
        object.__setattr__(self, "layout", layout)

    @property
    def rank(self) -> int:
        """The number of dimensions (0 for a scalar)."""
        return len(self.shape)

    @property
    def numel(self) -> int:
        """The number of elements (1 for a scalar, 0 when a dimension is 0)."""
        return math.prod(self.shape)

    @property
    def empty(self) -> bool:
        """True when some dimension is 0 (no elements, no bytes)."""
        return self.numel == 0

    @property
    def contiguous(self) -> bool:
        """True when the strides are row-major for the shape."""
        return self.strides == row_major(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes from the first element to the end of the last one (0 when empty)."""
        if self.empty:
            return 0
        last = sum((d - 1) * s for d, s in zip(self.shape, self.strides, strict=True))
        return (last + 1) * self.dtype.itemsize

    @property
    def byte_strides(self) -> tuple[int, ...]:
        """The strides in bytes (`strides` are in elements)."""
        return tuple(s * self.dtype.itemsize for s in self.strides)

    @classmethod
    def of_array(cls, array: Any, layout: Layout | str = Layout.GENERAL) -> TensorDesc:
        """The descriptor of a numpy array (its dtype and shape, row-major)."""
        array = np.asarray(array)
        return cls(DType.of(array.dtype), array.shape, None, layout)

    def __str__(self) -> str:
        return f"{self.dtype.value}{list(self.shape)}"


def _check_sizes(dtype: DType, shape: tuple[int, ...], strides: tuple[int, ...]) -> None:
    item = dtype.itemsize
    dense = math.prod(max(d, 1) for d in shape) * item
    last = 0 if 0 in shape else sum((d - 1) * s for d, s in zip(shape, strides, strict=True))
    widest = max((s * item for s in strides), default=0)
    for what, size in (
        ("its dimensions hold", dense),
        ("it spans", 0 if 0 in shape else (last + 1) * item),
        ("a stride steps", widest),
    ):
        if size > MAX_BYTES:
            raise ContractError(
                f"shape {shape} with strides {strides} of {dtype.value}: {what} {size} bytes, "
                f"more than the largest signed 64-bit size ({MAX_BYTES})"
            )


def _check_no_overlap(shape: tuple[int, ...], strides: tuple[int, ...]) -> None:
    """Refuse strides under which two distinct indices reach the same element.

    Taken in stride order, dimensions that each step past the whole reach of the smaller
    ones never overlap: that settles the common layouts (row-major, permuted, sliced) at
    once. Interleaved ones are decided exactly by `_collision`, whose work is bounded; a
    layout it cannot settle within `OVERLAP_SEARCH_STEPS` is refused as unverifiable,
    never accepted unchecked.
    """
    if 0 in shape:
        return
    dims = sorted((s, d - 1) for d, s in zip(shape, strides, strict=True) if d > 1)
    reach = 0
    for stride, top in dims:
        if stride <= reach:
            break
        reach += stride * top
    else:
        return
    reach = sum(stride * top for stride, top in dims)
    # More elements than offsets in the extent: two of them must share one.
    collides = math.prod(top + 1 for _, top in dims) > reach + 1 or _collision(dims)
    if collides is None:
        raise ContractError(
            f"strides {strides} for shape {shape} interleave their dimensions too intricately "
            f"to be checked for overlap within {OVERLAP_SEARCH_STEPS} steps; use strides "
            "where each dimension steps past the extent of those with smaller strides"
        )
    if collides:
        raise ContractError(
            f"strides {strides} overlap for shape {shape}: two distinct indices reach the "
            "same element"
        )


class _GaveUp(Exception):
    pass


def _collision(dims: list[tuple[int, int]]) -> bool | None:
    """Whether two distinct indices reach one offset, for `dims` as (stride, largest index)
    in stride order; None when deciding takes more than `OVERLAP_SEARCH_STEPS` steps.

    Two indices x != y collide when c = x - y, a nonzero vector with |c_i| <= top_i, has
    sum(c_i * stride_i) == 0. Take k the last dimension with c_k != 0, and c_k > 0 (else
    use -c): the dimensions before k must sum to -c_k * stride_k, or, negating their c_i,
    to c_k * stride_k. `sums_to(k, t)` searches that from the largest stride down, trying
    only the c_j that leave a rest the smaller dimensions can still reach, and remembers
    every (k, t) it has settled. Its steps are counted, so a layout whose search would
    explode (the problem is as hard as subset sum) ends in None instead.
    """
    reach = [0]
    for stride, top in dims:
        reach.append(reach[-1] + stride * top)
    settled: dict[tuple[int, int], bool] = {}
    steps = 0

    def sums_to(k: int, t: int) -> bool:
        """Whether the first `k` dimensions can sum to `t` (>= 0)."""
        nonlocal steps
        steps += 1
        if steps > OVERLAP_SEARCH_STEPS:
            raise _GaveUp
        if t == 0:
            return True
        if t > reach[k]:
            return False
        known = settled.get((k, t))
        if known is None:
            stride, top = dims[k - 1]
            rest = reach[k - 1]
            low = max(-top, -((rest - t) // stride))
            high = min(top, (t + rest) // stride)
            known = any(sums_to(k - 1, abs(t - c * stride)) for c in range(low, high + 1))
            settled[(k, t)] = known
        return known

    try:
        return any(
            sums_to(k, c * stride)
            for k, (stride, top) in enumerate(dims)
            for c in range(1, min(top, reach[k] // stride) + 1)
        )
    except _GaveUp:
        return None


class Tensor:
    """A descriptor over a view of a runtime buffer that holds `desc.nbytes`."""

    __slots__ = ("desc", "view")

    def __init__(self, desc: TensorDesc, view: View) -> None:
        if not isinstance(desc, TensorDesc):
            raise ContractError(f"a Tensor takes a TensorDesc, got {_check.shown(desc)}")
        if not isinstance(view, View):
            raise ContractError(f"a Tensor lives in a View, got {_check.shown(view)}")
        view.buffer.check_alive()
        if desc.nbytes > view.nbytes:
            raise ContractError(f"{desc} needs {desc.nbytes} bytes; {view} has {view.nbytes}")
        self.desc = desc
        self.view = view

    dtype = property(lambda self: self.desc.dtype)
    """The element type (`desc.dtype`)."""
    shape = property(lambda self: self.desc.shape)
    """The shape, in elements (`desc.shape`)."""
    nbytes = property(lambda self: self.desc.nbytes)
    """The full extent in bytes (`desc.nbytes`)."""

    @property
    def data(self) -> View:
        """The bytes the tensor spans (its view, cut to `nbytes`; the view when empty)."""
        n = self.desc.nbytes
        return self.view if n in (0, self.view.nbytes) else self.view.slice(0, n)

    def host_array(self, memory: memoryview) -> np.ndarray[Any, Any]:
        """The tensor as a numpy array over mapped `memory` of its view (no copy)."""
        desc = self.desc
        raw = np.frombuffer(memory, np.uint8, count=desc.nbytes)
        if desc.empty:
            return np.zeros(desc.shape, desc.dtype.numpy)
        array: np.ndarray[Any, Any] = np.lib.stride_tricks.as_strided(
            raw.view(desc.dtype.numpy),
            desc.shape,
            desc.byte_strides,
            writeable=not memory.readonly,
        )
        return array

    def check_array(self, value: Any) -> np.ndarray[Any, Any]:
        """`array` as numpy, when its dtype and shape are the tensor's (else `ContractError`)."""
        try:
            array: np.ndarray[Any, Any] = np.asarray(value)
        except (ValueError, TypeError, OverflowError) as exc:  # ragged nesting, odd objects
            raise ContractError(
                f"expected {self.desc} as an array, got {_check.shown(value)}: {exc}"
            ) from None
        dtype = DType.of(array.dtype) if array.dtype != np.uint16 else None
        wanted = self.desc.dtype
        ok_dtype = dtype is wanted or (wanted is DType.BF16 and array.dtype == np.uint16)
        if not ok_dtype or array.shape != self.desc.shape:
            raise ContractError(
                f"expected {self.desc} ({wanted.numpy} in numpy), got {array.dtype}"
                f"{list(array.shape)}"
            )
        return array

    async def write(self, array: Any) -> None:
        """Write a numpy array into a host-mappable tensor (waits for conflicting work)."""
        array = self.check_array(array)
        if self.desc.empty:
            return
        async with self.data.map_write() as memory:
            self.host_array(memory)[...] = array

    async def read(self) -> np.ndarray[Any, Any]:
        """A numpy copy of a host-mappable tensor (waits for pending writes)."""
        if self.desc.empty:
            return np.zeros(self.desc.shape, self.desc.dtype.numpy)
        async with self.data.map_read() as memory:
            return np.array(self.host_array(memory))

    def to_dlpack(self, xp: Any) -> Any:
        """The tensor in another array library, zero-copy through DLPack: `xp` is numpy,
        cupy or torch (GPU memory needs cupy or torch on the GPU backend)."""
        desc = self.desc
        if desc.empty:
            raise ContractError("an empty tensor has no bytes to share")
        raw = xp.from_dlpack(self.data)
        if getattr(xp, "__name__", "") == "torch":
            torch_dtype = getattr(xp, _TORCH[desc.dtype])
            return raw.view(torch_dtype).as_strided(desc.shape, desc.strides)
        typed = raw.view(desc.dtype.numpy)
        strided = getattr(xp, "lib", np.lib).stride_tricks.as_strided
        return strided(typed, desc.shape, desc.byte_strides)

    def __repr__(self) -> str:
        return f"<Tensor {self.desc} {self.desc.layout.value} in {self.view}>"


_TORCH = {
    DType.U8: "uint8",
    DType.F16: "float16",
    DType.BF16: "bfloat16",
    DType.I32: "int32",
    DType.U32: "uint32",
    DType.F32: "float32",
    DType.I64: "int64",
}


def bf16_from_f32(values: Any) -> np.ndarray[Any, np.dtype[np.uint16]]:
    """bf16 bits of float32 values, rounded to nearest even (NaN stays NaN)."""
    bits = np.ascontiguousarray(values, np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(np.asarray(values, np.float32))
    out = np.where(nan, (bits >> 16) | 0x40, rounded).astype(np.uint16)
    return out


def f32_from_bf16(bits: Any) -> np.ndarray[Any, np.dtype[np.float32]]:
    """float32 values of bf16 bit patterns (exact: bf16 is the top half of a float32)."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


__all__ = [
    "DType",
    "Layout",
    "Tensor",
    "TensorDesc",
    "bf16_from_f32",
    "f32_from_bf16",
    "row_major",
]
