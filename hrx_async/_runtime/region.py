"""A region of one submission on its way through a lane, and the submission itself.

A region's state moves QUEUED → ISSUED → DONE / FAILED / SKIPPED. Its checks
(`refusal`, `preflight`) run on the loop or, for the sim backend, on the worker
thread right before the region runs; they read fences and the poison book, never
other loop-side state.
"""

from __future__ import annotations

import contextvars
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from .._core.clock import get_ident
from .._core.graph import RegionPlan
from .._core.intervals import Interval
from .._core.lane import Lane
from ..backends.fence import FenceFollower
from ..errors import (
    Cancelled,
    ContractError,
    DependencyFailed,
    DeviceLost,
    ExecutionError,
    HrxError,
    PoisonedError,
)
from .completion import Completion, CompletionSource, Signal
from .region_owner import RegionOwner

if TYPE_CHECKING:
    from .._core.chains import ChainReplay
    from .._core.memory import Buffer
    from .._core.tracker import AccessTracker
    from ..backends.fence import Fence
    from .notify import LoopNotifier

# Final, so the compiled modules read them as constants, not as a globals lookup each.
QUEUED: Final = 0
ISSUED: Final = 1
DONE: Final = 2
FAILED: Final = 3
SKIPPED: Final = 4
CHECKING: Final = object()
"""`RegionRun.verdict` while its last check (`preflight`) is under way."""
PASSED: Final = object()
"""`RegionRun.verdict` once its last check passed, or for a region launched without one."""
RUNNING_HOST_REGION: contextvars.ContextVar[RegionRun | None] = contextvars.ContextVar(
    "RUNNING_HOST_REGION", default=None
)
"""The region of the `async def` host function this task runs, if any."""


def is_sticky(error: BaseException) -> bool:
    """Errors after which the device can run nothing more."""
    return isinstance(error, DeviceLost) or bool(getattr(error, "sticky", False))


class RegionRun(FenceFollower):
    """One region of one submission on its way through a lane; its fence's follower."""

    __slots__ = (
        "applied",
        "blockers",
        "budget",
        "cause",
        "chained",
        "clears",
        "copies",
        "deps",
        "done_waiters",
        "error",
        "estimates",
        "expected",
        "fence",
        "followers",
        "host_side",
        "index",
        "inputs",
        "issued_waiters",
        "key",
        "outcome",
        "plan",
        "program",
        "provider",
        "queues",
        "started_at",
        "state",
        "submission",
        "verdict",
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
        inputs: Sequence[Interval] | None = None,
        queues: list[Any] | None = None,
        budget: float = 0.0,
        host_side: bool = False,
        index: int = -1,
        copies: tuple[tuple[Lane, int], ...] | None = None,
    ) -> None:
        self.submission = submission
        self.host_side = host_side
        """It runs on the host, not on a backend's queue (an `async def` host function or
        a native stage): never issued with device-side waits."""
        self.budget = budget
        """Its provider's poll budget (µs): above 0, its queue is a watched device stream,
        which asks `preflight` as it launches."""
        self.queues = queues
        """Its prepared graph's queue per region, filled in on first use (None: look it up)."""
        self.plan = plan
        self.index = plan.index if index < 0 else index
        """Its plan's index (read on every replay: a field here is a native read, the plan's
        attribute is not; a replay passes it, read once from the plan)."""
        self.copies = plan.copies if copies is None else copies
        """Its plan's bytes copied per lane, for the statistics (passed as `index` is)."""
        self.program = program
        self.provider = provider
        self.estimates = estimates
        self.key = key
        self.clears = clears
        """Buffers this region writes whole: running clears their poison."""
        self.expected = False
        """The poison book counts on its `clears` (`PoisonBook.expect`): set once it waits
        where a later submission's check could come before it runs (see
        `Scheduler.expect_clears`)."""
        self.inputs: Sequence[Interval] = plan.reads if inputs is None else inputs
        """The bytes it reads before writing them itself: poisoned, they refuse it."""
        self.deps: tuple[RegionRun, ...] = ()
        """What it waits for (a tuple: compiled, iterating one is native)."""
        self.chained: ChainReplay[object] | None = None
        """The replay of its graph's chain it was registered with in the tracker, if it
        was (`AccessTracker.record_chain`; its region there is `index`): the handle it is
        forgotten by."""
        self.state = QUEUED
        self.fence: Fence | None = None
        self.error: BaseException | None = None
        self.cause: HrxError | None = None
        """The error this region's failure stands for (see `failure_cause`)."""
        self.applied = False
        """Its failure has poisoned what it writes."""
        self.started_at: float | None = None
        self.issued_waiters: list[Signal] | None = None
        self.done_waiters: list[Signal] | None = None
        self.outcome: tuple[BaseException | None, bool, float | None] | None = None
        """The outcome of a region that ended before everything it follows finished."""
        self.blockers = 0
        self.followers: list[RegionRun] | None = None
        """Regions whose outcome waits for this one to finish."""
        self.verdict: object = None
        """Its last check: None until asked, `CHECKING`, then `PASSED` or the refusal."""

    @property
    def finished(self) -> bool:
        return self.state >= DONE

    def wrote(self) -> bool:
        """Whether it ran and succeeded, so the bytes it writes hold its output. Safe from
        other threads: it reads the region's fence only."""
        fence = self.fence
        return fence is not None and fence.query() and fence.error() is None and not fence.skipped()

    def program_for_writers(
        self, tracker: AccessTracker[object], reads: Sequence[tuple[int, int, int]]
    ) -> Any:
        """The program to launch for this region, given who last wrote the byte ranges
        `reads` ((allocation, start, end) each, in its program's order) as the tracker has
        it before this region is recorded.

        A range whose every byte was last written by earlier regions of this lane and
        backend (for an NPU: the same NPU) is in device memory already, provided those
        regions run; bit i of the mask handed to `program.skipping`, with those regions,
        marks `reads[i]` so. Bytes without a registered writer, or written by anything
        else (the host, a mapping, a GPU, another NPU), leave their bit clear. The same
        program when no bit is set."""
        mask = 0
        bit = 1
        found: list[RegionRun] = []
        key = self.key
        provider = self.provider
        for allocation, start, end in reads:
            writers = tracker.writers(allocation, start, end)
            for writer in writers:
                if (
                    not isinstance(writer, RegionRun)
                    or writer.provider is not provider
                    or writer.key != key
                ):
                    break
            else:
                mask |= bit
                found.extend(writers)  # type: ignore[arg-type]  # RegionRuns, checked above
            bit <<= 1
        return self.program.skipping(mask, found) if mask else self.program

    async def wait_issued(self) -> None:
        if self.state == QUEUED:
            signal = Signal(self.submission.scheduler.asyncio_loop)
            if self.issued_waiters is None:
                self.issued_waiters = []
            self.issued_waiters.append(signal)
            await signal

    async def wait_finished(self) -> None:
        if self.state < DONE:
            signal = Signal(self.submission.scheduler.asyncio_loop)
            if self.done_waiters is None:
                self.done_waiters = []
            self.done_waiters.append(signal)
            await signal

    def fence_finished(self, fence: Fence) -> None:
        if self.state >= DONE:
            return
        submission = self.submission
        error = fence.error()
        if error is not None:
            # Seen by later regions' checks on worker threads before the loop hears of it.
            submission.device_error = error
        scheduler = submission.scheduler
        if get_ident() == scheduler.loop_thread:
            scheduler.fence_done(self, error)  # a sweep of a watched queue, on the loop
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

    def refusal(self, poison: bool = True) -> BaseException | None:
        """Why this region must not run, judged from its dependencies and its submission.

        Safe from worker threads. Failures of dependencies that finished on the device are
        applied to the poison book first, so they count even before the loop hears of them.
        `poison=False` leaves out the poison check: the book is exact for this region only
        once what it follows has run, so while it still waits for dependencies on the
        device, that check is the backend's last one (`preflight`).
        """
        submission = self.submission
        deps = self.deps
        own_failure: RegionRun | None = None
        for dep in deps:
            fence = dep.fence
            # A fence's error is set once it has finished: no need to ask the device.
            error = fence.error() if fence is not None else dep.error
            if error is not None:
                if fence is not None:
                    dep.apply_failure(error)
                if dep.submission is submission:
                    own_failure = dep
        if own_failure is not None:
            return DependencyFailed(f"not run: region {own_failure.plan.index} failed")
        if submission.error is not None or submission.device_error is not None:
            return DependencyFailed(f"not run: an earlier region of {submission.label!r} failed")
        if submission.cancelled or submission.scheduler.leaving:
            return Cancelled(f"submission of {submission.label!r} was cancelled")
        if poison:
            book = submission.scheduler.poison_book
            if book.empty():
                return None
            for interval in self.inputs:
                if interval.buffer.poison is not None:  # the book decides which bytes
                    found = book.find(self.inputs)
                    if found is not None:
                        return PoisonedError(found[0], found[1])
                    break
        return None

    def preflight(self) -> BaseException | None:
        """The last check before the region runs (the backend asks it as late as it can).

        Passing it commits the region to run: what it writes whole is no longer poisoned.
        A refusal for poisoned input poisons what it writes before anything after it runs.
        """
        # Marked before `refusal` reads `cancelled`, which `Submission.cancel` sets before
        # it reads this: a cancel that sees None here is one this check will see.
        self.verdict = CHECKING
        refusal = self.refusal()
        if refusal is None:
            self.run_clears()
            self.verdict = PASSED
        else:
            self.verdict = refusal
            if isinstance(refusal, PoisonedError):
                self.apply_failure(refusal)
        return refusal

    def run_clears(self, ran: bool = True) -> None:
        """Once: what this region writes whole is cleared of poison (`ran`), or it ended
        without running and will clear nothing."""
        clears, self.clears = self.clears, ()
        if clears:
            book = self.submission.scheduler.poison_book
            if self.expected:
                book.settle(clears, ran)
            elif ran:
                for buffer in clears:
                    book.clear(buffer)

    def apply_failure(self, error: BaseException) -> None:
        """Poison what this region writes, once (a region that never ran poisons nothing)."""
        if self.applied or isinstance(error, DependencyFailed | Cancelled):
            return
        self.applied = True
        cause = self.failure_cause(error)
        self.submission.scheduler.poison_book.add(self.plan.writes, cause)


class Submission(CompletionSource):
    """One `submit()` of a prepared graph."""

    __slots__ = (
        "admitted",
        "after",
        "cancelled",
        "completion",
        "device_error",
        "error",
        "label",
        "lanes",
        "remaining",
        "runs",
        "scheduler",
        "skipped",
    )

    def __init__(
        self,
        scheduler: RegionOwner,
        label: str,
        after: tuple[Completion, ...],
        submitted_at: float = 0.0,
    ) -> None:
        self.scheduler = scheduler
        self.label = label
        self.after = after
        self.admitted = False
        """It took one of the `max_submissions` places (it was not cancelled while waiting)."""
        self.cancelled = False
        self.error: BaseException | None = None
        self.device_error: BaseException | None = None
        self.runs: list[RegionRun] = []
        self.lanes: list[Any] | None = None
        """Its prepared graph's lane tasks per region (`ReplayPlan.lanes`), where it has one.
        (Typed loosely here: the lane tasks' module imports this one.)"""
        self.remaining = 0
        self.skipped = False
        """Some region was skipped (cancelled before it ran)."""
        self.completion = Completion(label, self, scheduler.asyncio_loop, scheduler, submitted_at)

    def sweep(self) -> bool:
        """Before the awaiting task suspends: finish what completed on the watched queues.

        Work that finished while the caller was busy then completes without a loop
        iteration spent on noticing it. While work is still watched and no other task
        leads, the caller becomes the leader and sweeps in place of the loop's tick.
        """
        scheduler = self.scheduler
        if scheduler.host_regions:  # (a context read costs more than the rest of a sweep)
            host_run = RUNNING_HOST_REGION.get()
            if host_run is not None:
                refuse_waiting_on(host_run, self.runs, self.after)
        watch = scheduler.watch
        if not watch.watched:
            return False
        watch.sweep(False)
        if self.remaining and watch.watched:
            watch.spin_near_end(self)
            if self.remaining and watch.watched and not watch.leader:
                watch.leader = True
                return True
        return False

    def sweep_again(self) -> bool:
        watch = self.scheduler.watch
        watch.sweep(True)
        if self.remaining and watch.watched:
            watch.spin_near_end(self)
        return bool(watch.watched)

    def release(self) -> None:
        watch = self.scheduler.watch
        watch.leader = False
        if watch.watched:
            watch.schedule_tick()

    def wake_lead(self) -> LoopNotifier | None:
        """The notifier, when the awaiting task is to wait on its wake-up socket: while
        queues are watched, the loop's sweeps finish regions, not posts."""
        scheduler = self.scheduler
        if scheduler.watch.watched:
            return None
        notifier = scheduler.notifier
        return notifier if notifier.lead() else None

    def cancel(self) -> bool:
        """Skip every region that has not passed its last check; True if there was one.

        Such a region is queued (waiting for admission, on its lane, or for what it
        follows) or issued to a queue that asks its check later (a worker thread's, on
        sim), which reads `cancelled` after this sets it. False when every region had
        passed it already (on a device stream, a region that follows only work on its
        device is issued and checked at submit), when the submission failed already (the
        rest skips anyway), and on a second call. A region whose check is under way on a
        worker thread at this moment counts as skipped.
        """
        if self.cancelled:
            return False
        self.cancelled = True
        skips = False
        if self.error is None and self.device_error is None:
            for run in self.runs:
                if run.outcome is not None:
                    continue
                state = run.state
                if state == QUEUED:
                    skips = True
                    break
                if state == ISSUED:
                    # Unchecked: handed to a queue (it has a fence) that asks later. A region
                    # issued without a fence (one that runs on the loop) has started.
                    verdict = run.verdict
                    if (
                        (verdict is None and run.fence is not None)
                        or verdict is CHECKING
                        or isinstance(verdict, Cancelled)
                    ):
                        skips = True
                        break
        self.scheduler.cancel_waiting(self)
        return skips


def refuse_waiting_on(
    host_run: RegionRun, runs: Sequence[RegionRun], after: Sequence[Completion]
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
