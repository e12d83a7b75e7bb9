"""In-order worker-thread queues with thread-side fences.

The sim backend runs each lane on one of these, and the runtime's host lane
runs plain host functions on one. A device-side wait is a wait inside the
worker before it runs the item, so chains on one backend never touch the
event loop.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from .._core.clock import perf_counter
from ..errors import Cancelled
from .fence import Fence

Preflight = Callable[[], BaseException | None] | None
"""Asked right before an item runs: None runs it, `Cancelled` skips it, other errors fail it.
No preflight at all: nothing can refuse the item (it was launched before it had a region)."""


class Runnable(Protocol):
    native_graph: bool

    def run(self) -> None: ...


class ThreadFence(Fence):
    """Finished when its worker has run (or skipped, or failed) the item.

    A held lock is the latch: waiters block acquiring it and the worker releases it.
    Locks are not tracked by the garbage collector, and fences are made per region per
    replay, so this keeps collector pauses short under load (threading.Event is a
    Condition, a deque and a lock per waiter).
    """

    __slots__ = (
        "_callbacks",
        "_done",
        "_error",
        "_guard",
        "_latch",
        "_skipped",
    )

    def __init__(self) -> None:
        self._latch = threading.Lock()
        self._latch.acquire()
        self._guard = threading.Lock()
        self._done = False
        self._callbacks: list[Callable[[Any], None]] | None = None
        self._error: BaseException | None = None
        self._skipped = False
        self.started_at = None
        self.finished_at = None

    def query(self) -> bool:
        return self._done

    def wait(self, timeout: float | None = None) -> bool:
        if self._done:
            return True
        if self._latch.acquire(timeout=-1 if timeout is None else timeout):
            self._latch.release()
            return True
        return self._done

    def error(self) -> BaseException | None:
        return self._error

    def skipped(self) -> bool:
        return self._skipped

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        with self._guard:
            if not self._done:
                if self._callbacks is None:
                    self._callbacks = [callback]
                else:
                    self._callbacks.append(callback)
                return
        callback(self)

    def finish(self, error: BaseException | None = None, skipped: bool = False) -> None:
        self._error = error
        self._skipped = skipped
        self.finished_at = perf_counter()
        with self._guard:
            self._done = True
            callbacks, self._callbacks = self._callbacks, None
        self._latch.release()
        if callbacks is not None:
            for callback in callbacks:
                callback(self)


_STOP = object()
_this_worker = threading.local()


def worker_origin() -> threading.Thread | None:
    """On a worker queue's thread, the thread that made the queue; None on other threads.

    Code that runs on behalf of whoever made the worker (host functions, sim kernels) must
    not block on it: a blocking facade asks this to refuse where it would deadlock.
    """
    origin: threading.Thread | None = getattr(_this_worker, "origin", None)
    return origin


class WorkerQueue:
    """One daemon thread executing submitted programs in FIFO order."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._items: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._origin = threading.current_thread()
        self._worker = threading.Thread(target=self._work, name=name, daemon=True)
        self._worker.start()

    def submit(self, program: Runnable, waits: Sequence[Any], preflight: Preflight) -> ThreadFence:
        fence = ThreadFence()
        self._items.put((program, tuple(waits), preflight, fence))
        return fence

    def close(self) -> None:
        self._items.put(_STOP)
        if threading.current_thread() is not self._worker:
            self._worker.join(timeout=10)

    def _work(self) -> None:
        _this_worker.origin = self._origin
        while True:
            item = self._items.get()
            if item is _STOP:
                return
            fence: ThreadFence = item[3]
            error, skipped = _run_item(*item)
            if error is not None:
                _release_runtime_frames(error)
            # The item reaches the region's program and views, so its buffers. It goes
            # before the fence finishes: whoever awaits the fence may drop the last handle
            # to a buffer the moment it does, and a collection then must not find it held
            # here (nor across the wait for the next item).
            del item
            fence.finish(error, skipped)
            del fence, error


def _release_runtime_frames(error: BaseException) -> None:
    """Clear the locals of the runtime's own frames in `error`'s traceback (and its causes'):
    they hold the region's program, its views and so its buffers. The error outlives them
    (in the completion, the poison book, a log), and whoever awaits it may drop the last
    handle to a buffer while this thread still holds the error for a moment; the buffer
    must go then, not once this thread comes round. The user's own frames keep their
    locals, for post-mortem debugging."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for frame, _ in traceback.walk_tb(current.__traceback__):
            if str(frame.f_globals.get("__name__", "")).startswith("hrx_async."):
                with contextlib.suppress(RuntimeError):  # still executing: not ours to clear
                    frame.clear()
        current = current.__cause__ or current.__context__


def _run_item(
    program: Runnable, waits: Sequence[Any], preflight: Preflight, fence: ThreadFence
) -> tuple[BaseException | None, bool]:
    """Run one queued item: (its error, whether it was skipped). A function, so that
    nothing of the item stays in the worker's frame once it returns."""
    for dependency in waits:
        dependency.wait()
    refusal = preflight() if preflight is not None else None
    if refusal is not None:
        if isinstance(refusal, Cancelled):
            return None, True
        return refusal, False
    fence.started_at = perf_counter()
    try:
        program.run()
    except BaseException as exc:
        return exc, False
    return None, False
