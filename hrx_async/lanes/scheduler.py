"""Admission, lane tasks and region completion.

`Scheduler.submit` is synchronous: it checks the submission, registers each
region's byte ranges with the tracker (so ordering across submissions is per
byte range, in call order) and queues the regions on their lanes. Each lane is
one async task that takes its next region, waits for its dependencies (on the
device when producer and consumer share a backend, on the host otherwise),
issues it and moves on without waiting for the device. A region with nothing
to wait for, on an idle lane, is issued by `submit()` itself.

Fences come back through their callbacks: on a backend's thread they go
through the loop notifier, which finishes regions and submissions in batches.
Queues of backends with a poll budget (the GPU streams) are *watched*
instead: the loop sweeps them once per iteration (and the awaiting task once
before it suspends), so a completion costs no thread hop and no contention for
the interpreter lock. All the sweeps of one loop pass share one budget of
`SWEEP_LIMIT` fences, so the pass stays short however many tasks await. A
watched queue is handed back to its own waiter thread only when the loop has
nothing else to do and the work is overdue: beyond the region's usual duration
plus the budget, at most `POLL_CAP_S`.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from ..completion import Completion
from ..errors import (
    Busy,
    Cancelled,
    ContractError,
    DependencyFailed,
    DeviceLost,
    ExecutionError,
    HrxError,
    PoisonedError,
    RuntimeClosed,
)
from ..graph import Interval, RegionPlan
from ..stats import Counters
from ..trace import TraceEvent, TraceRecorder
from ..tracker import AccessTracker
from .host import AsyncHostProgram
from .lane import Lane
from .notify import LoopNotifier

if TYPE_CHECKING:
    from ..backends.base import Fence, LaneQueue
    from ..prepared import PreparedGraph, ReplayStep

QUEUED, ISSUED, DONE, FAILED, SKIPPED = range(5)
POLL_CAP_S = 0.001
"""The longest an otherwise idle loop sweeps a queue for one region before handing it back."""
IDLE_GAP_S = 100e-6
"""Loop iterations this close together (smoothed) mean the loop only spins for fences."""
SWEEP_LIMIT = 16
"""The most fences one loop pass finishes: each wakes a task that runs in the next pass,
and a bounded pass keeps the loop responsive to everything else."""


def _nothing_to_refuse() -> BaseException | None:
    """The preflight of a region launched before it had a submission: nothing can fail it."""
    return None


def is_sticky(error: BaseException) -> bool:
    """Errors after which the device can run nothing more."""
    return isinstance(error, DeviceLost) or bool(getattr(error, "sticky", False))


class RegionRun:
    """One region of one submission on its way through a lane."""

    __slots__ = (
        "deps",
        "done_waiters",
        "error",
        "estimates",
        "fence",
        "issued_waiters",
        "key",
        "plan",
        "program",
        "provider",
        "started_at",
        "state",
        "submission",
    )

    def __init__(
        self,
        submission: Submission,
        plan: RegionPlan,
        program: Any,
        provider: object,
        estimates: list[float],
        key: tuple[Lane, int],
    ) -> None:
        self.submission = submission
        self.plan = plan
        self.program = program
        self.provider = provider
        self.estimates = estimates
        self.key = key
        self.deps: Sequence[RegionRun] = ()
        self.state = QUEUED
        self.fence: Fence | None = None
        self.error: BaseException | None = None
        self.started_at: float | None = None
        self.issued_waiters: list[anyio.Event] | None = None
        self.done_waiters: list[anyio.Event] | None = None

    @property
    def finished(self) -> bool:
        return self.state >= DONE

    async def wait_issued(self) -> None:
        if self.state == QUEUED:
            event = anyio.Event()
            if self.issued_waiters is None:
                self.issued_waiters = []
            self.issued_waiters.append(event)
            await event.wait()

    async def wait_finished(self) -> None:
        if self.state < DONE:
            event = anyio.Event()
            if self.done_waiters is None:
                self.done_waiters = []
            self.done_waiters.append(event)
            await event.wait()

    def on_fence(self, fence: Any) -> None:
        if self.state >= DONE:
            return
        submission = self.submission
        error = fence.error()
        if error is not None:
            # Seen by later regions' preflight on worker threads before the loop hears of it.
            submission.device_error = error
        scheduler = submission.scheduler
        if threading.get_ident() == scheduler.loop_thread:
            scheduler.fence_done(self)  # a sweep of a watched queue, on the loop
        else:
            scheduler.notifier.post(scheduler.fence_done, self)

    def failure_of_dependencies(self) -> BaseException | None:
        """Why this region must not run, judged from its dependencies and its submission.

        Safe from worker threads: it reads fences, not loop-side state.
        """
        submission = self.submission
        if submission.error is not None or submission.device_error is not None:
            return DependencyFailed(f"not run: an earlier region of {submission.label!r} failed")
        if submission.cancelled:
            return Cancelled(f"submission of {submission.label!r} was cancelled")
        for dep in self.deps:
            fence = dep.fence
            cause = fence.error() if fence is not None and fence.query() else dep.error
            if cause is None:
                continue
            if dep.submission is submission:
                return DependencyFailed(f"not run: region {dep.plan.index} failed")
            buffer = _first_overlap(dep.plan.writes, self.plan.reads)
            if buffer is not None:
                return PoisonedError(buffer, cause)
        return None


def _first_overlap(writes: Sequence[Interval], reads: Sequence[Interval]) -> str | None:
    for w in writes:
        for r in reads:
            if w.buffer is r.buffer and w.start < r.end and r.start < w.end:
                return w.buffer.label
    return None


class Submission:
    """One `submit()` of a prepared graph."""

    __slots__ = (
        "after",
        "cancelled",
        "completion",
        "device_error",
        "error",
        "label",
        "remaining",
        "runs",
        "scheduler",
        "skipped",
    )

    def __init__(self, scheduler: Scheduler, label: str, after: tuple[Completion, ...]) -> None:
        self.scheduler = scheduler
        self.label = label
        self.after = after
        self.cancelled = False
        self.error: BaseException | None = None
        self.device_error: BaseException | None = None
        self.runs: list[RegionRun] = []
        self.remaining = 0
        self.skipped = False
        """Some region was skipped (cancelled before it ran)."""
        self.completion = Completion(label, self, scheduler.asyncio_loop)

    def sweep(self) -> bool:
        """Before the awaiting task suspends: finish what completed on the watched queues.

        Work that finished while the caller was busy then completes without a loop
        iteration spent on noticing it. While work is still watched and no other task
        leads, the caller becomes the leader and sweeps in place of the loop's tick.
        """
        scheduler = self.scheduler
        if not scheduler.watched:
            return False
        scheduler.sweep_watched(False)
        if self.remaining and scheduler.watched and not scheduler.leader:
            scheduler.leader = True
            return True
        return False

    def sweep_again(self) -> bool:
        scheduler = self.scheduler
        scheduler.sweep_watched(True)
        return bool(scheduler.watched)

    def release(self) -> None:
        scheduler = self.scheduler
        scheduler.leader = False
        if scheduler.watched:
            scheduler._schedule_tick()

    def cancel(self) -> None:
        self.cancelled = True
        self.scheduler.cancel_waiting(self)


class LaneRunner:
    """One lane's task: issues its regions in FIFO order."""

    def __init__(self, scheduler: Scheduler, key: tuple[Lane, int]) -> None:
        self.scheduler = scheduler
        self.key = key
        self.items: collections.deque[RegionRun] = collections.deque()
        self.wakeup: anyio.Event | None = None
        self.closing = False
        self.busy = False

    def push(self, run: RegionRun) -> None:
        self.items.append(run)
        if self.wakeup is not None:
            self.wakeup.set()

    def close(self) -> None:
        self.closing = True
        if self.wakeup is not None:
            self.wakeup.set()

    async def serve(self) -> None:
        # Shielded: a cancelled caller must never strand admitted work; the lane ends when
        # the runtime closes it after draining.
        with anyio.CancelScope(shield=True):
            items = self.items
            issue = self.scheduler.issue
            issued = 0
            while True:
                issued += 1
                if issued % 32 == 0:
                    await anyio.lowlevel.checkpoint()  # a long queue must not starve the loop
                if not items:
                    if self.closing:
                        return
                    self.wakeup = anyio.Event()
                    await self.wakeup.wait()
                    self.wakeup = None
                    continue
                self.busy = True
                try:
                    await issue(items.popleft())
                finally:
                    self.busy = False


class Scheduler:
    """Owns admission order, lanes and the life of every region."""

    def __init__(
        self,
        task_group: anyio.abc.TaskGroup,
        counters: Counters,
        max_submissions: int,
        on_device_lost: Callable[[BaseException], None],
    ) -> None:
        self.notifier = LoopNotifier()
        self.task_group = task_group
        self.counters = counters
        self.max_submissions = max_submissions
        self.on_device_lost = on_device_lost
        self.tracker: AccessTracker[object] = AccessTracker()
        self.lanes: dict[tuple[Lane, int], LaneRunner] = {}
        self.in_flight = 0
        self.waiting: collections.deque[Submission] = collections.deque()
        self.live = 0
        self.idle: anyio.Event | None = None
        self.trace: TraceRecorder | None = None
        self.trace_origin = 0.0
        self.lost: BaseException | None = None
        self.closed = False
        self.loop_thread = threading.get_ident()
        self.asyncio_loop: asyncio.AbstractEventLoop | None
        try:
            self.asyncio_loop = asyncio.get_running_loop()
        except RuntimeError:  # trio
            self.asyncio_loop = None
        self.watched: dict[Any, float] = {}
        """Watched queues, each with the time until which an idle loop keeps sweeping it."""
        self.last_sweep = 0.0
        self.sweep_gap = POLL_CAP_S
        self.sweep_budget = SWEEP_LIMIT
        """Fences the current loop pass may still finish."""
        self.leader = False
        """True while a task awaiting a completion sweeps in place of the tick."""
        self.tick_scheduled = False
        self.watcher_wakeup: anyio.Event | None = None
        self.watcher_started = False

    # -- admission -------------------------------------------------------------

    def submit(
        self, prepared: PreparedGraph, after: Iterable[Completion], nowait: bool
    ) -> Completion:
        # The hot path of every replay: checks that pass cost one comparison each, and
        # the slower explanations live in _refuse and _check_inputs.
        if self.closed or self.lost is not None or threading.get_ident() != self.loop_thread:
            self._refuse()
        for buffer in prepared.buffers:
            if buffer._released:
                buffer.check_alive()
        for buffer in prepared.inputs:
            if buffer.poison is not None:
                raise PoisonedError(buffer.label, buffer.poison)
        runtime = prepared.runtime
        if runtime._mapping_count:
            runtime._check_mapping_conflicts(prepared.plan)
        after_items: tuple[Completion, ...] = ()
        if after:
            after_items = tuple(after)
            for item in after_items:
                if not isinstance(item, Completion):
                    raise ContractError(f"after= takes Completions of this runtime, got {item!r}")
        if nowait and (self.in_flight >= self.max_submissions or self.waiting):
            raise Busy(
                f"{self.in_flight} submissions are in flight (max_submissions="
                f"{self.max_submissions}); await one or use submit()"
            )

        admit_now = self.in_flight < self.max_submissions and not self.waiting
        early: Fence | BaseException | None = None
        started = 0.0
        steps = prepared.steps
        if admit_now and not after_items:
            started = time.perf_counter()
            try:
                early = self._launch_first(steps[0], prepared.estimates)
            except BaseException as exc:  # launched and failed: the region fails in _admit
                early = exc

        submission = Submission(self, prepared.plan.label, after_items)
        record = self.tracker.record
        estimates = prepared.estimates
        runs = submission.runs
        for region, program, provider, key, accesses in steps:
            run = RegionRun(submission, region, program, provider, estimates, key)
            deps: set[object] | None = None
            for ident, start, end, writes in accesses:
                found = record(ident, start, end, writes, run)
                if found:
                    if deps is None:
                        deps = found
                    else:
                        deps |= found
            if deps:
                run.deps = [dep for dep in deps if isinstance(dep, RegionRun)]
            runs.append(run)
        submission.remaining = len(runs)
        for buffer in prepared.plan.overwrites:
            buffer.poison = None
        self.counters.submissions += 1
        self.live += 1
        if early is not None:
            submission.completion.submitted_at = started  # it was submitted before it existed
            self._admit(submission, early, started)
        elif admit_now:
            self._admit(submission)
        else:
            self.waiting.append(submission)
        return submission.completion

    def _launch_first(self, step: ReplayStep, estimates: list[float]) -> Fence | None:
        """Launch a graph's first region before any bookkeeping, when nothing can come
        before it; `_admit` would issue it at once anyway.

        Only on a device stream (watched queues: they issue at once, so cancelling
        could not skip the work anyway), on an idle lane, and when no earlier work
        still uses any of its bytes. The bookkeeping that follows then overlaps the
        device's work instead of delaying it. None when the region does not qualify.
        """
        region, program, provider, key, accesses = step
        if getattr(provider, "poll_budget_us", 0.0) <= 0:
            return None
        lane = self.lanes.get(key)
        if lane is None or lane.items or lane.busy:
            return None
        untouched = self.tracker.untouched
        for access in accesses:
            if not untouched(access[0]):
                return None
        expected = estimates[region.index]
        return self._issue(provider, key, program, (), _nothing_to_refuse, expected)

    def _refuse(self) -> None:
        if self.closed:
            raise RuntimeClosed("the runtime is closed; submit inside `async with Runtime()`")
        if self.lost is not None:
            raise DeviceLost(f"the device was lost ({self.lost}); open a new runtime")
        raise ContractError(
            "submit() was called from a thread other than the runtime's event loop; "
            "use anyio.from_thread.run_sync(prepared.submit) or BlockingRuntime"
        )

    def _admit(
        self,
        submission: Submission,
        first: Fence | BaseException | None = None,
        started: float = 0.0,
    ) -> None:
        """Issue what can go now and queue the rest on its lanes. `first` is the first
        region's fence (or launch failure) when `_launch_first` already launched it."""
        self.in_flight += 1
        lanes = self.lanes
        direct = not submission.after and self.lost is None
        runs = submission.runs
        if first is not None:
            run = runs[0]
            run.state = ISSUED
            run.started_at = started
            if isinstance(first, BaseException):
                self.finish(run, first)
            else:
                self._attach(run, first)
            runs = runs[1:]
        for run in runs:
            key = run.key
            lane = lanes.get(key)
            if lane is None:
                lane = lanes[key] = LaneRunner(self, key)
                self.task_group.start_soon(lane.serve, name=f"hrx-lane-{key[0].label}-{key[1]}")
            if direct and not lane.items and not lane.busy and self._unblocked(run):
                # Nothing queued ahead on this lane and nothing to wait for: issue now,
                # saving the lane task's wake-up. Work that must wait goes through the lane,
                # where it stays cancellable until its dependencies are issued.
                self._launch(run, ())
                continue
            lane.push(run)

    @staticmethod
    def _unblocked(run: RegionRun) -> bool:
        """True when every dependency of `run` finished successfully (or it has none)."""
        if isinstance(run.program, AsyncHostProgram):
            return False
        return all(dep.state == DONE or dep.state == SKIPPED for dep in run.deps)

    def cancel_waiting(self, submission: Submission) -> None:
        """A cancelled submission still waiting for admission finishes at once."""
        if submission in self.waiting:
            self.waiting.remove(submission)
            self.in_flight += 1  # balanced by _finish_submission
            for run in submission.runs:
                self.finish(run, None, skipped=True)

    # -- issuing ---------------------------------------------------------------

    async def issue(self, run: RegionRun) -> None:
        submission = run.submission
        for item in submission.after:
            if not item.done():
                await item.wait_done()
            if item._error is not None and submission.error is None:
                cause = item._error
                error: HrxError = (
                    Cancelled(f"not run: submission {item.label!r} it follows was cancelled")
                    if isinstance(cause, Cancelled)
                    else DependencyFailed(f"not run: submission {item.label!r} it follows failed")
                )
                error.__cause__ = cause
                submission.error = error
        waits: list[Fence] = []
        for dep in run.deps:
            if dep.finished:
                continue
            if dep.provider is run.provider and not isinstance(run.program, AsyncHostProgram):
                await dep.wait_issued()
                if dep.fence is not None and not dep.finished:
                    waits.append(dep.fence)
            else:
                await dep.wait_finished()
        if self.lost is not None:
            self.finish(run, DeviceLost(f"the device was lost ({self.lost})"))
            return
        refusal = run.failure_of_dependencies()
        if refusal is not None:
            if isinstance(refusal, Cancelled) and submission.error is None:
                self.finish(run, None, skipped=True)
            else:
                self.finish(run, refusal)
            return
        program = run.program
        if isinstance(program, AsyncHostProgram):
            await self._run_inline(run, program)
            return
        self._launch(run, waits)

    def _launch(self, run: RegionRun, waits: Sequence[Fence]) -> None:
        """Hand `run` to its queue (device-side waits first) and follow its fence."""
        run.state = ISSUED
        run.started_at = time.perf_counter()
        try:
            fence = self._issue(
                run.provider,
                run.key,
                run.program,
                waits,
                run.failure_of_dependencies,
                run.estimates[run.plan.index],
            )
        except BaseException as exc:
            self.finish(run, exc)
            return
        self._attach(run, fence)

    def _issue(
        self,
        provider: Any,
        key: tuple[Lane, int],
        program: Any,
        waits: Sequence[Fence],
        preflight: Callable[[], BaseException | None],
        expected: float,
    ) -> Fence:
        """Submit `program` to its queue, then start watching the queue if it is a stream
        (for about `expected` seconds, the region's learned duration).

        The launch comes first and the watch bookkeeping after it, which then overlaps
        the device's work instead of delaying it.
        """
        queue: LaneQueue = provider.queue(key)
        budget_us: float = getattr(provider, "poll_budget_us", 0.0)
        watched = self.watched
        newly_watched = budget_us > 0 and queue not in watched
        if newly_watched:
            queue.watch()  # type: ignore[attr-defined]  # so its waiter never starts on this fence
        try:
            fence = queue.submit(program, waits, preflight)
        except BaseException:
            if newly_watched:
                queue.unwatch()  # type: ignore[attr-defined]
            raise
        if budget_us > 0:
            # An idle loop keeps sweeping until the region is overdue (see sweep_watched).
            deadline = time.perf_counter() + min(POLL_CAP_S, expected * 1.25 + budget_us * 1e-6)
            if newly_watched:
                watched[queue] = deadline
                self._schedule_tick()
            elif deadline > watched[queue]:
                watched[queue] = deadline
        return fence

    @staticmethod
    def _attach(run: RegionRun, fence: Fence) -> None:
        """`run` was issued as `fence`: wake who waits for that, and follow the fence."""
        run.fence = fence
        waiters = run.issued_waiters
        if waiters is not None:
            run.issued_waiters = None
            for event in waiters:
                event.set()
        fence.add_done_callback(run.on_fence)

    # -- watching queues -------------------------------------------------------

    def sweep_watched(self, new_pass: bool) -> None:
        """Finish what completed on the watched queues, within this loop pass's budget.

        `new_pass` is once per loop iteration (the tick, the trio watcher or the leader):
        it refills the budget, updates the idleness gauge and hands overdue queues back
        to their waiters. The sweeps of tasks about to suspend spend what is left of it,
        so however many tasks await, one pass finishes at most `SWEEP_LIMIT` fences.

        A queue is handed back only while the loop is idle (iterations close together):
        a busy loop sweeps at no cost worth saving, and a thread could not finish
        anything sooner than the loop's next iteration anyway.
        """
        now = time.perf_counter()
        idle = False
        if new_pass:
            # Smoothed over a few iterations, so one quick pass of a busy loop is not idleness.
            gap = min(now - self.last_sweep, POLL_CAP_S)
            self.sweep_gap = gap = 0.75 * self.sweep_gap + 0.25 * gap
            idle = gap < IDLE_GAP_S
            self.last_sweep = now
            self.sweep_budget = SWEEP_LIMIT
        budget = self.sweep_budget
        if budget <= 0:
            return
        watched = self.watched
        for queue, deadline in list(watched.items()):
            finished, remaining = queue.sweep(budget)
            budget -= finished
            if not remaining or (idle and now > deadline):
                del watched[queue]
                queue.unwatch()
            if budget <= 0:
                if queue in watched:  # the others get the first turn next pass
                    del watched[queue]
                    watched[queue] = deadline
                break
        self.sweep_budget = budget

    def _schedule_tick(self) -> None:
        loop = self.asyncio_loop
        if loop is not None:
            if not self.tick_scheduled:
                self.tick_scheduled = True
                loop.call_soon(self._tick)
        elif not self.watcher_started:
            self.watcher_started = True
            self.task_group.start_soon(self._watcher, name="hrx-queue-watcher")
        elif self.watcher_wakeup is not None:
            self.watcher_wakeup.set()

    def _tick(self) -> None:
        # asyncio: a plain callback per loop iteration is far cheaper than a task step.
        self.tick_scheduled = False
        if self.watched and not self.leader:
            self.sweep_watched(True)
            if self.watched:
                self.tick_scheduled = True
                self.asyncio_loop.call_soon(self._tick)  # type: ignore[union-attr]

    async def _watcher(self) -> None:
        # trio: the same sweep from a task, one per loop iteration while anything is watched.
        with anyio.CancelScope(shield=True):
            while not self.closed:
                if not self.watched or self.leader:
                    self.watcher_wakeup = anyio.Event()
                    await self.watcher_wakeup.wait()
                    self.watcher_wakeup = None
                    continue
                self.sweep_watched(True)
                await anyio.lowlevel.checkpoint()

    def unwatch_all(self) -> None:
        for queue in self.watched:
            queue.unwatch()
        self.watched.clear()

    async def _run_inline(self, run: RegionRun, program: AsyncHostProgram) -> None:
        run.state = ISSUED
        run.started_at = time.perf_counter()
        try:
            with anyio.CancelScope(shield=True):
                await program.run()
        except Exception as exc:
            self.finish(run, exc)
        else:
            self.finish(run, None)

    # -- completion ------------------------------------------------------------

    def fence_done(self, run: RegionRun) -> None:
        fence = run.fence
        assert fence is not None
        if fence.started_at is not None:
            run.started_at = fence.started_at
        self.finish(run, fence.error(), fence.skipped(), fence.finished_at)

    def finish(
        self,
        run: RegionRun,
        error: BaseException | None,
        skipped: bool = False,
        finished_at: float | None = None,
    ) -> None:
        if run.state >= DONE:
            return
        end = finished_at if finished_at is not None else time.perf_counter()
        submission = run.submission
        plan = run.plan
        self.tracker.forget(run)
        if error is not None:
            run.state = FAILED
            run.error = error
            self.note_failure(error)
            if submission.error is None:
                submission.error = (
                    error
                    if isinstance(error, PoisonedError | DependencyFailed | DeviceLost)
                    else ExecutionError(submission.label, plan.index, error)
                )
            # Work that never ran leaves its outputs as they were; work that failed (or read
            # poisoned input) leaves them undefined.
            if not isinstance(error, DependencyFailed | Cancelled):
                self.poison(plan, error if isinstance(error, PoisonedError) else submission.error)
        elif skipped:
            run.state = SKIPPED
            submission.skipped = True
        else:
            run.state = DONE
            started = run.started_at
            if started is not None and run.fence is not None:
                # Learn how long this region takes: an idle loop watches its next replay as long.
                estimates, index = run.estimates, plan.index
                estimates[index] = 0.8 * estimates[index] + 0.2 * (end - started)
            if plan.copy_bytes:
                self.counters.copied(plan.lane, plan.copy_bytes)
        started = run.started_at
        if started is not None and run.state != SKIPPED:
            submission.completion._mark_started(started)
        if self.trace is not None and started is not None:
            self.trace.record(
                TraceEvent(
                    graph=submission.label,
                    region=plan.index,
                    lane=plan.lane,
                    start_us=(started - self.trace_origin) * 1e6,
                    duration_us=max(0.0, end - started) * 1e6,
                    copied_bytes=plan.copy_bytes if run.state == DONE else 0,
                    failed=run.state == FAILED,
                )
            )
        self.wake_waiters(run)
        submission.remaining -= 1
        if submission.remaining == 0:
            self._finish_submission(submission)

    def note_failure(self, error: BaseException) -> None:
        """A sticky error loses the device, once."""
        if is_sticky(error) and self.lost is None:
            self.lost = error
            self.on_device_lost(error)

    @staticmethod
    def poison(plan: RegionPlan, error: BaseException) -> None:
        """Mark what `plan` writes as undefined (the first failure wins)."""
        if not isinstance(error, HrxError):
            return
        for interval in plan.writes:
            if interval.buffer.poison is None:
                interval.buffer.poison = error

    @staticmethod
    def wake_waiters(run: RegionRun) -> None:
        """`run` is final: release its dependencies and everyone waiting on it."""
        run.deps = ()
        for waiters in (run.issued_waiters, run.done_waiters):
            if waiters:
                for event in waiters:
                    event.set()
        run.issued_waiters = run.done_waiters = None

    def _finish_submission(self, submission: Submission) -> None:
        error = submission.error
        if error is None and submission.skipped:
            error = Cancelled(f"submission of {submission.label!r} was cancelled")
        submission.runs = []
        self.counters.completions += 1
        submission.completion._resolve(error)
        self.in_flight -= 1
        self.live -= 1
        waiting = self.waiting
        while waiting and self.in_flight < self.max_submissions:
            self._admit(waiting.popleft())
        if self.live == 0 and self.idle is not None:
            self.idle.set()

    # -- shutdown --------------------------------------------------------------

    def fail_pending(self, error: BaseException) -> None:
        """After a device loss: everything not yet issued fails."""
        for lane in self.lanes.values():
            while lane.items:
                self.finish(lane.items.popleft(), error)
        while self.waiting:
            submission = self.waiting.popleft()
            self.in_flight += 1
            for run in submission.runs:
                self.finish(run, error)

    def cancel_all(self) -> None:
        for lane in self.lanes.values():
            for run in lane.items:
                run.submission.cancelled = True
        for submission in list(self.waiting):
            submission.cancel()

    async def drain(self) -> None:
        """Wait until every submission has finished."""
        while self.live:
            self.idle = anyio.Event()
            await self.idle.wait()
        self.idle = None

    def close_lanes(self) -> None:
        self.closed = True
        for lane in self.lanes.values():
            lane.close()
        self.unwatch_all()
        if self.watcher_wakeup is not None:
            self.watcher_wakeup.set()
