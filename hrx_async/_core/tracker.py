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
writer (or None) and the readers since it. Bytes never accessed, or whose users were all
forgotten, are simply not covered by a segment, and touching neighbours with equal state are
always merged: the same access pattern replayed forever (with completed users forgotten)
therefore keeps the structure at a constant size, and the common replay case (an access
exactly covering one existing segment) is a bisect plus at most a tuple replacement.

Readers are kept in *reader groups*: sets with an identity, each counting the segments that
refer to it; a segment's readers are the union of a short tuple of disjoint groups. Many
pending users reading the same bytes is the common case at run time (inputs that nothing
writes), so neither admitting a reader nor forgetting one copies the others:

* a read adds its user in place to a group that only this segment refers to; when all of the
  segment's groups are shared (a split left several pieces referring to them) it adds a new
  group ``{user}`` instead, so splitting a segment does not copy its readers either;
* `forget` removes the user from the groups of the segments inside the ranges it recorded,
  which is right for every segment sharing such a group (all of them hold that user), and
  drops the groups it empties from those segments in the same pass;
* neighbours are compared by their *set* of readers, whatever groups hold them: sizes and a
  hash fingerprint kept per group tell unequal sets apart at once, groups both sides share
  are skipped, and a merged segment folds the groups only it refers to into one.

A WRITE returns every reader since the last writer, which is O(readers), but that is paid
once, by the write that ends that reader set. Everything else costs O(segments touched),
plus, when two segments turn out equal and merge, the readers they do not share: compared
once, then folded together.

This runs for every graph node at prepare time and every region at submit time, so it is
written for speed: parallel lists (segment starts for `bisect`, and ``(end, writer, groups)``
tuples), no per-call objects beyond the result set, one index entry and the few replaced
tuples, and a user -> recorded ranges index so that `forget` only visits the segments that
user may still appear in.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable
from typing import Final, Generic, TypeVar, cast

from .chains import ChainReplay, ReplayChain
from .intervals import check_range
from .segments import (
    Allocation,
    Piece,
    ReaderGroup,
    Readers,
    Segment,
    frozen,
    holds,
    join_reader,
    merge_after,
    merge_around,
    new_group,
    splice,
    with_reader,
    without_reader,
)

U = TypeVar("U", bound=Hashable)

# Final names: compiled, each call reads a native static instead of the module's globals.
bisect_left: Final = bisect.bisect_left
bisect_right: Final = bisect.bisect_right


class AccessTracker(Generic[U]):
    """Derives dependencies between users from their byte-range accesses on allocations.

    Pure and synchronous. `record` registers an access and returns its dependencies,
    `dependencies` asks the same question without registering, `forget` retires a user
    that completed, and `drop_allocation` forgets a freed buffer.
    """

    __slots__ = ("_index", "allocations")

    def __init__(self) -> None:
        self.allocations: dict[Hashable, Allocation[U]] = {}
        # user -> (allocation, start, end) of each access it recorded since it was last
        # forgotten: every segment the user can still appear in overlaps one of them.
        self._index: dict[U, list[tuple[Allocation[U], int, int]]] = {}

    # -- queries ---------------------------------------------------------------------------

    def __len__(self) -> int:
        """The number of allocations with at least one segment."""
        return len(self.allocations)

    def untouched(self, allocation: Hashable) -> bool:
        """True when no access to `allocation` is registered: a new one would wait for nobody."""
        return allocation not in self.allocations

    def segments(self, allocation: Hashable) -> list[tuple[int, int, U | None, frozenset[U]]]:
        """The ``(start, end, writer, readers)`` segments of `allocation`, sorted by start.

        Copies every reader set: meant for tests, debugging and assertions, not hot paths.
        """
        alloc = self._segmented(allocation)
        if alloc is None:
            return []
        return [(s, e, w, frozen(r)) for s, (e, w, r) in zip(alloc.starts, alloc.rest, strict=True)]

    def users(self) -> set[U]:
        """The users still referenced by some segment (as writer or reader).

        Scans every segment: meant for tests, debugging and assertions, not hot paths.
        """
        for alloc in list(self.allocations.values()):
            if alloc.chain is not None:
                self._materialize(cast("ReplayChain[U]", alloc.chain))
        found: set[U] = set()
        for alloc in self.allocations.values():
            for _, w, r in alloc.rest:
                if w is not None:
                    found.add(w)
                for g in r:
                    found.update(g.members)
        return found

    def dependencies(self, allocation: Hashable, start: int, end: int, writes: bool) -> set[U]:
        """What an access would depend on, without registering it.

        Unlike `record` there is no user to exclude, so a user asking about its own earlier
        accesses gets itself back; `record` never returns the recording user.
        """
        check_range(start, end)
        alloc = self._segmented(allocation)
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
            if writes:
                for g in r:
                    deps.update(g.members)
        return deps

    def writers(self, allocation: Hashable, start: int, end: int) -> set[U | None]:
        """The registered last writers of bytes ``[start, end)``, None standing for bytes
        that have none (never written by a registered user, or their writer was forgotten).

        What a read of those bytes would see when it runs: the output of these users.
        """
        if start < 0 or end <= start:
            check_range(start, end)
        alloc = self._segmented(allocation)
        if alloc is None:
            return {None}
        starts = alloc.starts
        rest = alloc.rest
        i = bisect_right(starts, start) - 1
        if i < 0 or rest[i][0] <= start:
            i += 1
        j = bisect_left(starts, end, i)
        found: set[U | None] = set()
        covered = start
        for k in range(i, j):
            if starts[k] > covered:
                found.add(None)  # a gap: bytes nobody registered touches
            seg_end, w, _ = rest[k]
            found.add(w)
            covered = seg_end
        if covered < end:
            found.add(None)
        return found

    # -- updates ---------------------------------------------------------------------------

    def record(self, allocation: Hashable, start: int, end: int, writes: bool, user: U) -> set[U]:
        """Register `user` accessing bytes ``[start, end)`` of `allocation`.

        Returns the users this access must wait for (never `user` itself). Raises
        `ContractError`, changing nothing, unless ``0 <= start < end``.
        """
        return self.record_all(((allocation, start, end, writes),), user)

    def record_all(self, accesses: tuple[tuple[Hashable, int, int, bool], ...], user: U) -> set[U]:
        """`record` for each of `accesses` ((allocation, start, end, writes), in order) of
        one user: what all of them must wait for, in one set (never `user` itself).

        One call and one result per user (a region's accesses at submit), where a call
        per access would make a set each. Every range is checked before any is
        registered, so a `ContractError` changes nothing.
        """
        for _, start, end, _ in accesses:
            if start < 0 or end <= start:
                check_range(start, end)
        deps: set[U] = set()
        ranges = self._ranges(user)
        for allocation, start, end, writes in accesses:
            self._record(allocation, start, end, writes, user, deps, ranges)
        deps.discard(user)
        return deps

    def _ranges(self, user: U) -> list[tuple[Allocation[U], int, int]]:
        """The user's list of recorded ranges in the index (made on its first access)."""
        ranges = self._index.get(user)
        if ranges is None:
            ranges = self._index[user] = []
        return ranges

    def _record(
        self,
        allocation: Hashable,
        start: int,
        end: int,
        writes: bool,
        user: U,
        deps: set[U],
        ranges: list[tuple[Allocation[U], int, int]],
    ) -> None:
        """Register one checked access, adding what it waits for to `deps` (which may come
        to hold `user` itself: the callers discard it once) and its range to `ranges`, the
        user's index entry."""
        alloc = self._segmented(allocation)  # (another user meets a chain's users here)
        if alloc is None:
            # Nothing pending on this allocation (the common case once earlier work is
            # forgotten): the access is the only segment and depends on nobody.
            segment: Segment[U]
            if writes:
                segment = (end, user, ())
            else:
                g: ReaderGroup[U] = ReaderGroup()
                g.members = {user}
                g.refs = 1
                g.fp = hash(user)
                segment = (end, None, (g,))
            alloc = Allocation(allocation, start, segment)
            self.allocations[allocation] = alloc
            ranges.append((alloc, start, end))
            return
        # The index is updated before the segments, but nothing below can raise (barring
        # a user whose __eq__ or __hash__ raises), so there is no partial state to undo.
        alloc.pending += 1
        ranges.append((alloc, start, end))

        starts = alloc.starts
        rest = alloc.rest
        i = bisect_right(starts, start) - 1
        seg_end, w, r = rest[i]  # (the last segment when i is -1: starts[-1] > start then)
        if starts[i] == start and seg_end == end:
            # Replay fast path: the access covers exactly one existing segment.
            if w is not None:
                deps.add(w)
            if writes:
                if r:
                    for g in r:
                        deps.update(g.members)
                        g.refs -= 1
                elif w == user:
                    return
                # Touching neighbours merge when written by the same user and not read since.
                if i + 1 < len(starts) and starts[i + 1] == end:
                    n_end, n_w, n_r = rest[i + 1]
                    if n_w == user and not n_r:
                        end = n_end
                        del starts[i + 1]
                        del rest[i + 1]
                if i and rest[i - 1][0] == start:
                    _, p_w, p_r = rest[i - 1]
                    if p_w == user and not p_r:
                        rest[i - 1] = (end, user, ())
                        del starts[i]
                        del rest[i]
                        return
                rest[i] = (end, user, ())
                return
            if not r:
                g = ReaderGroup()
                g.members = {user}
                g.refs = 1
                g.fp = hash(user)
                rest[i] = (end, w, (g,))
            elif len(r) == 1:
                g = r[0]
                members = g.members
                if user in members:
                    return
                if g.refs == 1:
                    members.add(user)  # the segment's own group: joined in place
                    g.fp ^= hash(user)
                else:
                    rest[i] = (end, w, (g, new_group(user, 1)))
            elif not join_reader(rest, i, user):
                return
            if (i + 1 < len(starts) and starts[i + 1] == end) or (i and rest[i - 1][0] == start):
                merge_around(alloc, i)
            return

        if i < 0 or seg_end <= start:
            i += 1
        j = bisect_left(starts, end, i)
        if not writes and j > i + 1 and starts[i] == start and rest[j - 1][0] == end:
            for k in range(i, j - 1):
                if rest[k][0] != starts[k + 1]:
                    break  # a gap: bytes nobody touched yet
            else:
                # The read covers whole segments without gaps: each is joined as above, and
                # pairs (k, k + 1) are checked from the right, so that merging one leaves
                # the next in place.
                changed = False
                for k in range(i, j):
                    w = rest[k][1]
                    if w is not None:
                        deps.add(w)
                    if join_reader(rest, k, user):
                        changed = True
                if changed:
                    k = j - 1 if j < len(starts) else j - 2
                    while k >= i - 1 and k >= 0:
                        merge_after(alloc, k)
                        k -= 1
                return

        pieces: list[Piece[U]] = []
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
                for g in r:
                    deps.update(g.members)
            pieces.append((start, end, user, ()))
            if i < j:
                last_end, w, r = rest[j - 1]
                if last_end > end:
                    pieces.append((end, last_end, w, r))
        else:
            pos = start
            for k in range(i, j):
                s_k = starts[k]
                e_k, w, r = rest[k]
                if s_k > pos:
                    pieces.append((pos, s_k, None, (new_group(user, 0),)))  # bytes nobody touched
                if w is not None:
                    deps.add(w)
                whole = s_k >= start and e_k <= end
                seg_e = e_k if e_k < end else end
                pieces.append(
                    (s_k if s_k > start else start, seg_e, w, with_reader(r, user, whole))
                )
                if e_k > end:
                    pieces.append((end, e_k, w, r))
                pos = seg_e
            if pos < end:
                pieces.append((pos, end, None, (new_group(user, 0),)))

        tail = pieces[-1][1]
        if hi < len(starts) and starts[hi] == tail:
            e0, w0, r0 = rest[hi]
            pieces.append((tail, e0, w0, r0))
            hi += 1
        splice(alloc, lo, hi, pieces)

    def forget(self, user: U) -> None:
        """Retire `user` (it completed): nothing will depend on it any more.

        Visits only the segments inside the ranges `user` recorded. Segments left without
        a writer or readers are dropped, and so are allocations left without segments.
        Forgetting an unknown user does nothing. (A user registered by `record_chain` is
        forgotten with `forget_chained`.)
        """
        # (get and del, not pop(user, None): compiled, those two are native calls.)
        index = self._index
        ranges = index.get(user)
        if ranges is None:
            return
        del index[user]
        # Every segment the user is in overlaps one of its ranges, and all of them are
        # visited. Leaving a group only one segment refers to changes that segment alone,
        # checked for merging right away; but leaving a shared group changes the other
        # segments that refer to it too, before their visit, so from then on every visited
        # segment is checked whether or not its own visit changed it.
        shared = False
        for alloc, start, end in ranges:
            pending = alloc.pending
            if pending <= 1:
                if pending:
                    # The last entry: whatever is left is this user's own. Once earlier work
                    # is forgotten this is the common case.
                    alloc.pending = 0
                    del self.allocations[alloc.key]
                continue  # or the allocation left the tracker already
            alloc.pending = pending - 1
            starts = alloc.starts
            rest = alloc.rest
            i = bisect_right(starts, start) - 1
            seg_end, w, r = rest[i]  # (the last segment when i is -1)
            if i < 0 or seg_end < end:
                # Not within the segment the range starts in (the common case is).
                if i < 0 or seg_end <= start:
                    i += 1
                j = bisect_left(starts, end, i)
                if j > i + 1:
                    shared = self._forget_segments(alloc, i, j, user, shared)
                    continue
                if j == i:
                    continue
                seg_end, w, r = rest[i]
            # One segment (the replay case): change it in place.
            new_r: Readers[U]
            if len(r) == 1:
                g = r[0]
                members = g.members
                if user in members:
                    members.discard(user)
                    g.fp ^= hash(user)
                    if g.refs > 1:
                        shared = True
                    new_r = r if members else ()
                elif not members:
                    new_r = ()  # emptied through another segment
                elif shared or w == user:
                    new_r = r
                else:
                    continue  # not here: overwritten by later writers
            elif r:
                dropped = without_reader(r, user)
                if dropped is None:
                    if not shared and w != user:
                        continue
                    new_r = r
                else:
                    new_r = dropped
                    if not shared:
                        for g in r:
                            if g.refs > 1:
                                shared = True
                                break
            elif shared or w == user:
                new_r = r
            else:
                continue
            new_w = None if w == user else w
            if new_w is None and not new_r:
                # Its groups are all empty: no other segment refers to them any more.
                del starts[i]
                del rest[i]
                if not starts:
                    self._remove(alloc)
                continue
            if new_w is not w or new_r is not r:
                rest[i] = (seg_end, new_w, new_r)
            merge_around(alloc, i)  # changed, or perhaps changed through a shared group

    def drop_allocation(self, allocation: Hashable) -> None:
        """Forget everything about a freed allocation. Unknown allocations are ignored."""
        alloc = self._segmented(allocation)
        if alloc is not None:
            self._remove(alloc)

    # -- replay chains ---------------------------------------------------------------------

    def record_chain(self, chain: ReplayChain[U], users: list[U]) -> ChainReplay[U] | None:
        """Register `users` (new to this tracker, one per region of `chain`'s pattern, in
        order; the chain keeps the list) as the chain's next replay, which says what each
        waits for (`ChainReplay.deps`) and is the handle to forget them by
        (`forget_chained`). None, changing nothing, when some allocation of the pattern
        holds another user pending (register them with `record_all` then, which takes the
        chain's pending users into account).

        The same answers `record_all` would give, in constant steps per region.
        """
        allocations = self.allocations
        marks = chain.marks
        for slot, ident in enumerate(chain.idents):
            found = allocations.get(ident)
            if found is not None and found is not marks[slot]:
                return None
        replays = chain.replays
        last = replays[-1] if replays else None
        own = chain.own
        previous = chain.previous
        slots = chain.slots
        result: list[tuple[U, ...]] = []
        earlier = last is not None and last.left > 0
        for region in range(len(users)):
            waits = own[region]
            before = previous[region] if earlier else ()
            if waits or before:
                deps = [users[j] for j in waits]
                if last is not None:
                    for j in before:
                        if last.pending >> j & 1:
                            deps.append(last.users[j])
                result.append(tuple(deps))
            else:
                result.append(())  # (no list and no tuple made: a 1-node graph's usual case)
            for index in slots[region]:
                mark = marks[index]
                if not mark.pending:
                    allocations[mark.key] = mark
                mark.pending += 1
        replay: ChainReplay[U] = ChainReplay(chain, users, result)
        replays.append(replay)
        return replay

    def forget_chained(self, replay: ChainReplay[U], region: int) -> None:
        """`forget` for the user of `region` of `replay`, which `record_chain` registered
        (a handle, not a lookup: this runs once per region of every replay)."""
        if replay.pending >> region & 1:
            self._forget_chained(replay.chain, replay, region)
        else:
            self.forget(replay.users[region])  # turned into segments meanwhile

    def _forget_chained(self, chain: ReplayChain[U], replay: ChainReplay[U], region: int) -> None:
        replay.pending &= ~(1 << region)
        replay.left -= 1
        marks = chain.marks
        for index in chain.slots[region]:
            mark = marks[index]
            mark.pending -= 1
            if not mark.pending:
                del self.allocations[mark.key]
        replays = chain.replays
        while replays and not replays[0].left:
            del replays[0]

    def _segmented(self, allocation: Hashable) -> Allocation[U] | None:
        """The allocation's segments, a chain's users on it turned into segments first."""
        alloc = self.allocations.get(allocation)
        if alloc is not None and alloc.chain is not None:
            self._materialize(cast("ReplayChain[U]", alloc.chain))
            alloc = self.allocations.get(allocation)
        return alloc

    def _materialize(self, chain: ReplayChain[U]) -> None:
        """Register the chain's users not forgotten as segments, oldest first, region by
        region: the state registering each with `record_all` would have left, since a user
        is forgotten only after every user it waits for (see `ReplayChain`). The chain
        starts afresh after: its next replay waits for these through the segments."""
        pending: list[tuple[U, int]] = []
        for replay in chain.replays:
            for region, user in enumerate(replay.users):
                if replay.pending >> region & 1:
                    pending.append((user, region))
            replay.pending = 0  # its users are forgotten as segments from now on
            replay.left = 0
        chain.replays.clear()
        for mark in chain.marks:
            if mark.pending:
                mark.pending = 0
                del self.allocations[mark.key]
        for user, region in pending:
            self.record_all(chain.pattern[region], user)

    # -- internals -------------------------------------------------------------------------

    def _forget_segments(self, alloc: Allocation[U], i: int, j: int, user: U, shared: bool) -> bool:
        """`forget` for segments ``[i, j)`` of `alloc`; returns `shared` as updated.

        Right to left, so that deleting or merging a segment leaves the indices still to
        visit in place; a pair of neighbours is checked for merging when either changed.
        """
        starts = alloc.starts
        rest = alloc.rest
        if not shared:
            for k in range(i, j):
                _, w, r = rest[k]
                if w == user or holds(r, user):
                    break
            else:
                return False  # not in any of them, and nothing else changed
        right_changed = shared
        for k in range(j - 1, i - 1, -1):
            seg_end, w, r = rest[k]
            changed = shared
            if w == user:
                w = None
                changed = True
            new_r = r
            if r:
                dropped = without_reader(r, user)
                if dropped is not None:
                    changed = True
                    new_r = dropped
                    if not shared:
                        for g in r:
                            if g.refs > 1:
                                shared = True
                                break
            if w is None and not new_r:
                del starts[k]
                del rest[k]
                right_changed = False  # a gap now: nothing to merge across it
                continue
            if w is not rest[k][1] or new_r is not r:
                rest[k] = (seg_end, w, new_r)
            if (changed or right_changed) and k + 1 < len(starts):
                merge_after(alloc, k)
            right_changed = changed
        if not starts:
            self._remove(alloc)
        elif right_changed and 0 < i < len(starts):
            merge_after(alloc, i - 1)
        return shared

    def _remove(self, alloc: Allocation[U]) -> None:
        # Index entries still naming it are skipped by `forget` (pending 0), rather than
        # searched for now among the entries of every user that touched it.
        del self.allocations[alloc.key]
        alloc.pending = 0
        alloc.starts.clear()
        alloc.rest.clear()


__all__ = ["AccessTracker"]
