"""One byte ceiling: guards, residency charges and runtime allocations under one limit,
idle values evicted to make room, nothing charged ever lost (the state machine)."""

from __future__ import annotations

import contextlib
import gc
from typing import Any

import anyio
import numpy as np
import pytest
from anyio.from_thread import start_blocking_portal
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import hrx_async as hrx
import hrx_async.models

pytestmark = pytest.mark.anyio


class Unit:
    """A budgeted value: guards it charged, and the unit budget to charge more."""

    def __init__(self, unit: hrx.models.UnitBudget) -> None:
        self.unit = unit
        self.guards: list[hrx.Reservation] = []


async def test_allocations_and_loaders_share_a_ceiling_and_idle_eviction() -> None:
    """residency.rs::allocations_and_loaders_share_a_ceiling_and_idle_eviction"""
    residency: hrx.models.Residency[Any] = hrx.models.Residency(100)
    budget = residency.budget
    held = budget.reserve(40)
    lease = await residency.load("model", 60, lambda: ("weights", 50))
    assert budget.reserved_bytes == 90 and residency.resources == 1
    with pytest.raises(hrx.Busy):
        budget.reserve(11)  # the model is leased: nothing to evict
    assert budget.reserved_bytes == 90
    lease.release()
    second = budget.reserve(60)
    assert residency.evictions == 1 and budget.reserved_bytes == 100
    assert "model" not in residency
    with pytest.raises(hrx.Busy):
        await residency.load("other", 1, lambda: ("other", 1))
    assert residency.resources == 0
    held.release()
    second.release()
    held.release()  # idempotent
    assert budget.reserved_bytes == 0
    with pytest.raises(hrx.BudgetExceeded):
        budget.reserve(101)
    assert budget.reserve(0).bytes() == 0 and budget.reserved_bytes == 0


async def test_budgeted_units_grow_without_double_charging_and_evict_only_when_idle() -> None:
    """residency.rs::budgeted_units_grow_without_double_charging_and_evict_only_when_idle"""
    residency: hrx.models.Residency[Unit] = hrx.models.Residency(100)
    budget = residency.budget

    def load(unit: hrx.models.UnitBudget) -> Unit:
        value = Unit(unit)
        value.guards.append(unit.reserve(40))
        return value

    lease = await residency.load_budgeted("unit", lambda value: True, load)
    assert lease.resident_bytes == 0 and budget.reserved_bytes == 40
    lease.value.guards.append(lease.value.unit.reserve(50))  # grows while leased
    assert budget.reserved_bytes == 90
    with pytest.raises(hrx.Busy):
        await residency.evict("unit")
    pin = lease.pin()
    lease.release()
    with pytest.raises(hrx.Busy):
        budget.reserve(11)  # pinned: kept although nobody leases it
    pin.release()
    whole = budget.reserve(100)
    assert residency.resources == 0 and residency.evictions == 1
    whole.release()
    assert budget.reserved_bytes == 0
    with pytest.raises(hrx.ContractError):
        await residency.evict("unit")  # absent (the original answers false)


async def test_budgeted_loader_failure_and_cancellation_release_and_allow_retry() -> None:
    """residency.rs::budgeted_loader_failure_and_panic_release_allocations_and_allow_retry
    (a Rust panic is a cancellation or any other exception here)."""
    residency: hrx.models.Residency[Any] = hrx.models.Residency(64)
    budget = residency.budget

    def failing(unit: hrx.models.UnitBudget) -> object:
        unit.reserve(64)
        raise ValueError("weights corrupt")

    with pytest.raises(ValueError, match="corrupt"):
        await residency.load_budgeted("m", lambda v: True, failing)
    assert budget.reserved_bytes == 0 and residency.resources == 0

    async def cancelled(unit: hrx.models.UnitBudget) -> object:
        unit.reserve(64)
        await anyio.sleep_forever()

    with anyio.move_on_after(0.01):
        await residency.load_budgeted("m", lambda v: True, cancelled)
    assert budget.reserved_bytes == 0 and residency.resources == 0

    lease = await residency.load_budgeted("m", lambda v: True, lambda unit: [unit.reserve(64)])
    assert budget.reserved_bytes == 64
    lease.release()
    await residency.evict("m")
    assert budget.reserved_bytes == 0 and residency.resources == 0
    assert budget.manager() is residency
    del residency, lease
    gc.collect()
    assert budget.manager() is None


async def test_budget_owners_do_not_cycle_and_survive_registry_teardown() -> None:
    """residency.rs::budget_owners_do_not_cycle_and_survive_registry_teardown"""
    residency: hrx.models.Residency[Any] = hrx.models.Residency(64)
    budget = residency.budget
    held = budget.reserve(16)
    lease = await residency.load("owner", 32, lambda: ({"budget": budget}, 32))
    assert budget.reserved_bytes == 48
    lease.release()
    del residency, lease
    # No cycle: dropping the residency frees its registry at once, no collector needed.
    assert budget.manager() is None and budget.reserved_bytes == 16
    rest = budget.reserve(48)
    with pytest.raises(hrx.Busy):
        budget.reserve(1)
    rest.release()
    held.release()
    assert budget.reserved_bytes == 0


async def test_runtime_allocations_charge_the_ceiling_and_evict_idle_values() -> None:
    """RuntimeOptions.memory_budget: an allocation evicts an idle budgeted model whose
    release is synchronous; an async release needs `reserve_wait`."""
    residency: hrx.models.Residency[Any] = hrx.models.Residency(1000)
    budget = residency.budget
    async with hrx.Runtime("sim", memory_budget=budget) as rt:
        assert rt.memory_budget is budget
        lease = await residency.load_budgeted(
            "w", lambda v: True, lambda unit: [rt.allocate(600, hrx.HOST_VISIBLE)]
        )
        assert budget.reserved_bytes == 600 and lease.resident_bytes == 0
        with pytest.raises(hrx.Busy):
            rt.allocate(500, hrx.GPU_LOCAL)  # leased
        assert rt.statistics().live_bytes == 600
        lease.release()
        buffer = rt.allocate(500, hrx.GPU_LOCAL)
        assert "w" not in residency and rt.statistics().live_bytes == 500
        assert budget.reserved_bytes == 500
        buffer.free()
        assert budget.reserved_bytes == 0

    released: list[str] = []

    async def release(value: Any) -> None:
        await anyio.sleep(0)
        released.append("done")
        for item in value:
            item.free()

    slow: hrx.models.Residency[Any] = hrx.models.Residency(1000, release=release)
    async with hrx.Runtime("sim", memory_budget=slow.budget) as rt:
        (
            await slow.load_budgeted(
                "w", lambda v: True, lambda unit: [rt.allocate(600, hrx.HOST_VISIBLE)]
            )
        ).release()
        with pytest.raises(hrx.Busy):
            rt.allocate(500, hrx.GPU_LOCAL)  # its release is async: not run synchronously
        assert released == [] and "w" in slow
        guard = await slow.budget.reserve_wait(500)
        assert released == ["done"] and "w" not in slow and slow.budget.reserved_bytes == 500
        guard.release()
        small = slow.budget.reserve(1)
        with pytest.raises(hrx.Busy):
            await slow.budget.reserve_wait(1000)  # a live guard is never reclaimed
        small.release()  # more than is free, none idle
        assert slow.budget.reserved_bytes == 0


async def test_shared_bytes_are_charged_once() -> None:
    """Re-adopting bytes already charged never charges twice."""
    residency: hrx.models.Residency[Any] = hrx.models.Residency(1000)
    async with hrx.Runtime("sim", memory_budget=residency.budget) as rt:
        buffer = rt.allocate(256, hrx.HOST_VISIBLE)
        async with buffer.map_write() as memory:
            array = np.frombuffer(memory, np.uint8)
            adopted = rt.adopt_gpu_buffer(array, hrx.GPU_LOCAL)
        assert residency.budget.reserved_bytes == 256
        del adopted, array
        gc.collect()
        buffer.free()
        assert residency.budget.reserved_bytes == 0


class CeilingMachine(RuleBasedStateMachine):
    """Guards, plain loads, budgeted loads (some failing, some cancelled), leases, pins and
    evictions on one ceiling: reserved <= limit; reserved = resident + live guards; what the
    machine holds and what stays resident account for every charged byte."""

    loop_backend = "asyncio"
    LIMIT = 200

    def __init__(self) -> None:
        super().__init__()
        self.portal_cm = start_blocking_portal(self.loop_backend)
        self.portal = self.portal_cm.__enter__()
        self.residency: hrx.models.Residency[Any] = hrx.models.Residency(self.LIMIT)
        self.budget = self.residency.budget
        self.guards: list[hrx.Reservation] = []
        self.leases: list[Any] = []
        self.pins: list[hrx.models.Pin] = []
        self.plain: dict[int, int] = {}  # key -> resident bytes of plain loads
        self.units: dict[int, Unit] = {}  # key -> budgeted value

    def _forget_evicted(self) -> None:
        self.plain = {k: v for k, v in self.plain.items() if k in self.residency}
        self.units = {k: v for k, v in self.units.items() if k in self.residency}

    def _unpinned_idle(self, key: int) -> bool:
        return not any(x.key == key for x in self.leases) and not any(
            p.key == key for p in self.pins
        )

    @rule(n=st.integers(0, 230), wait=st.booleans())
    def reserve(self, n: int, wait: bool) -> None:
        before = self.budget.reserved_bytes
        try:
            if wait:
                guard = self.portal.call(self.budget.reserve_wait, n)
            else:
                guard = self.budget.reserve(n)
        except hrx.BudgetExceeded:
            assert n > self.LIMIT
            return
        except hrx.Busy:
            self._forget_evicted()
            evictable = sum(self.plain[k] for k in self.plain if self._unpinned_idle(k)) + sum(
                u.unit.bytes() for k, u in self.units.items() if self._unpinned_idle(k)
            )
            assert self.budget.reserved_bytes - evictable + n > self.LIMIT
            return
        finally:
            self._forget_evicted()
        assert before + n > self.LIMIT or self.budget.reserved_bytes == before + n
        self.guards.append(guard)

    @precondition(lambda self: self.guards)
    @rule(index=st.integers(0, 99))
    def release_guard(self, index: int) -> None:
        self.guards.pop(index % len(self.guards)).release()

    @rule(key=st.integers(0, 4), peak=st.integers(1, 120), frac=st.floats(0.05, 1.0))
    def load(self, key: int, peak: int, frac: float) -> None:
        size = max(1, int(peak * frac))
        try:
            lease = self.portal.call(self.residency.load, key, peak, lambda: (f"v{key}", size))
        except (hrx.Busy, hrx.ContractError):
            self._forget_evicted()
            return
        self._forget_evicted()
        if key not in self.units:
            self.plain.setdefault(key, size)
        self.leases.append(lease)

    @rule(
        key=st.integers(5, 8),
        sizes=st.lists(st.integers(0, 80), min_size=1, max_size=3),
        outcome=st.sampled_from(["ok", "fail", "cancel"]),
    )
    def load_budgeted(self, key: int, sizes: list[int], outcome: str) -> None:
        async def loader(unit: hrx.models.UnitBudget) -> Unit:
            value = Unit(unit)
            for n in sizes:
                value.guards.append(unit.reserve(n))
            if outcome == "fail":
                raise ValueError("load failed")
            if outcome == "cancel":
                await anyio.sleep_forever()
            return value

        async def run() -> Any:
            with anyio.move_on_after(0.005):
                return await self.residency.load_budgeted(key, lambda v: True, loader)
            return None

        try:
            lease = self.portal.call(run)
        except (hrx.Busy, hrx.BudgetExceeded, ValueError):
            self._forget_evicted()
            assert key in self.units or key not in self.residency
            return
        self._forget_evicted()
        if lease is None:
            assert outcome == "cancel" and key not in self.residency
            return
        assert outcome == "ok" or key in self.units
        self.units.setdefault(key, lease.value)
        self.leases.append(lease)

    @precondition(lambda self: any(x.key in self.units for x in self.leases))
    @rule(index=st.integers(0, 99), n=st.integers(1, 60))
    def grow(self, index: int, n: int) -> None:
        """A leased unit grows (a leased unit cannot be evicted by its own growth)."""
        leased = [self.units[x.key] for x in self.leases if x.key in self.units]
        unit = leased[index % len(leased)]
        with contextlib.suppress(hrx.Busy):
            unit.guards.append(unit.unit.reserve(n))
        self._forget_evicted()

    @precondition(lambda self: self.leases)
    @rule(index=st.integers(0, 99), pin=st.booleans())
    def release_lease(self, index: int, pin: bool) -> None:
        lease = self.leases.pop(index % len(self.leases))
        if pin:
            self.pins.append(lease.pin())
        lease.release()

    @precondition(lambda self: self.pins)
    @rule(index=st.integers(0, 99))
    def unpin(self, index: int) -> None:
        self.pins.pop(index % len(self.pins)).release()

    @rule(key=st.integers(0, 8))
    def evict(self, key: int) -> None:
        try:
            self.portal.call(self.residency.evict, key)
        except hrx.ContractError:
            assert key not in self.plain and key not in self.units
        except hrx.Busy:
            assert any(x.key == key for x in self.leases) or any(p.key == key for p in self.pins)
        self._forget_evicted()

    @invariant()
    def nothing_charged_is_lost(self) -> None:
        budget = self.budget
        assert budget.reserved_bytes <= budget.limit
        guards = sum(g.bytes() for g in self.guards)
        units = sum(u.unit.bytes() for u in self.units.values())
        assert budget.live_bytes == guards + units
        assert budget.reserved_bytes == guards + units + sum(self.plain.values())
        assert self.residency.resources == len(self.plain) + len(self.units)

    def teardown(self) -> None:
        for hold in [*self.leases, *self.pins, *self.guards]:
            hold.release()
        self.portal.call(self.residency.clear)
        assert self.budget.reserved_bytes == 0 and self.residency.resources == 0
        self.portal_cm.__exit__(None, None, None)


class CeilingMachineTrio(CeilingMachine):
    loop_backend = "trio"


_SETTINGS = settings(max_examples=30, stateful_step_count=30, deadline=None)
TestCeilingAsyncio = CeilingMachine.TestCase
TestCeilingAsyncio.settings = _SETTINGS
TestCeilingTrio = CeilingMachineTrio.TestCase
TestCeilingTrio.settings = _SETTINGS
