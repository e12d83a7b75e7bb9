"""Model context and prepared models with slots."""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest

import hrx_async as hrx
from hrx_async.models import ModelContext, PreparedModel, SlotIO, TensorDesc

pytestmark = pytest.mark.anyio
N = 64


def double(arrays: list[np.ndarray[Any, Any]], constants: bytes) -> None:
    arrays[1].view(np.float32)[:] = arrays[0].view(np.float32) * 2


def factory(kernel: hrx.GpuKernel, log: list[int]) -> Any:
    def build(ctx: ModelContext, index: int) -> SlotIO:
        log.append(index)
        x = ctx.tensor(TensorDesc("f32", (N,)), hrx.GPU_LOCAL, f"x{index}")
        y = ctx.tensor(TensorDesc("f32", (N,)), hrx.GPU_LOCAL, f"y{index}")
        g = ctx.runtime.graph("double")
        g.gpu(kernel, [x.view, y.view])
        return SlotIO({"x": x}, {"y": y}, g.prepare())

    return build


def load_double(rt: hrx.Runtime) -> hrx.GpuKernel:
    return load_double_of(rt, N)


def load_double_of(rt: hrx.Runtime, n: int) -> hrx.GpuKernel:
    contract = hrx.KernelContract(
        [hrx.Binding(n * 4, hrx.Access.READ), hrx.Binding(n * 4, hrx.Access.WRITE)]
    )
    return rt.load_gpu_kernel(hrx.KernelSource(host=double), "double", (1,), (n,), contract)


async def test_context_transfers() -> None:
    async with hrx.Runtime("sim") as rt:
        ctx = ModelContext(rt)
        a = ctx.tensor(TensorDesc("i32", (4, 4)), hrx.GPU_LOCAL)
        b = ctx.tensor(TensorDesc("i32", (4, 4)), hrx.GPU_LOCAL)
        values = np.arange(16, dtype=np.int32).reshape(4, 4)
        await ctx.upload(a, values)
        await ctx.copy(b, a)
        assert (await ctx.download(b) == values).all()
        with pytest.raises(hrx.ContractError):
            await ctx.upload(a, values.astype(np.int64))
        with pytest.raises(hrx.ContractError):
            await ctx.copy(ctx.tensor(TensorDesc("f32", (4, 4)), hrx.GPU_LOCAL), a)


async def test_slots_run_concurrently_with_reused_staging() -> None:
    async with hrx.Runtime("sim") as rt:
        built: list[int] = []
        model = PreparedModel(ModelContext(rt), 2, factory(load_double(rt), built))
        results: dict[int, np.ndarray[Any, Any]] = {}

        async def request(i: int) -> None:
            x = np.full(N, i, np.float32)
            results[i] = (await model.infer({"x": x}))["y"]

        async with anyio.create_task_group() as tg:
            for i in range(10):
                tg.start_soon(request, i)
        assert all((results[i] == 2 * i).all() for i in range(10))
        assert sorted(built) == [0, 1] and model.staging_buffers == 4  # in and out, per slot
        async with model.slot() as s:
            with pytest.raises(hrx.ContractError):
                await s.write("z", np.zeros(N, np.float32))
            with pytest.raises(hrx.ContractError):
                await s.write("x", np.zeros(N + 1, np.float32))
            other = model.slot_nowait()
            with other, pytest.raises(hrx.Busy):
                model.slot_nowait()
        with pytest.raises(hrx.ContractError):
            await model.infer({"q": np.zeros(N, np.float32)})
        assert model.idle


async def test_slots_never_share_writable_io() -> None:
    async with hrx.Runtime("sim") as rt:
        kernel = load_double(rt)
        ctx = ModelContext(rt)
        shared_y = ctx.tensor(TensorDesc("f32", (N,)), hrx.GPU_LOCAL)

        def build(ctx: ModelContext, index: int) -> SlotIO:
            x = ctx.tensor(TensorDesc("f32", (N,)), hrx.GPU_LOCAL)
            g = ctx.runtime.graph()
            g.gpu(kernel, [x.view, shared_y.view])
            return SlotIO({"x": x}, {"y": shared_y}, g.prepare())

        model = PreparedModel(ctx, 2, build)
        async with model.slot():
            with pytest.raises(hrx.ContractError, match="never share"):
                async with model.slot():
                    pass
        for bad in ((ctx, 0, build), (ctx, 1, 3), (rt, 1, build)):
            with pytest.raises(hrx.ContractError):
                PreparedModel(*bad)  # type: ignore[arg-type]


async def test_transfers_refuse_tensors_and_staging_of_another_context() -> None:
    async with hrx.Runtime("sim") as rt, hrx.Runtime("sim") as other_rt:
        ctx, other = ModelContext(rt), ModelContext(other_rt)
        values = np.arange(4, dtype=np.int32)
        for placement in (hrx.HOST_VISIBLE, hrx.GPU_LOCAL):
            foreign = other.tensor(TensorDesc("i32", (4,)), placement)
            mine = ctx.tensor(TensorDesc("i32", (4,)), placement)
            with pytest.raises(hrx.ContractError, match="belongs to another model context"):
                await ctx.upload(foreign, values)
            with pytest.raises(hrx.ContractError, match="belongs to another model context"):
                await ctx.download(foreign)
            with pytest.raises(hrx.ContractError, match="belongs to another model context"):
                await ctx.copy(mine, foreign)
            assert (await other.download(foreign) == 0).all()
            assert ctx.owns(mine) and not ctx.owns(foreign)
        device = ctx.tensor(TensorDesc("i32", (4,)), hrx.GPU_LOCAL)
        stagings = [
            other_rt.allocate(16, hrx.HOST_VISIBLE),
            rt.allocate(8, hrx.HOST_VISIBLE),
            rt.allocate(16, hrx.GPU_LOCAL),
        ]
        live = rt.statistics().live_bytes
        for staging in stagings:
            with pytest.raises(hrx.ContractError, match="staging"):
                await ctx.upload(device, values, staging)
            with pytest.raises(hrx.ContractError, match="staging"):
                await ctx.download(device, staging)
        assert rt.statistics().live_bytes == live  # no temporary staging was made
        assert (await ctx.download(device) == 0).all()


async def test_infer_refuses_a_non_mapping_and_ragged_data_and_changes_nothing() -> None:
    async with hrx.Runtime("sim") as rt:
        built: list[int] = []
        model = PreparedModel(ModelContext(rt), 1, factory(load_double(rt), built))
        for bad in ([np.zeros(N, np.float32)], "x", 3):
            with pytest.raises(hrx.ContractError, match="mapping"):
                await model.infer(bad)  # type: ignore[arg-type]
        assert built == [] and model.idle
        x = np.arange(N, dtype=np.float32)
        assert (await model.infer({"x": x}))["y"].tolist() == (2 * x).tolist()
        submissions = rt.statistics().submissions
        for ragged in ([[1.0], [1.0, 2.0]], [x, [1.0]]):
            with pytest.raises(hrx.ContractError):
                await model.infer({"x": ragged})
        assert rt.statistics().submissions == submissions and model.idle
        async with model.slot() as s:
            assert (await s.read("y")).tolist() == (2 * x).tolist()


async def test_a_slot_of_foreign_tensors_or_graph_or_other_io_is_refused_when_built() -> None:
    async with hrx.Runtime("sim") as rt, hrx.Runtime("sim") as other_rt:
        kernel = load_double(rt)
        ctx, other = ModelContext(rt), ModelContext(other_rt)

        def slot_io(
            ctx: ModelContext, kernel: hrx.GpuKernel, n: int = N, name: str = "y"
        ) -> SlotIO:
            x = ctx.tensor(TensorDesc("f32", (n,)), hrx.GPU_LOCAL)
            y = ctx.tensor(TensorDesc("f32", (n,)), hrx.GPU_LOCAL)
            g = ctx.runtime.graph()
            g.gpu(kernel, [x.view, y.view])
            return SlotIO({"x": x}, {name: y}, g.prepare())

        foreign_io = slot_io(other, load_double(other_rt))
        mine = slot_io(ctx, kernel)
        factories: dict[str, Any] = {
            "another model context": lambda c, i: SlotIO(
                foreign_io.inputs, foreign_io.outputs, mine.graph
            ),
            "another runtime": lambda c, i: SlotIO(mine.inputs, mine.outputs, foreign_io.graph),
        }
        for message, build in factories.items():
            model = PreparedModel(ctx, 2, build)
            with pytest.raises(hrx.ContractError, match=message):
                async with model.slot():
                    pass
            assert model.pool.built == 0
        wide = load_double_of(rt, 2 * N)
        variants: dict[str, Any] = {
            "outputs": lambda c, i: slot_io(c, kernel, name="y" if i == 0 else "z"),
            "inputs": lambda c, i: slot_io(c, kernel if i == 0 else wide, N if i == 0 else 2 * N),
        }
        for kind, build in variants.items():
            model = PreparedModel(ctx, 2, build)
            async with model.slot():
                with pytest.raises(hrx.ContractError, match=f"slot 1's {kind} .* differ"):
                    async with model.slot():
                        pass
            assert model.pool.built == 1
            with model.slot_nowait():  # slot 0 still serves
                pass
