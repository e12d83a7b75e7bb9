"""A lane held by a native stage (`native.NativeSession`): the program of a region that
takes its lane to itself, off the loop, once everything submitted before it has finished."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread

if TYPE_CHECKING:
    from .completion import Completion


class LaneHold:
    """Runs `work` on a worker thread while its region holds the lane; `work` returns the
    region's failure (None: it succeeded). `older` is set at admission: the completions of
    every submission before it, which it waits for first (see `Scheduler.submit_hold`)."""

    __slots__ = ("native_graph", "older", "work")

    def __init__(self, work: Callable[[], BaseException | None]) -> None:
        self.work = work
        self.older: list[Completion] = []
        self.native_graph = False

    async def run(self) -> BaseException | None:
        # Shielded by the caller: once started, the stage and its fence always finish.
        return await anyio.to_thread.run_sync(self.work)
