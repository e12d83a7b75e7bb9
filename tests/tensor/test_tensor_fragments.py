"""TensorOps' fragment forms: gather_rows, finite and linear as model fragments, prepared
as slots (host-visible IO written in place) and recorded into a caller's graph (inputs
bound where they lie). On asyncio and trio, on every usable backend.

References: numpy indexing (exact bytes) for the gather; the flag is exact; the linear
uses small integers, whose bf16 products and f32 sums are exact, so it equals float64.
"""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest

import hrx_async as hrx
from hrx_async.tensor import TensorOps

pytestmark = pytest.mark.anyio
F32_MAX = float(np.finfo(np.float32).max)


async def device(
    ctx: hrx.models.ModelContext, array: Any, dtype: str | None = None
) -> hrx.models.DeviceTensor:
    array = np.ascontiguousarray(array)
    desc = hrx.models.TensorDesc(dtype or hrx.models.DType.of(array.dtype), array.shape)
    return await ctx.upload_tensor(desc, array.tobytes())


def writer(*arrays: Any) -> Any:
    def write(index: int, memory: memoryview) -> None:
        memory[:] = np.ascontiguousarray(arrays[index]).tobytes()

    return write


async def test_row_gather_fragment_binds_resident_source_and_reuses_mapped_io(
    hrx_backend: str,
) -> None:
    """ops.rs::row_gather_fragment_binds_resident_source_and_reuses_mapped_io: rows 0 and
    an empty source are refused; with a host-visible source and ids [3, 0, 3] warm runs
    add no allocations, copies or graphs and one submission each; an id out of range
    selects row 0; recorded, the fragment binds a resident source in place."""
    async with hrx.Runtime(backend=hrx_backend) as rt:
        ctx = hrx.models.ModelContext(rt)
        ops = TensorOps(rt)
        table = (np.arange(35) * 37 % 256).astype(np.uint8).reshape(5, 7)
        desc = hrx.models.TensorDesc("u8", (5, 7))
        for bad_desc, rows in ((desc, 0), (hrx.models.TensorDesc("u8", (0, 7)), 1), (desc, True)):
            with pytest.raises(hrx.ContractError):
                ops.gather_rows_fragment(bad_desc, rows)
        for bad in (hrx.models.TensorDesc("u8", (35,)), (5, 7)):
            with pytest.raises(hrx.ContractError):
                ops.gather_rows_fragment(bad, 3)  # type: ignore[arg-type]
        frag = ops.gather_rows_fragment(desc, 3, hrx.HOST_VISIBLE)
        model = frag.prepare(2, "gather")
        ids = np.array([3, 0, 3], np.int32)
        run = await model.submit_host_with(writer(table, ids))
        assert await run.download() == [table[[3, 0, 3]].tobytes()]
        assert run.outputs[0].view.buffer.placement.host_mappable  # type: ignore[union-attr]
        del run
        before = rt.statistics()
        for _ in range(4):
            run = await model.submit_host_with(writer(table, ids))
            assert await run.download() == [table[[3, 0, 3]].tobytes()]
            del run
        end = rt.statistics()
        for name in ("allocations", "native_graphs_prepared", "copied_bytes"):
            assert getattr(end, name) == getattr(before, name), name
        assert end.submissions - before.submissions == 4
        assert model.staging_buffers == 0 and model.copy_graphs == 0
        stray = await model.submit_host_with(writer(table, np.array([99, -1, 4], np.int32)))
        assert await stray.download() == [table[[0, 0, 4]].tobytes()]
        del stray
        # recorded: the resident source and the ids bind in place, nothing is copied
        source = await device(ctx, table)
        picked = await device(ctx, np.array([4, 1, 1], np.int32))
        graph = rt.graph("gather-in-place")
        (rows,) = frag.record(graph, [source, picked])
        copies = rt.statistics().device_copied_bytes
        await graph.prepare().submit()
        assert rt.statistics().device_copied_bytes == copies
        assert await ctx.download(rows) == table[[4, 1, 1]].tobytes()


@pytest.mark.parametrize("count", [1, 255, 256, 257, 65537])
async def test_finite_fragment_handles_tail_nonfinite_values_and_replay(
    hrx_backend: str, count: int
) -> None:
    """ops.rs::finite_reduction_handles_tail_nonfinite_values_and_replay through
    finite_fragment: the last value in {0, MAX, NaN, ±inf, −0}; replays zero the flag;
    each run reads back 4 bytes; [0] is refused."""
    async with hrx.Runtime(backend=hrx_backend) as rt:
        ops = TensorOps(rt)
        desc = hrx.models.TensorDesc("f32", (count,))
        model = ops.finite_fragment(desc).prepare(1, "finite")
        values = np.linspace(-1e30, 1e30, count, dtype=np.float32)
        for last, want in ((0.0, 0), (F32_MAX, 0), (np.nan, 1), (np.inf, 1), (-np.inf, 1)):
            values[-1] = last
            run = await model.submit_host_with(writer(values))
            (flag,) = await run.download()
            assert np.frombuffer(flag, np.int32).tolist() == [want], (count, last)
            del run
        values[-1] = -0.0
        before = rt.statistics()
        run = await model.submit_host_with(writer(values))
        assert await run.download() == [np.zeros(1, np.int32).tobytes()]
        assert rt.statistics().downloaded_bytes - before.downloaded_bytes <= 4
        for bad in (hrx.models.TensorDesc("f32", (0,)), hrx.models.TensorDesc("i32", (4,))):
            with pytest.raises(hrx.ContractError):
                ops.finite_fragment(bad)


def bf16(values: Any) -> np.ndarray[Any, Any]:
    return hrx.models.bf16_from_f32(np.asarray(values, np.float32))


@pytest.mark.parametrize("out", ["f32", "bf16"])
async def test_decode_linear_fragment_shares_dispatch_and_output_lease(
    hrx_backend: str, out: str
) -> None:
    """ops.rs::decode_linear_shares_dispatch_and_preserves_output_leases through
    linear_fragment: K = 256, x[i] = i%7 − 3, N in {37, 64, 129}, w[j] = j%11 − 5, exact;
    one dispatch, the outputs share the run's slot; no weights, an i32 output and a
    [2, K] input are refused."""
    k, ns = 256, (37, 64, 129)
    x = bf16(np.arange(k) % 7 - 3).reshape(1, k)
    ws = [bf16(np.arange(n * k) % 11 - 5).reshape(n, k) for n in ns]
    async with hrx.Runtime(backend=hrx_backend) as rt:
        ctx = hrx.models.ModelContext(rt)
        ops = TensorOps(rt)
        descs = [hrx.models.TensorDesc("bf16", w.shape) for w in ws]
        frag = ops.linear_fragment(hrx.models.TensorDesc("bf16", (1, k)), descs, out)
        assert len(frag.commands) == 1 and len(frag.outputs) == 3
        graph = rt.graph("linear")
        inputs = [await device(ctx, x, "bf16")] + [await device(ctx, w, "bf16") for w in ws]
        outputs = frag.record(graph, inputs)
        await graph.prepare().submit()
        for y, w in zip(outputs, ws, strict=True):
            want = hrx.models.f32_from_bf16(x).astype(np.float64) @ hrx.models.f32_from_bf16(w).T
            raw = await ctx.download(y)
            got = (
                np.frombuffer(raw, np.float32)
                if out == "f32"
                else hrx.models.f32_from_bf16(np.frombuffer(raw, np.uint16))
            )
            np.testing.assert_array_equal(got, want.reshape(-1).astype(np.float32))
        model = frag.prepare(1, "linear")
        run = await model.submit(inputs)
        assert len({id(t.lease) for t in run.outputs}) == 1
        keep = run.outputs[2]
        await run.wait()
        del run
        gc.collect()
        with pytest.raises(hrx.Busy):
            model.try_acquire()
        del keep
        gc.collect()
        model.try_acquire().release()
        xd = hrx.models.TensorDesc("bf16", (1, k))
        for call in (
            lambda: ops.linear_fragment(xd, [], out),
            lambda: ops.linear_fragment(xd, descs[:1], "i32"),
            lambda: ops.linear_fragment(hrx.models.TensorDesc("bf16", (2, k)), descs[:1], out),
            lambda: ops.linear_fragment(xd, descs[0], out),  # type: ignore[arg-type]
        ):
            with pytest.raises(hrx.ContractError):
                call()
