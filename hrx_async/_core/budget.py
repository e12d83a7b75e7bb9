"""One byte ceiling shared by runtime allocations and cached values.

    residency = Residency(budget_bytes=1 << 30)
    budget = residency.budget                      # a MemoryBudget
    async with Runtime(memory_budget=budget) as rt:
        with budget.reserve(4096):                 # a guard: released on exit
            ...
        rt.allocate(n, GPU_LOCAL)                  # charges the same ceiling

Why one ceiling: cached weights, slot scratch, staging and every other allocation compete
for the same device memory. An allocation that does not fit should make room by evicting
idle cached values, not fail while the cache holds memory nobody uses.

Rules:

* `reserve(n)`: `n` above the limit is `BudgetExceeded`; 0 gives a 0-byte guard. A
  request that fits is added in one step under a lock. Short of room, while the linked
  residency lives, its least recently used entry that is ready, unleased, unpinned and
  idle is evicted and the request tried again; with none left, `Busy`. Live reservations
  are never reclaimed. Without a residency the ceiling still holds.
* `reserve(n)` (and `charge(n)`, which `Runtime.allocate` calls) is synchronous, so it
  evicts only entries whose release is synchronous: values released by the default
  `free_buffers` (their buffers are freed now; one still used by submitted work gives its
  charge back when that work ends and the buffer is collected), by a plain-function
  `release`, or by none. `await reserve_wait(n)` evicts every kind, awaiting `async`
  releases, and waits while evictions of other tasks are still running.
* An evicted value's charge comes back only once its release has finished.
* The budget holds its residency weakly (`manager()` is None once it is gone) and the
  residency holds the budget strongly, so a value that keeps the budget makes no cycle.
* `reserved_bytes` = resident and loading charges of the residency + live reservations.

A guard (`Reservation`) is released by `release()` (idempotent), by leaving its `with`
block, or when it is garbage collected. Thread-safe counters; eviction runs on the thread
of the residency's event loop.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Protocol

from ..errors import BudgetExceeded, Busy, ContractError
from . import validate as _validate


class Manager(Protocol):
    """What a budget needs from the residency table it is linked to."""

    used: int

    def evict_one_now(self) -> bool: ...

    async def evict_one(self) -> bool: ...

    def releasing(self) -> bool: ...

    async def wait_changed(self) -> None: ...


class Reservation:
    """`nbytes` of a budget, held until `release()` (idempotent), `with` exit or collection."""

    __slots__ = ("__weakref__", "_budget", "nbytes")

    def __init__(self, budget: MemoryBudget, nbytes: int) -> None:
        self._budget: MemoryBudget | None = budget
        self.nbytes = nbytes

    def bytes(self) -> int:
        """The bytes this reservation still holds: `nbytes` until released, then 0."""
        return self.nbytes if self._budget is not None else 0

    @property
    def released(self) -> bool:
        """True once `release()` ran (or the `with` block ended)."""
        return self._budget is None

    def release(self) -> None:
        """Return the bytes to the budget; a second call does nothing."""
        budget, self._budget = self._budget, None
        if budget is not None and self.nbytes:
            budget.release(self.nbytes)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self._budget is None else "held"
        return f"<Reservation {self.nbytes} B {state}>"


class MemoryBudget:
    """A byte ceiling (`limit` >= 1) charged before every allocation; see the module
    docstring."""

    __slots__ = ("__weakref__", "_live", "_lock", "_manager", "_owner", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = _validate.integer(limit, "a memory budget (bytes)", 1)
        self._live = 0
        self._lock = threading.Lock()
        self._manager: weakref.ref[Any] | None = None
        self._owner: weakref.ref[Any] | None = None

    # -- linking ---------------------------------------------------------------------

    def link(self, manager: Manager, owner: object) -> None:
        """Link the residency (`owner`) and its table (`manager`), weakly; a `Residency`
        made with this budget calls it. `ContractError` when another residency has it."""
        if self._manager is not None and self._manager() is not None:
            raise ContractError("this memory budget already belongs to a residency")
        self._manager = weakref.ref(manager)
        self._owner = weakref.ref(owner)

    def _table(self) -> Manager | None:
        ref = self._manager
        return None if ref is None else ref()

    def manager(self) -> Any:
        """The residency this budget belongs to, or None once it is gone (or never was)."""
        ref = self._owner
        return None if ref is None else ref()

    # -- counters --------------------------------------------------------------------

    @property
    def live_bytes(self) -> int:
        """Bytes of live reservations and charges (runtime allocations included)."""
        return self._live

    @property
    def reserved_bytes(self) -> int:
        """Resident and loading charges of the residency plus live reservations."""
        table = self._table()
        return self._live + (table.used if table is not None else 0)

    @property
    def available_bytes(self) -> int:
        """Bytes that can still be reserved now: `limit - reserved_bytes` (never waits, never
        evicts)."""
        return self.limit - self.reserved_bytes

    def _add_live(self, nbytes: int) -> bool:
        with self._lock:
            table = self._table()
            resident = table.used if table is not None else 0
            if self._live + resident + nbytes > self.limit:
                return False
            self._live += nbytes
            return True

    def admit_resident(self, table: Manager, nbytes: int) -> bool:
        """Add `nbytes` to `table`'s charge when it fits with this budget's live
        reservations and the table's charge so far under the limit (the residency table's
        own step, under this budget's lock); whether it did."""
        with self._lock:
            if self._live + table.used + nbytes > self.limit:
                return False
            table.used += nbytes
            return True

    def _check(self, nbytes: object, low: int) -> int:
        n = _validate.integer(nbytes, "a memory budget request (bytes)", low)
        if n > self.limit:
            raise BudgetExceeded(
                f"{n} bytes can never fit in a memory budget of {self.limit} bytes"
            )
        return n

    def _busy(self, nbytes: int) -> Busy:
        return Busy(
            f"{nbytes} bytes do not fit now: {self.reserved_bytes} of {self.limit} budget "
            "bytes are in use and no idle, unleased, unpinned cached value is left to evict"
        )

    # -- reserving -------------------------------------------------------------------

    def reserve(self, nbytes: int) -> Reservation:
        """A guard on `nbytes`, evicting synchronously released idle values when short."""
        n = self._check(nbytes, 0)
        if n:
            self._charge(n)
        return Reservation(self, n)

    async def reserve_wait(self, nbytes: int) -> Reservation:
        """A guard on `nbytes`, evicting any idle value (awaiting its release) when short,
        and waiting for evictions already under way; `Busy` when nothing can make room."""
        n = self._check(nbytes, 0)
        while n and not self._add_live(n):
            table = self._table()
            if table is None:
                raise self._busy(n)
            if await table.evict_one():
                continue
            if not table.releasing():
                raise self._busy(n)
            await table.wait_changed()
        return Reservation(self, n)

    def charge(self, nbytes: int) -> None:
        """Reserve `nbytes` with no guard (`release(nbytes)` gives it back), evicting as
        `reserve` does. `Runtime.allocate` charges through this."""
        self._charge(self._check(nbytes, 1))

    def _charge(self, n: int) -> None:
        while not self._add_live(n):
            table = self._table()
            if table is None or not table.evict_one_now():
                raise self._busy(n)

    def release(self, nbytes: int) -> None:
        """Give back `nbytes` reserved earlier (a `Reservation` does this for you).

        `ContractError` when `nbytes` is not an int ≥ 1 or exceeds what is reserved; nothing
        changes then."""
        nbytes = _validate.integer(nbytes, "a memory budget release (bytes)", 1)
        with self._lock:
            if nbytes > self._live:
                raise ContractError(
                    f"cannot release {nbytes} bytes: only {self._live} are reserved"
                )
            self._live -= nbytes

    def __repr__(self) -> str:
        return f"<MemoryBudget {self.reserved_bytes}/{self.limit} B>"


__all__ = ["MemoryBudget", "Reservation"]
