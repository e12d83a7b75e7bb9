"""Bounded host jobs: coroutines on a task group, blocking callables on worker threads.

    async with Jobs(workers=4, capacity=64) as jobs:
        job = jobs.submit(decode_image, payload, callback=on_done)   # never waits
        pixels = await job                                            # or job.result()

At most `workers` jobs run at a time and at most `capacity` (>= workers) are queued or
running; `submit` beyond that raises `Busy`. A coroutine function (or an awaitable)
runs on the jobs' task group; any other callable runs on a worker thread, so it may
block (on a `Completion.wait()`, a file, a native call) without stalling the loop. A
blocking job may call back into the loop with `anyio.from_thread`.

Every job settles exactly once, and its `callback(job)` (if any) then runs exactly once
on the loop. `job.cancel()` of a queued job settles it at once with `Cancelled`; of a
running job it never interrupts the work: the job settles with `Cancelled` after its
work returns (the result is dropped). A job that raises settles with its exception.
Leaving the `async with` block waits for every job; leaving it by an exception, or being
cancelled while waiting there, settles the jobs that have not started with `Cancelled`
(they never run) and waits for the running ones.

A job raising what is not an `Exception` (`SystemExit`, `KeyboardInterrupt`, ...) stops
the jobs: that job settles with `Cancelled` (the exception chained as its cause), the
jobs that have not started settle with `Cancelled`, `submit` refuses, the owner's block
is cancelled like a task group whose child failed, and once the running jobs have
returned, leaving the block raises that exception itself (the first, unwrapped): it
reaches the owner and nothing else. A coroutine that is refused or never runs is closed,
so nothing warns that it was never awaited. For the event loop thread only.
"""

from __future__ import annotations

import collections
import enum
import functools
import inspect
import logging
from collections.abc import Callable, Generator
from types import TracebackType
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread

from ..errors import Busy, Cancelled, ContractError, RuntimeClosed
from . import _check

logger = logging.getLogger("hrx_async.models.jobs")


class JobState(enum.Enum):
    """Where a job is: `QUEUED`, `RUNNING` (a worker runs its function) or `DONE`."""
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"


class Job:
    """One submitted job. `await job` gives its result or raises its error (`Cancelled`
    when cancelled); `done()`, `result()`, `exception()` and `cancel()` never wait."""

    __slots__ = (
        "_args",
        "_callback",
        "_cancel_requested",
        "_done",
        "_error",
        "_fn",
        "_owner",
        "_result",
        "ident",
        "state",
    )

    def __init__(
        self,
        owner: Jobs,
        ident: int,
        fn: Any,
        args: tuple[Any, ...],
        callback: Callable[[Job], object] | None,
    ) -> None:
        self._owner = owner
        self.ident = ident
        self._fn = fn
        self._args = args
        self._callback = callback
        self.state = JobState.QUEUED
        self._cancel_requested = False
        self._result: Any = None
        self._error: BaseException | None = None
        self._done = anyio.Event()

    @property
    def cancel_requested(self) -> bool:
        """True once `cancel()` was called, even if the job ran on to the end."""
        return self._cancel_requested

    def done(self) -> bool:
        """True once the job finished: returned, failed or was cancelled."""
        return self.state is JobState.DONE

    def cancelled(self) -> bool:
        """True when the job is done and its outcome is `Cancelled`."""
        return self.state is JobState.DONE and isinstance(self._error, Cancelled)

    def result(self) -> Any:
        """The job's value; its error raised; `Busy` while it is not done."""
        if self.state is not JobState.DONE:
            raise Busy(f"job {self.ident} is {self.state.value}; await it")
        if self._error is not None:
            raise self._error
        return self._result

    def exception(self) -> BaseException | None:
        """The job's error, or None when it returned.

        `Busy` while it is not done yet (await it first)."""
        if self.state is not JobState.DONE:
            raise Busy(f"job {self.ident} is {self.state.value}; await it")
        return self._error

    def cancel(self) -> bool:
        """Ask the job to stop: False when it is already done. A queued job never runs; a
        running one settles with `Cancelled` once its work returns."""
        if self.state is JobState.DONE:
            return False
        self._cancel_requested = True
        if self.state is JobState.QUEUED:
            self._owner._settle_queued(self)
        return True

    async def wait(self) -> Any:
        """Wait until the job settles; its result, or its error raised."""
        await self._done.wait()
        return self.result()

    def __await__(self) -> Generator[Any, None, Any]:
        return self.wait().__await__()

    def __repr__(self) -> str:
        return f"<Job {self.ident} {self.state.value}>"


class Jobs:
    """`workers` (>= 1) at a time, `capacity` (>= workers) queued or running; see the
    module docstring. Enter it with `async with` before submitting."""

    def __init__(self, workers: int, capacity: int, label: str = "jobs") -> None:
        self.workers = _check.integer(workers, "workers", 1)
        self.capacity = _check.integer(
            capacity, f"a jobs capacity (>= workers = {self.workers})", self.workers
        )
        if not isinstance(label, str):
            raise ContractError(f"label must be a string, got {_check.shown(label)}")
        self.label = label
        self._queue: collections.deque[Job] = collections.deque()
        self._running = 0
        self._task_group: anyio.abc.TaskGroup | None = None
        self._limiter: anyio.CapacityLimiter | None = None
        self._closed = False
        self._skip_unstarted = False
        self._fatal: BaseException | None = None
        self._idle: anyio.Event | None = None
        self._ids = 0
        self.submitted = 0
        self.succeeded = 0
        self.failed = 0
        self.cancelled = 0

    # -- lifetime --------------------------------------------------------------------

    async def __aenter__(self) -> Jobs:
        if self._task_group is not None or self._closed:
            raise RuntimeClosed("a Jobs can be entered once; create a new one")
        self._limiter = anyio.CapacityLimiter(self.workers)
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = task_group
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        task_group = self._task_group
        assert task_group is not None
        stopped = exc
        if exc is None:
            try:
                await self.join()
            except BaseException as interrupted:  # the owner was cancelled while it waited
                stopped = interrupted
        self._closed = True
        if stopped is not None:
            self._cancel_unstarted()
        # Only a cancellation goes to the task group, which absorbs the one it caused itself
        # (see `_stop`); any other exception of the block goes on as it is, not in a group.
        # Running jobs shield themselves, so this waits for them even when cancelled.
        cancelled = anyio.get_cancelled_exc_class()
        forwarded = stopped if isinstance(stopped, cancelled) else None
        try:
            absorbed = await task_group.__aexit__(
                None if forwarded is None else type(forwarded),
                forwarded,
                None if forwarded is None else forwarded.__traceback__,
            )
        except BaseException:
            if self._fatal is None:
                raise
            absorbed = True
        finally:
            self._task_group = None
        if self._fatal is not None:
            raise self._fatal
        if absorbed:
            return True if exc is not None else None
        if stopped is not None and stopped is not exc:
            raise stopped  # join's interruption, which the task group did not raise itself
        return None

    async def join(self) -> None:
        """Wait until no job is queued or running."""
        while self._running or self._queue:
            if self._idle is None:
                self._idle = anyio.Event()
            await self._idle.wait()

    # -- submitting ------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Jobs queued or running."""
        return len(self._queue) + self._running

    @property
    def running(self) -> int:
        """Jobs a worker is running now."""
        return self._running

    def submit(
        self, fn: Any, /, *args: Any, callback: Callable[[Job], object] | None = None
    ) -> Job:
        """Queue `fn(*args)` (or an awaitable, with no args); `Busy` at capacity."""
        try:
            task_group = self._admit(fn, args, callback)
        except BaseException:
            if inspect.iscoroutine(fn):
                fn.close()  # refused: never awaited, and no warning about it
            raise
        self._ids += 1
        job = Job(self, self._ids, fn, args, callback)
        self.submitted += 1
        if self._running < self.workers:
            self._running += 1
            task_group.start_soon(self._worker, job)
        else:
            self._queue.append(job)
        return job

    def _admit(
        self, fn: Any, args: tuple[Any, ...], callback: Callable[[Job], object] | None
    ) -> anyio.abc.TaskGroup:
        """The task group to run a new job on, once every check has passed."""
        task_group = self._task_group
        if self._fatal is not None:
            raise RuntimeClosed(f"{self.label!r} stopped: a job raised {self._fatal!r}")
        if task_group is None or self._closed:
            raise RuntimeClosed(f"{self.label!r} is not open; submit inside `async with Jobs()`")
        if inspect.isawaitable(fn):
            if args:
                raise ContractError("an awaitable job takes no arguments")
        else:
            _check.function(fn, "a job")
        if callback is not None:
            _check.function(callback, "callback")
        if self.pending >= self.capacity:
            raise Busy(
                f"{self.label!r} is full: {self._running} running and {len(self._queue)} "
                f"queued of capacity {self.capacity}"
            )
        return task_group

    async def run(self, fn: Any, /, *args: Any) -> Any:
        """Submit and wait for the job's result."""
        return await self.submit(fn, *args)

    # -- running ---------------------------------------------------------------------

    async def _worker(self, job: Job | None) -> None:
        try:
            while job is not None:
                if job._cancel_requested or self._skip_unstarted:
                    self._settle(job, None, Cancelled(f"job {job.ident} was cancelled"))
                else:
                    await self._run(job)
                job = self._queue.popleft() if self._queue else None
        finally:
            self._running -= 1
            if not self._running and not self._queue and self._idle is not None:
                self._idle.set()
                self._idle = None

    async def _run(self, job: Job) -> None:
        job.state = JobState.RUNNING
        fn, args = job._fn, job._args
        value: Any = None
        error: BaseException | None = None
        # Running work is never interrupted: it drains, then the job settles.
        with anyio.CancelScope(shield=True):
            try:
                if inspect.isawaitable(fn):
                    value = await fn
                elif inspect.iscoroutinefunction(fn):
                    value = await fn(*args)
                else:
                    assert self._limiter is not None
                    value = await anyio.to_thread.run_sync(
                        functools.partial(fn, *args), limiter=self._limiter
                    )
                    if inspect.isawaitable(value):
                        value = await value
            except Exception as exc:
                error = exc
            except anyio.get_cancelled_exc_class() as exc:
                error = Cancelled(f"job {job.ident} was cancelled by its own work")
                error.__cause__ = exc
            except BaseException as exc:
                # Raised from this task it would end the task group (or, on asyncio, escape
                # the event loop); it is the owner's to handle.
                error = Cancelled(f"job {job.ident} was stopped by {exc!r}, raised to the owner")
                error.__cause__ = exc
                self._stop(exc)
        if job._cancel_requested:
            error = Cancelled(f"job {job.ident} was cancelled; its work ran to the end")
            value = None
        self._settle(job, value, error)

    def _stop(self, exc: BaseException) -> None:
        if self._fatal is None:
            self._fatal = exc
        self._cancel_unstarted()
        if self._task_group is not None:
            self._task_group.cancel_scope.cancel()

    def _cancel_unstarted(self) -> None:
        """Settle every job that has not started with `Cancelled`; none of them will run."""
        self._skip_unstarted = True
        for job in list(self._queue):
            self._settle_queued(job)

    def _settle_queued(self, job: Job) -> None:
        try:
            self._queue.remove(job)
        except ValueError:
            return
        self._settle(job, None, Cancelled(f"job {job.ident} was cancelled before it ran"))

    def _settle(self, job: Job, value: Any, error: BaseException | None) -> None:
        if job.state is JobState.DONE:
            return
        if job.state is JobState.QUEUED and inspect.iscoroutine(job._fn):
            job._fn.close()  # it never runs: no warning that it was never awaited
        job._result, job._error = value, error
        job.state = JobState.DONE
        job._fn = job._args = None  # type: ignore[assignment]
        if error is None:
            self.succeeded += 1
        elif isinstance(error, Cancelled):
            self.cancelled += 1
        else:
            self.failed += 1
        job._done.set()
        callback, job._callback = job._callback, None
        if callback is not None:
            try:
                callback(job)
            except Exception:
                logger.exception("the callback of job %d raised", job.ident)

    def __repr__(self) -> str:
        return (
            f"<Jobs {self.label!r} running={self._running} queued={len(self._queue)} "
            f"capacity={self.capacity}>"
        )


__all__ = ["Job", "JobState", "Jobs"]
