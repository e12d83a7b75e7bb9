"""Tests of kernel contracts: Access, Binding, KernelContract and byte-exact Constants packing.

Integer and IEEE scalars are checked against numpy's own encoders (an independent
implementation) and a few hand-written vectors; bfloat16 against an exact rational model
that rounds to the nearest representable value, ties to the even bit pattern.
"""

from __future__ import annotations

import math
import struct
from bisect import bisect_right
from collections.abc import Callable
from fractions import Fraction
from functools import cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hrx_async._core.contract import (
    Access,
    Binding,
    Constants,
    KernelContract,
    bf16_bits,
    check_dims,
)
from hrx_async.errors import ContractError

# -- Access ------------------------------------------------------------------------------


def test_access_reads_and_writes() -> None:
    assert [a.writes for a in Access] == [False, True, True]
    assert [a.reads for a in Access] == [True, False, True]


# -- Binding -----------------------------------------------------------------------------


def test_binding_defaults() -> None:
    binding = Binding(64, Access.READ)
    assert (binding.nbytes, binding.alignment, binding.layout) == (64, 4, "")
    assert binding.describe(2) == "binding 2"
    assert Binding(8, Access.WRITE, layout="f32[2]").describe(0) == "binding 0 (f32[2])"


@pytest.mark.parametrize("nbytes", [0, -1, -4096, 1.5, "8", None])
def test_binding_rejects_bad_sizes(nbytes: object) -> None:
    with pytest.raises(ContractError, match="nbytes") as info:
        Binding(nbytes, Access.READ)  # type: ignore[arg-type]
    assert repr(nbytes) in str(info.value)


@pytest.mark.parametrize("alignment", [0, -4, 3, 6, 12, 1.0, 2**20 + 1])
def test_binding_rejects_non_power_of_two_alignment(alignment: object) -> None:
    with pytest.raises(ContractError, match="power of two") as info:
        Binding(16, Access.READ, alignment=alignment)  # type: ignore[arg-type]
    assert repr(alignment) in str(info.value)


@pytest.mark.parametrize("alignment", [1, 2, 4, 8, 256, 2**16])
def test_binding_accepts_powers_of_two(alignment: int) -> None:
    assert Binding(16, Access.READ, alignment=alignment).alignment == alignment


def test_binding_rejects_non_access() -> None:
    with pytest.raises(ContractError, match="Access"):
        Binding(16, "read")  # type: ignore[arg-type]


# -- KernelContract ----------------------------------------------------------------------


def test_contract_keeps_bindings_in_order_and_packs_constants() -> None:
    bindings = [Binding(16, Access.READ), Binding(32, Access.WRITE)]
    contract = KernelContract(iter(bindings), Constants().u32(7).f32(1.5))
    assert contract.bindings == tuple(bindings)
    assert contract.constants == bytes.fromhex("070000000000c03f")
    assert KernelContract(bindings, b"\x01\x02").constants == b"\x01\x02"
    assert KernelContract(bindings).constants == b""


def test_contract_rejects_no_bindings_and_non_bindings() -> None:
    with pytest.raises(ContractError, match="at least one binding"):
        KernelContract([])
    with pytest.raises(ContractError, match="Binding objects"):
        KernelContract([Binding(4, Access.READ), (4, Access.READ)])  # type: ignore[list-item]


# -- grid and block shapes -----------------------------------------------------------------


def test_check_dims_pads_to_three() -> None:
    assert check_dims("grid", (4,)) == (4, 1, 1)
    assert check_dims("grid", (4, 2)) == (4, 2, 1)
    assert check_dims("block", (8, 4, 2)) == (8, 4, 2)


@pytest.mark.parametrize("dims", [(), (0,), (-1, 1), (1, 1, 1, 1), (2.0,)])
def test_check_dims_rejects_bad_shapes(dims: tuple[object, ...]) -> None:
    with pytest.raises(ContractError, match="grid must be 1 to 3 positive integers"):
        check_dims("grid", dims)  # type: ignore[arg-type]


# -- Constants: integers -----------------------------------------------------------------

INTEGER_TYPES: dict[str, str] = {
    "u8": "<u1",
    "u16": "<u2",
    "u32": "<u4",
    "u64": "<u8",
    "i8": "<i1",
    "i16": "<i2",
    "i32": "<i4",
    "i64": "<i8",
}


def packer(kind: str) -> Callable[[Constants, float], Constants]:
    method: Callable[[Constants, float], Constants] = getattr(Constants, kind)
    return method


@pytest.mark.parametrize(
    ("kind", "value", "expected"),
    [
        ("u8", 0xAB, "ab"),
        ("u16", 0x1234, "3412"),
        ("u32", 0xDEADBEEF, "efbeadde"),
        ("u64", 0x0102030405060708, "0807060504030201"),
        ("i8", -1, "ff"),
        ("i16", -2, "feff"),
        ("i32", -(2**31), "00000080"),
        ("i64", -3, "fdffffffffffffff"),
        ("f16", 1.0, "003c"),
        ("f16", -2.5, "00c1"),
        ("bf16", 1.0, "803f"),
        ("bf16", -2.5, "20c0"),
        ("f32", 1.5, "0000c03f"),
        ("f64", 1.0, "000000000000f03f"),
    ],
)
def test_known_vectors(kind: str, value: float, expected: str) -> None:
    packed = packer(kind)(Constants(), value)
    assert packed.to_bytes() == bytes.fromhex(expected)
    assert len(packed) == len(expected) // 2


@pytest.mark.parametrize("kind", sorted(INTEGER_TYPES))
def test_integer_range_limits_are_exact(kind: str) -> None:
    info = np.iinfo(np.dtype(INTEGER_TYPES[kind]))
    for value in (int(info.min), int(info.max), 0, 1):
        expected = np.array(value, dtype=INTEGER_TYPES[kind]).tobytes()
        assert packer(kind)(Constants(), value).to_bytes() == expected


@pytest.mark.parametrize("kind", sorted(INTEGER_TYPES))
def test_integer_out_of_range_raises_and_keeps_earlier_constants(kind: str) -> None:
    info = np.iinfo(np.dtype(INTEGER_TYPES[kind]))
    for bad in (int(info.max) + 1, int(info.min) - 1, 1.5, "3", None):
        constants = Constants().u8(9)
        with pytest.raises(ContractError, match=kind) as raised:
            packer(kind)(constants, bad)  # type: ignore[arg-type]
        assert repr(bad) in str(raised.value)
        assert constants.to_bytes() == b"\x09", "a rejected constant must not be packed"


@given(st.data())
@settings(max_examples=200, deadline=None)
def test_integer_sequences_match_numpy(data: st.DataObject) -> None:
    kinds = data.draw(st.lists(st.sampled_from(sorted(INTEGER_TYPES)), min_size=1, max_size=8))
    constants = Constants()
    expected = b""
    for kind in kinds:
        info = np.iinfo(np.dtype(INTEGER_TYPES[kind]))
        value = data.draw(st.integers(int(info.min), int(info.max)))
        packer(kind)(constants, value)
        expected += np.array(value, dtype=INTEGER_TYPES[kind]).tobytes()
    # Declaration order, no padding: a u8 followed by a u64 is 9 bytes, not 16.
    assert constants.to_bytes() == expected
    assert len(constants) == len(expected)


def test_no_implicit_padding() -> None:
    packed = Constants().u8(1).u64(2).u16(3).f32(0.0).to_bytes()
    assert packed == b"\x01" + (2).to_bytes(8, "little") + b"\x03\x00" + b"\x00" * 4


# -- Constants: IEEE floats --------------------------------------------------------------

FLOAT_TYPES = {"f16": "<f2", "f32": "<f4", "f64": "<f8"}


@pytest.mark.parametrize("kind", sorted(FLOAT_TYPES))
@given(st.data())
@settings(max_examples=150, deadline=None)
def test_floats_match_numpy(kind: str, data: st.DataObject) -> None:
    dtype = np.dtype(FLOAT_TYPES[kind])
    largest = float(np.finfo(dtype).max)
    value = data.draw(st.floats(-largest, largest, allow_nan=False))
    assert packer(kind)(Constants(), value).to_bytes() == np.array(value, dtype=dtype).tobytes()


@pytest.mark.parametrize("kind", sorted(FLOAT_TYPES))
def test_float_specials(kind: str) -> None:
    dtype = np.dtype(FLOAT_TYPES[kind])
    for value in (math.inf, -math.inf, -0.0, float(np.finfo(dtype).smallest_subnormal)):
        packed = packer(kind)(Constants(), value).to_bytes()
        assert packed == np.array(value, dtype=dtype).tobytes()
    nan = np.frombuffer(packer(kind)(Constants(), math.nan).to_bytes(), dtype=dtype)[0]
    assert math.isnan(float(nan))


@pytest.mark.parametrize("kind", ["f16", "f32"])
def test_float_overflow_raises(kind: str) -> None:
    constants = Constants()
    with pytest.raises(ContractError, match=kind):
        packer(kind)(constants, 1e300)
    assert constants.to_bytes() == b""


@pytest.mark.parametrize("kind", ["f16", "bf16", "f32", "f64"])
@pytest.mark.parametrize("bad", ["1.0", None, b"\x00"])
def test_float_rejects_non_numbers(kind: str, bad: object) -> None:
    constants = Constants().u8(1)
    with pytest.raises(ContractError, match=kind):
        packer(kind)(constants, bad)  # type: ignore[arg-type]
    assert constants.to_bytes() == b"\x01"


# -- Constants: bfloat16 -----------------------------------------------------------------


def bf16_value(bits: int) -> Fraction:
    """The exact magnitude of a non-negative bf16 pattern; 0x7F80 decodes to 2**128, which is
    where IEEE rounding places infinity."""
    exponent, mantissa = bits >> 7, bits & 0x7F
    if exponent == 0:
        return Fraction(mantissa) * Fraction(2) ** -133
    return Fraction(128 + mantissa) * Fraction(2) ** (exponent - 134)


@cache
def bf16_ladder() -> list[Fraction]:
    return [bf16_value(bits) for bits in range(0x7F81)]


def reference_bf16(value: float) -> int | None:
    """Round to nearest, ties to the even pattern, by exact search; None where it overflows."""
    sign = 0x8000 if math.copysign(1.0, value) < 0 else 0
    if math.isinf(value):
        return sign | 0x7F80
    target = Fraction(abs(value))
    ladder = bf16_ladder()
    if target >= ladder[-1]:
        return None
    below = bisect_right(ladder, target) - 1
    if ladder[below] == target:
        chosen = below
    else:
        low_gap, high_gap = target - ladder[below], ladder[below + 1] - target
        if low_gap != high_gap:
            chosen = below if low_gap < high_gap else below + 1
        else:
            chosen = below if below % 2 == 0 else below + 1
    return None if chosen == 0x7F80 else sign | chosen


def test_bf16_every_finite_pattern_round_trips() -> None:
    for bits in range(0x7F80):
        value = float(bf16_value(bits))
        assert bf16_bits(value) == bits
        assert bf16_bits(-value) == 0x8000 | bits


def test_bf16_ties_round_to_even() -> None:
    one, next_up = bf16_value(0x3F80), bf16_value(0x3F81)
    halfway = float((one + next_up) / 2)
    assert bf16_bits(halfway) == 0x3F80  # 0x3F80 is even
    odd, even = bf16_value(0x3F81), bf16_value(0x3F82)
    assert bf16_bits(float((odd + even) / 2)) == 0x3F82


def test_bf16_rounds_the_exact_value_not_a_float32_rounding_of_it() -> None:
    # Just above the halfway point between 1.0 and its successor. Rounding to float32 first
    # would land exactly on the halfway point and then round down to even (0x3F80).
    value = 1.0 + 2.0**-8 + 2.0**-40
    assert bf16_bits(value) == 0x3F81
    assert Constants().bf16(value).to_bytes() == b"\x81\x3f"


@given(st.floats(allow_nan=False, allow_infinity=True))
@settings(max_examples=500, deadline=None)
def test_bf16_matches_exact_rounding(value: float) -> None:
    expected = reference_bf16(value)
    if expected is None:
        with pytest.raises(ContractError, match="bf16"):
            Constants().bf16(value)
    else:
        assert Constants().bf16(value).to_bytes() == struct.pack("<H", expected)


@given(st.integers(0, 0x7F7F), st.booleans())
@settings(max_examples=300, deadline=None)
def test_bf16_halfway_points_round_to_even(bits: int, negative: bool) -> None:
    halfway = float((bf16_value(bits) + bf16_value(bits + 1)) / 2)
    expected = bits if bits % 2 == 0 else bits + 1
    if expected == 0x7F80:
        with pytest.raises(ContractError, match="bf16"):
            bf16_bits(-halfway if negative else halfway)
        return
    got = bf16_bits(-halfway if negative else halfway)
    assert got == (0x8000 | expected if negative else expected)


def test_bf16_overflow_raises_like_f32() -> None:
    largest = float(bf16_value(0x7F7F))
    assert bf16_bits(largest) == 0x7F7F
    constants = Constants()
    with pytest.raises(ContractError, match="bf16"):
        constants.bf16(1e300)
    with pytest.raises(ContractError, match="bf16"):
        constants.bf16(float(bf16_value(0x7F80)))  # 2**128 is beyond the largest finite
    assert constants.to_bytes() == b""


def test_bf16_infinities_zeros_and_nan() -> None:
    assert bf16_bits(math.inf) == 0x7F80
    assert bf16_bits(-math.inf) == 0xFF80
    assert bf16_bits(0.0) == 0x0000
    assert bf16_bits(-0.0) == 0x8000
    assert bf16_bits(2.0**-140) == 0x0000  # below half the smallest subnormal
    assert bf16_bits(2.0**-133) == 0x0001  # the smallest subnormal
    for nan, sign in ((math.nan, 0), (-math.nan, 0x8000)):
        bits = bf16_bits(nan)
        assert bits & 0x8000 == sign
        assert bits & 0x7F80 == 0x7F80 and bits & 0x007F, f"{bits:#06x} is not a NaN"
        assert bits & 0x0040, "NaN must come out quiet"


def test_bf16_nan_with_low_payload_stays_nan() -> None:
    # A double NaN whose payload sits only in bits truncation would drop must not become inf.
    (payload_nan,) = struct.unpack("<d", struct.pack("<Q", 0x7FF0_0000_0000_0001))
    bits = bf16_bits(payload_nan)
    assert bits & 0x7F80 == 0x7F80 and bits & 0x007F


def test_bf16_accepts_numpy_scalars() -> None:
    assert Constants().bf16(np.float32(1.0)).to_bytes() == b"\x80\x3f"
    assert Constants().bf16(np.float64(-2.5)).to_bytes() == b"\x20\xc0"
