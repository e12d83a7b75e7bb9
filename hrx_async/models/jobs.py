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
Leaving the `async with` block waits for every job; leaving it by an exception cancels
the queued ones and waits for the running ones. For the event loop thread only.
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
        return self._cancel_requested

    def done(self) -> bool:
        return self.state is JobState.DONE

    def cancelled(self) -> bool:
        return self.state is JobState.DONE and isinstance(self._error, Cancelled)

    def result(self) -> Any:
        """The job's value; its error raised; `Busy` while it is not done."""
        if self.state is not JobState.DONE:
            raise Busy(f"job {self.ident} is {self.state.value}; await it")
        if self._error is not None:
            raise self._error
        return self._result

    def exception(self) -> BaseException | None:
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
        try:
            if exc is not None:
                for job in list(self._queue):
                    job.cancel()
                    self._settle_queued(job)
            else:
                await self.join()
        finally:
            self._closed = True
            # Running jobs shield themselves, so this waits for them even when cancelled.
            await task_group.__aexit__(None, None, None)
            self._task_group = None
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
        return self._running

    def submit(
        self, fn: Any, /, *args: Any, callback: Callable[[Job], object] | None = None
    ) -> Job:
        """Queue `fn(*args)` (or an awaitable, with no args); `Busy` at capacity."""
        task_group = self._task_group
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
            if inspect.iscoroutine(fn):
                fn.close()  # refused: never awaited, and no warning about it
            raise Busy(
                f"{self.label!r} is full: {self._running} running and {len(self._queue)} "
                f"queued of capacity {self.capacity}"
            )
        self._ids += 1
        job = Job(self, self._ids, fn, args, callback)
        self.submitted += 1
        if self._running < self.workers:
            self._running += 1
            task_group.start_soon(self._worker, job)
        else:
            self._queue.append(job)
        return job

    async def run(self, fn: Any, /, *args: Any) -> Any:
        """Submit and wait for the job's result."""
        return await self.submit(fn, *args)

    # -- running ---------------------------------------------------------------------

    async def _worker(self, job: Job | None) -> None:
        try:
            while job is not None:
                if job._cancel_requested:
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
            except BaseException as exc:
                self._settle(job, None, exc)
                raise
        if job._cancel_requested:
            error = Cancelled(f"job {job.ident} was cancelled; its work ran to the end")
            value = None
        self._settle(job, value, error)

    def _settle_queued(self, job: Job) -> None:
        try:
            self._queue.remove(job)
        except ValueError:
            return
        self._settle(job, None, Cancelled(f"job {job.ident} was cancelled before it ran"))

    def _settle(self, job: Job, value: Any, error: BaseException | None) -> None:
        if job.state is JobState.DONE:
            return
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
