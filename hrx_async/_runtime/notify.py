"""Thread-safe, batched wake-ups of the event loop.

Fences finish on worker or waiter threads. `LoopNotifier.post` queues a call
for the loop thread and schedules at most one wake-up for a burst, so many
completions cost one loop iteration. Works on asyncio and trio.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any


class LoopNotifier:
    """Runs posted calls on the event loop thread that created it."""

    def __init__(self) -> None:
        self._schedule: Callable[[Callable[[], None]], Any] = loop_scheduler()
        self._items: collections.deque[tuple[Callable[[Any], None], Any]] = collections.deque()
        self._scheduled = False
        self._closed = False

    def post(self, fn: Callable[[Any], None], arg: Any) -> None:
        """Call `fn(arg)` on the loop thread soon. Safe from any thread."""
        self._items.append((fn, arg))
        if not self._scheduled:
            # A racing poster may schedule a second drain; that costs one empty wake-up only.
            self._scheduled = True
            try:
                self._schedule(self._drain)
            except RuntimeError:
                # The loop is gone: nobody is left to be told.
                self._closed = True

    def _drain(self) -> None:
        self._scheduled = False
        items = self._items
        while items:
            fn, arg = items.popleft()
            fn(arg)


def loop_scheduler() -> Callable[[Callable[[], None]], Any]:
    """The current loop's thread-safe "call this soon" (asyncio or trio)."""
    import asyncio

    try:
        return asyncio.get_running_loop().call_soon_threadsafe
    except RuntimeError:
        import trio

        return trio.lowlevel.current_trio_token().run_sync_soon
