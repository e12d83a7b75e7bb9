"""The fences of a stream backend, the events they are recorded with, and their waiters.

A fence is an event recorded after a program on one stream. The unfinished
fences of a stream are kept in issue order (`StreamFences`): fences of one
stream finish in order. While the event loop watches a stream it sweeps the
finished head fences itself, once per loop iteration; when it stops watching,
a Python-owned waiter thread (`FenceWaiter`) blocks in the native event wait on
the oldest unfinished fence and finishes every completed one in one batch. No
Python callable is ever handed to the driver.

A finished fence also proves the fences its stream waited for on the device
(`StreamFence.implies`: the stream could not pass those waits before they
finished), and through them what those waited for: they finish with it, without
a query of their own. Sweeping the most recently launched stream first (see
`watch.QueueWatch.sweep`) then finishes a replay of work chained across streams
with one query.

Threads: fences are issued from one thread (the event loop's) and finish on
that thread or on waiter threads. Events are pooled (`EventPool`): only the
submitting thread re-records an event, and an event goes back to the pool only
once no waiter is blocked on it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any, Union

from .._core.clock import perf_counter
from ..errors import BackendError, Cancelled
from ._stream_calls import ReplayCalls
from ._stream_driver import DriverTable, quietly
from .fence import Fence, FenceFollower
from .worker import ThreadFence

Implied = Union["StreamFence", list["StreamFence"], None]
"""What a fence proves finished once it finished (`StreamFence.implies`)."""


class StreamFence(Fence):
    """An event recorded after a program on one stream; finished by its `StreamFences`."""

    __slots__ = (
        "_callbacks",
        "_done",
        "_error",
        "_event",
        "_follower",
        "_thread_event",
        "_track",
        "implies",
        "issued_at",
        "sequence",
    )

    def __init__(
        self, track: StreamFences, event: Any, issued_at: float, implies: Implied = None
    ) -> None:
        self._track = track
        self.implies = implies
        """The fences of other streams its stream waited for before its program (one, a
        list, or None): finished, it proves them finished. Dropped by whoever finishes it,
        so a fence never keeps finished ones alive."""
        self.sequence = 0
        """Its place in its stream's issue order (set by `StreamFences.add`)."""
        self._event = event
        self._follower: FenceFollower | None = None
        """Its follower (a fence usually has one: its region), told first once finished."""
        self._callbacks: list[Callable[[Any], None]] | None = None
        """Its done callbacks, in the order they were added."""
        self._done = False
        self._error: BaseException | None = None
        self._thread_event: threading.Event | None = None
        self.issued_at = issued_at
        self.started_at = None
        self.finished_at = None

    @property
    def track(self) -> StreamFences:
        """The fences of the stream it was recorded on."""
        return self._track

    def pending_event(self) -> Any:
        """The event to wait on device-side, or None once finished."""
        return None if self._done else self._event

    def query(self) -> bool:
        if self._done:
            return True
        try:
            if not self._track.calls.event_query(self._event):
                return False
        except BackendError as exc:
            self._track.finish_early(self, exc)
            return True
        self._track.finish_early(self, None)
        return True

    def wait(self, timeout: float | None = None) -> bool:
        with self._track.lock:
            if self._done:
                return True
            if self._thread_event is None:
                self._thread_event = threading.Event()
            waiter = self._thread_event
        return waiter.wait(timeout)

    def error(self) -> BaseException | None:
        return self._error

    def skipped(self) -> bool:
        return False

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        with self._track.lock:
            if not self._done:
                if self._callbacks is None:
                    self._callbacks = [callback]
                else:
                    self._callbacks.append(callback)
                return
        callback(self)

    def follow(self, follower: FenceFollower) -> None:
        # acquire/release, not `with`: compiled, a `with` looks up and calls the lock's
        # __enter__ and __exit__, twice the cost, once per region.
        track = self._track
        track.acquire()
        try:
            done = self._done
            if not done and self._follower is None:
                self._follower = follower
                return
        finally:
            track.release()
        if done:
            follower.fence_finished(self)
        else:
            self.add_done_callback(follower.fence_finished)  # a second follower

    def _mark(self, error: BaseException | None, started_at: float, now: float) -> None:
        """Finish under the track's lock; whoever marked it then runs its callbacks outside
        the lock (`_run_fence_callbacks`): none can be added once it is done."""
        self._error = error
        self.started_at = started_at
        self.finished_at = now
        self._done = True
        if self._thread_event is not None:
            self._thread_event.set()


def finished_fence(refusal: BaseException) -> ThreadFence:
    """A fence for a program that never ran: skipped when cancelled, else failed."""
    fence = ThreadFence()
    if isinstance(refusal, Cancelled):
        fence.finish(skipped=True)
    else:
        fence.finish(refusal)
    return fence


class EventPool:
    """Reusable events, taken by the loop thread and given back by whoever finishes a fence."""

    def __init__(self, table: DriverTable, blocking: bool) -> None:
        self._table = table
        self._blocking = blocking
        self._free: list[Any] = []
        """Events free to record, taken from the end (a list: compiled, its pop and append
        are native, a deque's are generic calls)."""
        self._all: list[Any] = []

    def take(self) -> Any:
        free = self._free
        if free:
            return free.pop()
        event = self._table.event_create(self._blocking)
        self._all.append(event)
        return event

    def give(self, event: Any) -> None:
        self._free.append(event)

    def close(self) -> None:
        for event in self._all:
            quietly(self._table.event_destroy, event)
        self._all.clear()
        self._free.clear()


class StreamFences:
    """The unfinished fences of one stream, in issue order, and the thread that waits on them.

    Fences of one stream finish in order, so finishing always works from the head.
    Two parties finish them. While the event loop *watches* the stream it sweeps
    the head itself (`sweep()`, once per loop iteration): a short wait then costs
    no thread hop and no contention for the interpreter lock. Otherwise a waiter
    thread blocks in the native wait on the oldest unfinished fence and finishes
    every completed one in one batch. The lock guards the deque and each fence's
    state; callbacks always run outside it.

    An event goes back to the pool once its fence is finished and the waiter
    is not blocked on it, so a fence's event is never re-recorded under a wait.
    """

    def __init__(self, table: DriverTable, device: int, pool: EventPool, name: str) -> None:
        self.table = table
        self.calls: ReplayCalls = table.replay_calls
        self.pool = pool
        self.lock = threading.Lock()
        # Its methods, bound once: compiled, a call through a stored bound method skips the
        # lookup by name that `lock.acquire()` makes (twice per region and per sweep).
        self.acquire: Callable[[], bool] = self.lock.acquire
        self.release: Callable[[], None] = self.lock.release
        self.pending: list[StreamFence] = []
        """Unfinished fences, oldest first (a list: compiled, its reads and appends are
        native, a deque's are calls by name; finished ones leave from the head in one
        deletion per sweep)."""
        self.issued = 0
        """Fences added so far (each one's `sequence`)."""
        self.watched = False
        self._last_finished = 0.0
        self._waiting_on: StreamFence | None = None
        self._parked = False
        """The waiter's fence was finished meanwhile: the waiter gives back its event."""
        self.by_loop = 0
        """Fences the event loop's sweeps finished (a short wait, no thread hop)."""
        self.by_waiter = 0
        """Fences the waiter thread finished (the loop had handed the stream back)."""
        self.by_proof = 0
        """Fences finished with no query or wait of their own: a later fence of another
        stream that waited for them finished (see `StreamFence.implies`)."""
        self._waiter = FenceWaiter(self, device, name)

    def add(self, fence: StreamFence) -> None:
        self.issued += 1
        fence.sequence = self.issued
        self.pending.append(fence)
        if not self.watched:
            self._waiter.wake()

    def watch(self) -> None:
        """The loop sweeps this stream from now on; the waiter stays away."""
        self.watched = True

    def unwatch(self) -> None:
        """The loop stops sweeping: the waiter takes over whatever is unfinished."""
        self.watched = False
        if self.pending:
            self._waiter.wake()

    def sweep(self, limit: int) -> tuple[int, bool]:
        """Finish up to `limit` fences whose work completed, from the head: (how many
        were finished, whether any remain)."""
        if not self.pending:
            return 0, False
        self.acquire()  # (not `with`: see StreamFence.add_done_callback)
        try:
            finished = self._collect(None, None, limit)
        finally:
            self.release()
        if finished is None:
            return 0, bool(self.pending)
        self.by_loop += len(finished)
        return _finish(finished), bool(self.pending)

    def finish_through(self, fence: StreamFence) -> list[StreamFence] | None:
        """`fence` is known finished (a later fence that waited for it finished): finish
        it and every fence before it, without queries; those it finished now."""
        self.acquire()
        try:
            finished = self._collect(None, None, -1, fence.sequence)
        finally:
            self.release()
        if finished is not None:
            self.by_proof += len(finished)
        return finished

    def finish_early(self, fence: StreamFence, error: BaseException | None) -> None:
        """`fence` was found complete out of order; it leaves the deque at the next sweep."""
        with self.lock:
            if fence._done:
                return
            fence._mark(error, fence.issued_at, perf_counter())
        _finish([fence])

    def _collect(
        self,
        head: StreamFence | None,
        head_error: BaseException | None,
        limit: int = -1,
        through: int = 0,
    ) -> list[StreamFence] | None:
        """Under the lock: pop and finish completed fences (`head` is known complete), at
        most `limit` of them when it is positive; those it finished now (None if none: the
        common answer of a sweep while work runs, which then allocates nothing).

        With `through` (a sequence number), the fences up to it are known complete and
        it stops there: nothing after them is asked."""
        finished: list[StreamFence] | None = None
        pending = self.pending
        calls = self.calls
        now = 0.0
        # Those taken off the head leave the list in one deletion, in `finally`: an error
        # out of the driver leaves none behind to be taken (its event given back) twice.
        taken = 0
        try:
            count = len(pending)
            while taken < count and limit:
                limit -= 1
                fence = pending[taken]
                marked = False
                if not fence._done:
                    error: BaseException | None = None
                    if through:
                        if fence.sequence > through:
                            break
                    elif fence is head:
                        error = head_error
                    else:
                        try:
                            if not calls.event_query(fence._event):
                                break
                        except BackendError as exc:
                            error = exc
                    if not now:
                        now = perf_counter()
                    # A fence cannot start before the previous one on its stream finished.
                    started = max(fence.issued_at, self._last_finished)
                    fence._mark(error, started, now)
                    self._last_finished = now
                    marked = True
                taken += 1
                if fence is self._waiting_on:
                    self._parked = True
                else:
                    self.pool.give(fence._event)
                if marked:
                    if finished is None:
                        finished = [fence]
                    else:
                        finished.append(fence)
        finally:
            if taken:
                del pending[:taken]
        return finished

    # -- the waiter thread's side --------------------------------------------------------

    def next_to_wait(self) -> StreamFence | None:
        """The oldest unfinished fence, unless the loop watches the stream (or none is left)."""
        with self.lock:
            if self.watched:
                return None
            finished = self._collect(None, None)
            head = self.pending[0] if self.pending else None
            self._waiting_on = head
        if finished is not None:
            self.by_waiter += len(finished)
            _finish(finished)
        return head

    def waited(self, head: StreamFence, error: BaseException | None) -> None:
        """The native wait on `head` returned: finish it and everything completed after it."""
        with self.lock:
            self._waiting_on = None
            if self._parked:
                self._parked = False
                self.pool.give(head._event)
            finished = self._collect(head, error)
        if finished is not None:
            self.by_waiter += len(finished)
            _finish(finished)

    def close(self) -> None:
        self._waiter.close()


def _finish(finished: list[StreamFence]) -> int:
    """After `finished` were marked (by the caller, outside every lock): finish what they
    prove, then run their callbacks, the proven fences' first (what a region follows then
    settles before it, as it would have been swept first). How many finished in all."""
    count = len(finished) + _finish_implied(finished)
    for fence in finished:
        _run_fence_callbacks(fence)
    return count


def _finish_implied(finished: list[StreamFence]) -> int:
    """Finish the fences `finished` prove (`StreamFence.implies`) and, through them, what
    those prove; how many that finished. The newest first: finishing through one fence
    of a stream finishes the older ones of that stream with it."""
    count = 0
    index = len(finished)
    while index:
        index -= 1
        fence = finished[index]
        implies = fence.implies
        if implies is None:
            continue
        fence.implies = None
        if fence._error is not None:
            continue  # a failed fence proves nothing about what it waited for
        if isinstance(implies, StreamFence):
            count += _finish_proven(implies)
        else:
            for proven in implies:
                count += _finish_proven(proven)
    return count


def _finish_proven(fence: StreamFence) -> int:
    if fence._done:
        return 0
    proven = fence._track.finish_through(fence)
    if proven is None:
        return 0
    return _finish(proven)


def _run_fence_callbacks(fence: StreamFence) -> None:
    """Tell a fence's follower, then run its callbacks in the order they were added, once
    (only its marker calls this, after `_mark`)."""
    follower = fence._follower
    if follower is not None:
        fence._follower = None
        follower.fence_finished(fence)
    more = fence._callbacks
    if more is not None:
        fence._callbacks = None
        for callback in more:
            callback(fence)


class FenceWaiter:
    """The thread that waits natively for one stream's fences the loop is not watching."""

    def __init__(self, track: StreamFences, device: int, name: str) -> None:
        self._track = track
        self._device = device
        # A lock used as a binary semaphore: released to wake the idle thread (one futex op).
        self._wake = threading.Lock()
        self._wake.acquire()
        self._idle = False
        self._closing = False
        self._worker_thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._worker_thread.start()

    def wake(self) -> None:
        # The thread sets _idle before its last look for work, so either it sees the new
        # work or we see _idle and release it.
        if self._idle:
            with contextlib.suppress(RuntimeError):  # already released: it is awake
                self._wake.release()

    def close(self) -> None:
        self._closing = True
        with contextlib.suppress(RuntimeError):
            self._wake.release()
        if threading.current_thread() is not self._worker_thread:
            self._worker_thread.join(timeout=10)

    def _run(self) -> None:
        track = self._track
        table = track.table
        with contextlib.suppress(BackendError):  # the waits below report the device's state
            table.set_device(self._device)
        while not self._closing:
            head = track.next_to_wait()
            if head is None:
                self._idle = True
                if track.next_to_wait() is None and not self._closing:
                    self._wake.acquire()
                self._idle = False
                continue
            error: BaseException | None = None
            try:
                table.event_synchronize(head._event)
            except BackendError as exc:
                error = exc
            track.waited(head, error)


__all__ = [
    "EventPool",
    "FenceWaiter",
    "Implied",
    "StreamFence",
    "StreamFences",
    "finished_fence",
]
