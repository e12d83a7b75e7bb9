"""Access-conflict tracking: infer dependencies between users from byte-range accesses.

A *user* is whatever issues an access (a graph node index while a graph is prepared, a
region id while work is admitted at run time); an *allocation* is any hashable buffer key.
Both are opaque here. Given the accesses in program order, `AccessTracker.record` returns
the earlier users an access must wait for, which is how ordering is derived without the
caller spelling out dependencies:

* a READ of ``[s, e)`` depends on the last writer of every byte it touches (read after write);
* a WRITE of ``[s, e)`` depends on that last writer (write after write) and on every reader
  since it (write after read), and then becomes the only state of those bytes.

A user never depends on itself. Users that completed are removed with `forget`, after which
nothing can depend on them any more.

Per allocation the state is a sorted list of non-overlapping segments, each holding a last
writer (or None) and a frozenset of readers. Bytes never accessed, or whose users were all
forgotten, are simply not covered by a segment, and touching neighbours with equal state are
always merged: the same access pattern replayed forever (with completed users forgotten)
therefore keeps the structure at a constant size, and the common replay case (an access
exactly covering one existing segment) is a bisect plus a tuple replacement.

This runs for every graph node at prepare time and every region at submit time, so it is
written for speed: parallel lists (segment starts for `bisect`, and ``(end, writer, readers)``
tuples), no per-call objects beyond the result set and the few replaced tuples, and a
user -> allocations index so that `forget` only visits what that user touched.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Hashable, Iterable
from typing import Any, Generic, TypeVar

from hrx_async.errors import ContractError

U = TypeVar("U", bound=Hashable)

# One shared empty reader set: writes reset readers to it, and identity makes the common
# "no readers" equality check instant.
_NO_READERS: frozenset[Any] = frozenset()


class _Allocation(Generic[U]):
    """The segments of one allocation, plus the users that may appear in them."""

    __slots__ = ("rest", "starts", "touched")

    def __init__(self) -> None:
        # Kept apart from `rest` so `bisect` works on plain ints (no key function calls).
        self.starts: list[int] = []
        # (end, writer, readers) of the segment starting at the same index in `starts`.
        self.rest: list[tuple[int, U | None, frozenset[U]]] = []
        # Every user that recorded an access here and was not forgotten since. A superset of
        # the users still present (later writes may have overwritten some), which is all the
        # index needs: it lets `drop_allocation` and the removal of an emptied allocation
        # clean the user -> allocations index without scanning it.
        self.touched: set[U] = set()


def _check_range(start: int, end: int) -> None:
    if start < 0 or end <= start:
        raise ContractError(f"byte range [{start}, {end}) is invalid: need 0 <= start < end")


def _normalise(
    pieces: list[tuple[int, int, U | None, frozenset[U]]],
) -> tuple[list[int], list[tuple[int, U | None, frozenset[U]]]]:
    """Split sorted pieces into starts and (end, writer, readers), merging equal neighbours."""
    starts: list[int] = []
    rest: list[tuple[int, U | None, frozenset[U]]] = []
    for s, e, w, r in pieces:
        if rest:
            prev_end, prev_w, prev_r = rest[-1]
            if prev_end == s and prev_w == w and prev_r == r:
                rest[-1] = (e, w, r)
                continue
        starts.append(s)
        rest.append((e, w, r))
    return starts, rest


class AccessTracker(Generic[U]):
    """Derives dependencies between users from their byte-range accesses on allocations.

    Pure and synchronous. `record` registers an access and returns its dependencies,
    `dependencies` asks the same question without registering, `forget` retires a user
    that completed, and `drop_allocation` forgets a freed buffer.
    """

    __slots__ = ("_allocs", "_index")

    def __init__(self) -> None:
        self._allocs: dict[Hashable, _Allocation[U]] = {}
        # user -> allocations it recorded accesses on (and was not forgotten from since).
        self._index: dict[U, set[Hashable]] = {}

    # -- queries ---------------------------------------------------------------------------

    def __len__(self) -> int:
        """The number of allocations with at least one segment."""
        return len(self._allocs)

    def untouched(self, allocation: Hashable) -> bool:
        """True when no access to `allocation` is registered: a new one would wait for nobody."""
        return allocation not in self._allocs

    def segments(self, allocation: Hashable) -> list[tuple[int, int, U | None, frozenset[U]]]:
        """The ``(start, end, writer, readers)`` segments of `allocation`, sorted by start."""
        alloc = self._allocs.get(allocation)
        if alloc is None:
            return []
        return [(s, e, w, r) for s, (e, w, r) in zip(alloc.starts, alloc.rest, strict=True)]

    def users(self) -> set[U]:
        """The users still referenced by some segment (as writer or reader).

        Scans every segment: meant for tests, debugging and assertions, not hot paths.
        """
        found: set[U] = set()
        for alloc in self._allocs.values():
            for _, w, r in alloc.rest:
                if w is not None:
                    found.add(w)
                found.update(r)
        return found

    def dependencies(self, allocation: Hashable, start: int, end: int, writes: bool) -> set[U]:
        """What an access would depend on, without registering it.

        Unlike `record` there is no user to exclude, so a user asking about its own earlier
        accesses gets itself back; `record` never returns the recording user.
        """
        _check_range(start, end)
        alloc = self._allocs.get(allocation)
        deps: set[U] = set()
        if alloc is None:
            return deps
        starts = alloc.starts
        rest = alloc.rest
        i = bisect_right(starts, start) - 1
        if i < 0 or rest[i][0] <= start:
            i += 1
        j = bisect_left(starts, end, i)
        for k in range(i, j):
            _, w, r = rest[k]
            if w is not None:
                deps.add(w)
            if writes and r:
                deps.update(r)
        return deps

    # -- updates ---------------------------------------------------------------------------

    def record(self, allocation: Hashable, start: int, end: int, writes: bool, user: U) -> set[U]:
        """Register `user` accessing bytes ``[start, end)`` of `allocation`.

        Returns the users this access must wait for (never `user` itself). Raises
        `ContractError`, changing nothing, unless ``0 <= start < end``.
        """
        _check_range(start, end)
        alloc = self._allocs.get(allocation)
        if alloc is None:
            alloc = _Allocation()
            self._allocs[allocation] = alloc
        # The index is updated before the segments, but nothing below can raise (barring
        # a user whose __eq__ raises), so there is no partial state to undo.
        alloc.touched.add(user)
        idx = self._index.get(user)
        if idx is None:
            self._index[user] = {allocation}
        else:
            idx.add(allocation)

        starts = alloc.starts
        rest = alloc.rest
        if not starts:
            # Nothing pending on this allocation (the common case once earlier work is
            # forgotten): the access is the only segment and depends on nobody.
            starts.append(start)
            rest.append((end, user, _NO_READERS) if writes else (end, None, frozenset((user,))))
            return set()
        i = bisect_right(starts, start) - 1
        if i < 0 or rest[i][0] <= start:
            i += 1
        j = bisect_left(starts, end, i)
        deps: set[U] = set()

        if j == i + 1 and starts[i] == start and rest[i][0] == end:
            # Replay fast path: the access covers exactly one existing segment.
            _, w, r = rest[i]
            if w is not None:
                deps.add(w)
            if writes:
                if r:
                    deps.update(r)
                if w == user and not r:
                    deps.discard(user)
                    return deps
                rest[i] = (end, user, _NO_READERS)
            else:
                if user in r:
                    deps.discard(user)
                    return deps
                rest[i] = (end, w, r | {user})
            deps.discard(user)
            self._merge_around(alloc, i)
            return deps

        pieces: list[tuple[int, int, U | None, frozenset[U]]] = []
        lo = i
        hi = j
        # Pull in touching neighbours so the new pieces can merge with them.
        first = starts[i] if i < j and starts[i] < start else start
        if lo > 0 and rest[lo - 1][0] == first:
            lo -= 1
            e0, w0, r0 = rest[lo]
            pieces.append((starts[lo], e0, w0, r0))
        if i < j and starts[i] < start:
            # The part of the first overlapped segment before the access keeps its state.
            _, w0, r0 = rest[i]
            pieces.append((starts[i], start, w0, r0))

        if writes:
            for k in range(i, j):
                _, w, r = rest[k]
                if w is not None:
                    deps.add(w)
                if r:
                    deps.update(r)
            pieces.append((start, end, user, _NO_READERS))
            if i < j:
                last_end, w, r = rest[j - 1]
                if last_end > end:
                    pieces.append((end, last_end, w, r))
            tail = pieces[-1][1]
        else:
            alone: frozenset[U] = frozenset((user,))
            pos = start
            for k in range(i, j):
                s_k = starts[k]
                e_k, w, r = rest[k]
                if s_k > pos:
                    pieces.append((pos, s_k, None, alone))  # bytes nobody touched yet
                if w is not None:
                    deps.add(w)
                seg_e = e_k if e_k < end else end
                pieces.append((s_k if s_k > start else start, seg_e, w, r | alone))
                if e_k > end:
                    pieces.append((end, e_k, w, r))
                pos = seg_e
            if pos < end:
                pieces.append((pos, end, None, alone))
            tail = pieces[-1][1]

        if hi < len(starts) and starts[hi] == tail:
            e0, w0, r0 = rest[hi]
            pieces.append((tail, e0, w0, r0))
            hi += 1
        new_starts, new_rest = _normalise(pieces)
        starts[lo:hi] = new_starts
        rest[lo:hi] = new_rest
        deps.discard(user)
        return deps

    def forget(self, user: U) -> None:
        """Retire `user` (it completed): nothing will depend on it any more.

        Visits only the allocations `user` recorded accesses on. Segments left without a
        writer or readers are dropped, and so are allocations left without segments.
        Forgetting an unknown user does nothing.
        """
        keys = self._index.pop(user, None)
        if keys is None:
            return
        allocs = self._allocs
        for key in keys:
            alloc = allocs[key]
            touched = alloc.touched
            touched.discard(user)
            if not touched:
                # Nobody else may appear here (touched is a superset of the users present):
                # the allocation empties, as after every replay whose work completed.
                del allocs[key]
                continue
            rest = alloc.rest
            # Find the first segment `user` still appears in; everything before it (bar its
            # left neighbour, which may merge) stays as it is.
            first = 0
            for _, w, r in rest:
                if w == user or user in r:
                    break
                first += 1
            else:
                continue  # overwritten everywhere here by later writers
            starts = alloc.starts
            lo = first - 1 if first else 0
            new_starts: list[int] = []
            new_rest: list[tuple[int, U | None, frozenset[U]]] = []
            for k in range(lo, len(rest)):
                seg = rest[k]
                e, w, r = seg
                if w == user:
                    w = None
                if user in r:
                    r = r - {user}
                if w is None and not r:
                    continue
                s = starts[k]
                if new_rest:
                    prev_end, prev_w, prev_r = new_rest[-1]
                    if prev_end == s and prev_w == w and prev_r == r:
                        new_rest[-1] = (e, w, r)
                        continue
                new_starts.append(s)
                # Keep the original tuple when nothing changed: no new object per segment.
                new_rest.append(seg if seg[1] is w and seg[2] is r else (e, w, r))
            if new_starts or lo:
                starts[lo:] = new_starts
                rest[lo:] = new_rest
            else:
                self._remove(key, alloc)

    def drop_allocation(self, allocation: Hashable) -> None:
        """Forget everything about a freed allocation. Unknown allocations are ignored."""
        alloc = self._allocs.get(allocation)
        if alloc is not None:
            self._remove(allocation, alloc)

    # -- internals -------------------------------------------------------------------------

    def _remove(self, key: Hashable, alloc: _Allocation[U]) -> None:
        del self._allocs[key]
        index = self._index
        for u in alloc.touched:
            keys = index[u]
            keys.discard(key)
            if not keys:
                del index[u]

    @staticmethod
    def _merge_around(alloc: _Allocation[U], i: int) -> None:
        """Merge segment `i` with touching neighbours of equal state (after it changed)."""
        starts = alloc.starts
        rest = alloc.rest
        end, w, r = rest[i]
        if i + 1 < len(starts) and starts[i + 1] == end:
            n_end, n_w, n_r = rest[i + 1]
            if n_w == w and n_r == r:
                rest[i] = (n_end, w, r)
                del starts[i + 1]
                del rest[i + 1]
        if i > 0:
            p_end, p_w, p_r = rest[i - 1]
            if p_end == starts[i] and p_w == w and p_r == r:
                rest[i - 1] = rest[i]
                del starts[i]
                del rest[i]


def merge_intervals(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sort half-open intervals and merge those that overlap or touch.

    ``[(4, 8), (0, 4), (10, 12)]`` gives ``[(0, 8), (10, 12)]``. Empty intervals
    (``start == end``) cover nothing and are dropped; an interval with ``end < start``
    raises `ContractError`.
    """
    ordered: list[tuple[int, int]] = []
    for s, e in intervals:
        if e < s:
            raise ContractError(f"interval [{s}, {e}) is invalid: need start <= end")
        if e > s:
            ordered.append((s, e))
    ordered.sort()
    merged: list[tuple[int, int]] = []
    for s, e in ordered:
        if merged and s <= merged[-1][1]:
            if e > merged[-1][1]:
                merged[-1] = (merged[-1][0], e)
        else:
            merged.append((s, e))
    return merged


__all__ = ["AccessTracker", "merge_intervals"]
