"""Tensor descriptors under the original's rules, and tensors over runtime buffers."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hrx_async as hrx
import hrx_async.models
from hrx_async.models import DType, Layout, Tensor, TensorDesc


def test_the_rules() -> None:
    assert TensorDesc("f32", (2, 3), (4, 1)).nbytes == 28
    assert TensorDesc(DType.F32, (2, 3)).strides == (3, 1)
    scalar = TensorDesc("i64", ())
    assert scalar.numel == 1 and scalar.nbytes == 8 and scalar.contiguous
    empty = TensorDesc("u8", (4, 0, 2))
    assert empty.empty and empty.nbytes == 0
    assert {d: d.itemsize for d in DType} == {
        DType.U8: 1,
        DType.F16: 2,
        DType.BF16: 2,
        DType.I32: 4,
        DType.U32: 4,
        DType.F32: 4,
        DType.I64: 8,
    }
    assert TensorDesc("f16", (1, 3, 4, 4), layout="nchw").layout is Layout.NCHW
    assert TensorDesc("f32", (5, 7), (1, 5), layout=Layout.ROWS).nbytes == 35 * 4
    assert not TensorDesc("f32", (5, 7), (1, 5)).contiguous


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (("f64", (2,)), {}),
        (("f32", (2, -1)), {}),
        (("f32", (2, 3), (0, 1)), {}),
        (("f32", (2, 3), (2, 1)), {}),  # rows overlap
        (("f32", (2, 3), (3,)), {}),
        (("f32", (2, 3)), {"layout": "nchw"}),
        (("f32", (2, 3, 4)), {"layout": "rows"}),
        (("f32", (2, 3)), {"layout": "diagonal"}),
        (("f32", "23"), {}),
        (("f32", (2.0, 3)), {}),
        (("f32", (True, 3)), {}),
    ],
)
def test_bad_descriptors(args: tuple[object, ...], kwargs: dict[str, object]) -> None:
    with pytest.raises(hrx.ContractError):
        TensorDesc(*args, **kwargs)  # type: ignore[arg-type]


def offsets(shape: tuple[int, ...] | list[int], strides: tuple[int, ...] | list[int]) -> Any:
    """Every element offset of a layout, one per index, by brute force."""
    return [sum(i * s for i, s in zip(index, strides, strict=True)) for index in np.ndindex(*shape)]


@settings(max_examples=400)
@given(
    shape=st.lists(st.integers(0, 4), min_size=1, max_size=4),
    strides=st.lists(st.integers(1, 30), min_size=4, max_size=4),
)
def test_a_layout_is_refused_exactly_when_two_indices_share_an_element(
    shape: list[int], strides: list[int]
) -> None:
    strides = strides[: len(shape)]
    found = offsets(shape, strides)
    if len(set(found)) != len(found):
        with pytest.raises(hrx.ContractError, match="two distinct indices"):
            TensorDesc("u8", shape, strides)
    else:  # interleaved dimensions too, when their elements are distinct
        assert TensorDesc("u8", shape, strides).nbytes == (max(found) + 1 if found else 0)


def test_interleaved_layouts_are_checked_exactly_or_refused_as_unverifiable() -> None:
    assert sorted(offsets((3, 2), (2, 3))) == [0, 2, 3, 4, 5, 7]
    assert TensorDesc("f32", (3, 2), (2, 3)).nbytes == 8 * 4
    assert TensorDesc("u8", (3, 3), (2, 3)).nbytes == 11
    with pytest.raises(hrx.ContractError, match="two distinct indices"):
        TensorDesc("u8", (4, 3), (2, 3))  # (3, 0) and (0, 2) both reach 6
    # A set with distinct subset sums that no stride order nests (Conway and Guy's): every
    # element is distinct, but settling that exceeds the search's bound, so it is refused,
    # and not as overlapping.
    u = [0, 1]
    for n in range(1, 16):
        u.append(2 * u[n] - u[n - round((2 * n) ** 0.5)])
    sidon = [u[16] - u[i] for i in range(16)]
    shape = (2,) * 16
    assert len(set(np.array(offsets(shape, sidon)))) == 2**16
    with pytest.raises(hrx.ContractError, match="too intricately") as refused:
        TensorDesc("u8", shape, sidon)
    assert "overlap for" not in str(refused.value)


def test_ranks_and_sizes_past_numpy_and_signed_64_bits_are_refused() -> None:
    assert TensorDesc("u8", (1,) * 64).rank == 64
    largest = 2**63 - 1
    assert TensorDesc("f32", ((largest + 1) // 4 - 1,)).nbytes == largest - 3
    assert TensorDesc("u8", (0, largest)).nbytes == 0
    assert TensorDesc("u8", (1, 2), (largest, 1)).nbytes == 2
    for args in [
        ("u8", (1,) * 65),
        ("f32", (2**64 - 1,)),
        ("f32", ((largest + 1) // 4,)),
        ("u8", (2**32, 2**31)),
        ("f32", (0, (largest + 1) // 4)),
        ("u8", (0, largest + 1)),
        ("f32", (1, 2), ((largest + 1) // 4, 1)),
        ("u8", (2, 2), (largest, 1)),
    ]:
        with pytest.raises(hrx.ContractError):
            TensorDesc(*args)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [(np.int32, -1), (np.int32, 2), "i4,i4", object, None])
def test_what_numpy_cannot_read_as_a_supported_dtype_is_refused(value: object) -> None:
    with pytest.raises(hrx.ContractError, match="unsupported dtype"):
        DType.of(value)


def test_bf16_round_trip() -> None:
    values = np.array([1.0, -2.5, 3.140625, 65536.0, 0.15625], np.float32)
    assert (hrx.models.f32_from_bf16(hrx.models.bf16_from_f32(values)) == values).all()
    assert hrx.models.bf16_from_f32(np.float32(1.00390625)).item() == 0x3F80  # ties to even


@pytest.mark.anyio
async def test_tensors_over_views_round_trip_numpy_and_dlpack() -> None:
    async with hrx.Runtime("sim") as rt:
        buffer = rt.allocate(64, hrx.HOST_VISIBLE)
        t = Tensor(TensorDesc("f32", (2, 3), (4, 1)), buffer.view(8, 28))
        values = np.arange(6, dtype=np.float32).reshape(2, 3)
        await t.write(values)
        assert (await t.read() == values).all()
        async with buffer.map_read() as memory:
            raw = np.frombuffer(memory, np.float32)[2:9]
            assert raw.tolist() == [0, 1, 2, 0, 3, 4, 5]
        shared = t.to_dlpack(np)
        assert (shared == values).all() and shared.strides == (16, 4)
        with pytest.raises(hrx.ContractError):
            await t.write(values.astype(np.float64))
        with pytest.raises(hrx.ContractError):
            await t.write(values.T)
        with pytest.raises(hrx.ContractError):
            Tensor(TensorDesc("f32", (4, 4)), buffer.view(0, 60))
        assert (await t.read() == values).all()
        empty = Tensor(TensorDesc("f32", (0, 3)), buffer.view())
        assert (await empty.read()).shape == (0, 3)


@pytest.mark.anyio
async def test_ragged_and_odd_values_are_refused_and_write_nothing() -> None:
    async with hrx.Runtime("sim") as rt:
        buffer = rt.allocate(8, hrx.HOST_VISIBLE)
        t = Tensor(TensorDesc("i32", (2,)), buffer.view())
        await t.write(np.array([7, 8], np.int32))
        for value in ([[1], [1, 2]], [1, [2, 3]], 2**70, object()):
            with pytest.raises(hrx.ContractError):
                await t.write(value)
        assert (await t.read()).tolist() == [7, 8]
        deep = Tensor(TensorDesc("u8", (1,) * 64), buffer.view(0, 1))
        assert (await deep.read()).shape == (1,) * 64
