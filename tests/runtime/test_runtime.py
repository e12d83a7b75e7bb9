"""Runtime behaviour on every usable backend, under asyncio and trio."""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import numpy as np
import pytest

import hrx_async as hrx
from tests.helpers import load_mix, read_bytes, write_bytes

pytestmark = pytest.mark.anyio


def _raiser(message: str) -> Any:
    def fail(*arrays: np.ndarray) -> None:
        raise RuntimeError(message)

    return fail


async def test_disjoint_ranges_of_one_buffer_overlap_across_submissions(hrx_backend: str) -> None:
    async with hrx.Runtime(backend=hrx_backend) as rt:
        buffer = rt.allocate(128, hrx.npu_local(0))
        other_started = threading.Event()
        seen: list[bool] = []

        def wait_for_other(array: np.ndarray) -> None:
            seen.append(other_started.wait(timeout=10))

        def mark_started(arrays: list[np.ndarray], constants: bytes) -> None:
            other_started.set()

        contract = hrx.KernelContract([hrx.Binding(64, hrx.Access.WRITE)])
        npu_kernel = rt.npu(0).load_artifact(
            hrx.KernelSource(host=mark_started), "mark", 1, contract
        )
        first = rt.graph("first")
        first.host(wait_for_other, [(buffer.view(0, 64), hrx.Access.WRITE)])
        second = rt.graph("second")
        second.npu(npu_kernel, [buffer.view(64, 64)])
        a = first.prepare().submit()
        b = second.prepare().submit()
        await a
        await b
        assert seen == [True]


async def test_overlapping_ranges_across_submissions_run_in_admission_order(
    hrx_backend: str,
) -> None:
    async with hrx.Runtime(backend=hrx_backend) as rt:
        buffer = rt.allocate(128, hrx.npu_local(0))
        events: list[str] = []

        def slow_writer(array: np.ndarray) -> None:
            time.sleep(0.05)
            events.append("host done")

        def reader(arrays: list[np.ndarray], constants: bytes) -> None:
            events.append("npu start")

        contract = hrx.KernelContract([hrx.Binding(64, hrx.Access.READ)])
        npu_kernel = rt.npu(0).load_artifact(hrx.KernelSource(host=reader), "read", 1, contract)
        first = rt.graph("first")
        first.host(slow_writer, [(buffer.view(0, 64), hrx.Access.WRITE)])
        second = rt.graph("second")
        second.npu(npu_kernel, [buffer.view(32, 64)])
        a, b = first.prepare().submit(), second.prepare().submit()
        await a
        await b
        assert events == ["host done", "npu start"]


async def test_failure_names_region_skips_rest_poisons_and_recovers(hrx_backend: str) -> None:
    async with hrx.Runtime(backend=hrx_backend) as rt:
        src = rt.allocate(64, hrx.HOST_VISIBLE, label="src")
        out = rt.allocate(64, hrx.HOST_VISIBLE, label="out")
        later = rt.allocate(64, hrx.HOST_VISIBLE, label="later")
        unrelated = rt.allocate(64, hrx.HOST_VISIBLE, label="unrelated")
        ran_after: list[bool] = []
        graph = rt.graph("failing")
        graph.fill(src.view(), 1)  # region 0 (compute)
        graph.host(_raiser("kernel exploded"), [(out.view(), hrx.Access.WRITE)])  # region 1
        graph.host(lambda a: ran_after.append(True), [(later.view(), hrx.Access.WRITE)])  # 2
        failing = graph.prepare()
        assert len(failing.regions) == 3
        ok_graph = rt.graph("unrelated")
        ok_graph.fill(unrelated.view(), 9)
        ok = ok_graph.prepare()

        live_before = rt.statistics().live_bytes
        completion = failing.submit()
        unrelated_completion = ok.submit()
        with pytest.raises(hrx.ExecutionError) as caught:
            await completion
        assert caught.value.region == 1
        assert "region 1" in str(caught.value)
        assert isinstance(caught.value.__cause__, RuntimeError)
        assert ran_after == []
        await unrelated_completion
        assert await read_bytes(rt, unrelated) == bytes([9]) * 64

        # The failed region's output is poisoned for readers, at submit and at map time.
        reader = rt.graph("reader")
        reader.copy(src.view(), out.view())
        with pytest.raises(hrx.PoisonedError, match="out"):
            reader.prepare().submit()
        with pytest.raises(hrx.PoisonedError):
            async with out.map_read():
                pass
        # A full overwrite clears it.
        clear = rt.graph("clear")
        clear.fill(out.view(), 4)
        await clear.prepare().submit()
        await reader.prepare().submit()
        assert await read_bytes(rt, src) == bytes([4]) * 64
        stats = rt.statistics()
        assert stats.live_bytes == live_before
        assert stats.submissions == stats.completions
        assert rt.healthy


async def test_poison_propagates_to_readers_admitted_before_the_failure(hrx_backend: str) -> None:
    async with hrx.Runtime(backend=hrx_backend) as rt:
        a = rt.allocate(32, hrx.HOST_VISIBLE, label="a")
        b = rt.allocate(32, hrx.HOST_VISIBLE, label="b")
        c = rt.allocate(32, hrx.HOST_VISIBLE, label="c")
        gate = threading.Event()

        def fail_later(array: np.ndarray) -> None:
            gate.wait(10)
            raise ValueError("late failure")

        first = rt.graph("first")
        first.host(fail_later, [(a.view(), hrx.Access.WRITE)])
        second = rt.graph("second")
        second.copy(b.view(), a.view())
        third = rt.graph("third")
        third.copy(c.view(), b.view())
        one, two, three = (
            first.prepare().submit(),
            second.prepare().submit(),
            third.prepare().submit(),
        )
        gate.set()
        with pytest.raises(hrx.ExecutionError):
            await one
        with pytest.raises(hrx.PoisonedError, match="a"):
            await two
        with pytest.raises(hrx.PoisonedError):
            await three
        assert b.poison is not None and c.poison is not None


async def test_after_dependency_failure_and_cancellation_fail_dependent(hrx_backend: str) -> None:
    async with hrx.Runtime(backend=hrx_backend) as rt:
        a = rt.allocate(16, hrx.HOST_VISIBLE)
        b = rt.allocate(16, hrx.HOST_VISIBLE)
        gate = threading.Event()
        failing = rt.graph("failing")
        failing.host(_raiser("boom"), [(a.view(), hrx.Access.WRITE)])
        blocked = rt.graph("blocked")
        blocked.host(lambda x: gate.wait(10), [(a.view(), hrx.Access.READ)])
        dependent = rt.graph("dependent")
        dependent.fill(b.view(), 3)
        prepared_dependent = dependent.prepare()

        first = failing.prepare().submit()
        follower = prepared_dependent.submit(after=[first])
        with pytest.raises(hrx.DependencyFailed):
            await follower
        with pytest.raises(hrx.ExecutionError):
            await first
        assert await read_bytes(rt, b) == bytes(16)

        a_clear = rt.graph("clear")
        a_clear.fill(a.view(), 0)
        await a_clear.prepare().submit()
        waiting = blocked.prepare().submit()
        queued = blocked.prepare().submit()
        queued.cancel()
        follower = prepared_dependent.submit(after=[queued])
        gate.set()
        await waiting
        with pytest.raises(hrx.Cancelled):
            await queued
        with pytest.raises(hrx.Cancelled):
            await follower
        assert await read_bytes(rt, b) == bytes(16)


async def test_cancel_skips_unstarted_regions_and_running_ones_drain(hrx_backend: str) -> None:
    async with hrx.Runtime(backend=hrx_backend) as rt:
        a = rt.allocate(16, hrx.HOST_VISIBLE)
        b = rt.allocate(16, hrx.HOST_VISIBLE)
        started, release = threading.Event(), threading.Event()
        finished: list[bool] = []

        def running(array: np.ndarray, unused: np.ndarray) -> None:
            started.set()
            release.wait(10)
            array[:] = 5
            finished.append(True)

        graph = rt.graph("two")
        # The fill of b must wait for the host function, which reads b.
        graph.host(running, [(a.view(), hrx.Access.WRITE), (b.view(), hrx.Access.READ)])
        graph.fill(b.view(), 7)
        completion = graph.prepare().submit()
        await anyio.to_thread.run_sync(started.wait, 10)
        assert completion.cancel()
        release.set()
        with pytest.raises(hrx.Cancelled):
            await completion
        assert finished == [True]
        assert await read_bytes(rt, a) == bytes([5]) * 16
        assert await read_bytes(rt, b) == bytes(16)
        assert not completion.cancel()


async def test_cancelling_the_awaiting_task_never_cancels_device_work(hrx_backend: str) -> None:
    async with hrx.Runtime(backend=hrx_backend) as rt:
        a = rt.allocate(16, hrx.HOST_VISIBLE)
        release = threading.Event()
        graph = rt.graph("slow")
        graph.host(lambda x: (release.wait(10), x.fill(8)), [(a.view(), hrx.Access.WRITE)])
        completion = graph.prepare().submit()
        with anyio.move_on_after(0.01) as scope:
            await completion
        assert scope.cancelled_caught
        # Cancelled while waiting for a mapping: the mapping is not leaked.
        with anyio.move_on_after(0.01):
            async with a.map_read():
                pytest.fail("mapped before the writer finished")
        release.set()
        await completion
        assert await read_bytes(rt, a) == bytes([8]) * 16
        async with a.map_write() as memory:
            memory[:] = bytes(16)


async def test_cancel_scope_around_runtime_drains_and_resolves(hrx_backend: str) -> None:
    release = threading.Event()
    holder: list[hrx.Completion] = []
    with anyio.move_on_after(0.05):
        async with hrx.Runtime(backend=hrx_backend) as rt:
            a = rt.allocate(16, hrx.HOST_VISIBLE)
            graph = rt.graph("slow")
            graph.host(lambda x: release.wait(0.3), [(a.view(), hrx.Access.WRITE)])
            graph.fill(a.view(), 1)
            prepared = graph.prepare()
            holder.append(prepared.submit())
            holder.append(prepared.submit())
            await anyio.sleep(10)
    release.set()
    assert all(c.done() for c in holder)
    # The first one ran its host region; the second was skipped at exit.
    with pytest.raises(hrx.Cancelled):
        holder[1].result()


async def test_ten_thousand_submissions_from_a_hundred_tasks(hrx_backend: str) -> None:
    async with hrx.Runtime(backend=hrx_backend, max_submissions=64) as rt:
        buffers = [rt.allocate(64, hrx.HOST_VISIBLE) for _ in range(10)]
        prepared = []
        for i, buffer in enumerate(buffers):
            graph = rt.graph(f"fill{i}")
            graph.fill(buffer.view(0, 32), i)
            graph.copy(buffer.view(32, 32), buffer.view(0, 32))
            prepared.append(graph.prepare())
        done = 0

        async def client(index: int) -> None:
            nonlocal done
            pending = [prepared[(index + k) % 10].submit() for k in range(100)]
            for completion in pending:
                await completion
                done += 1

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for index in range(100):
                    tg.start_soon(client, index)
        assert done == 10_000
        stats = rt.statistics()
        assert stats.completions == stats.submissions == 10_000
        for i, buffer in enumerate(buffers):
            assert await read_bytes(rt, buffer) == bytes([i]) * 64


async def test_max_submissions_queues_in_order_and_nowait_is_busy(hrx_backend: str) -> None:
    async with hrx.Runtime(backend=hrx_backend, max_submissions=2) as rt:
        a = rt.allocate(8, hrx.HOST_VISIBLE)
        release = threading.Event()
        order: list[int] = []
        graphs = []
        for i in range(4):
            graph = rt.graph(f"g{i}")
            graph.host(
                lambda x, i=i: (release.wait(10), order.append(i)), [(a.view(), hrx.Access.READ)]
            )
            graphs.append(graph.prepare())
        first = [graphs[0].submit(), graphs[1].submit()]
        stats_before = rt.statistics()
        with pytest.raises(hrx.Busy):
            graphs[2].submit_nowait()
        assert rt.statistics() == stats_before
        queued = [graphs[2].submit(), graphs[3].submit()]
        release.set()
        for completion in first + queued:
            await completion
        assert order == [0, 1, 2, 3]


async def test_host_mappings_conflict_with_submissions(hrx_backend: str) -> None:
    async with hrx.Runtime(backend=hrx_backend) as rt:
        host = rt.allocate(64, hrx.HOST_VISIBLE)
        device = rt.allocate(64, hrx.GPU_LOCAL)
        graph = rt.graph("up")
        graph.copy(device.view(), host.view(0, 64))
        upload = graph.prepare()
        writer = rt.graph("write-host")
        writer.fill(host.view(32, 32), 1)
        write_upper = writer.prepare()
        with host.view(0, 16).map_read_nowait() as memory:
            assert bytes(memory) == bytes(16)
            await upload.submit()  # reads do not conflict with a read mapping
            upper = write_upper.submit()  # disjoint bytes
            with pytest.raises(hrx.Busy):
                host.view(32, 32).map_write_nowait()
        with pytest.raises(hrx.Busy):
            host.map_write_nowait()  # the fill of the upper half is still pending
        await upper
        with host.map_write_nowait() as memory:
            with pytest.raises(hrx.Busy):
                upload.submit()
            memory[:] = bytes([2]) * 64
        await upload.submit()
        assert await read_bytes(rt, device) == bytes([2]) * 64
        with pytest.raises(hrx.Unsupported):
            device.map_read_nowait()
        with pytest.raises(hrx.Unsupported):
            async with device.map_write():
                pass


async def test_bad_input_is_rejected_and_changes_nothing(hrx_backend: str) -> None:
    async with hrx.Runtime(backend=hrx_backend, memory_budget=1024) as rt:
        a = rt.allocate(256, hrx.HOST_VISIBLE)
        graph = rt.graph("fill")
        graph.fill(a.view(), 1)
        prepared = graph.prepare()
        before = rt.statistics()
        with pytest.raises(hrx.BudgetExceeded):
            rt.allocate(2048, hrx.HOST_VISIBLE)
        big = rt.allocate(768, hrx.HOST_VISIBLE)
        with pytest.raises(hrx.Busy):
            rt.allocate(1, hrx.HOST_VISIBLE)
        big.free()
        after_free = rt.statistics()
        assert after_free.live_bytes == before.live_bytes
        assert after_free.allocations == before.allocations + 1
        before = after_free
        assert rt.memory_budget is not None and rt.memory_budget.reserved_bytes == 256
        with pytest.raises(hrx.ContractError):
            rt.allocate(0, hrx.HOST_VISIBLE)
        with pytest.raises(hrx.ContractError):
            rt.allocate(-5, hrx.HOST_VISIBLE)
        with pytest.raises(hrx.ContractError):
            rt.start_trace(0)
        rt.start_trace(8)
        with pytest.raises(hrx.Busy):
            rt.start_trace(8)
        assert rt.finish_trace() is not None
        assert rt.finish_trace() is None
        freed = rt.allocate(64, hrx.HOST_VISIBLE)
        g2 = rt.graph("freed")
        g2.fill(freed.view(), 1)
        p2 = g2.prepare()
        freed.free()
        with pytest.raises(hrx.ContractError, match="freed"):
            p2.submit()
        with pytest.raises(hrx.ContractError, match="freed"):
            freed.view()
        assert rt.statistics().live_bytes == before.live_bytes
        await prepared.submit()
    with pytest.raises(hrx.RuntimeClosed):
        prepared.submit()
    with pytest.raises(hrx.ContractError):
        hrx.Runtime(max_submissions=0)
    with pytest.raises(hrx.ContractError):
        hrx.Runtime(memory_budget=-1)


async def test_views_from_another_runtime_are_rejected(hrx_backend: str) -> None:
    async with hrx.Runtime(backend=hrx_backend) as one, hrx.Runtime(backend=hrx_backend) as two:
        foreign = two.allocate(16, hrx.HOST_VISIBLE)
        graph = one.graph("g")
        with pytest.raises(hrx.ContractError, match="another runtime"):
            graph.fill(foreign.view(), 1)
        assert len(graph) == 0
        assert not one.owns(foreign.view()) and two.owns(foreign)
        assert not one.same_domain(two)


async def test_a_runtime_owns_the_completions_of_its_own_submissions(hrx_backend: str) -> None:
    async with hrx.Runtime(backend=hrx_backend) as one, hrx.Runtime(backend=hrx_backend) as two:
        graph = two.graph("fill")
        graph.fill(two.allocate(16, hrx.HOST_VISIBLE).view(), 1)
        completion = graph.prepare().submit()
        assert two.owns(completion) and not one.owns(completion)
        await completion
        assert two.owns(completion)  # still its own once done


async def test_replay_allocates_nothing(hrx_backend: str) -> None:
    import tracemalloc

    async with hrx.Runtime(backend=hrx_backend) as rt:
        host = rt.allocate(4096, hrx.HOST_VISIBLE)
        device = rt.allocate(4096, hrx.GPU_LOCAL)
        kernel = load_mix(rt, 4096)
        out = rt.allocate(4096, hrx.GPU_LOCAL)
        graph = rt.graph("replay")
        graph.copy(device.view(), host.view())
        graph.gpu(kernel, [device.view(), out.view()])
        graph.copy(host.view(), out.view())
        prepared = graph.prepare()
        for _ in range(50):
            await prepared.submit()
        before = rt.statistics()
        for _ in range(1000):
            await prepared.submit()
        after = rt.statistics()
        assert (after.allocations, after.imports, after.live_bytes) == (
            before.allocations,
            before.imports,
            before.live_bytes,
        )
        tracemalloc.start()
        snapshot_before = tracemalloc.take_snapshot()
        for _ in range(10_000):
            await prepared.submit()
        growth = sum(
            stat.size_diff
            for stat in tracemalloc.take_snapshot().compare_to(snapshot_before, "filename")
        )
        tracemalloc.stop()
        assert growth < 256 * 1024, f"replay grew Python memory by {growth} bytes"


async def test_trace_records_each_region(hrx_backend: str) -> None:
    async with hrx.Runtime(backend=hrx_backend) as rt:
        host = rt.allocate(1024, hrx.HOST_VISIBLE)
        device = rt.allocate(1024, hrx.GPU_LOCAL)
        graph = rt.graph("updown")
        graph.copy(device.view(), host.view())
        graph.copy(host.view(), device.view())
        prepared = graph.prepare()
        rt.start_trace(3)
        for _ in range(3):
            await prepared.submit()
        trace = rt.finish_trace()
        assert trace is not None
        assert len(trace.events) == 3 and trace.dropped == 3
        assert {e.lane for e in trace.events} <= {hrx.Lane.UPLOAD, hrx.Lane.DOWNLOAD}
        assert all(e.copied_bytes == 1024 and not e.failed for e in trace.events)
        chrome = trace.to_chrome()
        assert chrome["dropped_events"] == 3


async def test_statistics_count_copies_per_lane(hrx_backend: str) -> None:
    async with hrx.Runtime(backend=hrx_backend) as rt:
        host = rt.allocate(100, hrx.HOST_VISIBLE)
        device = rt.allocate(100, hrx.GPU_LOCAL)
        other = rt.allocate(100, hrx.GPU_LOCAL)
        graph = rt.graph("copies")
        graph.copy(device.view(), host.view())
        graph.copy(other.view(), device.view())
        graph.copy(host.view(0, 50), other.view(0, 50))
        before = rt.statistics()
        await graph.prepare().submit()
        after = rt.statistics()
        assert after.uploaded_bytes - before.uploaded_bytes == 100
        assert after.device_copied_bytes - before.device_copied_bytes == 100
        assert after.downloaded_bytes - before.downloaded_bytes == 50
        assert after.copied_bytes - before.copied_bytes == 250
        assert list(after.to_dict())[:3] == [
            "native_graphs_prepared",
            "copy_streams_created",
            "allocations",
        ]


async def test_completion_wait_from_another_thread_and_profile(hrx_backend: str) -> None:
    async with hrx.Runtime(backend=hrx_backend) as rt:
        a = rt.allocate(16, hrx.HOST_VISIBLE)
        release = threading.Event()
        graph = rt.graph("slow")
        graph.host(lambda x: release.wait(10), [(a.view(), hrx.Access.WRITE)])
        completion = graph.prepare().submit()
        assert await anyio.to_thread.run_sync(completion.wait, 0.01) is False
        assert not completion.done()
        with pytest.raises(hrx.Busy):
            completion.result()
        release.set()
        assert await anyio.to_thread.run_sync(completion.wait, 10) is True
        await completion
        profile = completion.profile
        assert profile.elapsed_us >= (profile.queue_us or 0) >= 0
        assert completion.finished_at is not None


async def test_async_host_function_runs_on_the_loop(hrx_backend: str) -> None:
    async with hrx.Runtime(backend=hrx_backend) as rt:
        a = rt.allocate(8, hrx.HOST_VISIBLE)

        async def fill_later(array: np.ndarray) -> None:
            await anyio.sleep(0.001)
            array[:] = 6

        graph = rt.graph("async-host")
        graph.host(fill_later, [(a.view(), hrx.Access.WRITE)])
        await graph.prepare().submit()
        assert await read_bytes(rt, a) == bytes([6]) * 8
        await write_bytes(a, bytes(8))


async def test_submit_from_another_thread_is_refused(hrx_backend: str) -> None:
    async with hrx.Runtime(backend=hrx_backend) as rt:
        a = rt.allocate(8, hrx.HOST_VISIBLE)
        graph = rt.graph("fill")
        graph.fill(a.view(), 1)
        prepared = graph.prepare()
        before = rt.statistics()
        with pytest.raises(hrx.ContractError, match="thread"):
            await anyio.to_thread.run_sync(prepared.submit)
        assert rt.statistics() == before
        await anyio.to_thread.run_sync(anyio.from_thread.run_sync, prepared.submit)
        await rt.drain()
        assert await read_bytes(rt, a) == bytes([1]) * 8
