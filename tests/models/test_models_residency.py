"""Residency: byte budget, peak reservations shrinking to resident size, leases, eviction
that gives the charge back only after the value's runtime buffers are freed."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from anyio.from_thread import start_blocking_portal
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import hrx_async as hrx
import hrx_async.models

pytestmark = pytest.mark.anyio


def buffer_loader(rt: hrx.Runtime, size: int, log: list[str] | None = None) -> Any:
    def load() -> tuple[hrx.Buffer, int]:
        if log is not None:
            log.append(f"load {size}")
        return rt.allocate(size, hrx.HOST_VISIBLE), size

    return load


async def test_peak_shrinks_to_resident_and_eviction_frees_first() -> None:
    async with hrx.Runtime("sim") as rt:
        residency: hrx.models.Residency[Any] = hrx.models.Residency(1000)
        seen: list[int] = []

        async def load() -> tuple[hrx.Buffer, int]:
            seen.append(residency.reserved_bytes)
            return rt.allocate(300, hrx.HOST_VISIBLE), 300

        lease = await residency.load("w", 800, load)
        assert seen == [800]
        assert residency.reserved_bytes == 300 and residency.resources == 1
        buffer = lease.value
        assert rt.statistics().live_bytes == 300
        # a second key needs 800: "w" is leased, so Busy and nothing changes
        with pytest.raises(hrx.Busy):
            await residency.load("x", 800, buffer_loader(rt, 100))
        assert residency.stats().to_dict()["reserved_bytes"] == 300
        lease.release()

        released_at: list[tuple[int, int]] = []

        async def release(value: hrx.Buffer) -> None:
            value.free()
            released_at.append((rt.statistics().live_bytes, residency2.reserved_bytes))

        residency2: hrx.models.Residency[Any] = hrx.models.Residency(1000, release=release)
        (await residency2.load("a", 600, buffer_loader(rt, 600))).release()
        before = rt.statistics().live_bytes
        (await residency2.load("b", 600, buffer_loader(rt, 600))).release()
        # while "a" was being released its charge was still counted
        assert released_at == [(before - 600, 600)]  # "a" still charged
        assert residency2.evictions == 1 and "b" in residency2 and "a" not in residency2
        await residency.evict("w")
        assert buffer.freed and residency.reserved_bytes == 0


async def test_budget_errors_and_bad_input_change_nothing() -> None:
    async with hrx.Runtime("sim") as rt:
        residency: hrx.models.Residency[Any] = hrx.models.Residency(100)
        with pytest.raises(hrx.BudgetExceeded):
            await residency.load("k", 101, buffer_loader(rt, 1))
        for peak in (0, -1, 1.5, True, "10"):
            with pytest.raises(hrx.ContractError):
                await residency.load("k", peak, buffer_loader(rt, 1))  # type: ignore[arg-type]
        with pytest.raises(hrx.ContractError):
            await residency.load({}, 10, buffer_loader(rt, 1))
        # a loader reporting a size above its peak: its value is released, nothing stays
        with pytest.raises(hrx.ContractError, match="resident_bytes"):
            await residency.load("k", 10, lambda: (rt.allocate(20, hrx.HOST_VISIBLE), 20))
        with pytest.raises(hrx.ContractError):
            await residency.load("k", 10, lambda: "no tuple")
        assert rt.statistics().live_bytes == 0
        assert residency.stats().to_dict() == {
            "budget_bytes": 100,
            "reserved_bytes": 0,
            "resources": 0,
            "evictions": 0,
            "hits": 0,
            "misses": 2,
        }
        with pytest.raises(hrx.ContractError):
            residency.lease("absent")
        with pytest.raises(hrx.ContractError):
            await residency.evict("absent")
        for budget in (0, None, 2.0):
            with pytest.raises(hrx.ContractError):
                hrx.models.Residency(budget)  # type: ignore[arg-type]


async def test_leases_pin_and_waiting_form_gets_space() -> None:
    async with hrx.Runtime("sim") as rt:
        residency: hrx.models.Residency[Any] = hrx.models.Residency(100)
        a = await residency.load("a", 60, buffer_loader(rt, 60))
        b = residency.lease("a")
        a.release()
        with pytest.raises(hrx.Busy):
            await residency.evict("a")
        with pytest.raises(hrx.Busy, match="timed out"):
            await residency.load("b", 60, buffer_loader(rt, 60), wait=True, timeout=0.01)
        got: list[Any] = []
        async with anyio.create_task_group() as tg:

            async def waiter() -> None:
                got.append(await residency.load("b", 60, buffer_loader(rt, 60), wait=True))

            tg.start_soon(waiter)
            await anyio.sleep(0.01)
            b.release()
        assert got[0].value.nbytes == 60 and residency.evictions == 1
        got[0].release()
        await residency.clear()
        assert residency.reserved_bytes == 0 and rt.statistics().live_bytes == 0


async def test_a_failing_release_leaves_its_value_resident_and_no_entry_evicting() -> None:
    failing = {"a", "b"}

    def release(value: str) -> None:
        if value in failing:
            raise OSError(f"cannot release {value}")

    residency: hrx.models.Residency[str] = hrx.models.Residency(15, release=release)
    for key in ("a", "b", "c"):
        (await residency.load(key, 5, lambda k=key: (k, 5))).release()
    # "c" needs all 15 bytes: the three releases run, two of them fail
    with anyio.fail_after(5):
        with pytest.raises(OSError, match="cannot release a") as failure:
            await residency.load("d", 15, lambda: ("d", 15))
    assert any("'b'" in note for note in getattr(failure.value, "__notes__", []))
    assert "a" in residency and "b" in residency and "c" not in residency and "d" not in residency
    assert residency.resident_bytes("a") == 5 and residency.reserved_bytes == 10
    assert residency.evictions == 1
    # nothing stays evicting: every later load answers at once
    with anyio.fail_after(5):
        with await residency.load("b", 5, lambda: ("never", 5)) as value:
            assert value == "b"
        (await residency.load("c", 5, lambda: ("c", 5))).release()
    failing.clear()
    # the values whose release failed are evicted again later, their release run anew
    (await residency.load("e", 10, lambda: ("e", 10))).release()
    assert [key for key in "abce" if key in residency] == ["c", "e"]
    failing.add("c")
    with pytest.raises(OSError, match="cannot release c"):
        await residency.clear()
    assert [key for key in "abce" if key in residency] == ["c"]
    assert residency.reserved_bytes == 5 and residency.evictions == 4
    failing.clear()
    await residency.evict("c")
    assert residency.reserved_bytes == 0 and residency.resources == 0


async def test_non_waiting_loads_are_busy_while_a_release_runs() -> None:
    gate = anyio.Event()
    releasing = anyio.Event()

    async def release(value: str) -> None:
        releasing.set()
        await gate.wait()

    residency: hrx.models.Residency[str] = hrx.models.Residency(10, release=release)
    (await residency.load("a", 10, lambda: ("a", 10))).release()
    loaded: list[str] = []
    async with anyio.create_task_group() as tg:

        async def evicting_load() -> None:
            with await residency.load("b", 10, lambda: ("b", 10)) as value:
                loaded.append(value)

        tg.start_soon(evicting_load)
        await releasing.wait()
        try:  # the release never ends unless the gate opens
            with anyio.fail_after(5):
                with pytest.raises(hrx.Busy, match="being evicted"):
                    await residency.load("a", 10, lambda: ("a", 10))
                with pytest.raises(hrx.Busy, match="being released"):
                    await residency.load("c", 5, lambda: ("c", 5))
                with pytest.raises(hrx.Busy, match="timed out"):
                    await residency.load("a", 10, lambda: ("a", 10), wait=True, timeout=0.01)
                with pytest.raises(hrx.Busy, match="timed out"):
                    await residency.load("c", 5, lambda: ("c", 5), wait=True, timeout=0.01)
            assert residency.reserved_bytes == 10 and residency.stats().misses == 1
        finally:
            gate.set()
    assert loaded == ["b"] and "a" not in residency and residency.evictions == 1


async def test_a_loader_asking_for_room_its_own_load_holds_is_refused() -> None:
    residency: hrx.models.Residency[str] = hrx.models.Residency(10)

    async def greedy() -> tuple[str, int]:
        with await residency.load("inner", 6, lambda: ("inner", 6), wait=True):
            return "outer", 5

    with anyio.fail_after(5), pytest.raises(hrx.ContractError, match="its own loads"):
        await residency.load("outer", 5, greedy)

    async def modest() -> tuple[str, int]:
        (await residency.load("inner", 5, lambda: ("inner", 5))).release()
        return "outer", 5

    (await residency.load("outer", 5, modest)).release()
    assert "inner" in residency and "outer" in residency and residency.reserved_bytes == 10


class ResidencyMachine(RuleBasedStateMachine):
    """Random loads, leases, releases and evictions of real runtime buffers: the budget is
    never exceeded and always covers every byte still allocated."""

    def __init__(self) -> None:
        super().__init__()
        self.portal_cm = start_blocking_portal(self.loop_backend)
        self.portal = self.portal_cm.__enter__()
        self.rt_cm = self.portal.wrap_async_context_manager(hrx.Runtime("sim"))
        self.rt = self.rt_cm.__enter__()
        self.residency: hrx.models.Residency[Any] = hrx.models.Residency(1000)
        self.leases: list[Any] = []
        self.sizes: dict[int, int] = {}

    loop_backend = "asyncio"

    @rule(key=st.integers(0, 7), peak=st.integers(1, 1200), frac=st.floats(0.01, 1.0))
    def load(self, key: int, peak: int, frac: float) -> None:
        size = max(1, int(peak * frac))
        try:
            lease = self.portal.call(self.residency.load, key, peak, buffer_loader(self.rt, size))
        except hrx.BudgetExceeded:
            assert peak > 1000
            return
        except hrx.Busy:
            unpinned = {k for k in self.sizes if not any(le.key == k for le in self.leases)}
            assert (
                self.residency.reserved_bytes - sum(self.sizes[k] for k in unpinned) + peak > 1000
            )
            return
        self.sizes.setdefault(key, size)
        self.sizes = {k: v for k, v in self.sizes.items() if k in self.residency}
        self.leases.append(lease)

    @precondition(lambda self: self.leases)
    @rule(index=st.integers(0, 100))
    def release(self, index: int) -> None:
        self.leases.pop(index % len(self.leases)).release()

    @rule(key=st.integers(0, 7))
    def evict(self, key: int) -> None:
        try:
            self.portal.call(self.residency.evict, key)
        except hrx.ContractError:
            assert key not in self.sizes
        except hrx.Busy:
            assert any(le.key == key for le in self.leases)
        else:
            del self.sizes[key]

    @invariant()
    def within_budget(self) -> None:
        stats = self.residency.stats()
        assert stats.reserved_bytes <= stats.budget_bytes
        assert stats.reserved_bytes == sum(self.sizes.values())
        assert stats.resources == len(self.sizes)
        assert self.rt.statistics().live_bytes == stats.reserved_bytes

    def teardown(self) -> None:
        for lease in self.leases:
            lease.release()
        self.portal.call(self.residency.clear)
        assert self.rt.statistics().live_bytes == 0
        self.rt_cm.__exit__(None, None, None)
        self.portal_cm.__exit__(None, None, None)


class ResidencyMachineTrio(ResidencyMachine):
    loop_backend = "trio"


TestResidencyAsyncio = ResidencyMachine.TestCase
TestResidencyAsyncio.settings = settings(max_examples=25, stateful_step_count=25, deadline=None)
TestResidencyTrio = ResidencyMachineTrio.TestCase
TestResidencyTrio.settings = settings(max_examples=25, stateful_step_count=25, deadline=None)
