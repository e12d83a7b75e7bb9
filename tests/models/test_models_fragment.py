"""Model fragments: the original's rejections when made, slots whose IO are slices of
exactly sized scratch, record(graph, inputs) binding inputs in place with every alias
check, and private scratch reused per graph."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import numpy as np
import pytest

import hrx_async as hrx
from hrx_async.models import (
    DeviceTensor,
    ModelContext,
    ModelSession,
    PreparedModel,
    SlotIO,
    Tensor,
    TensorDesc,
)
from hrx_async.models.region import Dispatch, Fill

pytestmark = pytest.mark.anyio
U8_32, U8_64 = TensorDesc("u8", (32,)), TensorDesc("u8", (64,))


def _copy(arrays: list[Any], constants: bytes) -> None:
    arrays[1][:] = arrays[0]


def copy_kernel(session: ModelSession) -> hrx.GpuKernel:
    contract = hrx.KernelContract(
        [hrx.Binding(64, hrx.Access.READ, 1), hrx.Binding(64, hrx.Access.WRITE, 1)]
    )
    return session.load_kernel(hrx.KernelSource(host=_copy), "copy", (1,), (64,), contract)


class Lease:
    """Stands for a slot lease: the test watches when the last reference goes."""


async def test_fragment_rejects_bad_io_weight_writes_and_foreign_kernels() -> None:
    """definition.rs fragment(): an empty desc or one larger than its region; IO, a fill or
    a write on weights; a kernel from another definition."""
    async with hrx.Runtime("sim") as rt:
        ctx = ModelContext(rt)
        s, other = ModelSession(ctx, "s"), ModelSession(ctx, "other")
        a, w = s.allocate(64), await s.weight(bytes(64))
        k, theirs = copy_kernel(s), copy_kernel(other)
        d = await s.freeze(ctx)
        fill = [Fill(a, 1)]
        cases: list[tuple[Any, Any, Any, str]] = [
            (fill, [(a, TensorDesc("u8", (0,)))], [], "empty"),
            (fill, [], [(a.slice(0, 16), U8_32)], "needs 32 bytes"),
            (fill, [(w, U8_64)], [], "weights are not model IO"),
            ([Fill(w, 1)], [], [], "a fill of weight"),
            ([Dispatch(k, [a.read(), w.write()])], [], [], "a write of weight"),
            ([Dispatch(theirs, [a.read(), a.write()])], [], [], "not loaded"),
            ([Fill(other.allocate(8), 1)], [], [], "another session"),
            (fill, [(a.slice(1, 8), TensorDesc("f32", (2,)))], [], "aligned"),
        ]
        for commands, inputs, outputs, message in cases:
            with pytest.raises(hrx.ContractError, match=message):
                d.fragment(commands, inputs, outputs)
        frag = d.fragment([Dispatch(k, [w.read(), a.write()])], [], [(a.slice(0, 32), U8_32)])
        assert frag.extents == {a.allocation: 64} and frag.private == ()


async def test_fragment_binding_rejects_undersized_foreign_and_new_aliases() -> None:
    """inference.rs::fragment_binding_rejects_undersized_foreign_and_new_aliases: a fill of
    a (64 B) with IO u8[32] on a, given a 32-B input, is refused; so is another context's
    graph and one tensor for inputs on a and b; the graph then stays empty."""
    async with hrx.Runtime("sim") as rt, hrx.Runtime("sim") as elsewhere:
        ctx = ModelContext(rt)
        s = ModelSession(ctx)
        a, b, w = s.allocate(64), s.allocate(64), await s.weight(bytes(64))
        d = await s.freeze(ctx)
        frag = d.fragment([Fill(a, 1)], [(a, U8_32)], [(a, U8_32)])
        g = rt.graph("g")
        x = ctx.allocate_with(U8_32, hrx.GPU_LOCAL)
        with pytest.raises(hrx.ContractError, match="outside the bound input"):
            frag.record(g, [x])
        with pytest.raises(hrx.ContractError, match="another runtime"):
            frag.record(elsewhere.graph("g"), [x])
        pair = d.fragment(
            [Fill(a.slice(0, 32), 1), Fill(b.slice(0, 32), 2)], [(a, U8_32), (b, U8_32)], []
        )
        with pytest.raises(hrx.ContractError, match="undeclared alias"):
            pair.record(g, [x, x])
        weight = DeviceTensor(U8_32, w.record.buffer.view(0, 32))  # type: ignore[union-attr]
        with pytest.raises(hrx.ContractError, match="undeclared alias"):
            pair.record(g, [weight, x])
        halves = d.fragment(
            [Fill(a.slice(0, 8), 1)], [(a.slice(0, 32), U8_32), (a.slice(32, 32), U8_32)], []
        )
        big = ctx.allocate_with(U8_64, hrx.GPU_LOCAL)
        with pytest.raises(hrx.ContractError, match="different bases"):
            halves.record(g, [big.view_as(32, U8_32), big.view_as(0, U8_32)])
        with pytest.raises(hrx.ContractError, match="takes 1 inputs"):
            frag.record(g, [x, x])
        with pytest.raises(hrx.ContractError, match="is u8"):
            frag.record(g, [ctx.allocate_with(TensorDesc("u8", (4, 8)), hrx.GPU_LOCAL)])
        with pytest.raises(hrx.ContractError, match="empty"):
            g.prepare()
        assert len(g) == 0


async def test_record_binds_inputs_in_place_and_keeps_their_lease() -> None:
    """inference.rs record(&mut graph, inputs): inputs bind with no copy; the graph and
    the outputs on an input's allocation hold its lease."""
    async with hrx.Runtime("sim") as rt:
        ctx = ModelContext(rt)
        s = ModelSession(ctx)
        a = s.allocate(64)
        d = await s.freeze(ctx)
        frag = d.fragment([Fill(a.slice(8, 8), 7)], [(a, U8_64)], [(a.slice(0, 32), U8_32)])
        data = bytes(range(64))
        plain = await ctx.upload_tensor(TensorDesc("u8", (128,)), data + data)
        assert plain.producer is not None
        await plain.producer
        lease = Lease()
        x = DeviceTensor(U8_64, plain.view_as(64, U8_64).view, plain.producer, lease)
        watch = weakref.ref(lease)
        del lease
        g = rt.graph("in-place")
        (y,) = frag.record(g, [x])
        assert y.view is not None and y.view.buffer is plain.view.buffer  # type: ignore[union-attr]
        assert y.view.offset == 64 and y.lease is watch()
        copies = rt.statistics().copied_bytes
        await g.prepare().submit()
        assert rt.statistics().copied_bytes == copies  # nothing copied
        assert await ctx.download(y) == data[:8] + bytes([7]) * 8 + data[16:32]
        del x, y
        gc.collect()
        assert watch() is not None  # the graph still binds it
        del g
        gc.collect()
        assert watch() is None


async def test_model_io_uses_sliced_scratch_without_hidden_copies() -> None:
    """inference.rs::model_io_uses_sliced_scratch_without_hidden_copies: scratch 4096, in
    slice(8,64), out slice(32,64), fill slice(40,8) = 7, 2 slots -> 2 allocations, 192
    live bytes; output = the scratch bytes 32..96; no device copies; 128 B up and down;
    warm runs allocate nothing."""
    async with hrx.Runtime("sim") as rt:
        ctx = ModelContext(rt)
        s = ModelSession(ctx)
        root = s.allocate(4096)
        d = await s.freeze(ctx)
        before = rt.statistics()
        model = d.prepare(
            [Fill(root.slice(40, 8), 7)], [(root.slice(8, 64), U8_64)],
            [(root.slice(32, 64), U8_64)], 2,
        )  # fmt: skip
        after = rt.statistics()
        assert after.allocations - before.allocations == 2
        assert after.live_bytes - before.live_bytes == 192
        data = np.arange(1, 65, dtype=np.uint8)
        scratch = np.zeros(96, np.uint8)
        scratch[8:72] = data
        scratch[40:48] = 7
        expected = scratch[32:96]

        async def run(slot: Any) -> None:
            await slot.write("input0", data)
            await slot.run()
            assert np.array_equal(await slot.read("output0"), expected)

        async with model.slot() as first, model.slot() as second:
            await run(first)
            await run(second)
        warm = rt.statistics()
        for _ in range(4):
            async with model.slot() as slot:
                await run(slot)
        end = rt.statistics()
        assert end.allocations == warm.allocations
        assert end.device_copied_bytes == before.device_copied_bytes
        assert end.uploaded_bytes - warm.uploaded_bytes == 4 * 64
        assert end.downloaded_bytes - warm.downloaded_bytes == 4 * 64


async def test_host_visible_model_io_preserves_slices_slots_and_avoids_staging() -> None:
    """inference.rs::host_visible_model_io_preserves_slices_slots_and_avoids_staging: shared
    root, in = out = slice(16,64), fill slice(32,8) -> 160 live bytes; host-visible
    outputs; Busy with 2 runs out, also after download(); read_into works; 10 runs add no
    allocations, graphs or transfer bytes."""
    async with hrx.Runtime("sim") as rt:
        ctx = ModelContext(rt)
        s = ModelSession(ctx)
        root = s.allocate_shared(4096)
        d = await s.freeze(ctx)
        live = rt.statistics().live_bytes
        io = root.slice(16, 64)
        model = d.prepare([Fill(root.slice(32, 8), 9)], [(io, U8_64)], [(io, U8_64)], 2)
        assert rt.statistics().live_bytes - live == 160
        data = bytes(range(100, 164))
        expected = data[:16] + bytes([9]) * 8 + data[24:]

        def writer(index: int, memory: memoryview) -> None:
            memory[:] = data

        one = await model.submit_host_with(writer)
        two = await model.submit_host_with(writer)
        assert one.outputs[0].view.buffer.placement.host_mappable  # type: ignore[union-attr]
        with pytest.raises(hrx.Busy):
            model.try_acquire()
        assert await one.download() == [expected]
        with pytest.raises(hrx.Busy):
            model.try_acquire()
        target = bytearray(64)
        await two.read_into([target])
        assert bytes(target) == expected
        del one, two
        gc.collect()
        model.try_acquire().release()
        before = rt.statistics()
        for _ in range(10):
            run = await model.submit_host_with(writer)
            assert await run.download() == [expected]
            del run
        end = rt.statistics()
        for name in ("allocations", "native_graphs_prepared", "copied_bytes"):
            assert getattr(end, name) == getattr(before, name), name
        assert model.staging_buffers == 0 and model.copy_graphs == 0


@pytest.mark.parametrize("reuse", [True, False])
async def test_graph_reuses_private_scratch_without_aliasing_outputs(reuse: bool) -> None:
    """inference.rs::graph_reuses_private_scratch_without_aliasing_outputs: two "fill a
    private temp with v, copy it to a host-visible output" fragments with reuse, in one
    graph per slot; 2 slots -> 6 allocations (8 without reuse); each round gives
    [7 x 64, 11 x 64]."""
    async with hrx.Runtime("sim") as rt:
        ctx = ModelContext(rt)
        s = ModelSession(ctx)
        temp, out = s.allocate(64), s.allocate_shared(64)
        k = copy_kernel(s)
        d = await s.freeze(ctx)

        def fragment(value: int) -> Any:
            commands = [Fill(temp, value), Dispatch(k, [temp.read(), out.write()])]
            made = d.fragment(commands, [], [(out, U8_64)])
            return made.reuse_private_scratch() if reuse else made

        seven, eleven = fragment(7), fragment(11)
        assert seven.private == (temp.allocation,)

        def build(c: ModelContext, index: int) -> SlotIO:
            g = c.runtime.graph(f"pair{index}")
            (x,) = seven.record(g, [])
            (y,) = eleven.record(g, [])
            assert x.view.buffer is not y.view.buffer
            return SlotIO(
                {}, {"a": Tensor(x.desc, x.view), "b": Tensor(y.desc, y.view)}, g.prepare()
            )

        before = rt.statistics().allocations
        model = PreparedModel(ctx, 2, build, "pair", eager=True)
        assert rt.statistics().allocations - before == (6 if reuse else 8)
        for _ in range(3):
            runs = [await model.submit([]), await model.submit([])]
            for run in runs:
                assert await run.download() == [bytes([7]) * 64, bytes([11]) * 64]
            del runs, run  # the slots go back with the last reference to each run
