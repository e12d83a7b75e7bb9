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
import contextvars
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
from ..graph import RegionPlan
from ..stats import Counters
from ..trace import TraceEvent, TraceRecorder
from ..tracker import AccessTracker
from .host import AsyncHostProgram
from .lane import Lane
from .notify import LoopNotifier
from .poison import PoisonBook

if TYPE_CHECKING:
    from ..backends.base import Fence, LaneQueue
    from ..memory import Buffer
    from ..prepared import PreparedGraph, ReplayStep

QUEUED, ISSUED, DONE, FAILED, SKIPPED = range(5)
RUNNING_HOST_REGION: contextvars.ContextVar[RegionRun | None] = contextvars.ContextVar(
    "RUNNING_HOST_REGION", default=None
)
"""The region of the `async def` host function this task runs, if any."""
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
        "applied",
        "blockers",
        "cause",
        "clears",
        "deps",
        "done_waiters",
        "error",
        "estimates",
        "fence",
        "followers",
        "issued_waiters",
        "key",
        "outcome",
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
        clears: tuple[Buffer, ...] = (),
    ) -> None:
        self.submission = submission
        self.plan = plan
        self.program = program
        self.provider = provider
        self.estimates = estimates
        self.key = key
        self.clears = clears
        """Buffers this region writes whole: running clears their poison."""
        self.deps: Sequence[RegionRun] = ()
        self.state = QUEUED
        self.fence: Fence | None = None
        self.error: BaseException | None = None
        self.cause: HrxError | None = None
        """The error this region's failure stands for (see `failure_cause`)."""
        self.applied = False
        """Its failure has poisoned what it writes."""
        self.started_at: float | None = None
        self.issued_waiters: list[anyio.Event] | None = None
        self.done_waiters: list[anyio.Event] | None = None
        self.outcome: tuple[BaseException | None, bool, float | None] | None = None
        """The outcome of a region that ended before everything it follows finished."""
        self.blockers = 0
        self.followers: list[RegionRun] | None = None
        """Regions whose outcome waits for this one to finish."""

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
            # Seen by later regions' checks on worker threads before the loop hears of it.
            submission.device_error = error
        scheduler = submission.scheduler
        if threading.get_ident() == scheduler.loop_thread:
            scheduler.fence_done(self)  # a sweep of a watched queue, on the loop
        else:
            scheduler.notifier.post(scheduler.fence_done, self)

    def failure_cause(self, error: BaseException) -> HrxError:
        """The error this region's failure stands for, in its submission and as poison."""
        cause = self.cause
        if cause is None:
            cause = (
                error
                if isinstance(error, PoisonedError | DependencyFailed | DeviceLost | Cancelled)
                else ExecutionError(self.submission.label, self.plan.index, error)
            )
            self.cause = cause
        return cause

    def refusal(self) -> BaseException | None:
        """Why this region must not run, judged from its dependencies and its submission.

        Safe from worker threads. Failures of dependencies that finished on the device are
        applied to the poison book first, so they count even before the loop hears of them.
        """
        submission = self.submission
        deps = self.deps
        own_failure: RegionRun | None = None
        for dep in deps:
            fence = dep.fence
            if fence is not None and fence.query():
                error = fence.error()
                if error is not None:
                    dep.apply_failure(error)
                    if dep.submission is submission:
                        own_failure = dep
            elif dep.submission is submission and dep.error is not None:
                own_failure = dep
        if own_failure is not None:
            return DependencyFailed(f"not run: region {own_failure.plan.index} failed")
        if submission.error is not None or submission.device_error is not None:
            return DependencyFailed(f"not run: an earlier region of {submission.label!r} failed")
        if submission.cancelled:
            return Cancelled(f"submission of {submission.label!r} was cancelled")
        found = submission.scheduler.poison_book.find(self.plan.reads)
        if found is not None:
            return PoisonedError(found[0], found[1])
        return None

    def preflight(self) -> BaseException | None:
        """The last check before the region runs (the backend asks it as late as it can).

        Passing it commits the region to run: what it writes whole is no longer poisoned.
        A refusal for poisoned input poisons what it writes before anything after it runs.
        """
        refusal = self.refusal()
        if refusal is None:
            for buffer in self.clears:
                self.submission.scheduler.poison_book.clear(buffer)
        elif isinstance(refusal, PoisonedError):
            self.apply_failure(refusal)
        return refusal

    def apply_failure(self, error: BaseException) -> None:
        """Poison what this region writes, once (a region that never ran poisons nothing)."""
        if self.applied or isinstance(error, DependencyFailed | Cancelled):
            return
        self.applied = True
        cause = self.failure_cause(error)
        self.submission.scheduler.poison_book.add(self.plan.writes, cause)


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
        self.completion = Completion(label, self, scheduler.asyncio_loop, scheduler)

    def sweep(self) -> bool:
        """Before the awaiting task suspends: finish what completed on the watched queues.

        Work that finished while the caller was busy then completes without a loop
        iteration spent on noticing it. While work is still watched and no other task
        leads, the caller becomes the leader and sweeps in place of the loop's tick.
        """
        scheduler = self.scheduler
        host_run = RUNNING_HOST_REGION.get()
        if host_run is not None:
            scheduler.refuse_waiting_on(host_run, self.runs, self.after)
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
        self.poison_book = PoisonBook()
        self.lanes: dict[tuple[Lane, int], LaneRunner] = {}
        self.settling: collections.deque[RegionRun] = collections.deque()
        """Regions whose outcome is final, to be settled in order (see `finish`)."""
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

    def start(self, npus: int) -> None:
        """Start every lane task (and trio's queue watcher) from the opening task.

        Admission also happens in loop callbacks (a finished submission admits the next
        waiting one), where no task can be started; so nothing is started lazily.
        """
        keys = [(lane, 0) for lane in (Lane.UPLOAD, Lane.COMPUTE, Lane.DOWNLOAD, Lane.HOST)]
        keys += [(Lane.NPU, index) for index in range(max(npus, 1))]
        for key in keys:
            self._start_lane(key)
        if self.asyncio_loop is None:
            self.watcher_started = True
            self.task_group.start_soon(self._watcher, name="hrx-queue-watcher")

    def _start_lane(self, key: tuple[Lane, int]) -> LaneRunner:
        lane = self.lanes[key] = LaneRunner(self, key)
        self.task_group.start_soon(lane.serve, name=f"hrx-lane-{key[0].label}-{key[1]}")
        return lane

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
                self._check_input_poison(prepared, buffer)
        runtime = prepared.runtime
        if runtime._mapping_count:
            runtime._check_mapping_conflicts(prepared.plan)
        after_items: tuple[Completion, ...] = ()
        if after:
            try:
                after_items = tuple(after)
            except TypeError:
                raise ContractError(
                    f"after= takes an iterable of Completions, got {after!r}"
                ) from None
            for item in after_items:
                if not isinstance(item, Completion) or item.owner is not self:
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
        clears = prepared.clears
        for region, program, provider, key, accesses in steps:
            run = RegionRun(
                submission, region, program, provider, estimates, key, clears[region.index]
            )
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

    def _check_input_poison(self, prepared: PreparedGraph, buffer: Buffer) -> None:
        """Refuse a graph that reads poisoned bytes of `buffer` before writing them.

        Only when no admitted region will overwrite the buffer whole before it: whether
        that one runs is decided later, and the graph's own regions check again then.
        """
        for user in self.tracker.dependencies(buffer.ident, 0, buffer.nbytes, True):
            if isinstance(user, RegionRun) and buffer in user.clears and not user.finished:
                return
        found = self.poison_book.find(i for i in prepared.input_reads if i.buffer is buffer)
        if found is not None:
            raise PoisonedError(found[0], found[1])

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
                for buffer in run.clears:  # it runs: nothing came between launch and here
                    self.poison_book.clear(buffer)
                self._attach(run, first)
            runs = runs[1:]
        for run in runs:
            key = run.key
            lane = lanes.get(key) or self._start_lane(key)
            if direct and not lane.items and not lane.busy:
                waits = self._device_waits(run)
                if waits is not None:
                    # Nothing queued ahead on this lane, and what it waits for the device
                    # orders by itself: issue now, with no lane wake-up or loop iteration.
                    self._launch(run, waits)
                    continue
            lane.push(run)

    @staticmethod
    def _device_waits(run: RegionRun) -> list[Fence] | None:
        """The fences `run` can wait for on the device, when that is all it waits for:
        every dependency finished, or was issued to the same backend and is running.
        None when something needs a wait on the host (the lane task does that)."""
        if isinstance(run.program, AsyncHostProgram):
            return None
        waits: list[Fence] = []
        provider = run.provider
        for dep in run.deps:
            state = dep.state
            if state == DONE or state == SKIPPED:
                continue
            fence = dep.fence
            if state != ISSUED or fence is None or dep.provider is not provider:
                return None
            if dep.outcome is not None:
                return None  # it ended and waits to settle: its outcome decides
            waits.append(fence)
        return waits

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
        program = run.program
        on_host = isinstance(program, AsyncHostProgram)
        waits: list[Fence] = []
        for dep in run.deps:
            if dep.finished:
                continue
            if dep.provider is run.provider and not on_host:
                await dep.wait_issued()
                if dep.fence is not None and not dep.finished:
                    waits.append(dep.fence)
            else:
                await dep.wait_finished()
        if self.lost is not None:
            self.finish(run, DeviceLost(f"the device was lost ({self.lost})"))
            return
        # The host function runs right here, so its last check is this one.
        refusal = run.preflight() if on_host else run.refusal()
        if refusal is not None:
            self._refused(run, refusal)
            return
        if on_host:
            assert isinstance(program, AsyncHostProgram)
            self._start_host(run, program)
            return
        self._launch(run, waits)

    def _refused(self, run: RegionRun, refusal: BaseException) -> None:
        if isinstance(refusal, Cancelled) and run.submission.error is None:
            self.finish(run, None, skipped=True)
        else:
            run.apply_failure(refusal)
            self.finish(run, refusal)

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
                run.preflight,
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

    def _start_host(self, run: RegionRun, program: AsyncHostProgram) -> None:
        """Run an `async def` host function as a task of its own.

        The host lane goes on meanwhile, so work the function submits and awaits is not
        stuck behind it; awaiting work that depends on the function itself is refused
        (see `refuse_waiting_on`).
        """
        run.state = ISSUED
        run.started_at = time.perf_counter()
        self.task_group.start_soon(self._run_host, run, program)

    async def _run_host(self, run: RegionRun, program: AsyncHostProgram) -> None:
        token = RUNNING_HOST_REGION.set(run)
        try:
            with anyio.CancelScope(shield=True):
                await program.run()
        except BaseException as exc:
            # Every exception settles the region, BaseExceptions included: an escaping one
            # would end this task with the region, its submission and its awaiters pending.
            run.apply_failure(exc)
            self.finish(run, exc)
        else:
            self.finish(run, None)
        finally:
            RUNNING_HOST_REGION.reset(token)

    def refuse_waiting_on(
        self, host_run: RegionRun, runs: Sequence[RegionRun], after: Sequence[Completion]
    ) -> None:
        """Raise instead of waiting forever: the host function `host_run` is about to wait
        for `runs`, and one of them (through dependencies) waits for `host_run` itself."""
        if host_run.finished:
            return
        seen: set[int] = set()
        stack: list[RegionRun] = list(runs)
        for item in after:
            source = item._source
            if isinstance(source, Submission):
                stack.extend(source.runs)
        while stack:
            run = stack.pop()
            if run is host_run:
                raise ContractError(
                    f"a host function of {host_run.submission.label!r} awaited work that "
                    "waits for that host function itself; it would never finish. Submit "
                    "it without awaiting it, or record it in the same graph"
                )
            if id(run) in seen or run.finished:
                continue
            seen.add(id(run))
            stack.extend(run.deps)
            for item in run.submission.after:
                source = item._source
                if isinstance(source, Submission):
                    stack.extend(source.runs)

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
        """`run` ended (ran, failed, or was skipped); the first outcome counts.

        Ordering is transitive whether or not the middle runs: a region that ends before
        everything it follows has finished (a skipped one, or one that failed without
        waiting) keeps its outcome until then, so nothing that follows it can overtake
        what it follows. Deferred outcomes settle in order, without recursion.
        """
        if run.state >= DONE or run.outcome is not None:
            return
        blockers = 0
        for dep in run.deps:
            if dep.state < DONE:
                blockers += 1
                if dep.followers is None:
                    dep.followers = [run]
                else:
                    dep.followers.append(run)
        for item in run.submission.after:
            if not item.done():
                blockers += 1
                item._on_done(lambda: self._unblock(run))
        run.outcome = (error, skipped, finished_at)
        if blockers and self.lost is None:  # once the device is lost, nothing runs anyway
            run.blockers = blockers
            return
        self._ready(run)

    def _unblock(self, run: RegionRun) -> None:
        run.blockers -= 1
        if run.blockers == 0 and run.state < DONE:
            self._ready(run)

    def _ready(self, run: RegionRun) -> None:
        settling = self.settling
        settling.append(run)
        if len(settling) > 1:
            return  # an outer call is settling; it takes this one in turn
        while settling:
            try:
                self._settle(settling[0])
            finally:
                settling.popleft()

    def _settle(self, run: RegionRun) -> None:
        if run.state >= DONE:
            return
        assert run.outcome is not None
        error, skipped, finished_at = run.outcome
        end = finished_at if finished_at is not None else time.perf_counter()
        submission = run.submission
        plan = run.plan
        self.tracker.forget(run)
        if error is not None:
            run.state = FAILED
            run.error = error
            self.note_failure(error)
            # Work that never ran leaves its outputs as they were; work that failed (or read
            # poisoned input) leaves them undefined.
            run.apply_failure(error)
            if submission.error is None:
                submission.error = run.failure_cause(error)
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

    def poison(self, plan: RegionPlan, error: BaseException) -> None:
        """Mark what `plan` writes as undefined (a buffer keeps its first failure)."""
        if isinstance(error, HrxError):
            self.poison_book.add(plan.writes, error)

    def wake_waiters(self, run: RegionRun) -> None:
        """`run` is final: release its dependencies, its followers and its waiters."""
        run.deps = ()
        for waiters in (run.issued_waiters, run.done_waiters):
            if waiters:
                for event in waiters:
                    event.set()
        run.issued_waiters = run.done_waiters = None
        followers = run.followers
        if followers is not None:
            run.followers = None
            for follower in followers:
                self._unblock(follower)

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
        host_run = RUNNING_HOST_REGION.get()
        if host_run is not None and host_run.submission.scheduler is self and self.live:
            raise ContractError(
                f"a host function of {host_run.submission.label!r} waited for every "
                "submission to finish, its own included; it would never finish"
            )
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
