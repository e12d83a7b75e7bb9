"""A lane's task and its queue: the regions of one lane, issued in FIFO order.

Compiled (see `_build.COMPILED`): the scheduler reads a lane's queue and current region
for every region it admits, natively so.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Protocol

import anyio

from .._core.lane import Lane
from .completion import Signal
from .region import RegionRun


class Issuer(Protocol):
    """What a lane's task needs of the scheduler that starts it (`Scheduler.issue`)."""

    asyncio_loop: asyncio.AbstractEventLoop | None

    async def issue(self, run: RegionRun) -> None: ...


class LaneRunner:
    """One lane's task: issues its regions in FIFO order."""

    def __init__(self, scheduler: Issuer, key: tuple[Lane, int]) -> None:
        self.scheduler = scheduler
        self.key = key
        self.items: collections.deque[RegionRun] = collections.deque()
        self.wakeup: Signal | None = None
        """What the idle task awaits (a `Signal`: compiled code must not await an
        `anyio.Event`, see `Signal`)."""
        self.closing = False
        self.current: RegionRun | None = None
        """The region this lane's task is issuing (it may be waiting for dependencies)."""
        self.held = False
        """A native stage runs with this lane to itself: nothing behind it may start."""

    def push(self, run: RegionRun) -> None:
        self.items.append(run)
        if self.wakeup is not None:
            self.wakeup.set()

    def close(self) -> None:
        self.closing = True
        if self.wakeup is not None:
            self.wakeup.set()

    async def serve(self) -> None:
        # Shielded: a cancelled caller must never strand admitted work; the lane ends when
        # the runtime closes it after draining.
        with anyio.CancelScope(shield=True):
            items = self.items
            issue = self.scheduler.issue
            loop = self.scheduler.asyncio_loop
            issued = 0
            while True:
                issued += 1
                if issued % 32 == 0:
                    await anyio.lowlevel.checkpoint()  # a long queue must not starve the loop
                if not items:
                    if self.closing:
                        return
                    wakeup = self.wakeup = Signal(loop)
                    await wakeup
                    self.wakeup = None
                    continue
                self.current = items.popleft()
                try:
                    await issue(self.current)
                finally:
                    self.current = None
