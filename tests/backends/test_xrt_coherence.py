"""Cache maintenance of the xrt backend, decided from who wrote the bytes last.

An NPU run flushes (`bo.sync` towards the device) only the ranges it reads whose last
writer, as the access tracker has it when the run is admitted, is not an earlier run on
the same NPU; it invalidates what it wrote as soon as it ends. The fake pyxrt keeps a
host and a device copy of every buffer, so a flush left out wrongly, or an invalidate
missing, shows up as a wrong value; `FAKE.syncs` records every sync. On asyncio and trio.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import hrx_async as hrx
from hrx_async.backends import xrt as xrt_backend

sys.path.insert(0, str(Path(__file__).parent.parent))
import fake_pyxrt
from fake_pyxrt import affine

pytestmark = pytest.mark.anyio
N = 64
WORDS = N // 4
TO_DEVICE, FROM_DEVICE = 0, 1


def step(values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return values * 2 + 1


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.delenv("HRX_NPU", raising=False)
    with fake_pyxrt.installed({"MLIR_AIE": affine}) as module:
        yield module


@pytest.fixture
def source(tmp_path: Path) -> hrx.KernelSource:
    xclbin = fake_pyxrt.write_xclbin(tmp_path / "final.xclbin", {"MLIR_AIE": 8})
    insts = tmp_path / "insts.bin"
    np.arange(1, 33, dtype=np.uint32).tofile(insts)
    return xrt_backend.xrt_source(xclbin, insts)


def load(rt: hrx.Runtime, source: hrx.KernelSource) -> Any:
    contract = hrx.KernelContract(
        [hrx.Binding(N, hrx.Access.READ), hrx.Binding(N, hrx.Access.WRITE)]
    )
    return rt.npu(0).load_artifact(source, "MLIR_AIE", 1, contract)


def npu_buffers(rt: hrx.Runtime, count: int) -> list[hrx.Buffer]:
    return [rt.allocate(N, hrx.npu_local(0)) for _ in range(count)]


async def write(view: hrx.View, values: np.ndarray[Any, Any]) -> None:
    async with view.map_write() as memory:
        np.frombuffer(memory, np.int32)[:] = values


async def read(view: hrx.View) -> np.ndarray[Any, Any]:
    async with view.map_read() as memory:
        return np.frombuffer(memory, np.int32).copy()


def serial(buffer: hrx.Buffer) -> int:
    """The fake's number for the buffer object behind `buffer`."""
    serial_number: int = buffer.storage.record.bo.serial
    return serial_number


def synced(buffer: hrx.Buffer, direction: int) -> list[tuple[int, int]]:
    """(size, offset) of every sync of `buffer` in `direction` since the last clear."""
    return [
        (size, offset)
        for bo, way, size, offset in fake_pyxrt.FAKE.syncs
        if bo == serial(buffer) and way == direction
    ]


def inputs(seed: int) -> np.ndarray[Any, Any]:
    return np.arange(WORDS, dtype=np.int32) * 3 + seed


async def test_npu_to_npu_in_one_graph_flushes_no_intermediate(
    fake: ModuleType, source: hrx.KernelSource
) -> None:
    async with hrx.Runtime(backend="sim", npu="xrt") as rt:
        kernel = load(rt, source)
        a, b, c = npu_buffers(rt, 3)
        graph = rt.graph("chain")
        graph.npu(kernel, [a.view(), b.view()])
        graph.npu(kernel, [b.view(), c.view()])
        chain = graph.prepare()
        for seed in range(3):
            await write(a.view(), inputs(seed))
            fake_pyxrt.FAKE.syncs.clear()
            await chain.submit()
            assert synced(a, TO_DEVICE) == [(N, 0)]
            assert synced(b, TO_DEVICE) == []  # the second run reads what the first wrote
            assert synced(b, FROM_DEVICE) == [(N, 0)]  # and the host sees it too
            assert synced(c, FROM_DEVICE) == [(N, 0)]
            assert np.array_equal(await read(c.view()), step(step(inputs(seed))))
            assert np.array_equal(await read(b.view()), step(inputs(seed)))
        assert rt.statistics().cache_maintenance_bytes == 3 * 3 * N  # a, b and c per replay


async def test_npu_to_npu_across_pending_submissions_flushes_no_intermediate(
    fake: ModuleType, source: hrx.KernelSource
) -> None:
    fake_pyxrt.FAKE.latency_s = 0.002  # the first run is still going when the second comes
    async with hrx.Runtime(backend="sim", npu="xrt") as rt:
        kernel = load(rt, source)
        a, b, c = npu_buffers(rt, 3)
        first, second = rt.graph("first"), rt.graph("second")
        first.npu(kernel, [a.view(), b.view()])
        second.npu(kernel, [b.view(), c.view()])
        produce, consume = first.prepare(), second.prepare()
        for seed in range(3):
            await write(a.view(), inputs(seed))
            fake_pyxrt.FAKE.syncs.clear()
            completions = [produce.submit(), consume.submit()]
            for completion in completions:
                await completion
            assert synced(b, TO_DEVICE) == []
            assert np.array_equal(await read(c.view()), step(step(inputs(seed))))


async def test_npu_to_npu_after_an_awaited_submission_is_right(
    fake: ModuleType, source: hrx.KernelSource
) -> None:
    # The first run has finished and the tracker has forgotten it when the second is
    # admitted: nothing says who wrote `b` last, so it is flushed (the host copy is
    # current: the first run's bytes were invalidated when it ended).
    async with hrx.Runtime(backend="sim", npu="xrt") as rt:
        kernel = load(rt, source)
        a, b, c = npu_buffers(rt, 3)
        first, second = rt.graph("first"), rt.graph("second")
        first.npu(kernel, [a.view(), b.view()])
        second.npu(kernel, [b.view(), c.view()])
        produce, consume = first.prepare(), second.prepare()
        await write(a.view(), inputs(5))
        await produce.submit()
        await consume.submit()
        assert np.array_equal(await read(c.view()), step(step(inputs(5))))


async def test_a_host_function_writing_between_two_npu_runs_is_flushed(
    fake: ModuleType, source: hrx.KernelSource
) -> None:
    seen: list[np.ndarray[Any, Any]] = []

    def add_100(data: np.ndarray[Any, Any]) -> None:
        seen.append(data.view(np.int32).copy())  # the first run's output, invalidated
        data.view(np.int32)[:] += 100

    async with hrx.Runtime(backend="sim", npu="xrt") as rt:
        kernel = load(rt, source)
        a, b, c = npu_buffers(rt, 3)
        graph = rt.graph("npu-host-npu")
        graph.npu(kernel, [a.view(), b.view()])
        graph.host(add_100, [(b.view(), hrx.Access.READ_WRITE)])
        graph.npu(kernel, [b.view(), c.view()])
        chain = graph.prepare()
        for seed in range(2):
            await write(a.view(), inputs(seed))
            fake_pyxrt.FAKE.syncs.clear()
            await chain.submit()
            assert np.array_equal(seen[-1], step(inputs(seed)))
            assert synced(b, TO_DEVICE) == [(N, 0)]
            assert np.array_equal(await read(c.view()), step(step(inputs(seed)) + 100))


async def test_host_writes_between_pending_npu_submissions_are_flushed(
    fake: ModuleType, source: hrx.KernelSource
) -> None:
    # A host function of its own submission, admitted between the two NPU runs, and a
    # host mapping written between two awaited runs.
    fake_pyxrt.FAKE.latency_s = 0.002

    def add_100(data: np.ndarray[Any, Any]) -> None:
        data.view(np.int32)[:] += 100

    async with hrx.Runtime(backend="sim", npu="xrt") as rt:
        kernel = load(rt, source)
        a, b, c = npu_buffers(rt, 3)
        first, middle, second = rt.graph("first"), rt.graph("host"), rt.graph("second")
        first.npu(kernel, [a.view(), b.view()])
        middle.host(add_100, [(b.view(), hrx.Access.READ_WRITE)])
        second.npu(kernel, [b.view(), c.view()])
        steps = [graph.prepare() for graph in (first, middle, second)]
        await write(a.view(), inputs(1))
        fake_pyxrt.FAKE.syncs.clear()
        completions = [prepared.submit() for prepared in steps]
        for completion in completions:
            await completion
        assert synced(b, TO_DEVICE) == [(N, 0)]
        assert np.array_equal(await read(c.view()), step(step(inputs(1)) + 100))

        await steps[0].submit()
        await write(b.view(), inputs(7))  # the host overwrites the NPU's output
        await steps[2].submit()
        assert np.array_equal(await read(c.view()), step(inputs(7)))


async def test_gpu_copies_around_npu_runs(fake: ModuleType, source: hrx.KernelSource) -> None:
    # A GPU copy reads the first run's output (invalidated), another writes the input of
    # the second run (flushed).
    async with hrx.Runtime(backend="sim", npu="xrt") as rt:
        kernel = load(rt, source)
        a, b, c = npu_buffers(rt, 3)
        out, feed = rt.allocate(N, hrx.GPU_LOCAL), rt.allocate(N, hrx.HOST_VISIBLE)
        graph = rt.graph("npu-gpu-npu")
        graph.npu(kernel, [a.view(), b.view()])
        graph.copy(out.view(), b.view())
        graph.copy(b.view(), feed.view())
        graph.npu(kernel, [b.view(), c.view()])
        chain = graph.prepare()
        back = rt.graph("back")
        back.copy(feed.view(), out.view())
        fetch = back.prepare()
        await write(a.view(), inputs(2))
        await write(feed.view(), inputs(40))
        fake_pyxrt.FAKE.syncs.clear()
        await chain.submit()
        assert synced(b, TO_DEVICE) == [(N, 0)]
        assert np.array_equal(await read(c.view()), step(inputs(40)))
        await fetch.submit()
        assert np.array_equal(await read(feed.view()), step(inputs(2)))


async def test_a_gpu_kernel_reads_an_npu_result(fake: ModuleType, source: hrx.KernelSource) -> None:
    def negate(arrays: list[np.ndarray[Any, Any]], constants: bytes) -> None:
        src, dst = (array.view(np.int32) for array in arrays)
        dst[:] = -src

    async with hrx.Runtime(backend="sim", npu="xrt") as rt:
        kernel = load(rt, source)
        gpu_kernel = rt.load_gpu_kernel(
            hrx.KernelSource(host=negate),
            "negate",
            grid=(1,),
            block=(WORDS,),
            contract=hrx.KernelContract(
                [hrx.Binding(N, hrx.Access.READ), hrx.Binding(N, hrx.Access.WRITE)]
            ),
        )
        a = rt.allocate(N, hrx.npu_local(0))
        b = rt.allocate(N, hrx.shared(0))  # NPU memory a GPU kernel can bind
        out = rt.allocate(N, hrx.HOST_VISIBLE)
        graph = rt.graph("npu-then-gpu")
        graph.npu(kernel, [a.view(), b.view()])
        graph.gpu(gpu_kernel, [b.view(), out.view()])
        chain = graph.prepare()
        for seed in range(2):
            await write(a.view(), inputs(seed))
            await chain.submit()
            assert np.array_equal(await read(out.view()), -step(inputs(seed)))


async def test_a_skipped_npu_writer_leaves_its_bytes_to_be_flushed(
    fake: ModuleType, source: hrx.KernelSource
) -> None:
    # The second run was admitted while the NPU run before it was to write `b`, so it
    # would not flush `b`; that run is cancelled, so `b` holds what the host wrote, and
    # the second run must flush it after all.
    fake_pyxrt.FAKE.latency_s = 0.02
    async with hrx.Runtime(backend="sim", npu="xrt") as rt:
        kernel = load(rt, source)
        b, c, x, y = npu_buffers(rt, 4)
        graphs = [rt.graph(label) for label in ("busy", "first", "second")]
        graphs[0].npu(kernel, [x.view(), y.view()])
        graphs[1].npu(kernel, [y.view(), b.view()])  # after "busy": cancellable till then
        graphs[2].npu(kernel, [b.view(), c.view()])
        busy, produce, consume = (graph.prepare() for graph in graphs)
        await write(b.view(), inputs(9))
        fake_pyxrt.FAKE.syncs.clear()
        occupied = busy.submit()  # keeps the NPU busy while the next two are queued
        skipped = produce.submit()
        consumed = consume.submit()
        assert skipped.cancel()
        with pytest.raises(hrx.Cancelled):
            await skipped
        await consumed
        await occupied
        assert synced(b, TO_DEVICE) == [(N, 0)]
        assert np.array_equal(await read(c.view()), step(inputs(9)))


async def test_a_dlpack_export_sees_every_npu_result(
    fake: ModuleType, source: hrx.KernelSource
) -> None:
    # A host array exported before the runs reads NPU memory with no call the runtime
    # could hook: the NPU's writes are invalidated when each run ends.
    async with hrx.Runtime(backend="sim", npu="xrt") as rt:
        kernel = load(rt, source)
        a, b = npu_buffers(rt, 2)
        graph = rt.graph("one")
        graph.npu(kernel, [a.view(), b.view()])
        run_once = graph.prepare()
        exported = np.from_dlpack(b.view()).view(np.int32)
        for seed in range(3):
            await write(a.view(), inputs(seed))
            await run_once.submit()
            assert np.array_equal(exported, step(inputs(seed)))


async def test_writes_through_a_dlpack_export_reach_the_next_npu_run(
    fake: ModuleType, source: hrx.KernelSource
) -> None:
    # The runtime does not see these writes. Between awaited runs they are legal, and the
    # producer of `b` has finished and been forgotten when the consumer is admitted, so
    # the consumer flushes `b`: that is what makes them visible to the NPU.
    async with hrx.Runtime(backend="sim", npu="xrt") as rt:
        kernel = load(rt, source)
        a, b, c = npu_buffers(rt, 3)
        first, second = rt.graph("first"), rt.graph("second")
        first.npu(kernel, [a.view(), b.view()])
        second.npu(kernel, [b.view(), c.view()])
        produce, consume = first.prepare(), second.prepare()
        exported = np.from_dlpack(b.view()).view(np.int32)
        await write(a.view(), inputs(3))
        await produce.submit()
        exported[:] += 1000
        await consume.submit()
        assert np.array_equal(await read(c.view()), step(step(inputs(3)) + 1000))


async def test_a_hung_run_that_skipped_a_flush_quarantines_its_program(
    fake: ModuleType, source: hrx.KernelSource
) -> None:
    async with hrx.Runtime(backend="sim", npu="xrt") as rt:
        rt._npu_backend.watchdog_s = 0.05
        kernel = load(rt, source)
        a, b, c = npu_buffers(rt, 3)
        first, second = rt.graph("first"), rt.graph("second")
        first.npu(kernel, [a.view(), b.view()])
        second.npu(kernel, [b.view(), c.view()])
        produce, consume = first.prepare(), second.prepare()
        await write(a.view(), inputs(6))
        fake_pyxrt.FAKE.syncs.clear()
        produced = produce.submit()  # started at once
        fake_pyxrt.FAKE.hang_next = 1  # the next run to start: the consumer
        consumed = consume.submit()  # admitted while `b`'s producer is pending
        await produced
        with pytest.raises(hrx.ExecutionError, match="watchdog"):
            await consumed
        assert synced(b, TO_DEVICE) == []
        with pytest.raises(hrx.ExecutionError, match="previous run is still going"):
            await consume.submit()  # the program itself, not a launch of it, is refused
        fake_pyxrt.FAKE.release_hung()
        await write(c.view(), np.zeros(WORDS, np.int32))  # clears the hung run's poison
        await consume.submit()
        assert np.array_equal(await read(c.view()), step(step(inputs(6))))
