"""On trio the runtime wakes every task it parked (on a completion, a lane's signal, the queue
watcher) with one shared outcome (`_runtime/resumed.py`) instead of a new `outcome.Value`
per wake-up. It must stay usable for every wake-up, and a parked task that is cancelled must
still get trio's own cancellation, leaving the others to be woken.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Generator
from typing import TypeVar

import outcome
import pytest
import trio
import trio.testing

from hrx_async._runtime import completion
from hrx_async._runtime.completion import Signal
from hrx_async._runtime.resumed import RESUMED


def test_the_shared_outcome_can_be_used_any_number_of_times() -> None:
    shared: outcome.Outcome[object] = RESUMED
    for _ in range(3):
        assert shared.unwrap() is None  # an outcome.Value would refuse a second unwrap

    received: list[object] = []

    def receiver() -> Generator[int, object, None]:
        while True:
            received.append((yield len(received)))

    gen = receiver()
    next(gen)
    assert RESUMED.send(gen) == 1
    assert RESUMED.send(gen) == 2
    assert received == [None, None]


def test_parked_tasks_are_woken_round_after_round() -> None:
    rounds, tasks = 20, 4
    woken: list[int] = []

    async def main() -> None:
        for round_number in range(rounds):
            signal = Signal(None)

            async def park(number: int = round_number, signal: Signal = signal) -> None:
                await signal
                woken.append(number)

            async with trio.open_nursery() as nursery:
                for _ in range(tasks):
                    nursery.start_soon(park)
                await trio.testing.wait_all_tasks_blocked()
                assert woken.count(round_number) == 0
                signal.set()

    trio.run(main)
    assert woken == [number for number in range(rounds) for _ in range(tasks)]


def test_a_cancelled_parked_task_gets_trios_cancellation_and_the_others_are_woken() -> None:
    results: dict[str, str] = {}

    async def main() -> None:
        signal = Signal(None)

        async def park(name: str, scope: trio.CancelScope) -> None:
            with scope:
                await signal
                results[name] = "woken"
                return
            results[name] = "cancelled"

        cancelled, kept = trio.CancelScope(), trio.CancelScope()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(park, "cancelled", cancelled)
            nursery.start_soon(park, "kept", kept)
            await trio.testing.wait_all_tasks_blocked()
            cancelled.cancel()
            await trio.testing.wait_all_tasks_blocked()
            # The cancelled task left the signal: waking it again would be trio's error.
            signal.set()

    trio.run(main)
    assert results == {"cancelled": "cancelled", "kept": "woken"}


_Result = TypeVar("_Result")


class CountedResumed(outcome.Outcome[None]):
    """The shared outcome, counting how often a woken task unwraps it."""

    __slots__ = ("unwraps",)

    def __init__(self) -> None:
        self.unwraps = 0

    def unwrap(self) -> None:
        self.unwraps += 1

    def send(self, gen: Generator[_Result, None, object]) -> _Result:
        return gen.send(None)

    async def asend(self, agen: AsyncGenerator[_Result, None]) -> _Result:
        return await agen.asend(None)


@pytest.mark.parametrize("tasks", [1, 3])
def test_every_parked_task_is_woken_with_the_shared_outcome(tasks: int) -> None:
    counted = CountedResumed()

    async def main() -> None:
        completion.trio_lowlevel()  # (imports trio's parts, the shared outcome among them)
        shared = completion._shared.resumed
        completion._shared.resumed = counted
        try:
            for _ in range(2):
                signal = Signal(None)
                async with trio.open_nursery() as nursery:
                    for _ in range(tasks):
                        nursery.start_soon(_park, signal)
                    await trio.testing.wait_all_tasks_blocked()
                    signal.set()
        finally:
            completion._shared.resumed = shared

    trio.run(main)
    assert counted.unwraps == 2 * tasks


async def _park(signal: Signal) -> None:
    await signal
