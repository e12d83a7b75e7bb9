"""The fence every backend's queue returns: a token that one submitted program finished.

A base class, not a protocol: the two kinds there are (`StreamFence` of a device stream,
`ThreadFence` of a worker thread) derive from it, and the compiled runtime, which reads a
fence several times per region, then calls its methods and reads its times natively instead
of looking each up by name.
"""

from __future__ import annotations

from collections.abc import Callable


class FenceFollower:
    """What follows a fence (the runtime's region): told once it finished, before its done
    callbacks. A base class: the compiled fences then tell it with a direct call, where a
    callable is called through Python's generic call, once per region of every replay."""

    __slots__ = ()

    def fence_finished(self, fence: Fence) -> None:
        """`fence` finished; may run on any thread, as done callbacks do."""
        raise NotImplementedError


class Fence:
    """A token that a submitted program has finished (successfully, failed or skipped).

    `add_done_callback` callbacks may run on any thread; they must be quick and
    thread-safe (the runtime hands them to the event loop).
    """

    __slots__ = ("finished_at", "started_at")

    # Set by each kind's own __init__ (no call up to a base initializer per fence).
    started_at: float | None
    """When the program started, as far as the backend knows (perf_counter seconds)."""
    finished_at: float | None
    """When it was seen finished."""

    def query(self) -> bool:
        """True once finished. Never blocks."""
        raise NotImplementedError

    def wait(self, timeout: float | None = None) -> bool:
        """Block the calling thread (never the event loop) until finished or timeout."""
        raise NotImplementedError

    def error(self) -> BaseException | None:
        """The failure, once finished; None on success."""
        raise NotImplementedError

    def skipped(self) -> bool:
        """True when the program was cancelled before it started."""
        raise NotImplementedError

    def add_done_callback(self, callback: Callable[[Fence], None]) -> None:
        """Call `callback(fence)` once finished (at once if it already is)."""
        raise NotImplementedError

    def follow(self, follower: FenceFollower) -> None:
        """Tell `follower` once finished (at once if it already is). A fence has one
        follower at most; a kind with no faster way makes it a done callback."""
        self.add_done_callback(follower.fence_finished)
