"""A budgeted, single-flight table of loaded values with LRU eviction of idle unheld entries.

The plan cache (every entry costs 1 of `capacity`) and the residency manager (an entry
costs its peak bytes while loading, then its resident bytes) are both this table.

Rules, all on one event loop thread:

* One loader per key at a time: callers of a key that is loading wait for its outcome
  and share it; the loader runs with no lock held. A loader that fails leaves no entry
  and its exception reaches every waiter; a loader whose caller is cancelled leaves no
  entry either, and one of the waiters loads again.
* A new entry is admitted only when its cost fits; admission and charging happen in one
  step, with no await in between, so the budget is never exceeded.
* Short of room, ready entries that nobody holds and whose value is idle are evicted,
  least recently used first; their charge is released only after `release(value)`
  returns (the value is gone). Without enough such entries, `Busy`, or, when asked to
  wait, a wait for room (bounded by a timeout). A refused request evicts nothing.
  Charges of values whose release is still running (another caller's eviction) are room
  only for a caller that waits: the non-waiting form answers `Busy` at once, also for a
  key that is being evicted.
* A release that raises leaves its value where it was: the entry is ready again and
  keeps its charge (the budget must still cover whatever the value holds); it moves to
  the most recently used end, so the next time room is needed it is tried last (and its
  release runs anew). Every other eviction started by the same call still runs to the
  end; then the call (a load, an `evict`, a `clear`) raises the first failure, with one
  note per further failure, and a load that needed the room reserves nothing.
* A loader (or a task it starts) that asks the same table for its own key, or for room
  that cannot come while its own loads hold their reservations, would wait for itself
  forever: that is a `ContractError` at once.
* With a `ceiling` (a `MemoryBudget`, the residency's), the table's charges and the
  budget's live reservations share one limit: admission is checked against both under the
  budget's lock, and the budget evicts through `evict_one_now`/`evict_one`. A budgeted
  entry costs nothing itself: its value's guards (taken through `UnitBudget`) are charged
  as live reservations and released when it is evicted or its loader fails. Pinned
  entries are never evicted.
"""

from __future__ import annotations

import collections
import contextvars
import enum
import inspect
from collections.abc import Awaitable, Callable, Hashable
from types import TracebackType
from typing import Any, Generic, TypeVar

import anyio
import anyio.lowlevel

from .._core.budget import MemoryBudget, Reservation
from ..errors import BudgetExceeded, Busy, ContractError, RuntimeClosed

V = TypeVar("V")

IDLE_POLL_S = 0.02
"""How often a task waiting for room looks again while only busy (non-idle) values block it."""


class State(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    EVICTING = "evicting"


class Entry(Generic[V]):
    __slots__ = (
        "cost",
        "error",
        "guards",
        "holds",
        "idle",
        "key",
        "pins",
        "ready",
        "state",
        "value",
        "waiters",
    )

    def __init__(self, key: Hashable, cost: int) -> None:
        self.guards: list[Reservation] | None = None
        """A budgeted entry's guards (taken by its loader or value through `UnitBudget`)."""
        self.idle: Callable[[Any], bool] | None = None
        self.pins = 0
        self.key = key
        self.cost = cost
        self.state = State.LOADING
        self.value: V | None = None
        self.holds = 0
        self.waiters = 0
        self.error: BaseException | None = None
        self.ready = anyio.Event()


_LOADING: contextvars.ContextVar[tuple[Entry[Any], ...]] = contextvars.ContextVar(
    "hrx_async_models_loading", default=()
)
"""The entries whose loader runs in this task: a context variable, so the tasks a loader
starts (and waits for) see them too."""


def value_idle(value: object) -> bool:
    """A value is idle unless it says otherwise through a boolean `idle` attribute."""
    idle = getattr(value, "idle", True)
    return bool(idle) if isinstance(idle, bool) else True


async def call_release(release: Callable[[Any], object] | None, value: object) -> None:
    if release is None:
        return
    outcome = release(value)
    if inspect.isawaitable(outcome):
        await outcome


def release_guards(entry: Entry[Any]) -> None:
    guards = entry.guards
    if guards:
        for guard in guards:
            guard.release()
        guards.clear()


def entry_idle(entry: Entry[Any]) -> bool:
    if entry.idle is not None:
        return bool(entry.idle(entry.value))
    return value_idle(entry.value)


class Table(Generic[V]):
    """See the module docstring. `what` names the table in messages ("plan cache", ...)."""

    def __init__(
        self,
        budget: int,
        release: Callable[[Any], object] | None,
        what: str,
        unit: str,
        ceiling: MemoryBudget | None = None,
        release_now: Callable[[Any], bool] | None = None,
    ) -> None:
        self.budget = budget
        self.used = 0
        self.ceiling = ceiling
        self.release_now = release_now
        """Releases a value synchronously (False: it cannot be, nothing done); None: the
        budget's synchronous reserve evicts nothing."""
        self.what = what
        self.unit = unit
        self.release = release
        self.entries: collections.OrderedDict[Hashable, Entry[V]] = collections.OrderedDict()
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self._changed: anyio.Event | None = None

    # -- notifications ---------------------------------------------------------------

    def notify(self) -> None:
        """Wake every task waiting for room."""
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    async def _wait_changed(self, poll: bool) -> None:
        if self._changed is None:
            self._changed = anyio.Event()
        changed = self._changed
        if poll:
            with anyio.move_on_after(IDLE_POLL_S):
                await changed.wait()
        else:
            await changed.wait()

    # -- holds -----------------------------------------------------------------------

    def unhold(self, entry: Entry[V]) -> None:
        if entry.holds <= 0:
            raise ContractError(f"{self.what} entry {entry.key!r} is not held")
        entry.holds -= 1
        if entry.holds == 0:
            self.notify()

    # -- acquiring -------------------------------------------------------------------

    async def acquire(
        self,
        key: Hashable,
        cost: int,
        loader: Callable[[], Awaitable[tuple[V, int]]],
        wait: bool,
        timeout: float | None,
        setup: Callable[[Entry[V]], None] | None = None,
    ) -> Entry[V]:
        """The ready entry of `key`, held once for the caller; loads it when missing
        (`setup` prepares a new entry before its loader runs)."""
        if cost > self.budget:
            raise BudgetExceeded(
                f"{cost} {self.unit} can never fit in the {self.what}'s budget of "
                f"{self.budget} {self.unit}"
            )
        deadline = None if timeout is None else anyio.current_time() + timeout
        await anyio.lowlevel.checkpoint()
        while True:
            entry = self.entries.get(key)
            if entry is not None:
                if entry.state is State.READY:
                    self.hits += 1
                    entry.holds += 1
                    self.entries.move_to_end(key)
                    return entry
                if entry.state is State.LOADING:
                    self._refuse_waiting_for_itself(entry)
                    if await self._join(entry):
                        self.hits += 1
                        return entry
                    continue  # the loading caller was cancelled: try again
                # Evicting: the key can load again once its old value is gone.
                if not wait:
                    raise Busy(
                        f"{self.what} entry {key!r} is being evicted (its release is still "
                        "running); retry or use the waiting form"
                    )
                await self._wait_for_change(cost, deadline, poll=False)
                continue
            if self.admit(cost):
                return await self._load(key, cost, loader, admitted=True, setup=setup)
            await self._make_room(cost, wait, deadline)

    def _own_loads(self) -> list[Entry[V]]:
        """The entries of this table that this task (or the loader that started it) is
        loading now."""
        return [
            entry
            for entry in _LOADING.get()
            if entry.state is State.LOADING and self.entries.get(entry.key) is entry
        ]

    def _refuse_waiting_for_itself(self, entry: Entry[V]) -> None:
        if entry in self._own_loads():
            raise ContractError(
                f"the loader of {self.what} entry {entry.key!r} asked for {entry.key!r} "
                "itself: it would wait for its own outcome forever"
            )

    def _refuse_room_held_by_own_loads(self, cost: int) -> None:
        own = sum(entry.cost for entry in self._own_loads())
        if own and cost + own > self.budget:
            raise ContractError(
                f"a loader of the {self.what} asked for {cost} {self.unit}, which cannot fit "
                f"while its own loads hold {own} of the {self.budget} {self.unit}: it would "
                "wait for itself forever"
            )

    async def _join(self, entry: Entry[V]) -> bool:
        """Wait for a loading entry; True when it loaded (and is now held for us)."""
        entry.waiters += 1
        try:
            await entry.ready.wait()
        except BaseException:
            if not entry.ready.is_set():
                entry.waiters -= 1
            elif entry.error is None:
                self.unhold(entry)
            raise
        error = entry.error
        if error is None:
            return True
        if isinstance(error, Exception):
            raise error
        return False

    def admit(self, cost: int) -> bool:
        """Charge `cost` when it fits (with the ceiling's live reservations counted)."""
        if self.ceiling is not None:
            return self.ceiling.admit_resident(self, cost)
        if self.used + cost > self.budget:
            return False
        self.used += cost
        return True

    def outside(self) -> int:
        """Bytes of the ceiling charged outside this table (live reservations)."""
        return 0 if self.ceiling is None else self.ceiling.live_bytes

    def weight(self, entry: Entry[V]) -> int:
        """What evicting `entry` gives back: its cost, plus a budgeted entry's live guards."""
        guards = entry.guards
        return entry.cost + (sum(g.bytes() for g in guards) if guards else 0)

    def evictable(self, entry: Entry[V]) -> bool:
        return (
            entry.state is State.READY
            and entry.holds == 0
            and entry.pins == 0
            and entry_idle(entry)
        )

    async def _load(
        self,
        key: Hashable,
        cost: int,
        loader: Callable[[], Awaitable[tuple[V, int]]],
        admitted: bool = False,
        setup: Callable[[Entry[V]], None] | None = None,
    ) -> Entry[V]:
        entry: Entry[V] = Entry(key, cost)
        if setup is not None:
            setup(entry)
        if not admitted:
            self.used += cost
        self.entries[key] = entry
        self.misses += 1
        token = _LOADING.set((*_LOADING.get(), entry))
        try:
            value, final = await loader()
        except BaseException as exc:
            del self.entries[key]
            self.used -= cost
            release_guards(entry)
            entry.error = exc
            entry.ready.set()
            self.notify()
            raise
        finally:
            _LOADING.reset(token)
        assert (entry.guards is not None or final >= 1) and final <= cost
        entry.value = value
        self.used -= cost - final
        entry.cost = final
        entry.state = State.READY
        entry.holds += 1 + entry.waiters
        entry.waiters = 0
        entry.ready.set()
        self.notify()
        return entry

    def victims(self, cost: int, count_releasing: bool) -> list[Entry[V]] | None:
        """LRU-first idle unheld ready entries whose eviction makes `cost` fit (with the
        charges of releases already running counted as room when `count_releasing`);
        None when even all of them would not."""
        missing = self.outside() + self.used + cost - self.budget
        if count_releasing:
            missing -= sum(e.cost for e in self.entries.values() if e.state is State.EVICTING)
        chosen: list[Entry[V]] = []
        for entry in self.entries.values():
            if missing <= 0:
                break
            if self.evictable(entry):
                chosen.append(entry)
                missing -= self.weight(entry)
        return chosen if missing <= 0 else None

    async def _make_room(self, cost: int, wait: bool, deadline: float | None) -> None:
        self._refuse_room_held_by_own_loads(cost)
        chosen = self.victims(cost, count_releasing=wait)
        if chosen:
            await self.evict_entries(chosen)
            return
        if not wait:
            raise Busy(self.busy_message(cost))
        # Either releases already running will make the room (chosen == []), or only
        # handles being released or busy values becoming idle can.
        blocked_by_busy_values = self.outside() > 0 or (
            chosen is None
            and any(e.state is State.READY and e.holds == 0 for e in self.entries.values())
        )
        await self._wait_for_change(cost, deadline, poll=blocked_by_busy_values)

    async def _wait_for_change(self, cost: int, deadline: float | None, poll: bool) -> None:
        remaining = None if deadline is None else deadline - anyio.current_time()
        if remaining is not None and remaining <= 0:
            raise Busy(f"timed out waiting for room: {self.busy_message(cost)}")
        with anyio.move_on_after(remaining):
            await self._wait_changed(poll)

    def busy_message(self, cost: int) -> str:
        held = sum(1 for e in self.entries.values() if e.holds or e.state is not State.READY)
        releasing = sum(e.cost for e in self.entries.values() if e.state is State.EVICTING)
        return (
            f"{cost} {self.unit} do not fit in the {self.what}: {self.used} of {self.budget} "
            f"{self.unit} in use ({releasing} of them by values still being released), "
            f"{held} of {len(self.entries)} entries held, loading or being evicted and the "
            "rest busy; release a handle or use the waiting form"
        )

    # -- eviction --------------------------------------------------------------------

    async def evict_entries(self, chosen: list[Entry[V]]) -> None:
        """Evict `chosen` (ready, unheld): each value is released (shielded: every release
        runs to the end, whatever fails or is cancelled), then its charge; see the module
        docstring for a release that raises."""
        for entry in chosen:
            entry.state = State.EVICTING
        failures: list[tuple[Entry[V], BaseException]] = []
        with anyio.CancelScope(shield=True):
            for entry in chosen:
                try:
                    await call_release(self.release, entry.value)
                except BaseException as exc:
                    entry.state = State.READY
                    self.entries.move_to_end(entry.key)
                    failures.append((entry, exc))
                else:
                    self._forget(entry)
                self.notify()
        if failures:
            (_, first), *others = failures
            for entry, other in others:
                first.add_note(
                    f"releasing {self.what} entry {entry.key!r} failed too: {other!r} (it stays "
                    "resident)"
                )
            raise first

    def _forget(self, entry: Entry[V]) -> None:
        """An evicted entry's release finished: drop it, then give its charge back."""
        del self.entries[entry.key]
        self.used -= entry.cost
        self.evictions += 1
        entry.value = None
        release_guards(entry)

    def evict_one_now(self) -> bool:
        """Evict the least recently used evictable entry whose value can be released
        synchronously (the budget's synchronous reserve); False when there is none."""
        release_now = self.release_now
        if release_now is None:
            return False
        for entry in list(self.entries.values()):
            if not self.evictable(entry):
                continue
            entry.state = State.EVICTING
            try:
                done = release_now(entry.value)
            except BaseException:
                entry.state = State.READY
                self.entries.move_to_end(entry.key)
                self.notify()
                raise
            if not done:
                entry.state = State.READY
                continue
            self._forget(entry)
            self.notify()
            return True
        return False

    async def evict_one(self) -> bool:
        """Evict the least recently used evictable entry (awaiting its release)."""
        for entry in self.entries.values():
            if self.evictable(entry):
                await self.evict_entries([entry])
                return True
        return False

    def releasing(self) -> bool:
        return any(e.state is State.EVICTING for e in self.entries.values())

    async def wait_changed(self) -> None:
        await self._wait_changed(poll=True)

    async def evict(self, key: Hashable) -> None:
        entry = self.entries.get(key)
        if entry is None:
            raise ContractError(f"the {self.what} has no entry {key!r}")
        if entry.state is not State.READY:
            raise Busy(f"{self.what} entry {key!r} is {entry.state.value}")
        if entry.holds or entry.pins:
            raise Busy(
                f"{self.what} entry {key!r} is held {entry.holds} time(s) and pinned "
                f"{entry.pins} time(s)"
            )
        if not entry_idle(entry):
            raise Busy(f"{self.what} entry {key!r} is still busy (its value is not idle)")
        await self.evict_entries([entry])

    async def clear(self) -> None:
        """Evict every ready, unheld, idle entry (the others stay)."""
        await self.evict_entries([e for e in self.entries.values() if self.evictable(e)])


class Hold(Generic[V]):
    """One hold on a table entry: `value`; `release()` (idempotent) lets the entry be
    evicted again. A synchronous context manager. Subclasses name what they hold."""

    __slots__ = ("_entry", "_table", "key")
    NOUN = "hold"
    AGAIN = "take it again"

    def __init__(self, table: Table[V], entry: Entry[V]) -> None:
        self._table = table
        self._entry: Entry[V] | None = entry
        self.key = entry.key

    def _held(self) -> Entry[V]:
        entry = self._entry
        if entry is None:
            raise RuntimeClosed(f"this {self.NOUN} on {self.key!r} was released; {self.AGAIN}")
        return entry

    @property
    def value(self) -> V:
        """The held value. `RuntimeClosed` once released."""
        return self._held().value  # type: ignore[return-value]

    @property
    def released(self) -> bool:
        """True once `release()` ran."""
        return self._entry is None

    def release(self) -> None:
        """Let the entry be evicted again (once nobody else holds it). Idempotent; `with` calls
        it."""
        entry, self._entry = self._entry, None
        if entry is not None:
            self._table.unhold(entry)

    def __enter__(self) -> V:
        return self.value

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self._entry is None else "held"
        return f"<{type(self).__name__} {self.key!r} {state}>"
