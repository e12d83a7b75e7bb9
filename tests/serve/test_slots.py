"""The slot pool: lazy per-slot resources, Busy, FIFO hand-over, and cancellation safety.

The cancellation test explores every interleaving of a small scenario: a few clients
compete for the slots of a pool; each may be cancelled while waiting, right as a slot
is handed to it, while holding, or while its submission is in flight; the device
finishes work in lane order whenever the schedule says so. After every step the
invariants are checked: one holder per slot, no slot handed out while a submission
made through it is still running, and at the end no slot leaked.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import numpy as np
import pytest

import hrx_async as hrx
from hrx_async.serve.slots import Batcher, Slot, SlotPool

pytestmark = pytest.mark.anyio


# -- gated work: a submission runs until the test releases it -----------------------------


class Device:
    """Submissions of gated slots finish one by one, in lane order, when `finish_next()`."""

    def __init__(self) -> None:
        self.gates: collections.deque[anyio.Event] = collections.deque()
        self.unreleased: collections.deque[tuple[anyio.Event, hrx.Completion]] = collections.deque()

    def submitted(self, completion: hrx.Completion, gate: anyio.Event) -> None:
        self.unreleased.append((gate, completion))

    def release_all(self) -> None:
        """Let everything finish (after a failure, so the runtime can drain)."""
        for gate, _ in self.unreleased:
            gate.set()
        self.unreleased.clear()

    async def finish_next(self) -> None:
        gate, completion = self.unreleased.popleft()
        gate.set()
        await completion.wait_done()


@dataclass
class GatedSlot:
    """A slot's resources: a counter buffer and a graph whose host step waits for a gate."""

    counter: hrx.Buffer
    step: hrx.PreparedGraph
    device: Device

    def submit(self, slot: Slot[GatedSlot]) -> hrx.Completion:
        gate = anyio.Event()
        self.device.gates.append(gate)
        completion = slot.submit(self.step)
        self.device.submitted(completion, gate)
        return completion


def gated_builder(device: Device) -> Callable[[hrx.Runtime, int], GatedSlot]:
    def build(rt: hrx.Runtime, index: int) -> GatedSlot:
        counter = rt.allocate(8, hrx.HOST_VISIBLE, f"counter{index}")

        async def step(array: np.ndarray[Any, Any]) -> None:
            # The host lane runs submissions in admission order, so the oldest gate is ours.
            gate = device.gates.popleft()
            await gate.wait()
            array.view(np.int64)[0] += 1

        graph = rt.graph(f"gated{index}")
        graph.host(step, [(counter.view(), hrx.Access.READ_WRITE)])
        return GatedSlot(counter, graph.prepare(), device)

    return build


async def settle() -> None:
    """Return once every other task waits on something (anyio's own version polls every
    100 ms on asyncio, too slow for thousands of steps)."""
    try:
        this = asyncio.current_task()
    except RuntimeError:
        this = None
    if this is None:
        import trio.testing

        await trio.testing.wait_all_tasks_blocked()
        return
    while True:
        await asyncio.sleep(0)
        if all(
            task is this or (task._fut_waiter is not None and not task._fut_waiter.done())  # type: ignore[attr-defined]
            for task in asyncio.all_tasks()
        ):
            return


# -- plain behaviour --------------------------------------------------------------------


async def test_slots_are_built_on_first_use_and_reused(anyio_backend: str) -> None:
    async with hrx.Runtime(backend="sim") as rt:
        built: list[int] = []

        def build(rt: hrx.Runtime, index: int) -> hrx.Buffer:
            built.append(index)
            return rt.allocate(64, hrx.HOST_VISIBLE, f"staging{index}")

        pool = SlotPool(rt, 3, build)
        assert pool.built == 0 and rt.statistics().allocations == 0
        seen: dict[int, hrx.Buffer] = {}
        for _ in range(5):
            async with pool.acquire() as slot:
                seen.setdefault(slot.index, slot.resources)
                assert seen[slot.index] is slot.resources
        # One slot at a time: the same idle slot comes back, built once.
        assert built == [0] and pool.built == 1
        allocations = rt.statistics().allocations
        async with pool.acquire() as a, pool.acquire() as b, pool.acquire() as c:
            assert sorted([a.index, b.index, c.index]) == [0, 1, 2]
        assert sorted(built) == [0, 1, 2]
        assert rt.statistics().allocations == allocations + 2
        for _ in range(4):
            async with pool.acquire() as a, pool.acquire() as b:
                pass
        assert rt.statistics().allocations == allocations + 2


async def test_acquire_nowait_raises_busy_and_never_jumps_the_queue(anyio_backend: str) -> None:
    async with hrx.Runtime(backend="sim") as rt:
        pool = SlotPool(rt, 2, lambda rt, i: i)
        first = pool.acquire_nowait()
        second = pool.acquire_nowait()
        with pytest.raises(hrx.Busy, match="no idle slot"):
            pool.acquire_nowait()
        got: list[int] = []

        async def waiter() -> None:
            async with pool.acquire() as slot:
                got.append(slot.index)

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await settle()
            assert pool.waiting == 1
            first.release()
            # The freed slot went to the waiter; taking it now would jump the queue.
            with pytest.raises(hrx.Busy, match="no idle slot"):
                pool.acquire_nowait()
        assert got == [0] and first.released
        second.release()
        assert pool.available == 2
        with pool.acquire_nowait() as slot:
            assert slot.resources in (0, 1)
        assert pool.available == 2


async def test_waiters_are_served_in_arrival_order(anyio_backend: str) -> None:
    async with hrx.Runtime(backend="sim") as rt:
        pool = SlotPool(rt, 1, lambda rt, i: i)
        order: list[int] = []
        held = pool.acquire_nowait()

        async def client(ident: int) -> None:
            async with pool.acquire():
                order.append(ident)

        async with anyio.create_task_group() as tg:
            for ident in range(5):
                tg.start_soon(client, ident)
                await settle()
            held.release()
        assert order == [0, 1, 2, 3, 4]


async def test_released_slot_refuses_use(anyio_backend: str) -> None:
    async with hrx.Runtime(backend="sim") as rt:
        device = Device()
        pool = SlotPool(rt, 1, gated_builder(device))
        async with pool.acquire() as slot:
            step = slot.resources.step
        with pytest.raises(hrx.RuntimeClosed, match="released"):
            _ = slot.resources
        with pytest.raises(hrx.RuntimeClosed, match="released"):
            slot.submit(step)
        assert rt.statistics().submissions == 0


@pytest.mark.parametrize("size", [0, -1, 1.5, True, "2"])
async def test_bad_size_is_refused(anyio_backend: str, size: Any) -> None:
    async with hrx.Runtime(backend="sim") as rt:
        with pytest.raises(hrx.ContractError, match=r"size >= 1"):
            SlotPool(rt, size, lambda rt, i: i)


async def test_failed_build_returns_the_slot(anyio_backend: str) -> None:
    async with hrx.Runtime(backend="sim") as rt:
        attempts: list[int] = []

        def build(rt: hrx.Runtime, index: int) -> int:
            attempts.append(index)
            if len(attempts) <= 2:
                raise hrx.BudgetExceeded("no memory for this slot")
            return index

        pool = SlotPool(rt, 1, build)
        with pytest.raises(hrx.BudgetExceeded):
            async with pool.acquire():
                pass
        assert pool.available == 1 and pool.built == 0
        with pytest.raises(hrx.BudgetExceeded):
            pool.acquire_nowait()
        async with pool.acquire() as slot:
            assert slot.resources == 0
        assert pool.available == 1 and pool.built == 1


async def test_slot_with_running_work_waits_for_it(anyio_backend: str) -> None:
    """A holder cancelled while awaiting its submission returns the slot, but the next
    holder gets it only once that submission has finished."""
    async with hrx.Runtime(backend="sim") as rt:
        device = Device()
        pool = SlotPool(rt, 1, gated_builder(device))
        events: list[str] = []

        async def first() -> None:
            with anyio.CancelScope() as scope:
                scopes.append(scope)
                async with pool.acquire() as slot:
                    await slot.resources.submit(slot)
            events.append("first cancelled")

        async def second() -> None:
            async with pool.acquire() as slot:
                value = slot.resources.counter.map_read_nowait()
                with value as memory:
                    events.append(f"second got count {np.frombuffer(memory, np.int64)[0]}")

        scopes: list[anyio.CancelScope] = []
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(first)
                await settle()
                tg.start_soon(second)
                await settle()
                scopes[0].cancel()
                await settle()
                assert events == ["first cancelled"]
                assert pool.available == 0  # second holds it, waiting for the work to drain
                await device.finish_next()
        finally:
            device.release_all()
        assert events == ["first cancelled", "second got count 1"]
        assert pool.idle


# -- exhaustive interleavings -------------------------------------------------------------


@dataclass(eq=False)
class Client:
    ident: int
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    state: str = "waiting"  # waiting -> holding -> submitted -> completed -> done
    go: anyio.Event = field(default_factory=anyio.Event)
    submit: bool = False
    cancelled: bool = False
    acquired: bool = False


class Violation(AssertionError):
    pass


class Schedule:
    """One run of the scenario, following `choices` where given and the first option after."""

    def __init__(self, rt: hrx.Runtime, clients: int, size: int, choices: list[int]) -> None:
        self.device = Device()
        self.pool = SlotPool(rt, size, gated_builder(self.device))
        self.clients = [Client(i) for i in range(clients)]
        self.choices = choices
        self.taken: list[int] = []
        self.options: list[int] = []
        self.holders: dict[int, Client] = {}
        self.slot_work: dict[int, list[hrx.Completion]] = collections.defaultdict(list)

    async def client(self, client: Client) -> None:
        with client.scope:
            async with self.pool.acquire() as slot:
                self.check_handout(client, slot.index)
                self.holders[slot.index] = client
                client.state, client.acquired = "holding", True
                try:
                    await client.go.wait()
                    client.go = anyio.Event()
                    if client.submit:
                        completion = slot.resources.submit(slot)
                        self.slot_work[slot.index].append(completion)
                        client.state = "submitted"
                        await completion
                        client.state = "completed"
                        await client.go.wait()
                finally:
                    del self.holders[slot.index]
        client.cancelled = client.scope.cancel_called
        client.state = "done"

    def check_handout(self, client: Client, index: int) -> None:
        if index in self.holders:
            raise Violation(
                f"slot {index} handed to client {client.ident} while "
                f"client {self.holders[index].ident} holds it"
            )
        running = [c for c in self.slot_work[index] if not c.done()]
        if running:
            raise Violation(f"slot {index} handed to client {client.ident} with work running")

    def actions(self) -> list[Callable[[], None] | str]:
        options: list[Callable[[], None] | str] = []
        live = [c for c in self.clients if c.state != "done"]
        for c in live:
            if not c.scope.cancel_called:
                options.append(c.scope.cancel)
        for c in live:
            if c.state == "holding" and not c.go.is_set():
                options.append(self.release_after(c, submit=True))
                options.append(self.release_after(c, submit=False))
            if c.state == "completed" and not c.go.is_set():
                options.append(self.release_after(c, submit=False))
                # A waiter cancelled in the very tick the slot is handed to it.
                for w in live:
                    if w.state == "waiting" and not w.scope.cancel_called:
                        options.append(self.release_after(c, submit=False, cancel=w))
        if self.device.unreleased:
            options.append("device")
        return options

    @staticmethod
    def release_after(
        client: Client, submit: bool, cancel: Client | None = None
    ) -> Callable[[], None]:
        def act() -> None:
            client.submit = submit
            client.go.set()
            if cancel is not None:
                cancel.scope.cancel()

        return act

    async def run(self) -> None:
        try:
            await self.drive()
        finally:
            self.device.release_all()
        self.check_end()

    async def drive(self) -> None:
        async with anyio.create_task_group() as tg:
            for client in self.clients:
                tg.start_soon(self.client, client)
            while True:
                await settle()
                options = self.actions()
                if not options:
                    break
                depth = len(self.taken)
                # Trio shuffles the order of tasks woken together, so a replayed prefix can
                # meet a different number of options; stay within them.
                pick = self.choices[depth] % len(options) if depth < len(self.choices) else 0
                self.taken.append(pick)
                self.options.append(len(options))
                action = options[pick]
                if action == "device":
                    await self.device.finish_next()
                else:
                    assert callable(action)
                    action()

    def check_end(self) -> None:
        stuck = [c.ident for c in self.clients if c.state != "done"]
        if stuck:
            raise Violation(f"clients {stuck} never finished")
        for c in self.clients:
            if not c.cancelled and not c.acquired:
                raise Violation(f"client {c.ident} was never cancelled yet got no slot")
        pool = self.pool
        if pool.available != pool.size or pool.waiting or not pool.idle:
            raise Violation(f"slots leaked: {pool!r}")
        held = [pool.acquire_nowait() for _ in range(pool.size)]
        if sorted(slot.index for slot in held) != list(range(pool.size)):
            raise Violation("acquire_nowait did not find every slot")
        for slot in held:
            slot.release()


async def explore(rt: hrx.Runtime, clients: int, size: int) -> int:
    """Depth-first over every choice sequence; returns the number of schedules run."""
    pending: list[list[int]] = [[]]
    runs = 0
    while pending:
        prefix = pending.pop()
        schedule = Schedule(rt, clients, size, prefix)
        try:
            await schedule.run()
        except (Violation, BaseExceptionGroup) as exc:
            raise AssertionError(f"schedule {schedule.taken}: {exc}") from exc
        runs += 1
        for depth in range(len(prefix), len(schedule.taken)):
            for alternative in range(1, schedule.options[depth]):
                pending.append([*schedule.taken[:depth], alternative])
    return runs


@pytest.mark.parametrize(("clients", "size"), [(2, 1), (3, 1), (3, 2)])
async def test_every_cancellation_interleaving_keeps_the_pool_sound(
    anyio_backend: str, clients: int, size: int
) -> None:
    async with hrx.Runtime(backend="sim") as rt:
        runs = await explore(rt, clients, size)
    assert runs > clients * 10  # the exploration really branched


# -- the batcher ----------------------------------------------------------------------------


class Doubler:
    """A batch run over a real runtime: each slot has one buffer of `capacity` int64s; the
    batch's items are written, doubled by a host step, and read back."""

    def __init__(self, rt: hrx.Runtime, slots: int, capacity: int) -> None:
        self.gate = anyio.Event()
        self.gate.set()
        self.batches: list[list[int]] = []

        def build(rt: hrx.Runtime, index: int) -> tuple[hrx.Buffer, hrx.PreparedGraph]:
            buffer = rt.allocate(8 * capacity, hrx.HOST_VISIBLE, f"batch{index}")

            async def double(array: np.ndarray[Any, Any]) -> None:
                await self.gate.wait()
                array.view(np.int64)[:] *= 2

            graph = rt.graph(f"double{index}")
            graph.host(double, [(buffer.view(), hrx.Access.READ_WRITE)])
            return buffer, graph.prepare()

        self.pool = SlotPool(rt, slots, build)
        self.batcher = Batcher(self.pool, capacity, self.run)

    async def run(
        self, slot: Slot[tuple[hrx.Buffer, hrx.PreparedGraph]], items: list[int]
    ) -> list[int]:
        self.batches.append(list(items))
        buffer, step = slot.resources
        with buffer.map_write_nowait() as memory:
            np.frombuffer(memory, np.int64)[: len(items)] = items
        await slot.submit(step)
        with buffer.map_read_nowait() as memory:
            return [int(v) for v in np.frombuffer(memory, np.int64)[: len(items)]]


async def test_batcher_runs_a_lone_request_at_once_and_gathers_under_load(
    anyio_backend: str,
) -> None:
    async with hrx.Runtime(backend="sim") as rt:
        doubler = Doubler(rt, slots=1, capacity=4)
        assert await doubler.batcher.submit(21) == 42
        assert doubler.batches == [[21]]
        doubler.gate = anyio.Event()  # hold the next batch on the device
        results: dict[int, int] = {}

        async def client(value: int) -> None:
            results[value] = await doubler.batcher.submit(value)

        async with anyio.create_task_group() as tg:
            for value in range(10):
                tg.start_soon(client, value)
                await settle()
            doubler.gate.set()
        assert results == {value: 2 * value for value in range(10)}
        # The first ran alone (the slot was free); the rest queued behind it in batches of
        # at most 4, in arrival order.
        assert doubler.batches[1:] == [[0], [1, 2, 3, 4], [5, 6, 7, 8], [9]]
        assert doubler.batcher.batches == 5 and doubler.batcher.items == 11
        assert doubler.pool.idle


async def test_batcher_shares_a_failure_and_survives_cancelled_members(
    anyio_backend: str,
) -> None:
    async with hrx.Runtime(backend="sim") as rt:
        doubler = Doubler(rt, slots=1, capacity=8)
        doubler.gate = anyio.Event()
        outcomes: dict[int, object] = {}
        scopes: dict[int, anyio.CancelScope] = {}

        async def client(value: int) -> None:
            with anyio.CancelScope() as scope:
                scopes[value] = scope
                try:
                    outcomes[value] = await doubler.batcher.submit(value)
                except ValueError as exc:
                    outcomes[value] = exc
            if scope.cancelled_caught:
                outcomes[value] = "cancelled"

        original = doubler.run

        async def run(slot: Any, items: list[int]) -> list[int]:
            if 13 in items:
                raise ValueError("thirteen is unlucky")
            return await original(slot, items)

        doubler.batcher._run = run
        async with anyio.create_task_group() as tg:
            for value in (1, 2, 3, 13, 5):
                tg.start_soon(client, value)
                await settle()
            # 1 leads a batch of its own on the busy device; 2 leads the next batch and 3,
            # 13 and 5 join it. Cancel the leader 2 and the member 3.
            scopes[2].cancel()
            scopes[3].cancel()
            await settle()
            doubler.gate.set()
        assert outcomes[1] == 2
        assert outcomes[3] == "cancelled"
        # The shielded leader ran the batch for the others; its failure reached each member.
        assert isinstance(outcomes[5], ValueError) and isinstance(outcomes[13], ValueError)
        assert outcomes[2] == "cancelled" or isinstance(outcomes[2], ValueError)
        assert doubler.pool.idle and doubler.pool.available == 1


async def test_batcher_checks_its_arguments_and_results(anyio_backend: str) -> None:
    async with hrx.Runtime(backend="sim") as rt:
        pool = SlotPool(rt, 1, lambda rt, i: i)

        async def short(slot: Slot[int], items: list[int]) -> list[int]:
            return items[:-1]

        with pytest.raises(hrx.ContractError, match="capacity"):
            Batcher(pool, 0, short)
        with pytest.raises(hrx.ContractError, match="run must be"):
            Batcher(pool, 2, "not callable")  # type: ignore[arg-type]
        batcher = Batcher(pool, 2, short)
        with pytest.raises(hrx.ContractError, match="1 items"):
            await batcher.submit(7)
        assert pool.idle and batcher.batches == 0
