"""The outcome of every region: settling in dependency order, and finishing submissions.

A region's outcome settles only once everything it follows has settled, so
ordering is transitive through skipped work (see `Outcomes.finish`). `Scheduler`
is built on this: admission and issue there, outcomes here.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

from .._core.clock import perf_counter
from .._core.counters import Counters
from .._core.graph import RegionPlan
from .._core.trace import TraceEvent, TraceRecorder
from .._core.tracker import AccessTracker
from ..errors import Cancelled, DependencyFailed, HrxError
from .completion import Completion, Signal
from .region import DONE, FAILED, SKIPPED, RegionRun, Submission, is_sticky
from .region_owner import UNREAD, RegionOwner


class Outcomes(RegionOwner):
    """How regions end and submissions finish; the state it needs is the scheduler's."""

    counters: Counters
    tracker: AccessTracker[object]
    settling: collections.deque[RegionRun]
    settling_now: bool
    trace: TraceRecorder | None
    trace_origin: float
    lost: BaseException | None
    on_device_lost: Callable[[BaseException], None]
    in_flight: int
    max_submissions: int
    waiting: collections.deque[Submission]
    live: int
    unfinished: dict[Submission, None]
    idle: Signal | None

    def _admit(self, submission: Submission) -> None:
        raise NotImplementedError

    def fence_done(self, run: RegionRun, error: BaseException | None = UNREAD) -> None:
        """`run`'s fence finished (`error`: its failure, when the caller read it already)."""
        fence = run.fence
        assert fence is not None
        if fence.started_at is not None:
            run.started_at = fence.started_at
        if error is UNREAD:
            error = fence.error()
        self.finish(run, error, fence.skipped(), fence.finished_at)

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
        after = run.submission.after
        if after:
            blockers += self._block_on(run, after)
        run.outcome = (error, skipped, finished_at)
        if blockers and self.lost is None:  # once the device is lost, nothing runs anyway
            run.blockers = blockers
            return
        self._ready(run)

    def _block_on(self, run: RegionRun, after: tuple[Completion, ...]) -> int:
        """Make `run` wait for the unfinished completions of `after`; how many. (Its own
        method: compiled, a function holding a lambda makes the lambda's environment on
        every call, and `finish` runs once per region.)"""
        blockers = 0
        for item in after:
            if not item.done():
                blockers += 1
                item._on_done(lambda: self._unblock(run))
        return blockers

    def _unblock(self, run: RegionRun) -> None:
        run.blockers -= 1
        if run.blockers == 0 and run.state < DONE:
            self._ready(run)

    def _ready(self, run: RegionRun) -> None:
        settling = self.settling
        if self.settling_now or settling:
            settling.append(run)  # an outer call is settling; it takes this one in turn
            return
        # The usual case, one region that settles alone, passes no queue.
        self.settling_now = True
        try:
            self._settle(run)
            while settling:
                try:
                    self._settle(settling[0])
                finally:
                    settling.popleft()
        finally:
            self.settling_now = False

    def _settle(self, run: RegionRun) -> None:
        if run.state >= DONE:
            return
        assert run.outcome is not None
        error, skipped, finished_at = run.outcome
        end = finished_at if finished_at is not None else perf_counter()
        submission = run.submission
        plan = run.plan
        chained = run.chained
        if chained is None:
            self.tracker.forget(run)
        else:
            run.chained = None  # (the replay holds its regions: no cycle left behind)
            self.tracker.forget_chained(chained, run.index)
        if run.clears:
            run.run_clears(ran=False)  # ended without running: it clears nothing any more
        if error is not None:
            run.state = FAILED
            run.error = error
            self.note_failure(error)
            # Work that never ran leaves its outputs as they were; work that failed (or read
            # poisoned input) leaves them undefined.
            run.apply_failure(error)
            # The submission reports the failure itself, not a region that refused because
            # of it (that one may settle first: it did not have to wait for it).
            known = submission.error
            if known is None or (
                isinstance(known, DependencyFailed) and not isinstance(error, DependencyFailed)
            ):
                submission.error = run.failure_cause(error)
        elif skipped:
            run.state = SKIPPED
            submission.skipped = True
        else:
            run.state = DONE
            started = run.started_at
            if started is not None and run.fence is not None:
                # Learn how long this region takes: an idle loop watches its next replay as long.
                estimates, index = run.estimates, run.index
                estimates[index] = 0.8 * estimates[index] + 0.2 * (end - started)
            if run.copies:
                self.counters.count_copies(run.copies)
        started = run.started_at
        if started is not None and run.state != SKIPPED:
            completion = submission.completion
            if completion.started_at is None or started < completion.started_at:
                completion.started_at = started
        if self.trace is not None and started is not None and run.state != SKIPPED:
            # A skipped region never ran: it has no place on the timeline.
            self.trace.record(
                TraceEvent(
                    graph=submission.label,
                    region=plan.index,
                    lane=plan.lane,
                    start_us=(started - self.trace_origin) * 1e6,
                    duration_us=max(0.0, end - started) * 1e6,
                    copied_bytes=plan.copy_bytes if run.state == DONE else 0,
                    failed=run.state == FAILED,
                    device=plan.queue_key[1],
                )
            )
        if run.deps or run.issued_waiters or run.done_waiters or run.followers:
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
        waiters = run.issued_waiters
        if waiters is not None:
            run.issued_waiters = None
            for signal in waiters:
                signal.set()
        waiters = run.done_waiters
        if waiters is not None:
            run.done_waiters = None
            for signal in waiters:
                signal.set()
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
        if submission.admitted:
            self.in_flight -= 1
        self.live -= 1
        del self.unfinished[submission]
        waiting = self.waiting
        while waiting and self.in_flight < self.max_submissions:
            self._admit(waiting.popleft())
        if self.live == 0 and self.idle is not None:
            self.idle.set()
            self.idle = None
