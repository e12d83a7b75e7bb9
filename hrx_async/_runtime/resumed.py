"""The one value trio tasks parked by the runtime are rescheduled with.

`trio.lowlevel.reschedule(task)` makes a new `outcome.Value(None)` for every wake-up (an
outcome can be unwrapped only once), and on trio every completion wakes a parked task: that
object was a fifth of a park and wake-up's cost on a one-task loop. A task parked in
`wait_task_rescheduled` only unwraps what it is sent, so an outcome whose unwrap can be
repeated (it holds nothing: None) serves every wake-up. Errors (a cancelled park) still
come from trio itself, as `outcome.Error`s of their own.

Imported only where trio runs (`outcome` is trio's dependency). Not compiled: it subclasses
a Python class.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Generator
from typing import TypeVar

import outcome

_Result = TypeVar("_Result")


class Resumed(outcome.Outcome[None]):
    """`outcome.Value(None)` that may be unwrapped (or sent) any number of times."""

    __slots__ = ()

    def unwrap(self) -> None:
        return None

    def send(self, gen: Generator[_Result, None, object]) -> _Result:
        return gen.send(None)

    async def asend(self, agen: AsyncGenerator[_Result, None]) -> _Result:
        return await agen.asend(None)

    def __repr__(self) -> str:
        return "Resumed()"


RESUMED = Resumed()
"""What the runtime reschedules its parked tasks with (`Signal.set`, the queue watcher)."""
