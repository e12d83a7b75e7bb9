"""A bounded, single-flight cache of prepared plans with idle-only LRU eviction.

    cache = PlanCache(capacity=8, release=close_plan)
    async with cache.use(("gemm", batch), lambda: build_plan(rt, batch)) as plan:
        ...                                    # the entry is held: never evicted meanwhile

`await cache.get_or_prepare(key, loader)` returns a `PlanHandle` (hold it while using
the plan, then `release()` it, or use it as a `with` block). Concurrent callers of one
key share a single call of `loader` (plain or `async`, called with no arguments and no
lock held); its exception reaches each of them and leaves no entry. When the cache is
full, the least recently used entry that nobody holds and whose plan is idle (a plan
with a boolean `idle` attribute that is False is busy) is evicted and `release(plan)`
called; with no such entry the call raises `Busy`, or with `wait=True` waits for room
(at most `timeout` seconds, then `Busy`). A loader (or a task it starts and waits for)
that asks the cache for its own key, or for room its own loads hold (capacity 1 and
another key), would wait for itself forever: that is a `ContractError` at once. For
one event loop thread.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..errors import ContractError
from . import _check
from ._table import Hold, State, Table

V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class PlanCacheStats:
    """The plan cache's counters: `entries` now (loading ones included), and since creation
    `hits` (callers that found the key ready or loading), `misses` (loader calls) and
    `evictions`."""

    capacity: int
    entries: int
    hits: int
    misses: int
    evictions: int

    def to_dict(self) -> dict[str, int]:
        """The counters as a plain dict (JSON-serializable)."""
        return dataclasses.asdict(self)


class PlanHandle(Hold[V]):
    """One hold on a cache entry: `value` is the plan; `release()` (idempotent) lets it be
    evicted again. A synchronous context manager."""

    __slots__ = ()
    NOUN = "handle"
    AGAIN = "get it again"


async def _call(loader: Callable[[], Any]) -> Any:
    value = loader()
    if inspect.isawaitable(value):
        value = await value
    return value


class PlanCache(Generic[V]):
    """At most `capacity` (>= 1) plans, keyed by any hashable; see the module docstring.

    `release(plan)` (plain or `async`, optional) runs when a plan is evicted, before its
    place is given to another.
    """

    def __init__(
        self,
        capacity: int,
        release: Callable[[V], object] | None = None,
        label: str = "plan cache",
    ) -> None:
        capacity = _check.integer(capacity, "a plan cache capacity", 1)
        if release is not None:
            _check.function(release, "release")
        if not isinstance(label, str):
            raise ContractError(f"label must be a string, got {_check.shown(label)}")
        self.label = label
        self._table: Table[V] = Table(capacity, release, label, "entries")

    @property
    def capacity(self) -> int:
        """The most plans the cache keeps; a full cache evicts the least recently used idle one."""
        return self._table.budget

    def __len__(self) -> int:
        return len(self._table.entries)

    def __contains__(self, key: object) -> bool:
        try:
            return key in self._table.entries
        except TypeError:
            return False

    def keys(self) -> list[Hashable]:
        """Keys of ready entries, least recently used first."""
        return [k for k, e in self._table.entries.items() if e.state is State.READY]

    def stats(self) -> PlanCacheStats:
        """The counters: capacity, entries, hits, misses, evictions."""
        table = self._table
        return PlanCacheStats(
            table.budget, len(table.entries), table.hits, table.misses, table.evictions
        )

    async def get_or_prepare(
        self,
        key: Hashable,
        loader: Callable[[], V | Awaitable[V]],
        *,
        wait: bool = False,
        timeout: float | None = None,
    ) -> PlanHandle[V]:
        """A held handle on the plan of `key`, prepared by `loader()` when missing.

        Full with nothing evictable: `Busy`; with `wait=True`, waits for room (up to
        `timeout` seconds when given, then `Busy`)."""
        key = _check.key(key, "plan cache key")
        _check.function(loader, "loader")
        timeout = _check.timeout(timeout)

        async def load() -> tuple[V, int]:
            return await _call(loader), 1

        entry = await self._table.acquire(key, 1, load, wait, timeout)
        return PlanHandle(self._table, entry)

    @asynccontextmanager
    async def use(
        self,
        key: Hashable,
        loader: Callable[[], V | Awaitable[V]],
        *,
        wait: bool = True,
        timeout: float | None = None,
    ) -> AsyncIterator[V]:
        """`async with cache.use(key, loader) as plan:` holds the plan for the block; waits
        for room by default."""
        handle = await self.get_or_prepare(key, loader, wait=wait, timeout=timeout)
        try:
            yield handle.value
        finally:
            handle.release()

    async def evict(self, key: Hashable) -> None:
        """Evict `key` now: `ContractError` when absent, `Busy` when held, loading or busy."""
        await self._table.evict(_check.key(key, "plan cache key"))

    async def clear(self) -> None:
        """Evict every entry nobody holds (held, loading and busy ones stay)."""
        await self._table.clear()

    def __repr__(self) -> str:
        s = self.stats()
        return (
            f"<PlanCache {self.label!r} {s.entries}/{s.capacity} hits={s.hits} misses={s.misses}>"
        )


__all__ = ["PlanCache", "PlanCacheStats", "PlanHandle"]
