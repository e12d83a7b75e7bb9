"""Kernel contracts: what each binding of a kernel accesses, and its exact scalar constants.

A contract is checked when a kernel node is recorded, so a wrong view count, a
short view or a misaligned offset fails at the call that made it, not on the device.
"""

from __future__ import annotations

import enum
import math
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .errors import ContractError


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
        if not isinstance(self.nbytes, int) or self.nbytes < 1:
            raise ContractError(f"binding nbytes must be an integer >= 1, got {self.nbytes!r}")
        if not isinstance(self.access, Access):
            raise ContractError(f"binding access must be an Access, got {self.access!r}")
        if not isinstance(self.alignment, int) or not _is_power_of_two(self.alignment):
            raise ContractError(
                f"binding alignment must be a power of two >= 1, got {self.alignment!r}"
            )

    def describe(self, index: int) -> str:
        label = f" ({self.layout})" if self.layout else ""
        return f"binding {index}{label}"


@dataclass(frozen=True, slots=True)
class KernelContract:
    """Bindings in ABI order plus the exact bytes of the scalar constants."""

    bindings: tuple[Binding, ...]
    constants: bytes = b""

    def __init__(self, bindings: Iterable[Binding], constants: bytes | Constants = b"") -> None:
        items = tuple(bindings)
        for item in items:
            if not isinstance(item, Binding):
                raise ContractError(f"contract bindings must be Binding objects, got {item!r}")
        if not items:
            raise ContractError("a kernel contract needs at least one binding")
        raw = constants.to_bytes() if isinstance(constants, Constants) else bytes(constants)
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
        return self._pack("u8", value)

    def u16(self, value: int) -> Constants:
        return self._pack("u16", value)

    def u32(self, value: int) -> Constants:
        return self._pack("u32", value)

    def u64(self, value: int) -> Constants:
        return self._pack("u64", value)

    def i8(self, value: int) -> Constants:
        return self._pack("i8", value)

    def i16(self, value: int) -> Constants:
        return self._pack("i16", value)

    def i32(self, value: int) -> Constants:
        return self._pack("i32", value)

    def i64(self, value: int) -> Constants:
        return self._pack("i64", value)

    def f16(self, value: float) -> Constants:
        return self._pack("f16", value)

    def f32(self, value: float) -> Constants:
        return self._pack("f32", value)

    def f64(self, value: float) -> Constants:
        return self._pack("f64", value)

    def bf16(self, value: float) -> Constants:
        try:
            (number,) = struct.unpack("<d", struct.pack("<d", value))
        except (struct.error, OverflowError, TypeError) as exc:
            raise ContractError(f"constant {value!r} does not fit bf16: {exc}") from None
        self._parts.append(struct.pack("<H", bf16_bits(number)))
        return self

    def to_bytes(self) -> bytes:
        return b"".join(self._parts)

    def __len__(self) -> int:
        return sum(len(part) for part in self._parts)


def check_dims(name: str, dims: Sequence[int]) -> tuple[int, int, int]:
    """Normalise a grid or block shape to three positive ints (missing parts are 1)."""
    values = tuple(dims)
    if not 1 <= len(values) <= 3 or not all(isinstance(v, int) and v >= 1 for v in values):
        raise ContractError(f"{name} must be 1 to 3 positive integers, got {dims!r}")
    padded = values + (1,) * (3 - len(values))
    return (padded[0], padded[1], padded[2])
