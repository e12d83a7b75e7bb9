"""Admission and issue of every region (their outcomes: `outcomes.py`).

`Scheduler.submit` is synchronous: it checks the submission, registers each
region's byte ranges with the tracker (so ordering across submissions is per
byte range, in call order) and issues what it can at once: a region on an idle
lane whose dependencies are finished, or issued to the same backend (device-side
waits), whichever submission they belong to. The rest goes to its
lane's task (`lane_task.LaneRunner`), which waits for dependencies (issued on the
same backend, else finished) and issues in FIFO order; when it issues one, the
later regions of that submission that waited only for it follow at once. Fences come
back through their callbacks, from the loop's sweep of watched GPU streams
(`watch.QueueWatch`) or from backend threads through the loop notifier.

A region's outcome settles only once everything it follows has settled, so
ordering is transitive through skipped work (see `outcomes.Outcomes.finish`).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Final, cast

import anyio
import anyio.abc

from .._core.clock import get_ident, perf_counter
from .._core.counters import Counters
from .._core.graph import RegionPlan
from .._core.lane import Lane
from .._core.trace import TraceRecorder
from .._core.tracker import AccessTracker
from ..errors import (
    Busy,
    Cancelled,
    ContractError,
    DependencyFailed,
    DeviceLost,
    HrxError,
    PoisonedError,
    RuntimeClosed,
)
from .completion import Completion, Signal
from .hold import LaneHold
from .host import AsyncHostProgram
from .lane_task import LaneRunner
from .notify import LoopNotifier
from .outcomes import Outcomes
from .poison import PoisonBook
from .region import (
    DONE,
    ISSUED,
    PASSED,
    QUEUED,
    RUNNING_HOST_REGION,
    SKIPPED,
    RegionRun,
    Submission,
)
from .watch import QueueWatch

if TYPE_CHECKING:
    from .._core.memory import Buffer
    from ..backends.base import Fence
    from .replay import ByteAccess, ReplayPlan


_NO_WAITS: Final[tuple[Fence, ...]] = ()


class Scheduler(Outcomes):
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
        """Regions whose outcome is final, to be settled in order (see `finish`), while a
        call settles another (`settling_now`)."""
        self.settling_now = False
        self.in_flight = 0
        self.waiting: collections.deque[Submission] = collections.deque()
        self.live = 0
        self.unfinished: dict[Submission, None] = {}
        """Submissions not finished yet, in submission order (what a native stage follows)."""
        self.idle: Signal | None = None
        self.trace: TraceRecorder | None = None
        self.trace_origin = 0.0
        self.lost: BaseException | None = None
        self.leaving = False
        """Set when the runtime is left by an exception: every region not started skips."""
        self.host_regions = 0
        self.closed = False
        self.pumping = False
        self.loop_thread = get_ident()
        self.asyncio_loop: asyncio.AbstractEventLoop | None
        try:
            self.asyncio_loop = asyncio.get_running_loop()
        except RuntimeError:  # trio
            self.asyncio_loop = None
        self.watch = QueueWatch(self.asyncio_loop)

    def start(self, gpus: int, npus: int) -> None:
        """Start every lane task (three per GPU, one per NPU, the host lane) and trio's
        queue watcher from the opening task. Admission also happens in loop callbacks (a
        finished submission admits the next one), where no task can be started."""
        keys = [(lane, gpu) for gpu in range(gpus) for lane in Lane if lane < Lane.NPU]
        keys += [(Lane.HOST, 0)] + [(Lane.NPU, index) for index in range(max(npus, 1))]
        for key in keys:
            self._start_lane(key)
        if self.asyncio_loop is None:
            self.task_group.start_soon(self.watch.serve, name="hrx-queue-watcher")

    def _start_lane(self, key: tuple[Lane, int]) -> LaneRunner:
        lane = self.lanes[key] = LaneRunner(self, key)
        self.task_group.start_soon(lane.serve, name=f"hrx-lane-{key[0].label}-{key[1]}")
        return lane

    # -- admission -------------------------------------------------------------

    def submit(self, replay: ReplayPlan, after: Iterable[Completion], nowait: bool) -> Completion:
        # The hot path of every replay: checks that pass cost one comparison each, and
        # the slower explanations live in _refuse and _check_inputs.
        if self.closed or self.lost is not None or get_ident() != self.loop_thread:
            self._refuse()
        marks = replay.marks
        frees = marks.frees
        if frees != replay.frees_seen:
            for buffer in replay.buffers:
                buffer.check_alive()
            replay.frees_seen = frees
        for buffer in replay.inputs:
            if buffer.poison is not None:
                self._check_input_poison(replay, buffer)
        if marks.mappings:
            replay.mappings.check_conflicts(replay.plan)
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
        early: Fence | None = None
        early_error: BaseException | None = None
        started = 0.0
        if admit_now and not after_items and replay.first_on_stream:
            started = perf_counter()
            try:
                early = self._launch_first(replay, started)
            except BaseException as exc:  # launched and failed: the region fails in _admit
                early_error = exc

        submission = Submission(self, replay.label, after_items, started)
        submission.lanes = replay.lanes
        tracker = self.tracker
        estimates = replay.estimates
        runs = submission.runs
        queues = replay.queues
        launched = early is not None
        chain = replay.chain
        for step in replay.steps:
            (
                region, program, provider, key, accesses, clears, inputs, coherent, budget, host,
                index, copies,
            ) = step  # fmt: skip
            if launched:
                # It runs already, so what it writes whole is no longer poisoned (nothing
                # can have come between its launch and here).
                launched = False
                for buffer in clears:
                    if buffer.poison is not None:
                        self.poison_book.clear(buffer)
                clears = ()
            run = RegionRun(
                submission, region, program, provider, estimates, key, clears, inputs, queues,
                budget, host, index, copies,
            )  # fmt: skip
            if chain is None:
                if coherent:  # its syncs depend on who wrote its inputs last
                    run.program = run.program_for_writers(tracker, coherent)
                self._record(run, accesses)
            runs.append(run)
        if chain is not None:
            # (The chain keeps the list itself: the submission's own is only ever replaced.)
            found = tracker.record_chain(chain, cast("list[object]", runs))
            if found is None:  # other work is pending on its bytes
                for index, run in enumerate(runs):
                    self._record(run, replay.steps[index][4])
            else:
                waits = found.deps
                for index, run in enumerate(runs):
                    run.chained = found
                    deps = waits[index]
                    if deps:
                        run.deps = cast("tuple[RegionRun, ...]", deps)  # the chain's users
        submission.remaining = len(runs)
        self.counters.submissions += 1
        self.live += 1
        self.unfinished[submission] = None
        if early is not None or early_error is not None:
            self._admit(submission, early, started, early_error)
        elif admit_now:
            self._admit(submission)
        else:
            for run in submission.runs:
                self.expect_clears(run)
            self.waiting.append(submission)
        return submission.completion

    def _record(self, run: RegionRun, accesses: tuple[ByteAccess, ...]) -> None:
        """Register `run`'s byte-range accesses: it waits for the regions they conflict with
        (other users of the tracker, host mappings and interop, are checked elsewhere)."""
        deps = self.tracker.record_all(accesses, run)
        if deps:
            run.deps = tuple([dep for dep in deps if isinstance(dep, RegionRun)])

    def expect_clears(self, run: RegionRun) -> None:
        """Tell the poison book that `run` will write its `clears` whole, once it waits
        where a later submission's input check could come before it runs (for admission,
        on its lane, on a queue that checks it later on another thread): that check then
        lets the later submission through, as the poison may be cleared first. A region
        launched on a device stream at submit needs none: its check passed as it launched."""
        if run.clears and not run.expected:
            run.expected = True
            self.poison_book.expect(run.clears)

    def submit_hold(self, label: str, key: tuple[Lane, int], hold: LaneHold) -> Completion:
        """Admit a native stage (`NativeSession.run`): one region that takes lane `key` to
        itself once every submission before it has finished (any lane, conflicting or
        not), runs `hold` off the loop, then gives the lane back. Regions of that lane
        submitted after it wait behind it, in the lane's order; other lanes go on.

        Stages count against `max_submissions` like submissions: beyond it, `Busy`.
        """
        if self.closed or self.lost is not None or get_ident() != self.loop_thread:
            self._refuse()
        if self.live >= self.max_submissions:
            raise Busy(
                f"native session capacity exhausted: {self.live} submissions and stages are "
                f"pending (max_submissions={self.max_submissions})"
            )
        hold.older = [submission.completion for submission in self.unfinished]
        submission = Submission(self, label, ())
        plan = RegionPlan(0, key[0], (), (), (), (), 0, gpu=key[1])
        submission.runs.append(
            RegionRun(submission, plan, hold, None, [0.0], key, host_side=True)
        )
        submission.remaining = 1
        self.counters.submissions += 1
        self.live += 1
        self.unfinished[submission] = None
        if self.in_flight < self.max_submissions and not self.waiting:
            self._admit(submission)
        else:
            self.waiting.append(submission)
        return submission.completion

    async def _hold(self, run: RegionRun, hold: LaneHold) -> None:
        """The lane task reached a native stage: wait for what came before, then hold."""
        for completion in hold.older:
            if not completion.done():
                await completion.wait_done()
        hold.older = []
        if run.submission.cancelled or self.leaving:
            self.finish(run, None, skipped=True)
            return
        if self.lost is not None:
            self.finish(run, DeviceLost(f"the device was lost ({self.lost})"))
            return
        lane = self.lanes[run.key]
        lane.held = True
        run.state = ISSUED
        run.verdict = PASSED  # started: nothing can skip it now
        run.started_at = perf_counter()
        try:
            with anyio.CancelScope(shield=True):
                error = await hold.run()
        except BaseException as exc:  # the worker thread could not run it at all
            error = exc
        finally:
            lane.held = False
        self.finish(run, error)
        self._pump()  # what queued behind the stage may go now

    def _check_input_poison(self, replay: ReplayPlan, buffer: Buffer) -> None:
        """Refuse a graph that reads poisoned bytes of `buffer` before writing them.

        Only when no admitted region will overwrite the buffer whole before it: whether
        that one runs is decided later, and the graph's own regions check again then.
        """
        if self.poison_book.expected(buffer):
            return
        found = self.poison_book.find(i for i in replay.input_reads if i.buffer is buffer)
        if found is not None:
            raise PoisonedError(found[0], found[1])

    def _launch_first(self, replay: ReplayPlan, now: float) -> Fence | None:
        """Launch a graph's first region before any bookkeeping, when nothing can come
        before it; `_admit` would issue it at once anyway.

        Only for a first region on a device stream (`replay.first_on_stream`, checked by
        the caller: watched queues issue at once, so cancelling could not skip the work
        anyway), on an idle lane, and when no earlier work
        still uses any of its bytes. The bookkeeping that follows then overlaps the
        device's work instead of delaying it. None when the region does not qualify.
        """
        step = replay.steps[0]
        program, provider, key, accesses, budget_us = step[1], step[2], step[3], step[4], step[8]
        lane = replay.lanes[0]
        if lane is None:
            lane = self.lanes.get(key)
            if lane is None:
                return None
            replay.lanes[0] = lane
        if lane.items or lane.current is not None:
            return None
        allocs = self.tracker.allocations
        for access in accesses:
            if access[0] in allocs:
                return None
        queue = replay.queues[0]
        if queue is None:
            queue = replay.queues[0] = provider.queue(key)  # type: ignore[attr-defined]
        return self.watch.launch(queue, budget_us, program, (), None, replay.estimates[0], now)

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
        first: Fence | None = None,
        started: float = 0.0,
        first_error: BaseException | None = None,
    ) -> None:
        """Issue what can go now and queue the rest on its lanes. `first` is the first
        region's fence when `_launch_first` already launched it, `first_error` its launch's
        failure. (Two arguments, not one of either type: compiled, telling a fence from an
        exception is a generic `isinstance`, several hundred instructions per replay.)"""
        self.in_flight += 1
        submission.admitted = True
        lanes = self.lanes
        direct = not submission.after and self.lost is None
        runs = submission.runs
        queued = False
        if first is not None or first_error is not None:
            run = runs[0]
            run.state = ISSUED
            run.verdict = PASSED  # launched with no check: nothing can skip it now
            run.started_at = started
            if first is None:
                self.finish(run, first_error)
            else:
                self._attach(run, first)  # (its poison was cleared in `submit`)
            runs = runs[1:]
        known: list[LaneRunner | None] | None = submission.lanes
        for run in runs:
            lane = None if known is None else known[run.index]
            if lane is None:
                key = run.key
                lane = lanes.get(key) or self._start_lane(key)
                if known is not None:
                    known[run.index] = lane
            if direct and not lane.items and lane.current is None:
                waits = self._device_waits(run)
                if waits is not None:
                    # Nothing queued ahead on this lane, and what it waits for the device
                    # orders by itself: issue now, with no lane wake-up or loop iteration.
                    self._launch(run, waits)
                    continue
            if run.clears:
                self.expect_clears(run)
            lane.push(run)
            queued = True
        if queued and direct:
            self._pump()  # its lane task may not have come round to what is ahead yet

    @staticmethod
    def _device_waits(run: RegionRun) -> Sequence[Fence] | None:
        """The fences `run` can wait for on the device, when that is all it waits for:
        every dependency finished, or issued to the same backend (by its own submission or
        an earlier one). None when something needs a wait on the host (the lane task does
        that, and until then the region can be cancelled).

        Replays of work on one device therefore go to its queues at submit time, each
        behind device-side waits for what it follows, as a hand-written chain of streams
        and events would: nothing is left for `cancel()` to skip, and no lane task wakes."""
        if run.host_side:
            return None
        if not run.deps:
            return _NO_WAITS
        waits: list[Fence] = []
        provider = run.provider
        for dep in run.deps:
            state = dep.state
            if state in (DONE, SKIPPED):
                continue
            fence = dep.fence
            if state != ISSUED or fence is None or dep.provider is not provider:
                return None
            outcome = dep.outcome
            if outcome is None:
                waits.append(fence)
            elif outcome[0] is not None or outcome[1]:
                return None  # it failed or was skipped and waits to settle: the lane judges
            # (else it ran and waits only for what it follows to settle: nothing to wait for)
        return waits

    def cancel_waiting(self, submission: Submission) -> None:
        """A cancelled submission still waiting for admission leaves the queue; it finishes
        once what it follows has (it never takes one of the `max_submissions` places, which
        the submissions it follows may still be waiting for)."""
        if submission in self.waiting:
            self.waiting.remove(submission)
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
            if (
                dep.provider is run.provider
                and not on_host
                and not isinstance(dep.program, AsyncHostProgram)  # it has no fence
            ):
                await dep.wait_issued()
                if dep.fence is not None and not dep.finished:
                    waits.append(dep.fence)
            else:
                await dep.wait_finished()
        if run.state != QUEUED or run.outcome is not None:
            return  # issued meanwhile along with an earlier region of its submission
        if isinstance(program, LaneHold):
            await self._hold(run, program)
            return
        if self.lost is not None:
            self.finish(run, DeviceLost(f"the device was lost ({self.lost})"))
            return
        # The host function runs right here, so its last check is this one.
        refusal = run.preflight() if on_host else run.refusal(poison=not waits)
        if refusal is not None:
            self._refused(run, refusal)
            return
        if on_host:
            assert isinstance(program, AsyncHostProgram)
            self._start_host(run, program)
            return
        self._launch(run, waits)
        self._pump()

    def _pump(self) -> None:
        """Issue the next region of every lane that waits only for work issued to its own
        backend, as its lane task would one loop iteration later, and again while that
        lets more go: the later regions of a submission a lane task just issued, and
        replays queued behind a lane that was busy when they were admitted (without this,
        once a lane has a queue, every replay behind it goes through the lane tasks, one
        wake-up per region, for as long as new ones keep coming).

        A lane's next region is the one its task waits on, else its first queued one; a
        lane whose task waits on one that cannot go yet keeps its order. Cancelling could
        have skipped a region until this moment, exactly as on the lane.
        """
        if self.pumping or self.lost is not None:
            return
        self.pumping = True
        try:
            progress = True
            while progress:
                progress = False
                for lane in self.lanes.values():
                    if lane.held:
                        continue  # a native stage holds it (`submit_hold`)
                    items = lane.items
                    head = lane.current
                    queued = head is None or head.state != QUEUED
                    if queued:
                        if not items:
                            continue
                        head = items[0]
                    assert head is not None
                    if head.state != QUEUED or head.outcome is not None or head.submission.after:
                        continue
                    waits = self._device_waits(head)
                    if waits is None:
                        continue
                    if queued:
                        items.popleft()
                    refusal = head.refusal(poison=not waits)
                    if refusal is not None:
                        self._refused(head, refusal)
                    else:
                        self._launch(head, waits)
                    progress = True
        finally:
            self.pumping = False

    def _refused(self, run: RegionRun, refusal: BaseException) -> None:
        if isinstance(refusal, Cancelled) and run.submission.error is None:
            self.finish(run, None, skipped=True)
        else:
            self.finish(run, refusal)

    def _launch(self, run: RegionRun, waits: Sequence[Fence]) -> None:
        """Hand `run` to its queue (device-side waits first) and follow its fence."""
        run.state = ISSUED
        run.started_at = started = perf_counter()
        index = run.index
        provider = run.provider
        budget = run.budget
        if budget <= 0.0 and run.clears:
            self.expect_clears(run)  # its queue checks it later, on another thread
        try:
            queues = run.queues
            if queues is None:
                queue = provider.queue(run.key)  # type: ignore[attr-defined]
            else:
                queue = queues[index]
                if queue is None:
                    queue = queues[index] = provider.queue(run.key)  # type: ignore[attr-defined]
            fence = self.watch.launch(
                queue,
                budget,
                run.program,
                waits,
                run.preflight,
                run.estimates[index],
                started,
            )
        except BaseException as exc:
            self.finish(run, exc)
            return
        self._attach(run, fence)

    @staticmethod
    def _attach(run: RegionRun, fence: Fence) -> None:
        """`run` was issued as `fence`: wake who waits for that, and follow the fence."""
        run.fence = fence
        waiters = run.issued_waiters
        if waiters is not None:
            run.issued_waiters = None
            for signal in waiters:
                signal.set()
        fence.follow(run)

    def _start_host(self, run: RegionRun, program: AsyncHostProgram) -> None:
        """Run an `async def` host function as a task of its own.

        The host lane goes on meanwhile, so work the function submits and awaits is not
        stuck behind it; awaiting work that depends on the function itself is refused
        (see `refuse_waiting_on`).
        """
        run.state = ISSUED
        run.started_at = perf_counter()
        self.task_group.start_soon(program.run_region, run, self.finish)

    # -- shutdown --------------------------------------------------------------

    def fail_pending(self, error: BaseException) -> None:
        """After a device loss: everything not yet issued fails."""
        for lane in self.lanes.values():
            while lane.items:
                self.finish(lane.items.popleft(), error)
        while self.waiting:
            submission = self.waiting.popleft()
            for run in submission.runs:
                self.finish(run, error)

    def cancel_all(self) -> None:
        """Leaving by an exception: nothing that has not started will start."""
        self.leaving = True
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
            # One event shared by every drainer: each new one must not strand the others.
            if self.idle is None:
                self.idle = Signal(self.asyncio_loop)
            await self.idle

    def close_lanes(self) -> None:
        self.closed = True
        for lane in self.lanes.values():
            lane.close()
        self.watch.close()
        self.notifier.close()
