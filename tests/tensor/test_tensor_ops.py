"""TensorOps: the original's scenarios (row gather, finite check, bf16 linear), result
leases (three live, then Busy), typed errors that change nothing, and references
(numpy take for the gather; ml_dtypes bfloat16 in float64 for the linear). On asyncio
and trio, on every usable backend.

Tolerances: gather and finite are exact; linear is exact against the numpy twin's
order (the kernel's f32 sums are reproduced step by step) and within
K·2⁻²⁴·Σ|x·w| (f32 accumulation) plus one bf16 rounding (2⁻⁸ relative) of float64.
"""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hrx_async as hrx
from hrx_async.tensor import TensorOps
from hrx_async.tensor.kernels import linear_sums

pytestmark = pytest.mark.anyio
F32_MAX = float(np.finfo(np.float32).max)


async def device(
    ctx: hrx.models.ModelContext, array: Any, dtype: str | None = None
) -> hrx.models.Tensor:
    array = np.asarray(array)
    desc = hrx.models.TensorDesc(dtype or hrx.models.DType.of(array.dtype), array.shape)
    tensor = ctx.tensor(desc, hrx.GPU_LOCAL)
    await ctx.upload(tensor, array)
    return tensor


def pattern(dtype: str, shape: tuple[int, int]) -> np.ndarray[Any, Any]:
    raw = (np.arange(np.prod(shape) * np.dtype(dtype).itemsize) * 37 % 256).astype(np.uint8)
    return raw.view(dtype).reshape(shape)


@pytest.mark.parametrize("dtype", ["u1", "f2", "f4", "i8"])
async def test_row_gather_preserves_bits_order_and_output_leases(
    hrx_backend: str, dtype: str
) -> None:
    async with hrx.Runtime(backend=hrx_backend) as rt:
        ctx = hrx.models.ModelContext(rt)
        ops = TensorOps(rt)
        table = pattern(dtype, (5, 7))
        t = await device(ctx, table)
        a = await ops.gather_rows(t, [4, 0, 4])
        b = await ops.gather_rows(t, [4, 0, 4])
        c = await ops.gather_rows(t, [4, 0, 4])
        with pytest.raises(hrx.Busy):
            await ops.gather_rows(t, [4, 0, 4])
        want = table[[4, 0, 4]]
        for r in (a, b, c):
            assert (await ctx.download(r)).tobytes() == want.tobytes()
        clone = a.clone()
        del a
        gc.collect()
        with pytest.raises(hrx.Busy):  # the clone holds the slot
            await ops.gather_rows(t, [4, 0, 4])
        assert (await ctx.download(clone)).tobytes() == want.tobytes()
        del clone
        d = await ops.gather_rows(t, [1, 2, 3])  # bucket 4: the same plan
        assert (await ctx.download(d)).tobytes() == table[1:4].tobytes()
        assert ops.stats().misses == 1
        empty = await ops.gather_rows(t, [])
        assert empty.shape == (0, 7) and (await ctx.download(empty)).shape == (0, 7)
        for bad in ([5], [2**63 - 1], [-1], [True], "12", 3):
            with pytest.raises(hrx.ContractError):
                await ops.gather_rows(t, bad)  # type: ignore[arg-type]
        async with hrx.Runtime(backend="sim") as other:
            foreign = await device(hrx.models.ModelContext(other), table)
            with pytest.raises(hrx.ContractError, match="another runtime"):
                await ops.gather_rows(foreign, [0])
        scalar = await device(ctx, np.float32(1))
        with pytest.raises(hrx.ContractError, match="rank-2"):
            await ops.gather_rows(scalar, [0])
        assert ops.stats().misses == 1


@pytest.mark.parametrize("count", [1, 255, 256, 257, 65537])
async def test_finite_reduction_handles_tail_nonfinite_values_and_replay(
    hrx_backend: str, count: int
) -> None:
    async with hrx.Runtime(backend=hrx_backend) as rt:
        ctx = hrx.models.ModelContext(rt)
        ops = TensorOps(rt)
        values = np.linspace(-1e30, 1e30, count, dtype=np.float32)
        x = await device(ctx, values)
        for last, want in (
            (0.0, 0),
            (F32_MAX, 0),
            (np.nan, 1),
            (np.inf, 1),
            (-np.inf, 1),
            (-0.0, 0),
        ):
            values[-1] = last
            await ctx.upload(x, values)
            flag = await ops.finite(x)
            assert flag.view.buffer.placement.host_mappable and flag.nbytes == 4
            got = await flag.read()
            assert got.tolist() == [want], (count, last)
            del flag
        s = ops.stats()
        assert (s.misses, s.entries) == (1, 1)
        with pytest.raises(hrx.ContractError):
            await ops.finite(await device(ctx, np.zeros(0, np.float32)))
        with pytest.raises(hrx.ContractError):
            await ops.finite(await device(ctx, np.zeros(4, np.int32)))


def bf16(values: Any) -> np.ndarray[Any, Any]:
    return hrx.models.bf16_from_f32(np.asarray(values, np.float32))


@pytest.mark.parametrize("out", ["f32", "bf16"])
async def test_decode_linear_shares_dispatch_and_preserves_output_leases(
    hrx_backend: str, out: str
) -> None:
    k = 256
    xs = (np.arange(k) % 7 - 3).astype(np.float32)
    async with hrx.Runtime(backend=hrx_backend) as rt:
        ctx = hrx.models.ModelContext(rt)
        ops = TensorOps(rt)
        x = await device(ctx, bf16(xs)[None, :], "bf16")
        ws, host = [], []
        for n in (37, 64, 129):
            w = (np.arange(n * k) % 11 - 5).astype(np.float32).reshape(n, k)
            host.append(w)
            ws.append(await device(ctx, bf16(w), "bf16"))
        results = await ops.linear_many(x, ws, out)
        assert len({r.lease for r in results}) == 1
        for r, w in zip(results, host, strict=True):
            got = await ctx.download(r)
            values = hrx.models.f32_from_bf16(got) if out == "bf16" else got
            np.testing.assert_array_equal(values, (w @ xs)[None, :])
        keep = [results, await ops.linear_many(x, ws, out), await ops.linear_many(x, ws, out)]
        with pytest.raises(hrx.Busy):
            await ops.linear_many(x, ws, out)
        del keep
        before = rt.statistics()
        again = await ops.linear_many(x, ws, out)
        after = rt.statistics()
        assert after.submissions - before.submissions == 1  # one dispatch for three weights
        assert after.allocations == before.allocations  # a warm slot allocates nothing
        del again
        single = await ops.linear(x, ws[0], out)
        assert single.shape == (1, 37)
        i32 = await device(ctx, np.zeros((1, k), np.int32))
        two = await device(ctx, bf16(np.zeros((2, k))), "bf16")
        odd = await device(ctx, bf16(np.zeros((1, 100))), "bf16")
        for call in (
            lambda: ops.linear_many(x, [], out),
            lambda: ops.linear_many(x, ws * 2, out),
            lambda: ops.linear(x, ws[0], "i32"),
            lambda: ops.linear(i32, ws[0], out),
            lambda: ops.linear(two, ws[0], out),
            lambda: ops.linear(odd, ws[0], out),
            lambda: ops.linear(x, odd, out),
        ):
            with pytest.raises(hrx.ContractError):
                await call()
        async with hrx.Runtime(backend="sim") as other:
            foreign = await device(hrx.models.ModelContext(other), bf16(xs)[None, :], "bf16")
            with pytest.raises(hrx.ContractError):
                await ops.linear(foreign, ws[0], out)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    blocks=st.integers(1, 6),
    ns=st.lists(st.integers(1, 70), min_size=1, max_size=3),
    out=st.sampled_from(["f32", "bf16"]),
    seed=st.integers(0, 2**32 - 1),
)
async def test_linear_matches_ml_dtypes_in_float64(
    hrx_backend: str, blocks: int, ns: list[int], out: str, seed: int
) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(seed)
    k = 128 * blocks
    x = rng.standard_normal((1, k)).astype(ml_dtypes.bfloat16)
    ws = [rng.standard_normal((n, k)).astype(ml_dtypes.bfloat16) for n in ns]
    async with hrx.Runtime(backend=hrx_backend) as rt:
        ctx = hrx.models.ModelContext(rt)
        ops = TensorOps(rt)
        xt = await device(ctx, x.view(np.uint16), "bf16")
        wts = [await device(ctx, w.view(np.uint16), "bf16") for w in ws]
        results = await ops.linear_many(xt, wts, out)
        for r, w in zip(results, ws, strict=True):
            got = await ctx.download(r)
            values = got.view(ml_dtypes.bfloat16).astype(np.float64) if out == "bf16" else got
            exact = w.astype(np.float64) @ x[0].astype(np.float64)
            bound = k * 2.0**-24 * (np.abs(w.astype(np.float64)) @ np.abs(x[0].astype(np.float64)))
            if out == "bf16":
                bound = bound + np.abs(exact) * 2.0**-8
            assert np.all(np.abs(values[0] - exact) <= bound + 1e-30)
            twin = linear_sums(x[0].view(np.uint16), w.view(np.uint16))
            want = twin if out == "f32" else twin.astype(ml_dtypes.bfloat16).astype(np.float64)
            np.testing.assert_array_equal(values[0], want)  # the twin's order, to the bit


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.integers(1, 40),
    cols=st.integers(1, 33),
    dtype=st.sampled_from(["u1", "f2", "i4", "i8"]),
    data=st.data(),
)
async def test_gather_rows_matches_numpy_take(
    hrx_backend: str, rows: int, cols: int, dtype: str, data: st.DataObject
) -> None:
    ids = data.draw(st.lists(st.integers(0, rows - 1), min_size=1, max_size=70))
    table = pattern(dtype, (rows, cols))
    async with hrx.Runtime(backend=hrx_backend) as rt:
        ctx = hrx.models.ModelContext(rt)
        ops = TensorOps(rt)
        got = await ctx.download(await ops.gather_rows(await device(ctx, table), ids))
        assert got.tobytes() == np.take(table, ids, axis=0).tobytes()


def test_bf16_helpers_agree_with_ml_dtypes() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bits = np.arange(2**16, dtype=np.uint16)
    want = bits.view(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(hrx.models.f32_from_bf16(bits), want)
    rng = np.random.default_rng(7)
    values = np.concatenate(
        [
            rng.standard_normal(100_000).astype(np.float32),
            rng.integers(0, 2**32, 100_000, dtype=np.uint64).astype(np.uint32).view(np.float32),
            np.float32([0.0, -0.0, np.inf, -np.inf, F32_MAX, -F32_MAX, 1e-45]),
        ]
    )
    finite = ~np.isnan(values)
    got = hrx.models.bf16_from_f32(values)
    with np.errstate(invalid="ignore"):
        ref = values.astype(ml_dtypes.bfloat16).view(np.uint16)
    np.testing.assert_array_equal(got[finite], ref[finite])
    assert np.isnan(
        hrx.models.f32_from_bf16(got[~finite])
    ).all()  # NaN stays NaN (payloads may differ)
