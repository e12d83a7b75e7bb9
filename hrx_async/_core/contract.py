"""Kernel contracts: what each binding of a kernel accesses, and its exact scalar constants.

A contract is checked when a kernel node is recorded, so a wrong view count, a
short view or a misaligned offset fails at the call that made it, not on the device.
"""

from __future__ import annotations

import enum
import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import ContractError
from . import validate as _validate


class Access(enum.Enum):
    """How a node uses a view. WRITE and READ_WRITE are writes."""

    READ = "read"
    WRITE = "write"
    READ_WRITE = "read_write"

    @property
    def writes(self) -> bool:
        return self is not Access.READ

    @property
    def reads(self) -> bool:
        return self is not Access.WRITE


def _is_power_of_two(value: int) -> bool:
    return value >= 1 and value & (value - 1) == 0


@dataclass(frozen=True, slots=True)
class Binding:
    """One kernel argument: the minimum extent in bytes, its access, its alignment.

    `layout` is a free-form label (e.g. "f32[1024]") used in error messages.
    """

    nbytes: int
    access: Access
    alignment: int = 4
    layout: str = ""

    def __post_init__(self) -> None:
        nbytes = _validate.integer(self.nbytes, "binding nbytes", 1)
        _validate.instance(self.access, Access, "binding access", "READ, WRITE or READ_WRITE")
        alignment = _validate.as_integer(self.alignment)
        if alignment is None or not _is_power_of_two(alignment):
            raise ContractError(
                "binding alignment must be a power of two >= 1 (an integer, not a bool), "
                f"got {_validate.shown(self.alignment)}"
            )
        _validate.text(self.layout, "binding layout")
        object.__setattr__(self, "nbytes", nbytes)
        object.__setattr__(self, "alignment", alignment)

    def describe(self, index: int) -> str:
        """How error messages name this binding: `binding INDEX`, with its `layout` label when it
        has one."""
        label = f" ({self.layout})" if self.layout else ""
        return f"binding {index}{label}"


@dataclass(frozen=True, slots=True)
class KernelContract:
    """Bindings in ABI order plus the exact bytes of the scalar constants.

    `bindings`: an ordered iterable of `Binding`s (at least one). `constants`: a
    `Constants` or bytes-like object (bytes, bytearray, memoryview); not an int or str.
    """

    bindings: tuple[Binding, ...]
    constants: bytes = b""

    def __init__(self, bindings: Iterable[Binding], constants: bytes | Constants = b"") -> None:
        items = _validate.items(bindings, "contract bindings")
        for item in items:
            if not isinstance(item, Binding):
                raise ContractError(
                    f"contract bindings must be Binding objects, got {_validate.shown(item)}"
                )
        if not items:
            raise ContractError("a kernel contract needs at least one binding")
        if isinstance(constants, Constants):
            raw = constants.to_bytes()
        else:
            raw = _validate.byte_string(constants, "contract constants (bytes or Constants)")
        object.__setattr__(self, "bindings", items)
        object.__setattr__(self, "constants", raw)


_FORMATS: dict[str, str] = {
    "u8": "<B",
    "u16": "<H",
    "u32": "<I",
    "u64": "<Q",
    "i8": "<b",
    "i16": "<h",
    "i32": "<i",
    "i64": "<q",
    "f16": "<e",
    "f32": "<f",
    "f64": "<d",
}


def bf16_bits(value: float) -> int:
    """The bfloat16 bit pattern of `value`, rounded to nearest even (NaN stays NaN).

    Rounds the exact value in one step: going through float32 first would round twice and
    get values just above a halfway point wrong. A finite value beyond the largest bfloat16
    raises `ContractError`, as f16 and f32 constants do.
    """
    if math.isnan(value):
        (bits,) = struct.unpack("<I", struct.pack("<f", value))
        return int(bits >> 16) | 0x0040
    sign = 0x8000 if math.copysign(1.0, value) < 0 else 0
    magnitude = abs(value)
    if math.isinf(magnitude):
        return sign | 0x7F80
    if magnitude == 0.0:
        return sign
    # The spacing of bfloat16 values near `magnitude`: 8 significant bits for normal
    # numbers, a fixed 2**-133 below them. Scaling by a power of two is exact and round()
    # ties to even, so `steps` is the correctly rounded value in units of that spacing.
    quantum = max(math.frexp(magnitude)[1] - 8, -133)
    steps = round(math.ldexp(magnitude, -quantum))
    # Exponent and mantissa fields line up so that the pattern is a plain sum; a carry out
    # of the mantissa (steps == 256) moves to the next exponent by itself.
    bits = ((quantum + 133) << 7) + steps
    if bits >= 0x7F80:
        raise ContractError(
            f"constant {value!r} does not fit bf16: its largest finite value is 3.3895e38"
        )
    return sign | bits


class Constants:
    """Typed little-endian scalars packed in declaration order, with no implicit padding.

    >>> Constants().u32(7).f32(1.5).to_bytes().hex()
    '070000000000c03f'
    """

    __slots__ = ("_parts",)

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def _pack(self, kind: str, value: float) -> Constants:
        try:
            self._parts.append(struct.pack(_FORMATS[kind], value))
        except (struct.error, OverflowError, TypeError) as exc:
            raise ContractError(f"constant {value!r} does not fit {kind}: {exc}") from None
        return self

    def u8(self, value: int) -> Constants:
        """Append `value` as a little-endian unsigned 8-bit integer; returns `self` for chaining.

        `ContractError` when `value` is not an int in the type's range; nothing is appended then."""
        return self._pack("u8", value)

    def u16(self, value: int) -> Constants:
        """Append `value` as a little-endian unsigned 16-bit integer; returns `self` for chaining.

        `ContractError` when `value` is not an int in the type's range; nothing is appended then."""
        return self._pack("u16", value)

    def u32(self, value: int) -> Constants:
        """Append `value` as a little-endian unsigned 32-bit integer; returns `self` for chaining.

        `ContractError` when `value` is not an int in the type's range; nothing is appended then."""
        return self._pack("u32", value)

    def u64(self, value: int) -> Constants:
        """Append `value` as a little-endian unsigned 64-bit integer; returns `self` for chaining.

        `ContractError` when `value` is not an int in the type's range; nothing is appended then."""
        return self._pack("u64", value)

    def i8(self, value: int) -> Constants:
        """Append `value` as a little-endian signed 8-bit integer; returns `self` for chaining.

        `ContractError` when `value` is not an int in the type's range; nothing is appended then."""
        return self._pack("i8", value)

    def i16(self, value: int) -> Constants:
        """Append `value` as a little-endian signed 16-bit integer; returns `self` for chaining.

        `ContractError` when `value` is not an int in the type's range; nothing is appended then."""
        return self._pack("i16", value)

    def i32(self, value: int) -> Constants:
        """Append `value` as a little-endian signed 32-bit integer; returns `self` for chaining.

        `ContractError` when `value` is not an int in the type's range; nothing is appended then."""
        return self._pack("i32", value)

    def i64(self, value: int) -> Constants:
        """Append `value` as a little-endian signed 64-bit integer; returns `self` for chaining.

        `ContractError` when `value` is not an int in the type's range; nothing is appended then."""
        return self._pack("i64", value)

    def f16(self, value: float) -> Constants:
        """Append `value` as a little-endian IEEE half float; returns `self` for chaining.

        `ContractError` when `value` is not a number or does not fit the type; nothing is
        appended then."""
        return self._pack("f16", value)

    def f32(self, value: float) -> Constants:
        """Append `value` as a little-endian IEEE single float; returns `self` for chaining.

        `ContractError` when `value` is not a number or does not fit the type; nothing is
        appended then."""
        return self._pack("f32", value)

    def f64(self, value: float) -> Constants:
        """Append `value` as a little-endian IEEE double float; returns `self` for chaining.

        `ContractError` when `value` is not a number or does not fit the type; nothing is
        appended then."""
        return self._pack("f64", value)

    def bf16(self, value: float) -> Constants:
        """Append `value` rounded to bfloat16 (round to nearest even, 2 bytes); returns `self`.

        `ContractError` when `value` is not a number; nothing is appended then."""
        try:
            (number,) = struct.unpack("<d", struct.pack("<d", value))
        except (struct.error, OverflowError, TypeError) as exc:
            raise ContractError(f"constant {value!r} does not fit bf16: {exc}") from None
        self._parts.append(struct.pack("<H", bf16_bits(number)))
        return self

    def to_bytes(self) -> bytes:
        """The packed constants, in the order they were appended: what a GPU kernel receives
        after its buffer pointers (and a `sim` kernel as its `constants` argument)."""
        return b"".join(self._parts)

    def __len__(self) -> int:
        return sum(len(part) for part in self._parts)


def check_dims(name: str, dims: Iterable[int]) -> tuple[int, int, int]:
    """Normalise a grid or block shape to three positive ints (missing parts are 1).

    Each part is an integer (numpy integers too, bools not) in 1..2**31-1; anything else,
    a non-iterable included, raises `ContractError`.
    """
    return _validate.dims(name, dims)
