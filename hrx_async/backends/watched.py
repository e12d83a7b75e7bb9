"""The queues whose fences the event loop finishes itself: device streams and NPU lanes.

A base class, not a protocol, for the reason `Fence` is one: the compiled queue watch
(`_runtime/watch.py`) starts, sweeps and stops watching such a queue on every replay, and
on a compiled subclass (`StreamQueue`) those are then direct calls that pass their numbers
unboxed, where a protocol's are attribute lookups, argument parsing and a tuple built per
sweep. Queues written in Python (the several-GPU and NPU queues) derive from it too; their
calls go through Python as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._core.compiler import mypyc_attr
from .fence import Fence
from .worker import Preflight


@mypyc_attr(allow_interpreted_subclasses=True)
class WatchedQueue:
    """An in-order queue of one lane whose fences the event loop can finish itself.

    While watched, the loop calls `sweep()` once per iteration and the queue's own waiter
    stays idle, so a short wait costs no thread hop. Subclasses call `__init__`.
    """

    def __init__(self) -> None:
        self.watch_deadline = -1.0
        """The loop's watch keeps it here (`_runtime/watch.QueueWatch`): while the loop
        watches it, until when an idle loop keeps sweeping it; -1 while it does not. (A
        field of the queue, read natively on every launch, not a dictionary's value.)"""

    def submit(
        self,
        program: Any,
        waits: Sequence[Fence],
        preflight: Preflight,
    ) -> Fence:
        """Enqueue device-side waits on `waits` (fences of this backend), then `program`
        (see `base.LaneQueue.submit`)."""
        raise NotImplementedError

    def watch(self) -> None:
        """The loop sweeps this queue from now on."""
        raise NotImplementedError

    def unwatch(self) -> None:
        """The loop stops sweeping; the queue's waiter finishes what is left."""
        raise NotImplementedError

    def sweep(self, limit: int) -> tuple[int, bool]:
        """Finish up to `limit` fences whose work completed: (how many, whether any remain)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError
