"""Completion: the awaitable outcome of one submission.

Awaiting never cancels anything: cancelling the awaiting task only stops the
wait. `cancel()` is the one way to skip work, and it skips only regions that
have not started. Other threads use `wait(timeout)`. `add_done_callback` and
`as_future()` let asyncio's own tools (`asyncio.wait`, `asyncio.as_completed`)
wait for completions alongside other futures.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, Final

from .._core.clock import get_ident, perf_counter
from ..errors import Busy, ContractError, Unsupported
from .notify import LoopNotifier


@dataclass(frozen=True, slots=True)
class CompletionProfile:
    """Host-observed times of one submission, in microseconds."""

    elapsed_us: float
    """From submit() to the completion resolving."""
    queue_us: float | None
    """From submit() to the first region starting (None if none ran)."""


class CompletionSource:
    """What a completion asks of the work behind it, until it resolves (`region.Submission`).

    A base class, not a protocol: compiled, the calls every await makes on it are then
    direct calls, where a protocol's are attribute lookups and generic calls.
    """

    __slots__ = ()

    def cancel(self) -> bool:
        """Skip what has not started; True if that was anything."""
        raise NotImplementedError

    def sweep(self) -> bool:
        """Finish whatever already completed, without waiting; called before suspending.

        True makes the caller the *leader*: it keeps calling `sweep_again()` between
        checkpoints instead of suspending until woken, then calls `release()`.
        """
        raise NotImplementedError

    def sweep_again(self) -> bool:
        """The leader's sweep; False once sweeping is no longer worth it (wait instead)."""
        raise NotImplementedError

    def release(self) -> None:
        """The leader stops sweeping."""
        raise NotImplementedError

    def wake_lead(self) -> LoopNotifier | None:
        """trio, before the awaiting task parks: the notifier whose wake-up socket it is to
        wait on itself (`LoopNotifier.lead`), or None to park until woken."""
        raise NotImplementedError


class _Shared:
    """The module's mutable state, in native fields: compiled, a module global is a
    dictionary entry, read and written on every await."""

    __slots__ = (
        "checkpoint",
        "checkpoint_if_cancelled",
        "current_task",
        "finished_without_yield",
        "reschedule",
        "resumed",
        "trio",
        "wait_task_rescheduled",
    )

    def __init__(self) -> None:
        self.trio: Any = None
        """`trio.lowlevel`, once imported, and the three functions of it a park and its
        wake-up call, and its two checkpoints (here, each is a field read; through the
        module, a lookup by name):"""
        self.checkpoint: Any = None
        self.checkpoint_if_cancelled: Any = None
        self.current_task: Any = None
        self.wait_task_rescheduled: Any = None
        self.reschedule: Any = None
        self.resumed: Any = None
        """What parked tasks are rescheduled with (`resumed.RESUMED`), once trio is imported."""
        self.finished_without_yield = 0
        """Awaits in a row that returned without yielding (see `Completion.wait_done`)."""


_shared: Final = _Shared()


def trio_checkpoint() -> Callable[[], Awaitable[None]]:
    """trio's own checkpoint. anyio's looks up the running backend on every call, which is
    a sixth of a trio checkpoint's cost."""
    trio_lowlevel()
    checkpoint: Callable[[], Awaitable[None]] = _shared.checkpoint
    return checkpoint


def trio_lowlevel() -> Any:
    """`trio.lowlevel`, imported on first use. A trio task parks on its completion with
    `wait_task_rescheduled` and is woken with `reschedule`: an `anyio.Event` per wait costs
    several times more (backend lookup, two wrapper objects)."""
    lowlevel = _shared.trio
    if lowlevel is None:
        import trio.lowlevel

        from .resumed import RESUMED

        lowlevel = trio.lowlevel
        _shared.checkpoint = lowlevel.checkpoint
        _shared.checkpoint_if_cancelled = lowlevel.checkpoint_if_cancelled
        _shared.current_task = lowlevel.current_task
        _shared.wait_task_rescheduled = lowlevel.wait_task_rescheduled
        _shared.reschedule = lowlevel.reschedule
        _shared.resumed = RESUMED
        _shared.trio = lowlevel
    return lowlevel


class _DoneWait:
    """What `Completion.wait_done` awaits: the completion's wait, without its error."""

    __slots__ = ("completion",)

    def __init__(self, completion: Completion) -> None:
        self.completion = completion

    def __await__(self) -> Generator[Any, None, None]:
        return self.completion._wait()


class Signal:
    """A one-shot wake-up on the loop's thread: `set()` wakes every task awaiting it.

    What a completion's waiters park on, and what a lane task awaits before it issues a
    region (`RegionRun.wait_issued`, `wait_finished`) or a drain waits for. On asyncio each
    waiter waits on a plain future of its own (so cancelling one cancels only its own wait),
    on trio the task parks with `wait_task_rescheduled`: several times cheaper than an
    `anyio.Event`. Compiled code must not await an `anyio.Event` anyway: it would pass a
    cancellation on to anyio's coroutine with the three-argument `throw()`, which Python
    3.12 deprecates (under `-W error` the cancelled task would fail with the warning); a
    future yielded bare, as here, gets the cancellation raised at the `yield`.
    """

    __slots__ = ("_futures", "_loop", "_tasks", "is_set")

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self._loop = loop
        """The asyncio loop, or None on trio."""
        self.is_set = False
        self._futures: list[asyncio.Future[None]] | None = None
        self._tasks: list[Any] | None = None
        """trio: the tasks parked on it (asyncio waits on `_futures`)."""

    def set(self) -> None:
        if self.is_set:
            return
        self.is_set = True
        tasks = self._tasks
        if tasks is not None:
            self._tasks = None
            trio_lowlevel()
            reschedule = _shared.reschedule
            resumed = _shared.resumed
            for task in tasks:
                reschedule(task, resumed)
        futures = self._futures
        if futures is not None:
            self._futures = None
            for future in futures:
                if not future.done():
                    future.set_result(None)

    def __await__(self) -> Generator[Any, None, None]:
        if self.is_set:
            return
        loop = self._loop
        if loop is not None:
            # (`loop.create_future()` is this call inside a Python method of asyncio's loop.)
            future: asyncio.Future[None] = asyncio.Future(loop=loop)
            if self._futures is None:
                self._futures = [future]
            else:
                self._futures.append(future)
            # What `yield from future.__await__()` does, without the `yield from` (see the
            # class docstring).
            future._asyncio_future_blocking = True
            yield future
        else:
            # The task parks right here, with `wait_task_rescheduled`, until `set`
            # reschedules it; cancelling it only takes it out of the list (awaiting never
            # cancels work). No coroutine of our own in between: every level a resumed
            # task passes through costs it a send.
            lowlevel = trio_lowlevel()
            task = _shared.current_task()
            tasks = self._tasks
            if tasks is None:
                tasks = self._tasks = [task]
            else:
                tasks.append(task)

            def abort(_: Any) -> Any:
                if task in tasks:
                    tasks.remove(task)
                return lowlevel.Abort.SUCCEEDED

            yield from _shared.wait_task_rescheduled(abort).__await__()


YIELD_EVERY: Final = 8
"""How many awaits in a row of completions already done (or finished by their own sweep)
return without yielding to the loop."""

# Makes threads that call `wait()` at once share one event (`_resolve` takes no lock). One
# lock for all completions: threads rarely wait, and a lock per submission would cost more.
_THREAD_WAITERS = threading.Lock()
_LOG = logging.getLogger("hrx_async")


class Completion:
    """The outcome of one submission (await it, or poll `done()`)."""

    __slots__ = (
        "_callbacks",
        "_error",
        "_leader",
        "_loop",
        "_signal",
        "_source",
        "_thread_event",
        "finished_at",
        "label",
        "owner",
        "started_at",
        "submitted_at",
        "wait_check",
    )

    def __init__(
        self,
        label: str,
        source: CompletionSource,
        loop: asyncio.AbstractEventLoop | None = None,
        owner: object = None,
        submitted_at: float = 0.0,
    ) -> None:
        self.label = label
        self.owner = owner
        """The scheduling domain that made it: `after=` accepts only its own."""
        self._source: CompletionSource | None = source
        self._callbacks: list[Callable[[], None]] | None = None
        self._loop = loop
        self._error: BaseException | None = None
        self._signal: Signal | None = None
        """What awaiting tasks park on, made when the first one does."""
        self._leader: LoopNotifier | None = None
        """trio: the notifier whose wake-up socket the awaiting task waits on."""
        self._thread_event: threading.Event | None = None
        self.wait_check: Callable[[Completion], None] | None = None
        """Run by `wait()` before it blocks (a facade refusing waits that would deadlock)."""
        self.submitted_at = submitted_at or perf_counter()
        """When it was submitted (the submitter's clock reading, when it has one)."""
        self.started_at: float | None = None
        self.finished_at: float | None = None

    # -- called by the scheduler on the loop thread ---------------------------------

    def _resolve(self, error: BaseException | None) -> None:
        if self.finished_at is not None:
            return
        self._error = error
        self._source = None
        # No lock: `wait` publishes its event before it reads `finished_at`, and this reads
        # the event after publishing `finished_at`, so one of the two sees the other.
        self.finished_at = perf_counter()
        thread_event = self._thread_event
        leader = self._leader
        if leader is not None:
            leader.nudge()
        signal = self._signal
        if signal is not None:
            self._signal = None
            signal.set()
        if thread_event is not None:
            thread_event.set()
        callbacks = self._callbacks
        if callbacks is not None:
            self._callbacks = None
            for callback in callbacks:
                callback()

    def _on_done(self, callback: Callable[[], None]) -> None:
        """Call `callback()` on the loop thread once resolved (at once if it is)."""
        if self.finished_at is not None:
            callback()
        elif self._callbacks is None:
            self._callbacks = [callback]
        else:
            self._callbacks.append(callback)

    def _mark_started(self, when: float) -> None:
        if self.started_at is None or when < self.started_at:
            self.started_at = when

    # -- public ----------------------------------------------------------------

    def done(self) -> bool:
        """Whether the submission has finished (ran, failed or was cancelled); never waits."""
        return self.finished_at is not None

    def result(self) -> None:
        """Return if the submission succeeded, raise its error if it failed; never waits."""
        if self.finished_at is None:
            raise Busy(f"submission of {self.label!r} has not finished; await it or use wait()")
        if self._error is not None:
            raise self._error

    def exception(self) -> BaseException | None:
        """The submission's error (None if it succeeded); `Busy` if it has not finished."""
        if self.finished_at is None:
            raise Busy(f"submission of {self.label!r} has not finished")
        return self._error

    def cancel(self) -> bool:
        """Skip the regions that have not started; running ones drain.

        True if that skipped anything (awaiting then raises `Cancelled`, unless a region
        failed); False when it is done, was cancelled already, or every region had
        started or been issued where nothing can skip it any more (on a device stream, a
        region that follows only work on its own device is issued at submit).
        """
        source = self._source
        if source is None:
            return False
        return source.cancel()

    def add_done_callback(self, fn: Callable[[Completion], object]) -> None:
        """Call `fn(completion)` on the loop's thread once it is done (at once if it is).

        As `asyncio.Future.add_done_callback` does, but without a loop iteration in
        between. An exception `fn` raises is logged (logger `hrx_async`); it does not reach
        the runtime. Call it on the loop's thread: ContractError from another thread.
        """
        if not callable(fn):
            raise ContractError(f"add_done_callback takes a callable, got {fn!r}")
        self._check_loop_thread("add_done_callback")

        def call() -> None:
            try:
                fn(self)
            except Exception:
                _LOG.exception("done callback %r of %r raised", fn, self)

        self._on_done(call)

    def as_future(self) -> asyncio.Future[None]:
        """A new asyncio future of this completion, for `asyncio.wait`, `as_completed`, ...

        It gets the submission's outcome: None, or its error as the exception. Cancelling
        the future (as `asyncio.wait_for` or a cancelled `gather` do) cancels that future
        only: the work runs on, as when an awaiting task is cancelled; `cancel()` is what
        skips work. asyncio only (Unsupported on trio, whose nurseries do what these
        tools do); on the loop's thread.
        """
        loop = self._loop
        if loop is None:
            raise Unsupported(
                "as_future() makes an asyncio future; on trio, await the completion in a "
                "nursery task"
            )
        self._check_loop_thread("as_future")
        future: asyncio.Future[None] = loop.create_future()

        def settle() -> None:
            if future.done():  # cancelled by its holder
                return
            if self._error is None:
                future.set_result(None)
            else:
                future.set_exception(self._error)

        self._on_done(settle)
        return future

    def _check_loop_thread(self, what: str) -> None:
        loop_thread = getattr(self.owner, "loop_thread", None)
        if loop_thread is not None and get_ident() != loop_thread:
            raise ContractError(
                f"{what}() was called from a thread other than the runtime's event loop; "
                "use wait() there"
            )

    async def wait_done(self) -> None:
        """Wait until finished without raising the submission's error.

        Awaiting a completion that was already done returns at once, as awaiting a
        finished future does; so does one that this very await finishes (its sweep found
        the work done), except that every `YIELD_EVERY`-th such await in a row yields once,
        so a task that submits and awaits in a loop never starves the loop. (Yielding every
        time would cost each short replay a loop iteration, a quarter of its latency on
        asyncio and more on trio.) On trio every await is still a cancel point: a cancelled
        caller gets `Cancelled` there, as from any of trio's own awaits.
        """
        await _DoneWait(self)

    def __await__(self) -> Generator[Any, None, None]:
        yield from self._wait()
        if self._error is not None:
            raise self._error

    def _wait(self) -> Generator[Any, None, None]:
        """`wait_done` as a generator, so that awaiting a completion runs it with no coroutine
        object in between. On asyncio its checkpoint is a bare `yield`, which is what
        `asyncio.sleep(0)` yields (a task whose coroutine yields None steps again in the next
        loop iteration), without the two calls and the coroutine that one makes."""
        loop = self._loop
        if loop is not None and self.finished_at is not None:
            return
        source = self._source
        lead = source.sweep() if source is not None else False
        if self.finished_at is not None:
            if _shared.finished_without_yield < YIELD_EVERY:
                _shared.finished_without_yield += 1
                if loop is None:
                    trio_lowlevel()
                    yield from _shared.checkpoint_if_cancelled().__await__()
                return
            _shared.finished_without_yield = 0
            if loop is not None:
                yield  # asyncio.sleep(0)
            else:
                yield from trio_checkpoint()().__await__()
            return
        _shared.finished_without_yield = 0
        if lead:
            assert source is not None
            # Sweeping between checkpoints notices the end of the work in the same loop
            # iteration that resumes this task, one iteration sooner than being woken.
            checkpoint = trio_checkpoint() if loop is None else None
            try:
                while True:
                    if checkpoint is None:
                        yield  # asyncio.sleep(0)
                    else:
                        yield from checkpoint().__await__()
                    # (`done()`, not the attribute: it changed across the await.)
                    if not source.sweep_again() or self.done():
                        break
            finally:
                source.release()
            if self.done():
                return
        if loop is None and source is not None:
            notifier = source.wake_lead()
            if notifier is not None:
                # This task reads the wake-up socket itself: a post from a worker thread
                # resumes it in the pass that runs the post, not one pass later.
                self._leader = notifier
                wait_readable = trio_lowlevel().wait_readable
                fd = notifier.wake_fd
                try:
                    while not self.done():  # (not the attribute: see above)
                        yield from wait_readable(fd).__await__()
                        notifier.woken()
                finally:
                    self._leader = None
                    notifier.step_down()
                return
        signal = self._signal
        if signal is None:
            signal = self._signal = Signal(loop)
        yield from signal.__await__()

    def wait(self, timeout: float | None = None) -> bool:
        """Block this (non-loop) thread until finished; False on timeout, changing nothing.

        `wait_check`, when set, runs first and raises where the wait could never return.
        """
        check = self.wait_check
        if check is not None:
            check(self)
        if self.finished_at is not None:
            return True
        with _THREAD_WAITERS:  # (threads that wait at once share one event)
            if self._thread_event is None:
                self._thread_event = threading.Event()
            event = self._thread_event
        if self.finished_at is not None:  # resolved before it could see the event
            return True
        return event.wait(timeout)

    @property
    def profile(self) -> CompletionProfile:
        """How long it took from `submit()` to finishing, and how long it queued before its
        first region started (µs); `Busy` if it has not finished."""
        if self.finished_at is None:
            raise Busy(f"submission of {self.label!r} has not finished; no profile yet")
        queue_us = None
        if self.started_at is not None:
            queue_us = max(0.0, (self.started_at - self.submitted_at) * 1e6)
        return CompletionProfile((self.finished_at - self.submitted_at) * 1e6, queue_us)

    def __repr__(self) -> str:
        state = "pending" if self.finished_at is None else ("failed" if self._error else "done")
        return f"<Completion {self.label!r} {state}>"
