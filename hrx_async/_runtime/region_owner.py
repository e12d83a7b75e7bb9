"""What a region and its submission need of the scheduler that owns them.

`RegionRun` and `Submission` (region.py) are made by the scheduler and call back into
it: to finish a fence, to leave the admission queue, to read the poison book. They see
it as this base class of `Scheduler` (through `Outcomes`), so region.py imports nothing
that imports it. Being a compiled class like the scheduler, the base keeps those calls
and attribute reads native: a Protocol would make each one a dynamic lookup.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from .notify import LoopNotifier
from .poison import PoisonBook
from .watch import QueueWatch

UNREAD: Final[BaseException] = BaseException("the fence's error was not read yet")
"""`fence_done`'s default: the caller did not read the fence's error. (Declared here, so the
base and the implementation agree on it whichever way the call is made.)"""


class RegionOwner:
    """The scheduler that owns a submission, as the submission and its regions see it."""

    loop_thread: int
    """The event loop's thread: fences finished there are settled at once."""
    notifier: LoopNotifier
    """Hands work finished on other threads to the loop."""
    leaving: bool
    """Set when the runtime is left by an exception: every region not started skips."""
    poison_book: PoisonBook
    asyncio_loop: asyncio.AbstractEventLoop | None
    """The asyncio loop, or None on trio."""
    watch: QueueWatch
    host_regions: int
    """Its `async def` host functions running now (`host.AsyncHostProgram.run_region`): while
    there are none, a task awaiting its work runs none of them, and the check for one that
    would wait for itself (`region.refuse_waiting_on`) need not read the context."""

    def fence_done(self, run: Any, error: BaseException | None = UNREAD) -> None:
        """`run`'s fence finished (`Outcomes.fence_done`)."""
        raise NotImplementedError

    def cancel_waiting(self, submission: Any) -> None:
        """A cancelled `submission` leaves the admission queue (`Scheduler.cancel_waiting`)."""
        raise NotImplementedError
