"""Regression tests of the ordering, failure and poison rules, one scenario each.

* A skipped region (cancelled, or after a failed region of its submission) counts as
  finished for what follows it only once everything it follows has finished.
* A queued submission that is the first to use a lane still runs.
* An `async def` host function that raises a BaseException settles its completion.
* Poison is cleared only by a whole overwrite that ran, whenever it was submitted; a
  failure in one part of a buffer does not refuse reads of another part.
* An `async def` host function may submit and await work that does not depend on it;
  awaiting work that does is refused at once.
* `after=` takes only completions of the same runtime.

Every host function and kernel logs its start and end with one shared counter, so
"ran before" and "overlapped" are exact, not timing guesses.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import anyio
import numpy as np
import pytest

import hrx_async as hrx
from hrx_async.errors import (
    Cancelled,
    ContractError,
    DependencyFailed,
    ExecutionError,
    PoisonedError,
)

pytestmark = pytest.mark.anyio

N = 16


class Log:
    """Start and end marks of named operations, totally ordered across threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counter = itertools.count()
        self.marks: dict[str, list[int]] = {}

    def mark(self, name: str) -> None:
        with self._lock:
            self.marks.setdefault(name, []).append(next(self._counter))

    def before(self, first: str, second: str) -> bool:
        """`first` ended before `second` started."""
        return self.marks[first][1] < self.marks[second][0]

    def ran(self, name: str) -> bool:
        return name in self.marks


def slow_writer(log: Log, name: str, value: int, seconds: float = 0.05) -> Any:
    """A sync host function (or sim kernel body) that writes `value` slowly."""

    def body(*arrays: np.ndarray) -> None:
        log.mark(name)
        time.sleep(seconds)
        arrays[-1][:] = value
        log.mark(name)

    return body


def gpu_writer(rt: hrx.Runtime, log: Log, name: str, value: int, seconds: float) -> hrx.GpuKernel:
    contract = hrx.KernelContract([hrx.Binding(N, hrx.Access.WRITE)])
    body = slow_writer(log, name, value, seconds)

    def kernel(arrays: list[np.ndarray], constants: bytes) -> None:
        body(*arrays)

    return rt.load_gpu_kernel(hrx.KernelSource(host=kernel), name, (1,), (1,), contract)


async def read(buffer: hrx.Buffer) -> bytes:
    async with buffer.map_read() as memory:
        return bytes(memory)


async def test_cancelled_middle_region_keeps_the_outer_two_in_order() -> None:
    log = Log()
    async with hrx.Runtime(backend="sim") as rt:
        h = rt.allocate(N, hrx.HOST_VISIBLE)
        src = rt.allocate(N, hrx.HOST_VISIBLE)
        g = rt.graph("W")
        g.gpu(gpu_writer(rt, log, "W", 1, 0.1), [h.view()])
        w = g.prepare().submit()
        g = rt.graph("X")
        g.copy(h.view(), src.view())
        x = g.prepare().submit()
        x.cancel()
        g = rt.graph("Y")
        g.host(slow_writer(log, "Y", 3, 0.0), [(h.view(), hrx.Access.WRITE)])
        y = g.prepare().submit()
        await w
        with pytest.raises(Cancelled):
            await x
        await y
        assert log.before("W", "Y")
        assert await read(h) == bytes([3]) * N


async def test_region_skipped_after_its_own_failure_keeps_order() -> None:
    log = Log()

    def broken(*arrays: np.ndarray) -> None:
        raise RuntimeError("injected")

    async with hrx.Runtime(backend="sim") as rt:
        h = rt.allocate(N, hrx.HOST_VISIBLE)
        other = rt.allocate(N, hrx.HOST_VISIBLE)
        g = rt.graph("W")
        g.gpu(gpu_writer(rt, log, "W", 1, 0.1), [h.view()])
        w = g.prepare().submit()
        g = rt.graph("X")
        g.host(broken, [(other.view(), hrx.Access.WRITE)])
        g.fill(h.view(), 2)  # skipped: the region before it failed
        x = g.prepare().submit()
        g = rt.graph("Y")
        g.host(slow_writer(log, "Y", 3, 0.0), [(h.view(), hrx.Access.WRITE)])
        y = g.prepare().submit()
        await w
        with pytest.raises(ExecutionError):
            await x
        await y
        assert log.before("W", "Y")
        assert await read(h) == bytes([3]) * N


async def test_cancelled_submission_waiting_for_admission_keeps_order() -> None:
    log = Log()
    async with hrx.Runtime(backend="sim", max_submissions=1) as rt:
        h = rt.allocate(N, hrx.HOST_VISIBLE)
        g = rt.graph("W")
        g.gpu(gpu_writer(rt, log, "W", 1, 0.1), [h.view()])
        w = g.prepare().submit()
        g = rt.graph("X")
        g.fill(h.view(), 2)
        x = g.prepare().submit()  # waits for admission
        x.cancel()
        g = rt.graph("Y")
        g.host(slow_writer(log, "Y", 3, 0.0), [(h.view(), hrx.Access.WRITE)])
        y = g.prepare().submit()
        await w
        with pytest.raises(Cancelled):
            await x
        await y
        assert log.before("W", "Y")
        assert await read(h) == bytes([3]) * N


async def test_skip_after_a_cancelled_after_link_waits_for_that_link() -> None:
    log = Log()
    async with hrx.Runtime(backend="sim") as rt:
        h = rt.allocate(N, hrx.HOST_VISIBLE)
        gate = rt.allocate(N, hrx.HOST_VISIBLE)
        g = rt.graph("W")
        g.gpu(gpu_writer(rt, log, "W", 1, 0.1), [gate.view()])
        w = g.prepare().submit()
        g = rt.graph("X")
        g.fill(h.view(), 2)
        x = g.prepare().submit(after=[w])
        x.cancel()
        g = rt.graph("Y")
        g.host(slow_writer(log, "Y", 3, 0.0), [(h.view(), hrx.Access.WRITE)])
        y = g.prepare().submit()
        await y
        # Y follows X (same bytes), X follows W (after=): Y may not overtake W.
        assert log.before("W", "Y")
        with pytest.raises(Cancelled):
            await x
        await w


@pytest.mark.parametrize("limit", [1, 64])
async def test_queued_submission_first_on_its_lane_runs(limit: int) -> None:
    ran: list[str] = []
    async with hrx.Runtime(backend="sim", max_submissions=limit) as rt:
        fills = []
        for i in range(limit):
            b = rt.allocate(N, hrx.HOST_VISIBLE)
            g = rt.graph(f"fill{i}")
            g.fill(b.view(), i)
            fills.append(g.prepare().submit())
        host_buffer = rt.allocate(N, hrx.HOST_VISIBLE)
        g = rt.graph("host")
        g.host(lambda a: ran.append("host"), [(host_buffer.view(), hrx.Access.WRITE)])
        host = g.prepare().submit()
        device = rt.allocate(N, hrx.GPU_LOCAL)
        g = rt.graph("download")
        g.copy(host_buffer.view(), device.view())
        download = g.prepare().submit()
        with anyio.fail_after(10):
            await host
            await download
            for c in fills:
                await c
    assert ran == ["host"]


class Stop(BaseException):
    """A BaseException that is not an Exception."""


async def test_async_host_function_raising_base_exception_settles() -> None:
    async def raises(a: np.ndarray) -> None:
        await anyio.sleep(0)
        raise Stop()

    with anyio.fail_after(10):
        async with hrx.Runtime(backend="sim") as rt:
            b = rt.allocate(N, hrx.HOST_VISIBLE)
            g = rt.graph("base")
            g.host(raises, [(b.view(), hrx.Access.WRITE)])
            c = g.prepare().submit()
            with pytest.raises(ExecutionError) as info:
                await c
            assert isinstance(info.value.__cause__, Stop)
            assert b.poison is not None
            # The runtime still works.
            g = rt.graph("after")
            g.fill(b.view(), 7)
            await g.prepare().submit()
            assert b.poison is None


def broken_host(*arrays: np.ndarray) -> None:
    raise RuntimeError("injected")


async def test_overwrite_submitted_before_a_failure_clears_it_when_it_runs() -> None:
    log = Log()
    async with hrx.Runtime(backend="sim") as rt:
        h = rt.allocate(N, hrx.HOST_VISIBLE)
        g = rt.graph("W")
        g.host(slow_writer(log, "W-start", 1, 0.05), [(h.view(), hrx.Access.WRITE)])
        g.host(broken_host, [(h.view(), hrx.Access.WRITE)])
        w = g.prepare().submit()
        g = rt.graph("V")
        g.fill(h.view(), 9)
        v = g.prepare().submit()
        with pytest.raises(ExecutionError):
            await w
        await v
        assert h.poison is None
        assert await read(h) == bytes([9]) * N


async def test_cancelled_overwrite_clears_nothing() -> None:
    async with hrx.Runtime(backend="sim") as rt:
        h = rt.allocate(N, hrx.HOST_VISIBLE)
        gate = rt.allocate(N, hrx.HOST_VISIBLE)
        g = rt.graph("fail")
        g.host(broken_host, [(h.view(), hrx.Access.WRITE)])
        with pytest.raises(ExecutionError):
            await g.prepare().submit()
        assert h.poison is not None
        log = Log()
        g = rt.graph("slow")
        g.host(slow_writer(log, "slow", 1, 0.05), [(gate.view(), hrx.Access.WRITE)])
        slow = g.prepare().submit()
        g = rt.graph("V")
        g.host(lambda a, b: None, [(gate.view(), hrx.Access.READ), (h.view(), hrx.Access.WRITE)])
        v = g.prepare().submit()
        v.cancel()
        with pytest.raises(Cancelled):
            await v
        await slow
        assert h.poison is not None
        with pytest.raises(PoisonedError):
            await read(h)


async def test_refused_overwrite_clears_nothing() -> None:
    async with hrx.Runtime(backend="sim") as rt:
        h = rt.allocate(N, hrx.HOST_VISIBLE)
        other = rt.allocate(N, hrx.HOST_VISIBLE)
        g = rt.graph("fail")
        g.host(broken_host, [(h.view(), hrx.Access.WRITE)])
        with pytest.raises(ExecutionError):
            await g.prepare().submit()
        g = rt.graph("A")
        g.host(broken_host, [(other.view(), hrx.Access.WRITE)])
        a = g.prepare().submit()
        g = rt.graph("V")
        g.fill(h.view(), 5)
        v = g.prepare().submit(after=[a])  # refused: what it follows failed
        with pytest.raises(ExecutionError):
            await a
        with pytest.raises(DependencyFailed):
            await v
        assert h.poison is not None


async def test_poison_is_per_byte_range() -> None:
    async with hrx.Runtime(backend="sim") as rt:
        h = rt.allocate(N, hrx.HOST_VISIBLE)
        g = rt.graph("fail")
        g.host(broken_host, [(h.view(8, 8), hrx.Access.WRITE)])
        with pytest.raises(ExecutionError):
            await g.prepare().submit()
        out = rt.allocate(N, hrx.HOST_VISIBLE)
        g = rt.graph("clean part")
        g.copy(out.view(0, 8), h.view(0, 8))
        await g.prepare().submit()
        g = rt.graph("poisoned part")
        g.copy(out.view(8, 8), h.view(4, 8))
        with pytest.raises(PoisonedError):
            g.prepare().submit()


async def test_skipped_writer_passes_the_poison_under_it_on() -> None:
    log = Log()
    async with hrx.Runtime(backend="sim") as rt:
        h = rt.allocate(N, hrx.HOST_VISIBLE)
        src = rt.allocate(N, hrx.HOST_VISIBLE)
        out = rt.allocate(N, hrx.HOST_VISIBLE)
        g = rt.graph("W")
        g.host(slow_writer(log, "W", 1, 0.05), [(h.view(0, 8), hrx.Access.WRITE)])
        g.host(broken_host, [(h.view(0, 8), hrx.Access.WRITE)])
        w = g.prepare().submit()
        g = rt.graph("X")
        g.copy(h.view(0, 8), src.view(0, 8))
        x = g.prepare().submit()
        x.cancel()
        g = rt.graph("R")
        g.copy(out.view(0, 4), h.view(0, 4))
        r = g.prepare().submit()
        with pytest.raises(ExecutionError):
            await w
        with pytest.raises(Cancelled):
            await x
        with pytest.raises(PoisonedError):
            await r
        assert out.poison is not None


async def test_host_function_awaits_independent_work_it_submits() -> None:
    async with hrx.Runtime(backend="sim") as rt:
        a = rt.allocate(N, hrx.HOST_VISIBLE)
        b = rt.allocate(N, hrx.HOST_VISIBLE)
        g = rt.graph("inner")
        g.host(lambda x: x.fill(4), [(b.view(), hrx.Access.WRITE)])
        inner = g.prepare()

        async def outer(x: np.ndarray) -> None:
            await inner.submit()
            x[:] = 2

        g = rt.graph("outer")
        g.host(outer, [(a.view(), hrx.Access.WRITE)])
        with anyio.fail_after(10):
            await g.prepare().submit()
        assert await read(a) == bytes([2]) * N
        assert await read(b) == bytes([4]) * N


async def test_host_function_awaiting_work_that_waits_for_it_is_refused() -> None:
    seen: list[BaseException] = []
    async with hrx.Runtime(backend="sim") as rt:
        a = rt.allocate(N, hrx.HOST_VISIBLE)
        g = rt.graph("inner")
        g.host(lambda x: x.fill(4), [(a.view(), hrx.Access.WRITE)])
        inner = g.prepare()

        async def outer(x: np.ndarray) -> None:
            c = inner.submit()  # follows `outer` (same bytes): fine to submit
            try:
                await c
            except ContractError as exc:
                seen.append(exc)
            x[:] = 2

        g = rt.graph("outer")
        g.host(outer, [(a.view(), hrx.Access.WRITE)])
        with anyio.fail_after(10):
            await g.prepare().submit()
            await rt.drain()
        assert len(seen) == 1
        assert await read(a) == bytes([4]) * N  # inner ran after outer


async def test_after_refuses_a_completion_of_another_runtime() -> None:
    async with hrx.Runtime(backend="sim") as one, hrx.Runtime(backend="sim") as two:
        b1 = one.allocate(N, hrx.HOST_VISIBLE)
        b2 = two.allocate(N, hrx.HOST_VISIBLE)
        g = one.graph("one")
        g.fill(b1.view(), 1)
        c1 = g.prepare().submit()
        g = two.graph("two")
        g.fill(b2.view(), 2)
        p2 = g.prepare()
        submissions = two.statistics().to_dict()["submissions"]
        with pytest.raises(ContractError):
            p2.submit(after=[c1])
        with pytest.raises(ContractError):
            p2.submit(after=5)  # type: ignore[arg-type]
        assert two.statistics().to_dict()["submissions"] == submissions
        await c1


async def test_host_function_draining_its_own_runtime_is_refused() -> None:
    seen: list[BaseException] = []
    async with hrx.Runtime(backend="sim") as rt:
        a = rt.allocate(N, hrx.HOST_VISIBLE)

        async def outer(x: np.ndarray) -> None:
            try:
                await rt.drain()
            except ContractError as exc:
                seen.append(exc)

        g = rt.graph("outer")
        g.host(outer, [(a.view(), hrx.Access.WRITE)])
        with anyio.fail_after(10):
            await g.prepare().submit()
        assert len(seen) == 1


async def test_two_tasks_draining_at_once_both_return() -> None:
    log = Log()
    async with hrx.Runtime(backend="sim") as rt:
        h = rt.allocate(N, hrx.HOST_VISIBLE)
        g = rt.graph("slow")
        g.host(slow_writer(log, "slow", 1, 0.05), [(h.view(), hrx.Access.WRITE)])
        g.prepare().submit()
        done: list[int] = []

        async def drainer(i: int) -> None:
            await rt.drain()
            done.append(i)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(drainer, 1)
                tg.start_soon(drainer, 2)
        assert sorted(done) == [1, 2]


async def test_whole_write_mapping_cancelled_while_waiting_clears_nothing() -> None:
    log = Log()
    async with hrx.Runtime(backend="sim") as rt:
        h = rt.allocate(N, hrx.HOST_VISIBLE)
        g = rt.graph("fail")
        g.host(broken_host, [(h.view(), hrx.Access.WRITE)])
        with pytest.raises(ExecutionError):
            await g.prepare().submit()
        g = rt.graph("slow partial writer")
        g.host(slow_writer(log, "slow", 1, 0.2), [(h.view(0, 1), hrx.Access.WRITE)])
        g.prepare().submit()
        with anyio.move_on_after(0.01):
            async with h.map_write():
                pytest.fail("the mapping should still be waiting")
        assert h.poison is not None
        await rt.drain()
        async with h.map_write() as memory:  # handed out: it overwrites everything
            memory[:] = bytes(N)
        assert h.poison is None


async def test_plain_host_function_waits_for_an_async_one_it_follows() -> None:
    log = Log()
    async with hrx.Runtime(backend="sim") as rt:
        buf = rt.allocate(2 * N, hrx.HOST_VISIBLE)

        async def first(a: np.ndarray) -> None:
            log.mark("first")
            await anyio.sleep(0.02)
            a[:] = 1
            log.mark("first")

        def second(a: np.ndarray, b: np.ndarray) -> None:
            log.mark("second")
            b[:] = a
            log.mark("second")

        g = rt.graph("g")
        g.host(first, [(buf.view(0, N), hrx.Access.WRITE)])
        g.host(second, [(buf.view(0, N), hrx.Access.READ), (buf.view(N, N), hrx.Access.WRITE)])
        await g.prepare().submit()
        assert log.before("first", "second")
        assert await read(buf) == bytes([1]) * (2 * N)


async def test_cancelled_waiting_submissions_do_not_hold_admission_places() -> None:
    async with hrx.Runtime(backend="sim", max_submissions=1) as rt:
        h = rt.allocate(N, hrx.HOST_VISIBLE)

        def fill_graph(value: int) -> hrx.PreparedGraph:
            g = rt.graph(f"fill{value}")
            g.fill(h.view(), value)
            return g.prepare()

        first = fill_graph(1).submit()
        second = fill_graph(2).submit()  # waits for admission
        third = fill_graph(3).submit()  # waits too; follows `second` (same bytes)
        third.cancel()  # settles after `second`, which still needs a place
        with anyio.fail_after(10):
            await first
            await second
            with pytest.raises(Cancelled):
                await third
        assert await read(h) == bytes([2]) * N


async def test_submit_does_not_refuse_bytes_an_admitted_overwrite_will_clear() -> None:
    log = Log()
    async with hrx.Runtime(backend="sim") as rt:
        h = rt.allocate(N, hrx.HOST_VISIBLE)
        gate = rt.allocate(N, hrx.HOST_VISIBLE)
        out = rt.allocate(N, hrx.HOST_VISIBLE)
        g = rt.graph("fail")
        g.host(broken_host, [(h.view(), hrx.Access.WRITE)])
        with pytest.raises(ExecutionError):
            await g.prepare().submit()
        g = rt.graph("slow")
        g.host(slow_writer(log, "slow", 1, 0.05), [(gate.view(), hrx.Access.WRITE)])
        g.prepare().submit()
        g = rt.graph("overwrite")  # waits for `slow`, then writes all of h
        g.host(
            lambda a, b: b.fill(7),
            [(gate.view(), hrx.Access.READ), (h.view(), hrx.Access.WRITE)],
        )
        overwrite = g.prepare().submit()
        g = rt.graph("partial")  # a later writer of part of h: the overwrite is no longer last
        g.fill(h.view(0, 4), 9)
        partial = g.prepare().submit()
        g = rt.graph("reader")
        g.copy(out.view(), h.view())
        reader = g.prepare().submit()  # not refused: the overwrite clears h before it
        await overwrite
        await partial
        await reader
        assert await read(out) == bytes([9] * 4 + [7] * (N - 4))


async def test_a_region_reading_bytes_it_overwrote_itself_is_not_refused() -> None:
    async with hrx.Runtime(backend="sim") as rt:
        h = rt.allocate(N, hrx.HOST_VISIBLE)
        out = rt.allocate(N, hrx.HOST_VISIBLE)
        g = rt.graph("fail")
        g.host(broken_host, [(h.view(), hrx.Access.WRITE)])
        with pytest.raises(ExecutionError):
            await g.prepare().submit()
        g = rt.graph("refill then read")  # one region: the fill defines what the copy reads
        g.fill(h.view(), 5)
        g.copy(out.view(), h.view())
        await g.prepare().submit()
        assert h.poison is None and out.poison is None
        assert await read(out) == bytes([5]) * N
