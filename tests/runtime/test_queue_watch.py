"""The watch's spin near the expected end of the work: when it spins, and when it stops.

`QueueWatch` is driven directly here, over queues that answer sweeps from a script (what a
stream queue answers: fences finished, whether any remain), so each rule is checked
without depending on how fast this machine runs a loop pass.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import trio

from hrx_async._core.clock import perf_counter
from hrx_async._runtime.watch import (
    SPIN_AHEAD_S,
    SPIN_PASS_S,
    SPIN_PASS_TRIO_S,
    SPIN_REGION_S,
    SPIN_S,
    QueueWatch,
)
from hrx_async.backends.watched import WatchedQueue
from hrx_async.backends.worker import ThreadFence


class ScriptedQueue(WatchedQueue):
    """A watched queue whose work finishes at the `finish_at`-th sweep (never if None)."""

    def __init__(self, finish_at: int | None) -> None:
        super().__init__()
        self.finish_at = finish_at
        self.sweeps = 0
        self.watching = False

    def submit(self, program: Any, waits: Any, preflight: Any) -> ThreadFence:
        return ThreadFence()

    def watch(self) -> None:
        self.watching = True

    def unwatch(self) -> None:
        self.watching = False

    def sweep(self, limit: int) -> tuple[int, bool]:
        self.sweeps += 1
        if self.finish_at is not None and self.sweeps >= self.finish_at:
            return 1, False
        return 0, True


class Pending:
    """What the awaiting task's submission tells the spin: regions still unfinished."""

    def __init__(self) -> None:
        self.remaining = 1


LONG_S = 2 * SPIN_REGION_S
"""A region long enough to spin for."""


def launched(
    queue: ScriptedQueue,
    expected: float = LONG_S,
    ago: float = LONG_S,
    loop: asyncio.AbstractEventLoop | None = None,
) -> QueueWatch:
    """A watch of an idle loop with `queue`'s one region launched `ago` seconds ago,
    expected to take `expected` seconds (by default: a long region, due now)."""
    watch = QueueWatch(loop)
    watch.launch(queue, 30.0, None, (), None, expected, perf_counter() - ago)
    watch.pass_cost = SPIN_PASS_S / 2  # passes of an idle loop
    return watch


def test_a_spin_near_the_end_stops_at_the_first_fence_it_finishes() -> None:
    queue = ScriptedQueue(finish_at=5)
    watch = launched(queue)
    watch.spin_near_end(Pending())
    assert queue.sweeps == 5  # it kept sweeping without yielding until the work finished
    assert not watch.watched and not queue.watching
    assert not watch.ends  # the finished region's expected end is gone with it


def test_no_spin_long_before_the_expected_end() -> None:
    queue = ScriptedQueue(finish_at=1)
    watch = launched(queue, expected=10.0, ago=0.0)
    watch.spin_near_end(Pending())
    assert queue.sweeps == 0  # a pass of the loop comes long before the work can end


def test_no_spin_for_a_short_region() -> None:
    queue = ScriptedQueue(finish_at=1)
    watch = launched(queue, expected=SPIN_REGION_S / 10, ago=1.0)
    watch.spin_near_end(Pending())
    assert queue.sweeps == 0  # its end is noticed within a pass or two anyway


def test_no_spin_with_more_than_one_region_in_flight() -> None:
    first, second = ScriptedQueue(finish_at=1), ScriptedQueue(finish_at=1)
    watch = launched(first)
    watch.launch(second, 30.0, None, (), None, LONG_S, perf_counter() - LONG_S)
    watch.spin_near_end(Pending())
    assert first.sweeps == second.sweeps == 0  # a pipeline's passes keep its host work going


def test_no_spin_on_a_busy_loop() -> None:
    queue = ScriptedQueue(finish_at=1)
    watch = launched(queue)
    watch.pass_cost = watch.idle_pass_s * 2  # passes that run other tasks too
    watch.spin_near_end(Pending())
    assert queue.sweeps == 0


def test_no_spin_while_an_asyncio_callback_is_ready() -> None:
    for other_callback in (True, False):
        loop = asyncio.new_event_loop()
        try:
            queue = ScriptedQueue(finish_at=1)
            watch = launched(queue, loop=loop)
            assert watch.tick_scheduled  # the launch scheduled the watch's tick
            if other_callback:
                loop.call_soon(lambda: None)
            watch.spin_near_end(Pending())
            # Another callback would wait for the spin; the tick may (a spin does its work).
            assert queue.sweeps == (0 if other_callback else 1)
        finally:
            loop.close()


def test_a_spin_that_finishes_nothing_ends_within_its_bound() -> None:
    queue = ScriptedQueue(finish_at=None)
    watch = launched(queue)
    started = time.perf_counter()
    watch.spin_near_end(Pending())
    elapsed = time.perf_counter() - started
    assert queue.sweeps > 1
    assert watch.watched  # still unfinished: the loop's passes (or its waiter) go on
    # A bound, not a timing: a spin that ignored SPIN_S would never return.
    assert elapsed < SPIN_S + 1.0
    assert watch.spun > 0  # the next pass leaves the spin out of the loop's pass cost


def test_a_new_watch_forgets_the_ends_of_work_finished_unwatched() -> None:
    queue = ScriptedQueue(finish_at=None)
    watch = launched(queue)
    watch.watched.clear()  # handed back: a waiter thread finishes it, the loop never hears
    queue.unwatch()
    later = ScriptedQueue(finish_at=1)
    watch.launch(later, 30.0, None, (), None, 10.0, perf_counter())
    assert list(watch.ends) == [watch.ends[0]] and watch.ends[0] > perf_counter() + 5
    watch.spin_near_end(Pending())
    assert later.sweeps == 0  # the stale end of the first region does not start a spin


def test_a_spin_starts_within_one_pass_of_the_end_when_passes_are_long() -> None:
    # A trio watch whose idle passes are slow (as on a slow CPU): the end comes sooner than
    # the next pass would, though later than SPIN_AHEAD_S from now.
    pass_s = SPIN_PASS_TRIO_S * 0.9
    assert pass_s > 3 * SPIN_AHEAD_S
    queue = ScriptedQueue(finish_at=1)
    watch = launched(queue, expected=LONG_S, ago=LONG_S - pass_s * 0.8)
    watch.pass_cost = pass_s
    watch.spin_near_end(Pending())
    assert queue.sweeps == 1  # spun, and the first sweep finished the region


def test_the_idle_pass_bound_is_the_loops_own() -> None:
    assert QueueWatch(None).idle_pass_s == SPIN_PASS_TRIO_S  # trio
    loop = asyncio.new_event_loop()
    try:
        assert QueueWatch(loop).idle_pass_s == SPIN_PASS_S
    finally:
        loop.close()


def test_no_spin_on_trio_while_another_task_is_runnable() -> None:
    sweeps: list[int] = []

    async def main() -> None:
        for other_task in (True, False):
            queue = ScriptedQueue(finish_at=1)
            watch = launched(queue)
            watch.statistics = trio.lowlevel.current_statistics
            async with trio.open_nursery() as nursery:
                if other_task:
                    nursery.start_soon(trio.lowlevel.checkpoint)  # runnable, not run yet
                watch.spin_near_end(Pending())
                sweeps.append(queue.sweeps)

    trio.run(main)
    assert sweeps == [0, 1]
