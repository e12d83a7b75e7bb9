"""PlanCache: single-flight, idle-only LRU eviction, Busy and the waiting form, counters."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hrx_async as hrx
import hrx_async.models

pytestmark = pytest.mark.anyio


async def test_single_flight_under_a_thousand_callers() -> None:
    calls = 0
    handles: list[Any] = []

    async def loader() -> str:
        nonlocal calls
        calls += 1
        await anyio.sleep(0.01)
        return "plan"

    cache: hrx.models.PlanCache[str] = hrx.models.PlanCache(2)

    async def caller() -> None:
        handles.append(await cache.get_or_prepare("k", loader))

    async with anyio.create_task_group() as tg:
        for _ in range(1000):
            tg.start_soon(caller)
    assert calls == 1
    assert {h.value for h in handles} == {"plan"}
    s = cache.stats()
    assert (s.entries, s.misses, s.hits, s.evictions) == (1, 1, 999, 0)
    for h in handles:
        h.release()
    await cache.evict("k")
    assert cache.stats().entries == 0


async def test_a_failed_loader_reaches_every_waiter_and_leaves_no_entry() -> None:
    calls = 0

    async def loader() -> str:
        nonlocal calls
        calls += 1
        await anyio.sleep(0.01)
        raise OSError("no plan")

    cache: hrx.models.PlanCache[str] = hrx.models.PlanCache(1)
    errors: list[BaseException] = []

    async def caller() -> None:
        try:
            await cache.get_or_prepare("k", loader)
        except OSError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(caller)
    assert calls == 1 and len(errors) == 10
    assert "k" not in cache and cache.stats().entries == 0
    # the next caller loads again
    with await cache.get_or_prepare("k", lambda: "ok") as plan:
        assert plan == "ok"


async def test_a_cancelled_loader_lets_a_waiter_load_again() -> None:
    started = anyio.Event()

    async def slow() -> str:
        started.set()
        await anyio.sleep(10)
        return "never"

    cache: hrx.models.PlanCache[str] = hrx.models.PlanCache(1)
    result: list[str] = []

    async def waiter() -> None:
        await started.wait()
        with await cache.get_or_prepare("k", lambda: "second") as plan:
            result.append(plan)

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        with anyio.move_on_after(0.05):
            await cache.get_or_prepare("k", slow)
    assert result == ["second"]
    assert cache.stats().misses == 2


async def test_a_loader_asking_for_its_own_key_is_refused_at_once() -> None:
    cache: hrx.models.PlanCache[str] = hrx.models.PlanCache(2)

    async def itself() -> str:
        return (await cache.get_or_prepare("k", lambda: "inner", wait=True)).value

    async def through_a_child_task() -> str:
        async with anyio.create_task_group() as tg:
            tg.start_soon(cache.get_or_prepare, "k", lambda: "inner")
        return "outer"

    with anyio.fail_after(5), pytest.raises(hrx.ContractError, match="itself"):
        await cache.get_or_prepare("k", itself)
    assert "k" not in cache and len(cache) == 0
    refused = pytest.RaisesGroup(pytest.RaisesExc(hrx.ContractError, match="itself"))
    with anyio.fail_after(5), refused:
        await cache.get_or_prepare("k", through_a_child_task)
    assert "k" not in cache and len(cache) == 0
    # a loader may use the cache for other keys that fit
    with await cache.get_or_prepare("k", lambda: "plain") as plan:
        assert plan == "plain"


@pytest.mark.parametrize("wait", [True, False])
async def test_a_loader_asking_for_room_its_own_load_holds_is_refused(wait: bool) -> None:
    cache: hrx.models.PlanCache[str] = hrx.models.PlanCache(1)

    async def other_key() -> str:
        return (await cache.get_or_prepare("inner", lambda: "inner", wait=wait)).value

    with anyio.fail_after(5), pytest.raises(hrx.ContractError, match="its own loads"):
        await cache.get_or_prepare("outer", other_key)
    assert len(cache) == 0
    wide: hrx.models.PlanCache[str] = hrx.models.PlanCache(2)

    async def fits() -> str:
        (await wide.get_or_prepare("inner", lambda: "inner", wait=wait)).release()
        return "outer"

    (await wide.get_or_prepare("outer", fits)).release()
    assert sorted(wide.keys()) == ["inner", "outer"]


async def test_eviction_is_lru_of_unheld_entries_then_busy() -> None:
    released: list[str] = []
    cache: hrx.models.PlanCache[str] = hrx.models.PlanCache(2, release=released.append)
    a = await cache.get_or_prepare("a", lambda: "A")
    b = await cache.get_or_prepare("b", lambda: "B")
    b.release()
    a.release()
    # "b" was used least recently? no: a was acquired first; touch "a" to make "b" the LRU
    (await cache.get_or_prepare("a", lambda: "X")).release()
    c = await cache.get_or_prepare("c", lambda: "C")
    assert released == ["B"] and cache.keys() == ["a", "c"]
    held_a = await cache.get_or_prepare("a", lambda: "X")
    before = cache.stats()
    with pytest.raises(hrx.Busy):
        await cache.get_or_prepare("d", lambda: "D")
    assert cache.stats() == before and released == ["B"]
    # the waiting form: room comes when a handle is released
    async with anyio.create_task_group() as tg:
        got: list[Any] = []

        async def wait_for_room() -> None:
            got.append(await cache.get_or_prepare("d", lambda: "D", wait=True))

        tg.start_soon(wait_for_room)
        await anyio.sleep(0.01)
        assert got == []
        c.release()
    assert [h.value for h in got] == ["D"] and released == ["B", "C"]
    with pytest.raises(hrx.Busy, match="timed out"):
        await cache.get_or_prepare("e", lambda: "E", wait=True, timeout=0.01)
    held_a.release()
    got[0].release()
    assert cache.stats().evictions == 2


async def test_busy_values_are_not_evicted() -> None:
    class Plan:
        idle = False

    plan = Plan()
    cache: hrx.models.PlanCache[Plan] = hrx.models.PlanCache(1)
    (await cache.get_or_prepare("p", lambda: plan)).release()
    with pytest.raises(hrx.Busy):
        await cache.get_or_prepare("q", Plan)
    with pytest.raises(hrx.Busy):
        await cache.evict("p")
    plan.idle = True
    (await cache.get_or_prepare("q", Plan, wait=True, timeout=5)).release()
    assert cache.keys() == ["q"]


async def test_bad_input_is_refused() -> None:
    with pytest.raises(hrx.ContractError):
        hrx.models.PlanCache(0)
    with pytest.raises(hrx.ContractError):
        hrx.models.PlanCache(True)
    with pytest.raises(hrx.ContractError):
        hrx.models.PlanCache(2, release=3)  # type: ignore[arg-type]
    cache: hrx.models.PlanCache[str] = hrx.models.PlanCache(1)
    with pytest.raises(hrx.ContractError):
        await cache.get_or_prepare([1], lambda: "x")
    with pytest.raises(hrx.ContractError):
        await cache.get_or_prepare("k", "not callable")  # type: ignore[arg-type]
    with pytest.raises(hrx.ContractError):
        await cache.get_or_prepare("k", lambda: "x", wait=True, timeout=-1)
    with pytest.raises(hrx.ContractError):
        await cache.evict("absent")
    h = await cache.get_or_prepare("k", lambda: "x")
    h.release()
    h.release()  # idempotent
    with pytest.raises(hrx.RuntimeClosed):
        h.value  # noqa: B018
    assert cache.stats().to_dict() == {
        "capacity": 1,
        "entries": 1,
        "hits": 0,
        "misses": 1,
        "evictions": 0,
    }


@settings(max_examples=40, deadline=None)
@given(
    capacity=st.integers(1, 4),
    ops=st.lists(st.tuples(st.integers(0, 6), st.booleans()), min_size=1, max_size=30),
)
async def test_against_a_model(capacity: int, ops: list[tuple[int, bool]]) -> None:
    """Random gets (kept held or released at once) against a plain LRU model."""
    released: list[int] = []
    cache: hrx.models.PlanCache[int] = hrx.models.PlanCache(capacity, release=released.append)
    model: list[int] = []  # LRU order, least recent first
    held: dict[int, list[Any]] = {}
    for key, keep in ops:
        if key in model:
            model.remove(key)
            model.append(key)
            expect_busy = False
        elif len(model) < capacity:
            model.append(key)
            expect_busy = False
        else:
            free = [k for k in model if not held.get(k)]
            expect_busy = not free
            if free:
                model.remove(free[0])
                model.append(key)
        if expect_busy:
            with pytest.raises(hrx.Busy):
                await cache.get_or_prepare(key, lambda k=key: k)
        else:
            handle = await cache.get_or_prepare(key, lambda k=key: k)
            assert handle.value == key
            if keep:
                held.setdefault(key, []).append(handle)
            else:
                handle.release()
        assert cache.keys() == model
        assert len(cache) <= capacity
    s = cache.stats()
    assert s.evictions == len(released) and s.entries == len(model)
