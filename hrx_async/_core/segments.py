"""The segments of one allocation in the access tracker, and the reader groups in them.

`tracker.AccessTracker` keeps, per allocation, sorted non-overlapping segments
``(end, writer, readers)``; `readers` is a short tuple of `ReaderGroup`s shared
between the pieces of a split segment, so that neither a read nor a split copies
reader sets (see the `tracker` module for the whole design). This module holds that
representation and the operations on it; the tracker holds the algorithm.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Final, Generic, TypeVar

U = TypeVar("U", bound=Hashable)

# What `segments` reports for a segment without readers.
NO_READERS: Final[frozenset[Any]] = frozenset()


class ReaderGroup(Generic[U]):
    """Readers shared by the segments that refer to it.

    `refs` counts those segments. A group only one segment refers to may grow in place when
    that segment is read again; a shared one never grows (the reader would leak into the
    other segments), but `forget` removes users from it, which is right for all of them.
    `fp` is the XOR of the members' hashes, kept current so that reader sets of equal size
    are told apart without comparing their members.

    No ``__init__``: the hot paths set the three fields inline, `new_group` elsewhere.
    """

    __slots__ = ("fp", "members", "refs")
    members: set[U]
    refs: int
    fp: int


# A segment's readers: disjoint, non-empty groups (empty groups exist only in the middle of
# a `forget`, which drops them), () when there are none.
Readers = tuple[ReaderGroup[U], ...]
Segment = tuple[int, U | None, Readers[U]]  # (end, writer, readers)
Piece = tuple[int, int, U | None, Readers[U]]  # (start, end, writer, readers)


def new_group(user: U, refs: int) -> ReaderGroup[U]:
    group: ReaderGroup[U] = ReaderGroup()
    group.members = {user}
    group.refs = refs
    group.fp = hash(user)
    return group


def holds(readers: Readers[U], user: U) -> bool:
    for group in readers:  # noqa: SIM110 - a plain loop: no generator on this path
        if user in group.members:
            return True
    return False


def refers(readers: Readers[U], group: ReaderGroup[U]) -> bool:
    return any(g is group for g in readers)


def same_readers(a: Readers[U], b: Readers[U]) -> bool:
    """Whether two segments' groups hold the same set of users."""
    if a is b:
        return True
    if len(a) == 1 and len(b) == 1:
        x = a[0]
        y = b[0]
        return x is y or (
            x.fp == y.fp and len(x.members) == len(y.members) and x.members == y.members
        )
    size = 0
    fp = 0
    for g in a:
        size += len(g.members)
        fp ^= g.fp
    for g in b:
        size -= len(g.members)
        fp ^= g.fp
    if size or fp:
        return False
    # Same size (the groups of a segment are disjoint): equal when every member of a group
    # of `a` that `b` does not refer to is in one of the groups only `b` refers to.
    only_b = [g.members for g in b if not refers(a, g)]
    for g in a:
        if refers(b, g):
            continue
        for user in g.members:
            for members in only_b:
                if user in members:
                    break
            else:
                return False
    return True


def compact(readers: Readers[U]) -> Readers[U]:
    """The same readers with the groups only this segment refers to folded into one."""
    own: ReaderGroup[U] | None = None
    kept: list[ReaderGroup[U]] = []
    folded = False
    for g in readers:
        if g.refs != 1:
            kept.append(g)
        elif own is None:
            own = g
        else:
            folded = True
            if len(g.members) > len(own.members):
                own, g = g, own
            own.members |= g.members  # the smaller one into the larger one
            own.fp ^= g.fp
            g.refs = 0
    if not folded or own is None:
        return readers
    kept.append(own)
    return tuple(kept)


def join_reader(rest: list[Segment[U]], k: int, user: U) -> bool:
    """Add `user` to the readers of segment `k`, read as a whole; False if it was one."""
    e, w, r = rest[k]
    if not r:
        rest[k] = (e, w, (new_group(user, 1),))
        return True
    for g in r:
        if user in g.members:
            return False
    for g in r:
        if g.refs == 1:
            g.members.add(user)
            g.fp ^= hash(user)
            return True
    rest[k] = (e, w, (*r, new_group(user, 1)))
    return True


def with_reader(readers: Readers[U], user: U, whole: bool) -> Readers[U]:
    """`readers` plus `user`, for a segment the read covers (`whole`) or a piece of one.

    Grows a group in place only when it is the segment's own and the segment is not split;
    otherwise adds a new group (refs 0: `splice` counts the segments that keep it).
    """
    for g in readers:
        if user in g.members:
            return readers
    if whole:
        for g in readers:
            if g.refs == 1:
                g.members.add(user)
                g.fp ^= hash(user)
                return readers
    return (*readers, new_group(user, 0))


def without_reader(readers: Readers[U], user: U) -> Readers[U] | None:
    """Remove `user` from the groups; the groups left non-empty, or None if nothing changed."""
    changed = False
    emptied = False
    for g in readers:
        members = g.members
        if user in members:
            members.discard(user)
            g.fp ^= hash(user)
            changed = True
            if not members:
                emptied = True
        elif not members:  # emptied earlier in the same `forget`, through another segment
            emptied = True
    if emptied:
        return tuple([g for g in readers if g.members])
    return readers if changed else None


def frozen(readers: Readers[U]) -> frozenset[U]:
    if not readers:
        return NO_READERS
    if len(readers) == 1:
        return frozenset(readers[0].members)
    return frozenset().union(*(g.members for g in readers))


class Allocation(Generic[U]):
    """The segments of one allocation, or the mark of a replay chain's users on it."""

    __slots__ = ("chain", "key", "pending", "rest", "starts")

    def __init__(self, key: Hashable, start: int, segment: Segment[U]) -> None:
        """An allocation with its first segment, recorded by one index entry."""
        self.key = key
        # Index entries naming this allocation that `forget` has not processed yet. Once
        # none is left every user that recorded an access here was forgotten, and the
        # allocation leaves the tracker; it is set to 0 when the allocation leaves for
        # another reason, so that entries still naming it are skipped. (A chain's mark:
        # the chain's users not forgotten that access it.)
        self.pending = 1
        # Kept apart from `rest` so `bisect` works on plain ints (no key function calls).
        self.starts = [start]
        # (end, writer, readers) of the segment starting at the same index in `starts`.
        self.rest = [segment]
        self.chain: object = None
        """Set on a chain's mark, which has no segments: the `chains.ReplayChain` whose
        users stand for them (typed `object`: that module builds on this one)."""


def splice(alloc: Allocation[U], lo: int, hi: int, pieces: list[Piece[U]]) -> None:
    """Replace segments ``[lo, hi)`` by sorted `pieces`, merging equal neighbours.

    Pieces without a writer or readers are left out. Group reference counts move from the
    replaced segments to the resulting ones.
    """
    rest = alloc.rest
    for k in range(lo, hi):
        for g in rest[k][2]:
            g.refs -= 1
    new_starts: list[int] = []
    new_rest: list[Segment[U]] = []
    for s, e, w, r in pieces:
        if w is None and not r:
            continue
        if new_rest:
            prev_end, prev_w, prev_r = new_rest[-1]
            if prev_end == s and prev_w == w and same_readers(prev_r, r):
                new_rest[-1] = (e, prev_w, prev_r)
                continue
        new_starts.append(s)
        new_rest.append((e, w, r))
    for _, _, r in new_rest:
        for g in r:
            g.refs += 1
    for k, (e, w, r) in enumerate(new_rest):
        if len(r) > 1:
            folded = compact(r)
            if folded is not r:
                new_rest[k] = (e, w, folded)
    alloc.starts[lo:hi] = new_starts
    rest[lo:hi] = new_rest


def merge_after(alloc: Allocation[U], k: int) -> None:
    """Merge segment ``k + 1`` into segment `k` if they touch and have equal state."""
    starts = alloc.starts
    rest = alloc.rest
    end, w, r = rest[k]
    if starts[k + 1] != end:
        return
    n_end, n_w, n_r = rest[k + 1]
    if n_w == w and same_readers(r, n_r):
        for g in n_r:
            g.refs -= 1
        if len(r) > 1:
            r = compact(r)
        rest[k] = (n_end, w, r)
        del starts[k + 1]
        del rest[k + 1]


def merge_around(alloc: Allocation[U], i: int) -> None:
    """Merge segment `i` with touching neighbours of equal state (after it changed)."""
    if i + 1 < len(alloc.starts):
        merge_after(alloc, i)
    if i > 0:
        merge_after(alloc, i - 1)
