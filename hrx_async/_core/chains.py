"""Replay chains: the replays of one fixed pattern of accesses registered with the access
tracker in a few constant steps each, instead of segment by segment.

A prepared graph's regions access the same byte ranges on every replay. While nothing but
the graph's own replays is pending on those bytes, what replay k's regions wait for follows
from the pattern alone, and `ReplayChain` holds it, worked out once (`replay_chain`);
`tracker.AccessTracker.record_chain` registers a replay with it and turns the chain's
pending users into segments the moment any other access meets them.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, Protocol, TypeVar

from .intervals import check_range
from .segments import Allocation

U = TypeVar("U", bound=Hashable)

Pattern = tuple[tuple[tuple[Hashable, int, int, bool], ...], ...]
"""Per region, its accesses (allocation, start, end, writes) in order."""


class ChainReplay(Generic[U]):
    """One replay of a `ReplayChain`: its users, by region, which are still registered
    through the chain, and what each waits for.

    The handle its users are forgotten by (`AccessTracker.forget_chained`): the caller
    keeps it with each user, so neither registering nor forgetting one looks it up."""

    __slots__ = ("chain", "deps", "left", "pending", "users")

    def __init__(self, chain: ReplayChain[U], users: list[U], deps: list[tuple[U, ...]]) -> None:
        self.chain = chain
        self.users = users
        self.deps = deps
        """Per region, the users its user waits for (the same `record_all` would give)."""
        self.left = len(users)
        self.pending = (1 << self.left) - 1
        """Bit i set: the user of region i is registered through the chain and not
        forgotten (cleared too once the chain's users were turned into segments)."""


class ReplayChain(Generic[U]):
    """The replays of one fixed pattern of accesses (a prepared graph's regions), each
    registered in a few constant steps instead of segment by segment.

    While no other user is pending on any allocation the pattern touches, what replay k's
    regions wait for follows from the pattern alone: the regions of replay k before them
    that they conflict with, and those of replay k-1 not forgotten yet (bytes the pattern
    writes hold only the last replay's users; bytes it only reads may hold readers of
    many, which a replay's reads never wait for). Worked out once, here, by a tracker run
    over two replays. Each allocation the chain's pending users touch holds a mark in the
    tracker (`Allocation.chain`), so any other access to it is seen: it first turns the
    chain's pending users into segments (`AccessTracker` registers them again, in order,
    which gives the state registering them one by one would have left, as users are only
    forgotten after everything they wait for).
    """

    __slots__ = ("idents", "marks", "own", "pattern", "previous", "replays", "slots")

    def __init__(
        self,
        pattern: Pattern,
        own: tuple[tuple[int, ...], ...],
        previous: tuple[tuple[int, ...], ...],
    ) -> None:
        self.pattern = pattern
        """Per region, its accesses (allocation, start, end, writes) in order."""
        self.own = own
        """Per region, the earlier regions of the same replay it waits for."""
        self.previous = previous
        """Per region, the regions of the previous replay it waits for (if not forgotten)."""
        idents: list[Hashable] = []
        for accesses in pattern:
            for access in accesses:
                if access[0] not in idents:
                    idents.append(access[0])
        self.idents = tuple(idents)
        self.slots = tuple(
            tuple(idents.index(ident) for ident in dict.fromkeys(a[0] for a in accesses))
            for accesses in pattern
        )
        """Per region, the allocations it touches (their places in `idents`)."""
        marks: list[Allocation[U]] = []
        for ident in idents:
            mark: Allocation[U] = Allocation(ident, 0, (1, None, ()))
            mark.starts.clear()
            mark.rest.clear()
            mark.pending = 0
            mark.chain = self
            marks.append(mark)
        self.marks = marks
        """Per allocation, the chain's mark (in the tracker while `pending`)."""
        self.replays: list[ChainReplay[U]] = []
        """Its replays since the oldest with users not forgotten, oldest first, the last one
        last (a list, not a deque: compiled, its operations are native; it stays short)."""


class Recorder(Protocol):
    """What `replay_chain` asks of an empty tracker (`tracker.AccessTracker`, which builds
    on this module)."""

    def record_all(
        self, accesses: tuple[tuple[Hashable, int, int, bool], ...], user: tuple[int, int]
    ) -> set[tuple[int, int]]: ...


def replay_chain(pattern: Pattern, scratch: Recorder) -> ReplayChain[U]:
    """A chain for replays of `pattern`; `ContractError` for a bad range. What a region
    waits for comes from a run of `scratch`, an empty tracker, over two replays of it:
    `replay_chain(pattern, AccessTracker())`."""
    for accesses in pattern:
        for _, start, end, _ in accesses:
            if start < 0 or end <= start:
                check_range(start, end)
    own: list[tuple[int, ...]] = []
    previous: list[tuple[int, ...]] = []
    for replay in (0, 1):
        for region, accesses in enumerate(pattern):
            deps = scratch.record_all(accesses, (replay, region))
            if replay:
                own.append(tuple(sorted(j for k, j in deps if k == 1)))
                previous.append(tuple(sorted(j for k, j in deps if k == 0)))
    return ReplayChain(pattern, tuple(own), tuple(previous))


__all__ = ["ChainReplay", "Pattern", "Recorder", "ReplayChain", "replay_chain"]
