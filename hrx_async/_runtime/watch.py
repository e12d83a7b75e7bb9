"""Watching GPU streams from the event loop.

Queues of backends with a poll budget (the GPU streams) are *watched*: the loop
sweeps them once per iteration (and the awaiting task once before it suspends),
so a completion costs no thread hop and no contention for the interpreter lock.
All the sweeps of one loop pass share one budget of `SWEEP_LIMIT` fences, so the
pass stays short however many tasks await. A watched queue is handed back to its
own waiter thread only when the loop has nothing else to do and the work is
overdue: beyond the region's usual duration plus the budget, at most `POLL_CAP_S`.
On asyncio the per-iteration sweep is a plain loop callback (the tick); on trio it
is a task (`serve`), parked while nothing is watched or a task leads. Waking it is a
bare `trio.lowlevel.reschedule` and is skipped while a task leads (that task's
`release` wakes it if work is left), because each wake costs the loop a task step.

A task awaiting one long region alone (nothing else launched is unfinished, the region's
learned duration at least `SPIN_REGION_S`) keeps sweeping without yielding close to the
moment the region is expected to end (`spin_near_end`), for at most `SPIN_S`, and only
while the loop runs nothing else (its passes short; no other callback ready on asyncio, no
other task runnable on trio): on an idle loop a pass would only come back to the same
sweep, a loop iteration later, so the end is noticed within a query instead of within a
pass. A spin stops at the first fence it finishes. Measured on an H200, this took a
~200 µs region's detection from one loop pass after its end to one query; spinning for
short regions (a 1-node fill) or with several in flight (a pipeline) cost more than it
saved, so neither spins.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

import anyio

from .._core.clock import perf_counter
from ..backends.watched import WatchedQueue

if TYPE_CHECKING:
    from ..backends.base import Fence

POLL_CAP_S: Final = 0.001
"""The longest an otherwise idle loop sweeps a queue for one region before handing it back."""
IDLE_GAP_S: Final = 100e-6
"""Loop iterations this close together (smoothed) mean the loop only spins for fences."""
SPIN_REGION_S: Final = 50e-6
"""The shortest learned duration of a region whose end an awaiting task spins for."""
SPIN_AHEAD_S: Final = 6e-6
"""How close to the region's expected end, less one loop pass, an awaiting task starts
spinning (the expected end is learned from when ends were noticed: up to a pass late)."""
SPIN_S: Final = 20e-6
"""The longest one spin lasts: it holds the loop, idle though the loop is."""
SPIN_PASS_S: Final = 15e-6
"""Loop passes this short (smoothed, spins left out) are passes of an idle loop: nothing
but the awaiting task runs, which a spin then holds back from nothing."""
SPIN_PASS_TRIO_S: Final = 30e-6
"""The same on trio, whose run loop does about twice the Python per pass of asyncio's (an
idle pass took 6-14 µs on the H200, asyncio's 4)."""
SWEEP_LIMIT = 16
"""The most fences one loop pass finishes: each wakes a task that runs in the next pass,
and a bounded pass keeps the loop responsive to everything else."""
ENDS_KEPT: Final = 4 * SWEEP_LIMIT
"""The most expected ends the watch keeps (`QueueWatch.ends`): only the first is read."""


class QueueWatch:
    """The watched queues of one scheduler and the loop's sweep over them."""

    def __init__(self, asyncio_loop: asyncio.AbstractEventLoop | None) -> None:
        self.asyncio_loop = asyncio_loop
        self.watched: dict[WatchedQueue, None] = {}
        """Watched queues, in the order they started being watched (each keeps the time
        until which an idle loop keeps sweeping it: `WatchedQueue.watch_deadline`)."""
        self.last_sweep = 0.0
        self.sweep_gap = POLL_CAP_S
        self.pass_cost = POLL_CAP_S
        """Smoothed time between loop passes, less the spins in them (`spin_near_end`)."""
        self.spun = 0.0
        """Seconds spun since the current pass began."""
        self.ends: list[float] = []
        """When each region launched to the watched queues is expected to end, oldest
        first, one taken off per fence finished (they finish about in launch order), the
        latest `ENDS_KEPT` at most. (A list: compiled, a deque's every call is generic.)"""
        self.last_launch = 0.0
        """When the region launched last was issued (the caller's clock reading)."""
        self.ready: Any = None
        """asyncio: the loop's queue of ready callbacks, where it has one (a spin must not
        hold back a ready callback)."""
        self.statistics: Callable[[], Any] | None = None
        """trio: `trio.lowlevel.current_statistics`, set when the watcher starts (a spin
        must not hold back a runnable task)."""
        self.idle_pass_s = SPIN_PASS_S if asyncio_loop is not None else SPIN_PASS_TRIO_S
        """The longest smoothed pass of an idle loop, on this loop."""
        if asyncio_loop is not None:
            ready = getattr(asyncio_loop, "_ready", None)
            if isinstance(ready, collections.deque):
                self.ready = ready
        self.sweep_budget = SWEEP_LIMIT
        """Fences the current loop pass may still finish."""
        self.leader = False
        """True while a task awaiting a completion sweeps in place of the tick."""
        self.tick_scheduled = False
        self.watcher: Any = None
        """trio: the watcher task while it is parked (`serve`), to be rescheduled once."""
        self.reschedule: Callable[[Any, Any], None] | None = None
        """trio: `trio.lowlevel.reschedule`, set when the watcher starts."""
        self.resumed: Any = None
        """trio: what the watcher is rescheduled with (`resumed.RESUMED`)."""
        self.closed = False

    def launch(
        self,
        queue: Any,
        budget_us: float,
        program: Any,
        waits: Sequence[Fence],
        preflight: Callable[[], BaseException | None] | None,
        expected: float,
        now: float,
    ) -> Fence:
        """Submit `program` to `queue`, then start watching the queue if it is a stream
        (`budget_us` > 0) for about `expected` seconds, the region's learned duration, from
        `now` (the caller's clock reading as it issued the region: one read per region).

        The launch comes first and the watch bookkeeping after it, which then overlaps
        the device's work instead of delaying it.
        """
        if budget_us <= 0:
            return queue.submit(program, waits, preflight)  # type: ignore[no-any-return]
        stream: WatchedQueue = queue  # (a provider with a poll budget makes only these)
        watched = self.watched
        newly_watched = stream.watch_deadline < 0.0
        if newly_watched:
            if not watched:
                self.ends.clear()  # nothing watched is unfinished
            stream.watch()  # so its waiter never starts on this fence
            try:
                fence = stream.submit(program, waits, preflight)
            except BaseException:
                stream.unwatch()
                raise
        else:
            fence = stream.submit(program, waits, preflight)
        ends = self.ends
        ends.append(now + expected)
        if len(ends) > ENDS_KEPT:
            del ends[0]
        self.last_launch = now
        # An idle loop keeps sweeping until the region is overdue (see sweep).
        deadline = now + min(POLL_CAP_S, expected * 1.25 + budget_us * 1e-6)
        if newly_watched:
            stream.watch_deadline = deadline
            watched[stream] = None
            self.schedule_tick()
        elif deadline > stream.watch_deadline:
            stream.watch_deadline = deadline
        return fence

    def sweep(self, new_pass: bool) -> None:
        """Finish what completed on the watched queues, within this loop pass's budget.

        `new_pass` is once per loop iteration (the tick, the trio watcher or the leader):
        it refills the budget, updates the idleness gauge and hands overdue queues back
        to their waiters. The sweeps of tasks about to suspend spend what is left of it,
        so however many tasks await, one pass finishes at most `SWEEP_LIMIT` fences.

        A queue is handed back only while the loop is idle (iterations close together):
        a busy loop sweeps at no cost worth saving, and a thread could not finish
        anything sooner than the loop's next iteration anyway.
        """
        now = 0.0
        idle = False
        if new_pass:
            now = perf_counter()
            # Smoothed over a few iterations, so one quick pass of a busy loop is not idleness.
            gap = min(now - self.last_sweep, POLL_CAP_S)
            self.sweep_gap = 0.75 * self.sweep_gap + 0.25 * gap
            idle = self.sweep_gap < IDLE_GAP_S
            self.pass_cost = 0.75 * self.pass_cost + 0.25 * max(0.0, gap - self.spun)
            self.spun = 0.0
            self.last_sweep = now
            self.sweep_budget = SWEEP_LIMIT
        budget = self.sweep_budget
        if budget <= 0:
            return
        watched = self.watched
        if len(watched) == 1:
            # One queue (the usual case): no copy of the dictionary to walk. (A loop left
            # after its first turn: compiled, `next(iter(...))` is three generic calls.)
            for queue in watched:
                finished, remaining = queue.sweep(budget)
                budget -= finished
                if not remaining or (idle and now > queue.watch_deadline):
                    self._stop_watching(queue)
                break
        else:
            # The queue watched last first: work chained across queues is usually launched
            # in its order, and a fence finished downstream finishes what it waited for
            # upstream without a query there (a stream backend's fences prove what they
            # waited for).
            for queue in list(reversed(watched)):
                finished, remaining = queue.sweep(budget)
                budget -= finished
                if not remaining or (idle and now > queue.watch_deadline):
                    self._stop_watching(queue)
                if budget <= 0:
                    if queue in watched and len(watched) > 1:
                        # The others get the first turn next pass: it moves to the far end.
                        del watched[queue]
                        self.watched = {queue: None, **watched}
                    break
        finished = self.sweep_budget - budget
        if finished:
            self.sweep_budget = budget
            del self.ends[:finished]

    def _stop_watching(self, queue: WatchedQueue) -> None:
        """The one way a queue leaves the watch: its waiter takes over what is left."""
        del self.watched[queue]
        queue.watch_deadline = -1.0
        queue.unwatch()

    def spin_near_end(self, pending: Any) -> None:
        """Keep sweeping, without yielding, while `pending.remaining` regions of the caller's
        submission are unfinished, if one long region alone is unfinished, it is expected to
        end within `SPIN_AHEAD_S` and one loop pass and the loop runs nothing else (see the
        module's docstring); for at most `SPIN_S`, and only until the first fence finishes."""
        ends = self.ends
        if len(ends) != 1 or ends[0] - self.last_launch < SPIN_REGION_S:
            return
        pass_cost = self.pass_cost
        if pass_cost > self.idle_pass_s:
            return
        ready = self.ready
        if ready is not None and len(ready) > self.tick_scheduled:
            return  # (the watch's own tick may wait: a spin does its work)
        started = perf_counter()
        # The expected end is learned from when ends were noticed, up to a pass after they
        # came: a pass earlier is when this one may have come already.
        if started < ends[0] - SPIN_AHEAD_S - pass_cost:
            return
        statistics = self.statistics
        if statistics is not None:
            # Asked last, as it builds an object: once per pass near the end at most.
            found = statistics()
            if found.tasks_runnable or found.run_sync_soon_queue_size:
                return
        until = started + SPIN_S
        budget = self.sweep_budget
        now = started
        while now < until and budget > 0:
            self.sweep(False)
            if self.sweep_budget != budget or not pending.remaining or not self.watched:
                break
            now = perf_counter()
        self.spun += perf_counter() - started

    def schedule_tick(self) -> None:
        loop = self.asyncio_loop
        if loop is not None:
            if not self.tick_scheduled:
                self.tick_scheduled = True
                loop.call_soon(self._tick)
        elif self.watcher is not None and not self.leader:
            self._wake_watcher()

    def _wake_watcher(self) -> None:
        task, self.watcher = self.watcher, None
        assert self.reschedule is not None
        self.reschedule(task, self.resumed)

    def _tick(self) -> None:
        # asyncio: a plain callback per loop iteration is far cheaper than a task step.
        self.tick_scheduled = False
        if self.watched and not self.leader:
            self.sweep(True)
            if self.watched:
                self.tick_scheduled = True
                self.asyncio_loop.call_soon(self._tick)  # type: ignore[union-attr]

    async def serve(self) -> None:
        # trio: the same sweep from a task, one per loop iteration while anything is watched.
        # Parked and woken with trio's own primitives: an Event per wait costs several times
        # more, once per region that starts a watch.
        import trio.lowlevel as lowlevel  # trio is optional: imported only where it runs

        from .resumed import RESUMED

        task = lowlevel.current_task()
        self.resumed = RESUMED
        self.reschedule = lowlevel.reschedule
        self.statistics = lowlevel.current_statistics
        with anyio.CancelScope(shield=True):
            while not self.closed:
                if not self.watched or self.leader:
                    self.watcher = task
                    await lowlevel.wait_task_rescheduled(_stay_parked)
                    continue
                self.sweep(True)
                # The scope is shielded: trio's full checkpoint would only add a look at a
                # cancellation that cannot reach this task, on every loop pass.
                await lowlevel.cancel_shielded_checkpoint()

    def close(self) -> None:
        self.closed = True
        for queue in list(self.watched):
            self._stop_watching(queue)
        if self.watcher is not None:
            self._wake_watcher()


def _stay_parked(raise_cancel: Any) -> Any:
    # The watcher parks inside a shielded scope, so no cancellation reaches it; were one
    # to, it stays parked until `close` reschedules it.
    import trio.lowlevel

    return trio.lowlevel.Abort.FAILED
