"""Tensor descriptors under the original's rules, and tensors over runtime buffers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import hrx_async as hrx
from hrx_async import DType, Layout, Tensor, TensorDesc


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


@given(
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    strides=st.lists(st.integers(1, 30), min_size=3, max_size=3),
)
def test_non_overlap_matches_brute_force(shape: list[int], strides: list[int]) -> None:
    strides = strides[: len(shape)]
    offsets = [
        sum(i * s for i, s in zip(index, strides, strict=True)) for index in np.ndindex(*shape)
    ]
    overlapping = len(set(offsets)) != len(offsets)
    if overlapping:
        with pytest.raises(hrx.ContractError):
            TensorDesc("u8", shape, strides)
        return
    nested = True  # in stride order, each dimension steps past the smaller ones' extent
    extent = 1
    for stride, dim in sorted((s, d) for d, s in zip(shape, strides, strict=True) if d > 1):
        nested = nested and stride >= extent
        extent += stride * (dim - 1)
    if nested:
        assert TensorDesc("u8", shape, strides).nbytes == max(offsets) + 1
    else:  # interleaved dimensions are refused too, though their elements are distinct
        with pytest.raises(hrx.ContractError):
            TensorDesc("u8", shape, strides)


def test_bf16_round_trip() -> None:
    values = np.array([1.0, -2.5, 3.140625, 65536.0, 0.15625], np.float32)
    assert (hrx.f32_from_bf16(hrx.bf16_from_f32(values)) == values).all()
    assert hrx.bf16_from_f32(np.float32(1.00390625)).item() == 0x3F80  # ties to even


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
