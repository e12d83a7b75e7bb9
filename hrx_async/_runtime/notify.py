"""Thread-safe, batched wake-ups of the event loop.

Fences finish on worker or waiter threads. `LoopNotifier.post` queues a call
for the loop thread and schedules at most one wake-up for a burst, so many
completions cost one loop iteration. Works on asyncio and trio.

On trio a wake-up through `run_sync_soon` costs two loop passes: trio's own
entry-queue task runs the posted calls in the first, and the task they
reschedule (the one awaiting the completion) runs in the second. So a task that
must park on trio reads a wake-up socket of ours itself, when no other task does
(`lead`): while it leads, posts write a byte to that socket, and trio's I/O
manager resumes the leader, which runs the posted calls and sees its own
completion finish, in one pass.
"""

from __future__ import annotations

import collections
import socket
import threading
from collections.abc import Callable
from typing import Any


class LoopNotifier:
    """Runs posted calls on the event loop thread that created it."""

    def __init__(self) -> None:
        self._schedule: Callable[[Callable[[], None]], Any]
        self._items: collections.deque[tuple[Callable[[Any], None], Any]] = collections.deque()
        self._scheduled = False
        self.posted = 0
        """Calls posted so far (from any thread)."""
        self._lock: threading.Lock | None = None
        """trio: guards `_scheduled` and `leading` between posters and the leader."""
        self._wake_in: socket.socket | None = None
        self._wake_out: socket.socket | None = None
        self.wake_fd = -1
        """trio: the socket the leader waits to become readable."""
        self.leading = False
        """trio: a task waits on `wake_fd` now; posts wake it rather than trio's entry queue."""
        self.in_drain = False
        """True while the leader runs posted calls (what they finish, it sees itself)."""
        self._close_on_step_down = False
        import asyncio

        try:
            self._schedule = asyncio.get_running_loop().call_soon_threadsafe
        except RuntimeError:
            import trio

            self._schedule = trio.lowlevel.current_trio_token().run_sync_soon
            self._lock = threading.Lock()
            self._wake_in, self._wake_out = socket.socketpair()
            self._wake_in.setblocking(False)
            self._wake_out.setblocking(False)
            self.wake_fd = self._wake_in.fileno()

    def post(self, fn: Callable[[Any], None], arg: Any) -> None:
        """Call `fn(arg)` on the loop thread soon. Safe from any thread."""
        self.posted += 1
        lock = self._lock
        if lock is None:
            self._items.append((fn, arg))
            if not self._scheduled:
                # A racing poster may schedule a second drain; that costs one empty wake-up.
                self._scheduled = True
                self._schedule_drain()
            return
        with lock:
            self._items.append((fn, arg))
            if self._scheduled:
                return
            self._scheduled = True
            to_leader = self.leading
        if to_leader:
            self._write_wake()
        else:
            self._schedule_drain()

    def _schedule_drain(self) -> None:
        try:  # noqa: SIM105  (as in _write_wake)
            self._schedule(self._drain)
        except RuntimeError:
            pass  # the loop is gone: nobody is left to be told

    def _write_wake(self) -> None:
        out = self._wake_out
        if out is None:
            return
        # (Not contextlib.suppress: that would be an object per post.)
        try:  # noqa: SIM105
            out.send(b"\0")
        except OSError:
            # Full: the bytes already there wake the leader. Closed: nobody is left.
            pass

    def _drain(self) -> None:
        lock = self._lock
        if lock is None:
            self._scheduled = False
        else:
            with lock:
                self._scheduled = False
        self._run_posted()

    def _run_posted(self) -> None:
        items = self._items
        while items:
            fn, arg = items.popleft()
            fn(arg)

    # -- trio: the task that reads the wake-up socket ----------------------------------

    def lead(self) -> bool:
        """Make the calling task the one that waits on `wake_fd`; False where another
        task does already, or on asyncio (whose wake-ups cost one iteration anyway)."""
        lock = self._lock
        if lock is None or self.leading or self._wake_in is None:
            return False
        with lock:
            self.leading = True
        return True

    def woken(self) -> None:
        """The leader found `wake_fd` readable: run what was posted."""
        wake_in = self._wake_in
        if wake_in is not None:
            try:  # noqa: SIM105  (as in _write_wake)
                wake_in.recv(4096)  # more than that: the next wait returns at once
            except OSError:
                pass  # a spurious wake-up
        self.in_drain = True
        try:
            self._drain()
        finally:
            self.in_drain = False

    def nudge(self) -> None:
        """Wake the leader from the loop thread (what it awaits finished another way)."""
        if self.leading and not self.in_drain:
            self._write_wake()

    def step_down(self) -> None:
        """The leader stops waiting on `wake_fd`; what was posted to it runs now."""
        lock = self._lock
        assert lock is not None
        with lock:
            self.leading = False
            woke_leader = self._scheduled
            self._scheduled = False
        if self._close_on_step_down:
            self._close_sockets()
        if woke_leader:
            # Posts that went to the socket reach nobody now (a drain scheduled through
            # trio finds nothing left, which costs it nothing).
            self._run_posted()

    def close(self) -> None:
        """Release the wake-up socket (later posts go through the loop, or nowhere)."""
        if self._lock is None:
            return
        if self.leading:  # (written on this thread only)
            # Closing a socket a task waits on fails that task's wait: the leader closes it.
            self._close_on_step_down = True
        else:
            self._close_sockets()

    def _close_sockets(self) -> None:
        wake_in, wake_out = self._wake_in, self._wake_out
        self._wake_in = self._wake_out = None
        if wake_in is not None:
            wake_in.close()
        if wake_out is not None:
            wake_out.close()
