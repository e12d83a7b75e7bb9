"""Device tensors (views, upload, copy_into, concatenate, download, validate) and prepared
models that chain on the device: slots built eagerly with their checks, try_acquire,
submit with device tensors, submit_host_with, Inference outputs that keep the slot."""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest

import hrx_async as hrx
from hrx_async.models import DeviceTensor, ModelContext, PreparedModel, SlotIO, TensorDesc

pytestmark = pytest.mark.anyio
U8_64 = TensorDesc("u8", (64,))


def copy_model(ctx: ModelContext, slots: int = 1, placement: Any = hrx.GPU_LOCAL) -> Any:
    def build(c: ModelContext, index: int) -> SlotIO:
        x = c.tensor(U8_64, placement, f"x{index}")
        y = c.tensor(U8_64, placement, f"y{index}")
        g = c.runtime.graph("copy")
        g.copy(y.view, x.view)
        return SlotIO({"x": x}, {"y": y}, g.prepare())

    return PreparedModel(ctx, slots, build, "copy", eager=True)


async def test_views_check_extent_and_alignment_and_keep_producer_and_lease() -> None:
    """tensor.rs: DeviceTensor::view and the empty tensor (no view, nothing allocated)."""
    async with hrx.Runtime("sim") as rt:
        ctx = ModelContext(rt)
        before = rt.statistics().allocations
        empty = ctx.allocate_with(TensorDesc("f32", (0, 4)), hrx.GPU_LOCAL)
        assert empty.view is None and empty.binding() is None
        assert rt.statistics().allocations == before
        t = await ctx.upload_tensor(TensorDesc("f32", (8,)), np.arange(8, dtype=np.float32))
        lease = object()
        leased = DeviceTensor(t.desc, t.view, t.producer, lease)
        half = leased.view_as(16, TensorDesc("f32", (4,)))
        assert half.lease is lease and half.producer is t.producer
        assert np.frombuffer(await ctx.download(half), np.float32).tolist() == [4, 5, 6, 7]
        with pytest.raises(hrx.ContractError, match="past"):
            leased.view_as(20, TensorDesc("f32", (4,)))
        with pytest.raises(hrx.ContractError, match="aligned"):
            leased.view_as(2, TensorDesc("f32", (2,)))
        assert leased.view_as(32, TensorDesc("f32", (0,))).view is None
        binding = leased.binding()
        assert binding is not None and binding.lease is lease and binding.nbytes == 32


async def test_upload_checks_length_and_leaks_nothing() -> None:
    """ModelContext::upload: the length must match; nothing stays allocated on failure."""
    async with hrx.Runtime("sim") as rt:
        ctx = ModelContext(rt)
        live = rt.statistics().live_bytes
        with pytest.raises(hrx.ContractError, match="holds 64 bytes"):
            await ctx.upload_tensor(U8_64, bytes(63))
        assert rt.statistics().live_bytes == live
        data = bytes(range(64))
        for placement in (hrx.GPU_LOCAL, hrx.HOST_VISIBLE):
            t = await ctx.upload_tensor(U8_64, data, placement)
            assert await ctx.download(t) == data


async def test_copy_into_checks_and_orders_after_both_producers() -> None:
    """ModelContext::copy_into: off + src <= dst, same dtype, contiguous, aligned offset;
    the copy runs after both producers and becomes dst's producer."""
    async with hrx.Runtime("sim") as rt:
        ctx = ModelContext(rt)
        dst = await ctx.upload_tensor(TensorDesc("f32", (8,)), np.zeros(8, np.float32))
        src = await ctx.upload_tensor(TensorDesc("f32", (3,)), np.array([1, 2, 3], np.float32))
        out = ctx.copy_into(dst, 8, src)
        assert out.producer is not None and out.producer is not dst.producer
        assert np.frombuffer(await ctx.download(out), np.float32).tolist() == [
            0, 0, 1, 2, 3, 0, 0, 0,
        ]  # fmt: skip
        with pytest.raises(hrx.ContractError, match="ends past"):
            ctx.copy_into(dst, 24, src)
        with pytest.raises(hrx.ContractError, match="dtypes differ"):
            ctx.copy_into(dst, 0, await ctx.upload_tensor(TensorDesc("i32", (1,)), bytes(4)))
        with pytest.raises(hrx.ContractError, match="aligned"):
            ctx.copy_into(dst, 2, src)
        strided = DeviceTensor(TensorDesc("f32", (2,), (2,)), dst.view)
        with pytest.raises(hrx.ContractError, match="contiguous"):
            ctx.copy_into(dst, 0, strided)


async def test_concatenate_checks_everything_and_waits_for_every_producer() -> None:
    """ModelContext::concatenate along axis 0, with each of the original's errors."""
    async with hrx.Runtime("sim") as rt, hrx.Runtime("sim") as other:
        ctx = ModelContext(rt)
        a = await ctx.upload_tensor(TensorDesc("i32", (1, 2)), np.array([[1, 2]], np.int32))
        b = await ctx.upload_tensor(TensorDesc("i32", (2, 2)), np.array([[3, 4], [5, 6]], np.int32))
        empty = ctx.allocate_with(TensorDesc("i32", (0, 2)), hrx.GPU_LOCAL)
        # an empty input's producer is waited for too
        gate = (await ctx.upload_tensor(TensorDesc("u8", (4,)), bytes(4))).producer
        empty = empty.with_producer(gate)
        joined = ctx.concatenate([a, empty, b])
        assert joined.shape == (3, 2)
        assert np.frombuffer(await ctx.download(joined), np.int32).tolist() == [1, 2, 3, 4, 5, 6]
        cases: list[tuple[Any, str]] = [
            ([], "non-empty"),
            ([await ctx.upload_tensor(TensorDesc("i32", ()), bytes(4))], "scalars"),
            ([DeviceTensor(TensorDesc("i32", (2, 1), (1, 2)), b.view), a], "not contiguous"),
            ([a, await ctx.upload_tensor(TensorDesc("f32", (1, 2)), bytes(8))], "f32"),
            ([a, await ctx.upload_tensor(TensorDesc("i32", (1, 2), None, "rows"), bytes(8))],
             "layout"),
            ([a, await ctx.upload_tensor(TensorDesc("i32", (2,)), bytes(8))], "rank"),
            ([a, await ctx.upload_tensor(TensorDesc("i32", (1, 3)), bytes(12))], "trailing"),
            ([a, await ModelContext(other).upload_tensor(a.desc, bytes(8))], "another model"),
        ]  # fmt: skip
        for tensors, message in cases:
            with pytest.raises(hrx.ContractError, match=message):
                ctx.concatenate(tensors)
        with pytest.raises(hrx.ContractError):
            TensorDesc("i32", (2**62, 2))  # overflow is refused when the shape is made


async def test_validate_refuses_another_contexts_tensor() -> None:
    """ModelContext::validate: "belongs to another model context"."""
    async with hrx.Runtime("sim") as rt, hrx.Runtime("sim") as other:
        mine, theirs = ModelContext(rt), ModelContext(other)
        t = await theirs.upload_tensor(U8_64, bytes(64))
        with pytest.raises(hrx.ContractError, match="belongs to another model context"):
            mine.validate(t)
        with pytest.raises(hrx.ContractError, match="belongs to another model context"):
            await mine.download(t)


async def test_slots_are_built_eagerly_and_refuse_foreign_shared_or_differing_io() -> None:
    """inference.rs: prepare rejects a foreign graph or tensor, IO shared with another
    slot, and differing descriptions, when the model is made."""
    async with hrx.Runtime("sim") as rt, hrx.Runtime("sim") as other:
        ctx = ModelContext(rt)
        shared = ctx.tensor(U8_64, hrx.GPU_LOCAL, "shared")

        def sharing(c: ModelContext, index: int) -> SlotIO:
            y = c.tensor(U8_64, hrx.GPU_LOCAL)
            g = c.runtime.graph("g")
            g.copy(y.view, shared.view)
            return SlotIO({"x": shared}, {"y": y}, g.prepare())

        def foreign(c: ModelContext, index: int) -> SlotIO:
            y = c.tensor(U8_64, hrx.GPU_LOCAL)
            g = other.graph("g")
            g.fill(other.allocate(8, hrx.GPU_LOCAL).view(), 1)
            return SlotIO({}, {"y": y}, g.prepare())

        def differing(c: ModelContext, index: int) -> SlotIO:
            y = c.tensor(TensorDesc("u8", (64 + index,)), hrx.GPU_LOCAL)
            g = c.runtime.graph("g")
            g.fill(y.view, 1)
            return SlotIO({}, {"y": y}, g.prepare())

        for build, message in ((sharing, "already uses"), (foreign, "another runtime"),
                               (differing, "differ")):  # fmt: skip
            with pytest.raises(hrx.ContractError, match=message):
                PreparedModel(ctx, 2, build, eager=True)
        model = copy_model(ctx, 2)
        assert model.pool.built == 2 and model.is_idle()


async def test_inference_chaining_retains_slots_and_propagates_values() -> None:
    """tests/inference.rs::inference_chaining_retains_slots_and_propagates_values (the
    stream count there is "no new copy graphs or native graphs in warm runs" here)."""
    async with hrx.Runtime("sim") as rt:
        ctx = ModelContext(rt)
        model = copy_model(ctx, 1)
        data = bytes(range(64))
        x = await ctx.upload_tensor(U8_64, data)
        inference = await model.submit([x])
        clone = inference.outputs[0]
        del inference
        with pytest.raises(hrx.Busy):
            model.try_acquire()  # the output still holds the slot
        downstream_out = ctx.allocate_with(U8_64, hrx.GPU_LOCAL)
        binding = clone.binding()
        assert binding is not None and downstream_out.view is not None
        g = rt.graph("downstream")
        g.copy(downstream_out.view, binding)
        downstream = g.prepare()
        del binding
        done = downstream.submit(clone.after())
        del clone
        gc.collect()
        with pytest.raises(hrx.Busy):
            model.try_acquire()  # the downstream graph holds the output's binding
        await done
        assert await ctx.download(downstream_out) == data
        del downstream, g
        gc.collect()
        model.try_acquire().release()  # the slot is free again
        # submit and drop: the next acquire waits for (drains) that run
        await model.submit([x])
        lease = await model.acquire()
        assert model.pool.idle is False
        lease.release()
        await model.submit([x])  # warm: the copy graph into the input is made already
        graphs, copies = rt.statistics().native_graphs_prepared, model.copy_graphs
        for _ in range(8):
            inference = await model.submit([x])
            assert (await inference.download()) == [data]
            del inference
        assert model.copy_graphs == copies
        assert rt.statistics().native_graphs_prepared == graphs


async def test_chained_models_pass_outputs_without_a_host_round_trip() -> None:
    """An output of one model is the input of the next: only the last is read back."""
    async with hrx.Runtime("sim") as rt:
        ctx = ModelContext(rt)
        first, second = copy_model(ctx, 2), copy_model(ctx, 2)
        data = bytes(range(64))
        x = await ctx.upload_tensor(U8_64, data)
        down = rt.statistics().downloaded_bytes
        a = await first.submit([x])
        b = await second.submit(a.outputs)
        assert rt.statistics().downloaded_bytes == down  # nothing came back to the host
        assert await b.download() == [data]
        with pytest.raises(hrx.ContractError, match="takes 1 inputs"):
            await second.submit([])
        with pytest.raises(hrx.ContractError, match="got"):
            await second.submit([ctx.allocate_with(TensorDesc("u8", (63,)), hrx.GPU_LOCAL)])


async def test_host_visible_io_uses_no_staging_and_keeps_slots() -> None:
    """tests/inference.rs::host_visible_model_io_preserves_slices_slots_and_avoids_staging
    (IO here is whole host-visible tensors: slices of one scratch need ModelSession)."""
    async with hrx.Runtime("sim") as rt:
        ctx = ModelContext(rt)
        model = copy_model(ctx, 2, hrx.HOST_VISIBLE)
        data = bytes(range(64))

        def write(index: int, memory: memoryview) -> None:
            memory[:] = data

        runs = [await model.submit_host_with(write) for _ in range(2)]
        with pytest.raises(hrx.Busy):
            model.try_acquire()
        assert [await r.download() for r in runs] == [[data], [data]]
        with pytest.raises(hrx.Busy):
            model.try_acquire()  # also after download: the inferences still hold them
        target = bytearray(64)
        await runs[0].read_into([target])
        assert bytes(target) == data
        del runs
        gc.collect()
        stats = rt.statistics()
        for _ in range(10):
            await (await model.submit_host_with(write)).wait()
        after = rt.statistics()
        assert model.staging_buffers == 0 and model.copy_graphs == 0
        assert after.allocations == stats.allocations
        assert after.native_graphs_prepared == stats.native_graphs_prepared
        assert after.uploaded_bytes == stats.uploaded_bytes


async def test_submit_host_with_a_failing_writer_runs_nothing_and_frees_the_slot() -> None:
    """PreparedModel::submit_host_with: on error nothing runs and the slot is freed."""
    async with hrx.Runtime("sim") as rt:
        ctx = ModelContext(rt)
        model = copy_model(ctx, 1)
        submissions = rt.statistics().submissions

        def fail(index: int, memory: memoryview) -> None:
            memory[:4] = b"abcd"
            raise ValueError("bad request")

        with pytest.raises(ValueError, match="bad request"):
            await model.submit_host_with(fail)
        assert rt.statistics().submissions == submissions
        model.try_acquire().release()
        assert model.staging_buffers == 1  # device IO: staged, lazily, once per slot
