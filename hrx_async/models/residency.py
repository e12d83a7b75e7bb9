"""Byte-budgeted residency of loaded values (model weights on the device), with leases.

    residency = Residency(budget_bytes=2 << 30)
    lease = await residency.load("encoder", peak_bytes, load_encoder)
    with lease as weights:                    # leased: never evicted meanwhile
        ...

`load(key, peak_bytes, loader)` reserves `peak_bytes` of the budget, then calls
`loader()` (plain or `async`, no lock held), which returns `(value, resident_bytes)`
with 1 <= resident_bytes <= peak_bytes; the reservation then shrinks to
`resident_bytes`. Loads of one key are single-flight. A peak larger than the whole
budget raises `BudgetExceeded`. Short of space, entries that nobody leases (and whose
value is idle) are evicted least recently used first; with none to evict, `Busy`, or with
`wait=True` a wait for space (up to `timeout` seconds, then `Busy`). An evicted value is
released by `release(value)` (by default: its runtime buffers are freed) and only then
is its charge given back, so the budget always covers everything still allocated. While
a release runs, its charge is room only for the waiting form: without `wait`, a load
that needs it (or a load of the key being evicted) raises `Busy` at once.

A release that raises leaves that value resident, with its charge, leasable and evicted
again (its release run anew) when room is next needed, after the others. The other
evictions of the same call still finish; then the call (`load`, `evict` or `clear`)
raises the first failure, noting any further ones, and a load reserves nothing. Failed
loads reserve nothing and leave no entry. A loader that asks its own residency for its
own key, or for more than the budget less its own reservation, is a `ContractError`
(it would wait for itself). For one event loop thread.

One ceiling: `residency.budget` is the `MemoryBudget` the residency charges; open a
runtime with it (`Runtime(memory_budget=residency.budget)`) and every allocation charges
the same limit, evicting idle unleased unpinned values when it does not fit (see
`hrx_async._core.budget` for which releases a synchronous allocation can run). Values whose
memory is allocated through such a runtime, or that grow, are loaded with
`load_budgeted(key, idle, loader)`: the entry costs nothing itself, `loader(unit)` gets
a `UnitBudget` and charges what it holds through `unit.reserve(n)` (guards kept in the
value; more may be added while leased, never charged twice), or allocates through the
runtime. A loader that fails or is cancelled releases every guard it took and leaves no
entry. `lease.pin()` keeps a value resident after its leases are gone, until the pin is
released.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import anyio

from .._core.budget import MemoryBudget, Reservation
from .._core.memory import Buffer
from ..errors import Busy, ContractError
from . import _check
from ._table import Entry, Hold, State, Table

V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class ResidencyStats:
    """`budget_bytes`; `reserved_bytes` now (resident sizes, peaks of loads under way and
    charges of values being released); `resources` entries now (loading ones included);
    `evictions`, `hits` and `misses` (loader calls) since creation."""

    budget_bytes: int
    reserved_bytes: int
    resources: int
    evictions: int
    hits: int
    misses: int

    def to_dict(self) -> dict[str, int]:
        """The counters as a plain dict (JSON-serializable)."""
        return dataclasses.asdict(self)


def buffers_of(value: object) -> list[Buffer]:
    """The runtime buffers a value holds: itself, the items of a sequence or mapping, or a
    `buffers` attribute (one level of each)."""
    if isinstance(value, Buffer):
        return [value]
    found = getattr(value, "buffers", None)
    if found is not None and not callable(found):
        value = found
    items: Iterable[Any]
    if isinstance(value, Mapping):
        items = value.values()
    elif isinstance(value, list | tuple | set | frozenset):
        items = value
    else:
        return []
    return [item for item in items if isinstance(item, Buffer)]


async def free_buffers(value: object) -> None:
    """The default release: `await value.aclose()` or `value.close()` when it has one, else
    free every runtime buffer it holds (see `buffers_of`). A buffer still used by submitted
    work is freed as soon as that work finishes."""
    closer = getattr(value, "aclose", None) or getattr(value, "close", None)
    if callable(closer):
        outcome = closer()
        if inspect.isawaitable(outcome):
            await outcome
        return
    for buffer in buffers_of(value):
        while not buffer.freed:
            try:
                buffer.free()
            except Busy:
                # Submitted work still reads it; the runtime frees nothing under running work.
                await anyio.sleep(0.001)


def free_buffers_now(value: object) -> bool:
    """`free_buffers` for a synchronous eviction: False (nothing done) for a value with
    only an `async` closer; else closes it, or frees its buffers now (one still used by
    submitted work is left to be freed, and uncharged, when that work ends)."""
    closer = getattr(value, "close", None)
    if not callable(closer):
        if callable(getattr(value, "aclose", None)):
            return False
        for buffer in buffers_of(value):
            # Work still reads it: it is freed (and uncharged) once that work drops its views.
            with contextlib.suppress(Busy):
                buffer.free()
        return True
    if inspect.iscoroutinefunction(closer):
        return False
    closer()
    return True


def _release_now_of(release: Callable[[Any], object] | None) -> Callable[[Any], bool] | None:
    if release is None:
        return lambda value: True
    if release is free_buffers:
        return free_buffers_now
    if inspect.iscoroutinefunction(release):
        return None

    def now(value: object) -> bool:
        outcome = release(value)
        if inspect.isawaitable(outcome):
            raise ContractError(
                "a release given as a plain function returned an awaitable during a "
                "synchronous eviction; declare it `async def`"
            )
        return True

    return now


class UnitBudget:
    """The budget a `load_budgeted` loader (and its value) charges through: each guard it
    gives is also recorded for the entry, so eviction or a failed load releases it."""

    __slots__ = ("_guards", "budget")

    def __init__(self, budget: MemoryBudget, guards: list[Reservation]) -> None:
        self.budget = budget
        self._guards = guards

    def reserve(self, nbytes: int) -> Reservation:
        """`MemoryBudget.reserve(nbytes)`, recorded for the entry so its eviction or a failed
        load releases it. Raises what `reserve` raises (`ContractError`, `BudgetExceeded`)."""
        guard = self.budget.reserve(nbytes)
        self._keep(guard)
        return guard

    async def reserve_wait(self, nbytes: int) -> Reservation:
        """`MemoryBudget.reserve_wait(nbytes)` (waits for room), recorded for the entry like
        `reserve`."""
        guard = await self.budget.reserve_wait(nbytes)
        self._keep(guard)
        return guard

    def _keep(self, guard: Reservation) -> None:
        guards = self._guards
        guards[:] = [g for g in guards if not g.released]
        guards.append(guard)

    def bytes(self) -> int:
        """The bytes this unit's live guards hold."""
        return sum(g.bytes() for g in self._guards)


class Pin:
    """Keeps a value resident (never evicted) until `release()` (idempotent) or collection."""

    __slots__ = ("_entry", "_table", "key")

    def __init__(self, table: Table[Any], entry: Entry[Any]) -> None:
        self._table: Table[Any] | None = table
        self._entry = entry
        self.key = entry.key
        entry.pins += 1

    def release(self) -> None:
        """Let the pinned entry be evicted again (once no other pin holds it). Idempotent."""
        table, self._table = self._table, None
        if table is not None:
            self._entry.pins -= 1
            table.notify()

    def __enter__(self) -> Pin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()


class Lease(Hold[V]):
    """A hold on one resident value: `value`; `release()` (idempotent) lets it be evicted.
    A synchronous context manager."""

    __slots__ = ()
    NOUN = "lease"
    AGAIN = "lease it again"

    @property
    def resident_bytes(self) -> int:
        """The residency's charge for it (0 for a budgeted value: its guards are live
        reservations of the budget)."""
        return self._held().cost

    def pin(self) -> Pin:
        """Keep the value resident after every lease is released, until the pin is."""
        return Pin(self._table, self._held())


class Residency(Generic[V]):
    """Values resident within `budget_bytes` (>= 1); see the module docstring."""

    def __init__(
        self,
        budget_bytes: int,
        release: Callable[[V], object] | None = free_buffers,
        label: str = "residency",
    ) -> None:
        budget_bytes = _check.integer(budget_bytes, "a residency budget (bytes)", 1)
        if release is not None:
            _check.function(release, "release")
        if not isinstance(label, str):
            raise ContractError(f"label must be a string, got {_check.shown(label)}")
        self.label = label
        self.budget = MemoryBudget(budget_bytes)
        self._table: Table[V] = Table(
            budget_bytes, release, label, "bytes", self.budget, _release_now_of(release)
        )
        self.budget.link(self._table, self)

    # -- counters --------------------------------------------------------------------

    @property
    def budget_bytes(self) -> int:
        """The byte ceiling resident values share (with runtime allocations made through
        `budget`)."""
        return self._table.budget

    @property
    def reserved_bytes(self) -> int:
        """The whole ceiling in use: resident and loading charges and live reservations."""
        return self.budget.reserved_bytes

    @property
    def resources(self) -> int:
        """How many values are resident."""
        return len(self._table.entries)

    @property
    def evictions(self) -> int:
        """How many values were evicted so far."""
        return self._table.evictions

    def stats(self) -> ResidencyStats:
        """The counters: budget, reserved bytes, resident values, evictions, hits, misses."""
        t = self._table
        return ResidencyStats(
            t.budget, self.reserved_bytes, len(t.entries), t.evictions, t.hits, t.misses
        )

    def __contains__(self, key: object) -> bool:
        try:
            entry = self._table.entries.get(key)
        except TypeError:
            return False
        return entry is not None and entry.state is State.READY

    def resident_bytes(self, key: Hashable) -> int:
        """The resident size of a ready entry (`ContractError` when there is none)."""
        return self._ready(key).cost

    # -- loading and leasing ---------------------------------------------------------

    async def load(
        self,
        key: Hashable,
        peak_bytes: int,
        loader: Callable[[], tuple[V, int] | Awaitable[tuple[V, int]]],
        *,
        wait: bool = False,
        timeout: float | None = None,
    ) -> Lease[V]:
        """A lease on the value of `key`, loaded within `peak_bytes` when not resident."""
        key = _check.key(key, "residency key")
        peak = _check.integer(peak_bytes, "peak_bytes", 1)
        _check.function(loader, "loader")
        timeout = _check.timeout(timeout)
        release = self._table.release

        async def load() -> tuple[V, int]:
            outcome = loader()
            if inspect.isawaitable(outcome):
                outcome = await outcome
            if not (isinstance(outcome, tuple) and len(outcome) == 2):
                raise ContractError(
                    f"a residency loader returns (value, resident_bytes), got "
                    f"{_check.shown(outcome)}"
                )
            value, size = outcome
            try:
                size = _check.integer(size, f"resident_bytes (1..{peak}, the peak)", 1, peak)
            except ContractError:
                with anyio.CancelScope(shield=True):
                    if release is not None:
                        result = release(value)
                        if inspect.isawaitable(result):
                            await result
                raise
            return value, size

        entry = await self._table.acquire(key, peak, load, wait, timeout)
        return Lease(self._table, entry)

    async def load_budgeted(
        self,
        key: Hashable,
        idle: Callable[[V], bool],
        loader: Callable[[UnitBudget], V | Awaitable[V]],
    ) -> Lease[V]:
        """A lease on the value of `key`, loaded by `loader(unit)` when not resident; the
        value is evictable only while `idle(value)` is true. Nothing is reserved up front:
        the loader charges what it holds (see the module docstring)."""
        key = _check.key(key, "residency key")
        _check.function(idle, "idle")
        _check.function(loader, "loader")
        guards: list[Reservation] = []
        unit = UnitBudget(self.budget, guards)

        def setup(entry: Entry[V]) -> None:
            entry.guards = guards
            entry.idle = idle

        async def load() -> tuple[V, int]:
            outcome = loader(unit)
            if inspect.isawaitable(outcome):
                outcome = await outcome
            return outcome, 0

        entry = await self._table.acquire(key, 0, load, False, None, setup)
        return Lease(self._table, entry)

    def lease(self, key: Hashable) -> Lease[V]:
        """Another lease on a resident value (`ContractError` when `key` is not resident)."""
        entry = self._ready(key)
        entry.holds += 1
        self._table.hits += 1
        self._table.entries.move_to_end(entry.key)
        return Lease(self._table, entry)

    def _ready(self, key: Hashable) -> Entry[V]:
        key = _check.key(key, "residency key")
        entry = self._table.entries.get(key)
        if entry is None or entry.state is not State.READY:
            state = "absent" if entry is None else entry.state.value
            raise ContractError(f"{key!r} is not resident in {self.label!r} ({state})")
        return entry

    async def evict(self, key: Hashable) -> None:
        """Release the value of `key` now, then its charge. `ContractError` when absent,
        `Busy` when leased, loading or busy."""
        await self._table.evict(_check.key(key, "residency key"))

    async def clear(self) -> None:
        """Evict everything nobody leases (use at shutdown, before the runtime closes)."""
        await self._table.clear()

    def __repr__(self) -> str:
        t = self._table
        return f"<Residency {self.label!r} {t.used}/{t.budget} B {len(t.entries)} resources>"


__all__ = [
    "Lease",
    "Pin",
    "Residency",
    "ResidencyStats",
    "UnitBudget",
    "buffers_of",
    "free_buffers",
    "free_buffers_now",
]
