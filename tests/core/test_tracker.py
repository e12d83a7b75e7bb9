"""Tests of the access-conflict tracker against exact examples and a per-byte brute force."""

from __future__ import annotations

import statistics
import tracemalloc
from collections.abc import Callable, Hashable
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hrx_async._core.chains import ChainReplay, ReplayChain, replay_chain
from hrx_async._core.intervals import merge_intervals
from hrx_async._core.tracker import AccessTracker
from hrx_async.errors import ContractError

Segments = list[tuple[int, int, int | None, frozenset[int]]]


def snapshot(tracker: AccessTracker[int], allocations: list[Hashable]) -> list[Segments]:
    return [tracker.segments(a) for a in allocations]


def check_shape(segs: Segments) -> None:
    """Sorted, non-overlapping, no empty state, no touching neighbours of equal state."""
    for s, e, w, r in segs:
        assert 0 <= s < e
        assert w is not None or r, f"empty-state segment {(s, e, w, r)}"
        assert isinstance(r, frozenset)
    for (_, e0, w0, r0), (s1, _, w1, r1) in pairwise(segs):
        assert e0 <= s1, f"unsorted or overlapping: {segs}"
        assert not (e0 == s1 and w0 == w1 and r0 == r1), f"unmerged neighbours: {segs}"


def check_groups(tracker: AccessTracker[int]) -> None:
    """The reader groups behind the segments: counted, fingerprinted, disjoint, non-empty."""
    refs: dict[int, int] = {}
    groups = {}
    for alloc in tracker.allocations.values():
        assert alloc.starts, "an allocation without segments is kept"
        for _, _, readers in alloc.rest:
            seen: set[int] = set()
            for group in readers:
                assert group.members, "empty reader group"
                assert not seen & group.members, "a segment's groups overlap"
                seen |= group.members
                fp = 0
                for u in group.members:
                    fp ^= hash(u)
                assert group.fp == fp
                refs[id(group)] = refs.get(id(group), 0) + 1
                groups[id(group)] = group
    for key, group in groups.items():
        assert group.refs == refs[key], "a group's reference count is off"


# -- the seed example --------------------------------------------------------------------


def test_seed_example() -> None:
    t: AccessTracker[str] = AccessTracker()
    assert t.record("buf", 0, 64, True, "u1") == set()
    assert t.record("buf", 0, 32, False, "u2") == {"u1"}
    assert t.record("buf", 64, 96, False, "u3") == set()
    assert t.record("buf", 16, 80, True, "u4") == {"u1", "u2", "u3"}
    assert t.record("buf", 24, 32, False, "u5") == {"u4"}
    assert t.segments("buf") == [
        (0, 16, "u1", frozenset({"u2"})),
        (16, 24, "u4", frozenset()),
        (24, 32, "u4", frozenset({"u5"})),
        (32, 80, "u4", frozenset()),
        (80, 96, None, frozenset({"u3"})),
    ]
    assert t.users() == {"u1", "u2", "u3", "u4", "u5"}
    assert len(t) == 1


def test_allocations_are_independent() -> None:
    t: AccessTracker[int] = AccessTracker()
    t.record("a", 0, 64, True, 1)
    assert t.record("b", 0, 64, True, 2) == set()
    assert t.record("b", 0, 64, False, 3) == {2}
    assert len(t) == 2


def test_never_depends_on_itself() -> None:
    t: AccessTracker[int] = AccessTracker()
    assert t.record("a", 0, 8, True, 1) == set()
    assert t.record("a", 0, 8, False, 1) == set()
    assert t.record("a", 0, 8, False, 1) == set()  # already a reader: nothing changes
    assert t.record("a", 0, 4, False, 1) == set()
    assert t.record("a", 0, 8, True, 1) == set()
    assert t.record("a", 0, 8, False, 2) == {1}
    # 1 writes again: it waits for reader 2 but not for its own earlier write.
    assert t.record("a", 0, 16, True, 1) == {2}


# -- brute-force model -------------------------------------------------------------------

SIZE = 64
ALLOCS: list[Hashable] = ["x", ("y", 1), 7]


class ByteModel:
    """The rules applied byte by byte: obviously right, and slow."""

    def __init__(self) -> None:
        self.bytes: dict[Hashable, list[tuple[int | None, frozenset[int]]]] = {
            a: [(None, frozenset())] * SIZE for a in ALLOCS
        }

    def dependencies(self, alloc: Hashable, s: int, e: int, writes: bool) -> set[int]:
        deps: set[int] = set()
        for w, r in self.bytes[alloc][s:e]:
            if w is not None:
                deps.add(w)
            if writes:
                deps |= r
        return deps

    def writers(self, alloc: Hashable, s: int, e: int) -> set[int | None]:
        return {w for w, _ in self.bytes[alloc][s:e]}

    def record(self, alloc: Hashable, s: int, e: int, writes: bool, user: int) -> set[int]:
        deps = self.dependencies(alloc, s, e, writes) - {user}
        cells = self.bytes[alloc]
        for b in range(s, e):
            w, r = cells[b]
            cells[b] = (user, frozenset()) if writes else (w, r | {user})
        return deps

    def forget(self, user: int) -> None:
        for cells in self.bytes.values():
            for b, (w, r) in enumerate(cells):
                cells[b] = (None if w == user else w, r - {user})

    def drop(self, alloc: Hashable) -> None:
        self.bytes[alloc] = [(None, frozenset())] * SIZE

    def users(self) -> set[int]:
        found: set[int] = set()
        for cells in self.bytes.values():
            for w, r in cells:
                if w is not None:
                    found.add(w)
                found |= r
        return found

    def live_allocations(self) -> int:
        return sum(any(w is not None or r for w, r in cells) for cells in self.bytes.values())


def expand(segs: Segments) -> list[tuple[int | None, frozenset[int]]]:
    cells: list[tuple[int | None, frozenset[int]]] = [(None, frozenset())] * SIZE
    for s, e, w, r in segs:
        for b in range(s, e):
            cells[b] = (w, r)
    return cells


# Boundaries on a coarse grid make exact re-hits (the replay fast path) and touching
# neighbours common; arbitrary bytes exercise splits everywhere else.
bound = st.one_of(st.sampled_from([0, 8, 16, 32, 48, 56]), st.integers(0, SIZE - 1))
length = st.one_of(st.sampled_from([8, 16, 32]), st.integers(1, SIZE))


@st.composite
def record_op(draw: st.DrawFn) -> tuple[str, Hashable, int, int, bool, int]:
    s = draw(bound)
    e = min(SIZE, s + draw(length))
    return ("record", draw(st.sampled_from(ALLOCS)), s, e, draw(st.booleans()), draw(user))


user = st.integers(0, 7)
op = st.one_of(
    record_op(),
    record_op(),
    record_op(),
    st.tuples(st.just("forget"), user),
    st.tuples(st.just("drop"), st.sampled_from(ALLOCS)),
)


def matches_model(tracker: AccessTracker[int], model: ByteModel) -> None:
    """Every allocation's segments are well formed and hold the model's bytes."""
    for a in ALLOCS:
        segs = tracker.segments(a)
        check_shape(segs)
        assert expand(segs) == model.bytes[a]
    assert tracker.users() == model.users()
    check_groups(tracker)


@settings(max_examples=400, deadline=None)
@given(st.lists(op, max_size=60))
def test_matches_byte_model(ops: list[tuple[object, ...]]) -> None:
    tracker: AccessTracker[int] = AccessTracker()
    model = ByteModel()
    for step in ops:
        if step[0] == "record":
            _, alloc, s, e, writes, u = step
            assert isinstance(s, int) and isinstance(e, int) and isinstance(u, int)
            assert isinstance(writes, bool) and isinstance(alloc, Hashable)
            before = snapshot(tracker, ALLOCS)
            asked = tracker.dependencies(alloc, s, e, writes)
            assert tracker.writers(alloc, s, e) == model.writers(alloc, s, e)
            assert snapshot(tracker, ALLOCS) == before, "dependencies() or writers() changed state"
            assert asked == model.dependencies(alloc, s, e, writes)
            got = tracker.record(alloc, s, e, writes, u)
            assert got == model.record(alloc, s, e, writes, u)
            assert got == asked - {u}
        elif step[0] == "forget":
            assert isinstance(step[1], int)
            tracker.forget(step[1])
            model.forget(step[1])
        else:
            assert isinstance(step[1], Hashable)
            tracker.drop_allocation(step[1])
            model.drop(step[1])
        matches_model(tracker, model)
        assert len(tracker) == model.live_allocations()


@st.composite
def region_op(draw: st.DrawFn) -> tuple[object, ...]:
    """One user's accesses in order, as a region registers them at submit."""
    accesses = []
    for _ in range(draw(st.integers(0, 4))):
        _, alloc, s, e, writes, _ = draw(record_op())
        accesses.append((alloc, s, e, writes))
    return ("record_all", tuple(accesses), draw(user))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(region_op(), region_op(), st.tuples(st.just("forget"), user)), max_size=40)
)
def test_record_all_is_records_in_order(ops: list[tuple[object, ...]]) -> None:
    """A user's accesses registered in one call wait for what the same accesses recorded
    one by one would, and leave the same state."""
    tracker: AccessTracker[int] = AccessTracker()
    model = ByteModel()
    for step in ops:
        if step[0] == "record_all":
            _, accesses, u = step
            assert isinstance(accesses, tuple) and isinstance(u, int)
            expected: set[int] = set()
            for alloc, s, e, writes in accesses:
                expected |= model.record(alloc, s, e, writes, u)
            assert tracker.record_all(accesses, u) == expected - {u}
        else:
            assert isinstance(step[1], int)
            tracker.forget(step[1])
            model.forget(step[1])
        matches_model(tracker, model)


def test_record_all_with_a_bad_range_changes_nothing() -> None:
    t: AccessTracker[int] = AccessTracker()
    t.record("a", 0, 16, True, 1)
    before = t.segments("a")
    with pytest.raises(ContractError):
        t.record_all((("a", 0, 8, False), ("b", 0, 8, True), ("a", 8, 8, True)), 2)
    assert t.segments("a") == before
    assert t.segments("b") == []
    assert t.users() == {1}
    t.forget(2)  # 2 must not have been indexed
    assert t.segments("a") == before


# -- replay chains -------------------------------------------------------------------------


@st.composite
def chain_pattern(draw: st.DrawFn) -> tuple[tuple[tuple[Hashable, int, int, bool], ...], ...]:
    regions = []
    for _ in range(draw(st.integers(1, 4))):
        accesses = []
        for _ in range(draw(st.integers(0, 3))):
            _, alloc, s, e, writes, _ = draw(record_op())
            accesses.append((alloc, s, e, writes))
        regions.append(tuple(accesses))
    return tuple(regions)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(chain_pattern(), min_size=1, max_size=2),
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 10**6)), min_size=1, max_size=50),
)
def test_chains_wait_for_what_records_would(
    patterns: list[tuple[tuple[tuple[Hashable, int, int, bool], ...], ...]],
    steps: list[tuple[int, int]],
) -> None:
    """Replays registered through chains wait for exactly what the same replays registered
    region by region would, among themselves and with other users' accesses in between,
    when users are forgotten as the runtime does (only after everything they wait for),
    and the state they leave, once turned into segments, is the same."""
    chained: AccessTracker[int] = AccessTracker()
    plain: AccessTracker[int] = AccessTracker()
    chains = [replay_chain(p, AccessTracker()) for p in patterns]
    waits: dict[int, set[int]] = {}  # every user, and what it waits for
    handles: dict[int, tuple[ChainReplay[int], int]] = {}  # chained users: replay, region
    pending: list[int] = []
    forgotten: set[int] = set()
    for kind, pick in steps:
        if kind <= 2:  # a replay of a pattern
            index = pick % len(patterns)
            pattern = patterns[index]
            users = list(range(len(waits), len(waits) + len(pattern)))
            replay = chained.record_chain(chains[index], users)
            if replay is None:
                got = [tuple(chained.record_all(a, u)) for a, u in zip(pattern, users, strict=True)]
            else:
                got = replay.deps
                handles.update((u, (replay, region)) for region, u in enumerate(users))
            for accesses, u, deps in zip(pattern, users, got, strict=True):
                expected = plain.record_all(accesses, u)
                assert set(deps) == expected
                waits[u] = expected
                pending.append(u)
        elif kind == 3:  # another user's access
            alloc = ALLOCS[pick % len(ALLOCS)]
            s, e, writes = pick % (SIZE - 1), SIZE, pick % 2 == 0
            u = len(waits)
            expected = plain.record(alloc, s, e, writes, u)
            assert chained.record(alloc, s, e, writes, u) == expected
            waits[u] = expected
            pending.append(u)
        else:  # forget a user whose waits are all forgotten
            ready = [u for u in pending if waits[u] <= forgotten]
            if ready:
                u = ready[pick % len(ready)]
                pending.remove(u)
                forgotten.add(u)
                if u in handles:  # forgotten as the runtime forgets a chain's user
                    chained.forget_chained(*handles.pop(u))
                else:
                    chained.forget(u)
                plain.forget(u)
        for a in ALLOCS:
            assert chained.untouched(a) == plain.untouched(a)
        assert len(chained) == len(plain)
    for a in ALLOCS:
        segs = chained.segments(a)
        check_shape(segs)
        assert expand(segs) == expand(plain.segments(a))
    assert chained.users() == plain.users()
    check_groups(chained)


def test_a_chain_replay_waits_for_the_replay_before() -> None:
    t: AccessTracker[str] = AccessTracker()
    chain: ReplayChain[str] = replay_chain(
        ((("in", 0, 8, False), ("mid", 0, 8, True)), (("mid", 0, 8, False), ("out", 0, 8, True))),
        AccessTracker(),
    )

    def replay(users: list[str]) -> ChainReplay[str]:
        found = t.record_chain(chain, users)
        assert found is not None
        assert found.users is users  # kept, not copied
        return found

    a = replay(["a0", "a1"])
    assert a.deps == [(), ("a0",)]
    b = replay(["b0", "b1"])
    assert b.deps == [("a0", "a1"), ("b0", "a1")]
    t.forget_chained(a, 0)
    t.forget_chained(a, 1)
    assert chain.replays == [b]  # a replay whose users are all forgotten leaves the chain
    c = replay(["c0", "c1"])
    assert c.deps == [("b0", "b1"), ("c0", "b1")]
    assert t.record("out", 0, 4, False, "reader") == {"c1"}  # the chain's users in segments
    assert chain.replays == [] and b.pending == 0 and c.pending == 0
    assert t.record_chain(chain, ["d0", "d1"]) is None  # another user is pending on "out"
    assert t.record_all((("in", 0, 8, False), ("mid", 0, 8, True)), "d0") == {"c0", "c1"}
    # The handles of users turned into segments forget them there.
    for handle in (b, c):
        t.forget_chained(handle, 0)
        t.forget_chained(handle, 1)
    assert t.users() == {"reader", "d0"}
    for user in ("reader", "d0"):
        t.forget(user)
    assert len(t) == 0
    assert replay(["e0", "e1"]).deps == [(), ("e0",)]


# One allocation, few users, long runs, ranges on a coarse grid so that they overlap and
# touch often: reader groups are split, shared between pieces, emptied by `forget` through
# one segment while other segments still refer to them, and merged back.
few_users = st.integers(0, 3)
grid_bound = st.sampled_from(range(0, SIZE, 8))
grid_length = st.sampled_from([8, 16, 24, 32, 40])


@st.composite
def shared_op(draw: st.DrawFn) -> tuple[object, ...]:
    if draw(st.integers(0, 3)) == 0:
        return ("forget", draw(few_users))
    s = draw(grid_bound)
    e = min(SIZE, s + draw(grid_length))
    return ("record", "x", s, e, draw(st.integers(0, 4)) == 0, draw(few_users))


@settings(max_examples=200, deadline=None)
@given(st.lists(shared_op(), min_size=30, max_size=150))
def test_shared_reader_groups_match_byte_model(ops: list[tuple[object, ...]]) -> None:
    tracker: AccessTracker[int] = AccessTracker()
    model = ByteModel()
    for step in ops:
        if step[0] == "record":
            _, alloc, s, e, writes, u = step
            assert isinstance(s, int) and isinstance(e, int) and isinstance(u, int)
            assert isinstance(writes, bool) and isinstance(alloc, Hashable)
            assert tracker.record(alloc, s, e, writes, u) == model.record(alloc, s, e, writes, u)
        else:
            assert isinstance(step[1], int)
            tracker.forget(step[1])
            model.forget(step[1])
        segs = tracker.segments("x")
        check_shape(segs)
        assert expand(segs) == model.bytes["x"]
        assert tracker.users() == model.users()
        check_groups(tracker)


def test_dependencies_is_record_without_registering() -> None:
    t: AccessTracker[int] = AccessTracker()
    t.record("a", 0, 32, True, 1)
    t.record("a", 8, 16, False, 2)
    t.record("a", 40, 48, False, 3)
    before = t.segments("a")
    assert t.dependencies("a", 0, 64, True) == {1, 2, 3}
    assert t.dependencies("a", 0, 64, False) == {1}
    assert t.dependencies("a", 40, 48, True) == {3}
    assert t.dependencies("nowhere", 0, 8, True) == set()
    assert t.segments("a") == before
    assert len(t) == 1
    assert t.record("a", 0, 64, True, 4) == {1, 2, 3}


def test_writers_names_the_last_writer_of_every_byte() -> None:
    t: AccessTracker[int] = AccessTracker()
    t.record("a", 8, 16, True, 1)
    t.record("a", 16, 24, True, 2)
    t.record("a", 24, 32, False, 3)  # read only: no writer
    assert t.writers("a", 8, 24) == {1, 2}
    assert t.writers("a", 10, 12) == {1}
    assert t.writers("a", 0, 16) == {None, 1}  # [0, 8) was never written
    assert t.writers("a", 16, 40) == {2, None}
    assert t.writers("a", 40, 48) == {None}
    assert t.writers("nowhere", 0, 8) == {None}
    t.forget(1)
    assert t.writers("a", 8, 24) == {None, 2}
    with pytest.raises(ContractError):
        t.writers("a", 8, 8)


# -- replay stays small ------------------------------------------------------------------


def test_replay_keeps_structure_small() -> None:
    # Each iteration: a producer writes `inp`, a kernel reads `inp` and writes `out` in two
    # halves, a consumer reads all of `out`. Completed users are forgotten one iteration late,
    # as a runtime would after their completions are observed.
    t: AccessTracker[int] = AccessTracker()
    previous: list[int] = []
    for it in range(10_000):
        base = 4 * it
        prod, kern_lo, kern_hi, cons = base, base + 1, base + 2, base + 3
        deps = t.record("inp", 0, 64, True, prod)
        # The previous iteration's users are not forgotten yet: its producer (last writer)
        # and both kernel halves (readers) must finish first.
        assert deps == set(previous[:3])
        assert t.record("inp", 0, 64, False, kern_lo) == {prod}
        assert t.record("inp", 0, 64, False, kern_hi) == {prod}
        deps = t.record("out", 0, 32, True, kern_lo)
        assert deps == ({previous[1], previous[3]} if it else set())
        t.record("out", 32, 64, True, kern_hi)
        assert t.record("out", 0, 64, False, cons) == {kern_lo, kern_hi}
        for u in previous:
            t.forget(u)
        previous = [prod, kern_lo, kern_hi, cons]
        assert len(t.segments("inp")) <= 3
        assert len(t.segments("out")) <= 3
        assert len(t.users()) <= 8
    for u in previous:
        t.forget(u)
    assert len(t) == 0
    assert t.users() == set()


def test_replay_same_write_keeps_one_segment() -> None:
    t: AccessTracker[int] = AccessTracker()
    for u in range(10_000):
        t.record("a", 0, 64, True, u)
        assert len(t.segments("a")) == 1
    assert t.segments("a") == [(0, 64, 9_999, frozenset())]


def test_adjacent_equal_state_merges() -> None:
    t: AccessTracker[int] = AccessTracker()
    t.record("a", 0, 16, True, 1)
    t.record("a", 32, 48, True, 1)
    t.record("a", 16, 32, True, 1)
    assert t.segments("a") == [(0, 48, 1, frozenset())]
    t.record("a", 0, 16, False, 2)
    t.record("a", 16, 48, False, 2)
    assert t.segments("a") == [(0, 48, 1, frozenset({2}))]
    t.forget(1)
    assert t.segments("a") == [(0, 48, None, frozenset({2}))]


def test_forget_merges_neighbours_that_become_equal() -> None:
    t: AccessTracker[int] = AccessTracker()
    t.record("a", 0, 16, False, 3)
    t.record("a", 16, 32, True, 2)
    t.record("a", 16, 32, False, 3)
    t.record("a", 32, 48, True, 4)
    t.record("a", 32, 48, False, 3)
    assert len(t.segments("a")) == 3
    t.forget(2)  # the middle segment becomes equal to its left neighbour
    assert t.segments("a") == [(0, 32, None, frozenset({3})), (32, 48, 4, frozenset({3}))]
    t.forget(4)
    assert t.segments("a") == [(0, 48, None, frozenset({3}))]
    t.forget(3)
    assert t.segments("a") == []
    assert len(t) == 0


# -- many pending readers ----------------------------------------------------------------

Access = tuple[int, int, bool]

# What pending user k accesses on allocation "buf".
PATTERNS: dict[str, Callable[[int], Access]] = {
    "same bytes": lambda k: (0, 16, False),
    # The reader state splits in two segments whose reader sets overlap.
    "full and half": lambda k: (0, 64 >> (k & 1), False),
    "reads and writes": lambda k: (0, 16, k % 8 == 7),
    # Every pending user reads bytes of its own: one segment each.
    "own slice": lambda k: (16 * k, 16 * k + 16, False),
}


def steady_allocations(pending: int, pattern: Callable[[int], Access]) -> tuple[int, int]:
    """Median bytes allocated at once by a `record`, and by a `forget`, with `pending` users.

    With `pending` users pending, each step records a new user and forgets the oldest one.
    Copying the pending readers (or their segments) would allocate a table of at least a
    pointer each; the median leaves out the steps where a hash table or list happens to
    grow.
    """
    t: AccessTracker[object] = AccessTracker()
    users = [object() for _ in range(pending + 64)]
    for k in range(pending):
        t.record("buf", *pattern(k), users[k])
    recorded: list[int] = []
    forgotten: list[int] = []
    tracing = tracemalloc.is_tracing()
    tracemalloc.start()
    try:
        for k in range(pending, pending + 64):
            s, e, w = pattern(k)
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            t.record("buf", s, e, w, users[k])
            recorded.append(tracemalloc.get_traced_memory()[1] - before)
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            t.forget(users[k - pending])
            forgotten.append(tracemalloc.get_traced_memory()[1] - before)
    finally:
        if not tracing:
            tracemalloc.stop()
    return int(statistics.median(recorded)), int(statistics.median(forgotten))


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_pending_readers_are_not_copied(pattern: str) -> None:
    small = steady_allocations(512, PATTERNS[pattern])
    large = steady_allocations(8192, PATTERNS[pattern])
    # 8192 pointers are 64 KiB: a step that copies the readers allocates more than that.
    assert large[0] < 4096, f"record allocates {large[0]} bytes with 8192 pending readers"
    assert large[1] < 4096, f"forget allocates {large[1]} bytes with 8192 pending readers"
    # ... and the work per step does not grow with the number of pending users.
    assert large[0] <= small[0] + 256 and large[1] <= small[1] + 256, (small, large)


def test_readers_join_one_group_in_place() -> None:
    t: AccessTracker[int] = AccessTracker()
    for u in range(1000):
        assert t.record("a", 0, 16, False, u) == set()
    ((_, _, readers),) = t.allocations["a"].rest
    assert len(readers) == 1 and len(readers[0].members) == 1000
    group = readers[0]
    t.record("a", 0, 16, False, 1000)
    t.forget(3)
    ((_, _, readers),) = t.allocations["a"].rest
    assert readers[0] is group  # the same group, changed in place
    assert 1000 in group.members and 3 not in group.members
    # A write ends the readers: it waits for all of them, once.
    assert t.record("a", 0, 16, True, 2000) == set(range(1001)) - {3}
    assert t.segments("a") == [(0, 16, 2000, frozenset())]


def test_split_shares_readers_and_merges_back() -> None:
    t: AccessTracker[int] = AccessTracker()
    for u in range(100):
        t.record("a", 0, 64, False, u)
    t.record("a", 0, 32, False, 100)  # splits the segment: the halves share the 100 readers
    (_, _, left), (_, _, right) = t.allocations["a"].rest
    assert left[0] is right[0] and len(left[0].members) == 100
    assert t.segments("a") == [
        (0, 32, None, frozenset(range(101))),
        (32, 64, None, frozenset(range(100))),
    ]
    t.record("a", 0, 64, False, 101)  # each half gets it once
    t.forget(5)  # leaves the shared group: both halves lose it
    assert t.segments("a") == [
        (0, 32, None, frozenset(range(102)) - {5}),
        (32, 64, None, frozenset(range(102)) - {5, 100}),
    ]
    t.forget(100)  # the halves are equal again: one segment
    assert t.segments("a") == [(0, 64, None, frozenset(range(102)) - {5, 100})]
    t.record("a", 32, 64, False, 102)
    t.record("a", 0, 32, False, 102)  # equal by content although built from other groups
    assert t.segments("a") == [(0, 64, None, frozenset(range(103)) - {5, 100})]
    check_groups(t)


# -- forget, drop, errors ----------------------------------------------------------------


def test_forget_removes_user_and_empty_allocations() -> None:
    t: AccessTracker[int] = AccessTracker()
    t.record("a", 0, 16, True, 1)
    t.record("a", 0, 16, False, 2)
    t.record("b", 0, 16, False, 2)
    t.forget(2)
    assert t.segments("a") == [(0, 16, 1, frozenset())]
    assert t.segments("b") == []
    assert len(t) == 1
    assert t.record("a", 0, 8, True, 3) == {1}
    t.forget(1)
    t.forget(3)
    assert len(t) == 0
    assert t.users() == set()
    assert t._index == {}  # no leak through the user -> allocations index


def test_forget_overwritten_user_is_harmless() -> None:
    t: AccessTracker[int] = AccessTracker()
    t.record("a", 0, 16, True, 1)
    t.record("a", 0, 16, True, 2)  # 1 is gone from the segments, still in the index
    assert t.users() == {2}
    t.forget(1)
    assert t.segments("a") == [(0, 16, 2, frozenset())]
    t.forget(2)
    assert len(t) == 0
    assert t._index == {}


def test_forget_unknown_user_is_noop() -> None:
    t: AccessTracker[int] = AccessTracker()
    t.forget(42)
    assert len(t) == 0
    t.record("a", 0, 16, True, 1)
    t.record("a", 4, 8, False, 2)
    before = t.segments("a")
    t.forget(42)
    assert t.segments("a") == before
    assert t.users() == {1, 2}


def test_drop_allocation() -> None:
    t: AccessTracker[int] = AccessTracker()
    t.record("a", 0, 16, True, 1)
    t.record("b", 0, 16, True, 1)
    t.drop_allocation("a")
    t.drop_allocation("never-seen")
    assert len(t) == 1
    assert t.segments("a") == []
    assert t.record("a", 0, 16, False, 2) == set()
    t.forget(1)
    t.forget(2)
    assert len(t) == 0
    assert t._index == {}


@pytest.mark.parametrize(("start", "end"), [(-1, 8), (8, 8), (8, 4), (-8, -4)])
@pytest.mark.parametrize("writes", [True, False])
def test_bad_range_raises_and_changes_nothing(start: int, end: int, writes: bool) -> None:
    t: AccessTracker[int] = AccessTracker()
    t.record("a", 0, 16, True, 1)
    before = t.segments("a")
    with pytest.raises(ContractError):
        t.record("a", start, end, writes, 2)
    with pytest.raises(ContractError):
        t.record("new", start, end, writes, 2)
    with pytest.raises(ValueError):  # ContractError is also a ValueError
        t.dependencies("a", start, end, writes)
    assert t.segments("a") == before
    assert len(t) == 1
    assert t.users() == {1}
    t.forget(2)  # 2 must not have been indexed
    assert t.segments("a") == before


# -- merge_intervals ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ([], []),
        ([(0, 4)], [(0, 4)]),
        ([(0, 4), (4, 8)], [(0, 8)]),
        ([(4, 8), (0, 4)], [(0, 8)]),
        ([(0, 4), (5, 8)], [(0, 4), (5, 8)]),
        ([(0, 10), (2, 3)], [(0, 10)]),
        ([(2, 3), (0, 10)], [(0, 10)]),
        ([(0, 4), (2, 6), (6, 7), (9, 12), (10, 11)], [(0, 7), (9, 12)]),
        ([(3, 3)], []),
        ([(0, 4), (4, 4), (4, 8)], [(0, 8)]),
        ([(0, 4), (0, 4)], [(0, 4)]),
        ([(-4, 0), (0, 2)], [(-4, 2)]),
    ],
)
def test_merge_intervals(given: list[tuple[int, int]], expected: list[tuple[int, int]]) -> None:
    assert merge_intervals(given) == expected
    assert merge_intervals(iter(given)) == expected  # any iterable, consumed once


def test_merge_intervals_rejects_inverted() -> None:
    with pytest.raises(ContractError):
        merge_intervals([(0, 4), (8, 2)])


@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 10)), max_size=20))
def test_merge_intervals_covers_same_bytes(raw: list[tuple[int, int]]) -> None:
    intervals = [(s, s + n) for s, n in raw]
    merged = merge_intervals(intervals)
    covered = {b for s, e in intervals for b in range(s, e)}
    assert {b for s, e in merged for b in range(s, e)} == covered
    for (_, e0), (s1, _) in pairwise(merged):
        assert e0 < s1  # sorted, disjoint and not touching
    assert all(s < e for s, e in merged)
