"""Random programs for the stateful scheduler test, and the sequential model they are checked
against.

A *program* is a few buffers, a few graphs (fills, copies, GPU kernels, NPU kernels and host
functions over small, often overlapping views) and a list of steps: submit a graph (reusing
its prepared form or preparing it afresh, maybe `after=` earlier submissions), cancel a
submission now or from a background task a little later, let the loop run (checkpoints,
short sleeps), await a submission. `tests/runtime/test_stateful.py` runs a program on a runtime and
records what it can observe; `check` below replays the admitted submissions one by one in
admission order and says whether the observations are a legal outcome.

The replay is nondeterministic where the runtime legitimately is: whether a region of a
cancelled submission had started before `cancel()`, and whether a region of a submission
that failed elsewhere had started before the failure. Host functions and kernels log their
start and end (a global sequence number under a lock, so the log is totally ordered across
threads) with the bytes they read; fills and copies cannot log, so the model searches over
the outcomes it cannot see and accepts the run when at least one assignment explains every
observation: the log (what ran, what it read, and in which order), each completion's outcome,
each buffer's final bytes and poison flag.

The rules checked (the README's rules table, with byte-range poison):

* Conflicting operations (overlapping bytes, at least one write) never overlap in time and
  run in admission order; what every logged operation read equals the model's bytes there.
* A region fails when one of its operations raises, and then poisons every byte range the
  region writes; regions of the same submission that had not started are skipped, and those
  ordered after the failed one (by a conflict inside the graph) are always skipped.
* A region is refused (`PoisonedError`) iff the bytes it reads overlap poisoned bytes at its
  point in admission order; a refused region poisons what it writes. "The bytes it reads" are
  those of all its operations, checked as the region starts, so a region that overwrites a
  poisoned buffer whole and then reads it is refused too. A skipped region
  (cancelled, behind a failure of its own submission, or behind a failed/cancelled `after=`
  dependency) neither writes nor poisons.
* Poison is cleared only by a fill or copy whose destination is a whole allocation and that
  actually ran (kernels and host functions in these programs never purely write a whole
  allocation, so they are never candidates).
* `submit()` may raise `PoisonedError` only when the graph's inputs (bytes it reads before it
  writes them itself) are poisoned at that point in admission order; it then admits nothing.
* Completion: success iff every region ran and none failed; `ExecutionError` naming a failed
  region (cause chained) or `PoisonedError` for a refused one; `Cancelled` when regions were
  skipped by `cancel()` only; `DependencyFailed`/`Cancelled` behind a failed/cancelled
  `after=` dependency.
* Final bytes equal the model's everywhere except poisoned bytes (undefined); a buffer's
  `poison` is set iff the model has poisoned bytes in it.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import strategies as st

import hrx_async as hrx
from hrx_async.errors import Cancelled, DependencyFailed, ExecutionError, PoisonedError

U8 = np.ndarray[Any, np.dtype[np.uint8]]

# -- buffers ---------------------------------------------------------------------------------

PLACEMENTS: dict[str, hrx.Placement] = {
    "h0": hrx.HOST_VISIBLE,
    "h1": hrx.HOST_VISIBLE,
    "g0": hrx.GPU_LOCAL,
    "g1": hrx.GPU_LOCAL,
    "n0": hrx.npu_local(0),
    "s0": hrx.shared(0),
}
BUFFER_NAMES = tuple(PLACEMENTS)
GPU_BUFFERS = ("g0", "g1")


def placement(name: str, gpus: int) -> hrx.Placement:
    """With two GPUs, g1 is the second GPU's memory; with one, both live on the first."""
    return hrx.gpu_local(1) if name == "g1" and gpus == 2 else PLACEMENTS[name]


def gpu_of(buf: str, gpus: int) -> int | None:
    """The GPU whose memory `buf` is (None for host-mapped memory)."""
    if buf not in GPU_BUFFERS:
        return None
    return 1 if buf == "g1" and gpus == 2 else 0


SHARED_SIZE = 16
"""Shared memory is ordered as a whole allocation; every view of s0 is the whole buffer, so
byte-range and whole-allocation readings of the poison rules agree on it."""
GPU_BINDABLE = ("h0", "h1", "g0", "g1", "s0")
NPU_BINDABLE = ("n0", "s0")
HOST_MAPPABLE = ("h0", "h1", "n0", "s0")
SIZES = (16, 24, 32, 48, 64)


class InjectedFailure(RuntimeError):
    """Raised on purpose by a host function or kernel of a program."""

    def __init__(self, opid: int) -> None:
        super().__init__(f"injected failure of op {opid}")
        self.opid = opid


# -- programs --------------------------------------------------------------------------------


@dataclass(frozen=True)
class V:
    """The bytes [offset, offset + nbytes) of buffer `buf`."""

    buf: str
    offset: int
    nbytes: int

    @property
    def end(self) -> int:
        return self.offset + self.nbytes

    def overlaps(self, other: V) -> bool:
        return self.buf == other.buf and self.offset < other.end and other.offset < self.end

    def __repr__(self) -> str:
        return f"{self.buf}[{self.offset}:{self.end}]"


@dataclass(frozen=True)
class Node:
    """One operation. `fill`: dst; `copy`: dst <- src; `gpu`/`npu`: kernel src -> dst
    (dst read too when `rw`); `host`: reads `reads`, writes `writes` ((view, rw) pairs)."""

    kind: str
    dst: V | None = None
    src: V | None = None
    rw: bool = False
    reads: tuple[V, ...] = ()
    writes: tuple[tuple[V, bool], ...] = ()
    fail: bool = False
    slow: bool = False
    is_async: bool = False

    def accesses(self) -> list[tuple[V, bool, bool]]:
        """(view, reads, writes) of every access."""
        if self.kind == "fill":
            assert self.dst is not None
            return [(self.dst, False, True)]
        if self.kind in ("copy", "gpu", "npu"):
            assert self.dst is not None and self.src is not None
            return [(self.src, True, False), (self.dst, self.rw, True)]
        return [(v, True, False) for v in self.reads] + [(v, rw, True) for v, rw in self.writes]

    def read_views(self) -> list[V]:
        """What the operation reads, in the order a logged operation reports it."""
        return [v for v, reads, _ in self.accesses() if reads]

    @property
    def logs(self) -> bool:
        return self.kind in ("gpu", "npu", "host")

    def __repr__(self) -> str:
        flags = "".join(f" {name}" for name in ("fail", "slow", "is_async") if getattr(self, name))
        if self.kind == "fill":
            return f"fill({self.dst}){flags}"
        if self.kind == "copy":
            return f"copy({self.dst} <- {self.src})"
        if self.kind in ("gpu", "npu"):
            return f"{self.kind}({self.src} -> {self.dst}{' rw' if self.rw else ''}){flags}"
        writes = ", ".join(f"{v}{' rw' if rw else ''}" for v, rw in self.writes)
        return f"host(reads=[{', '.join(map(repr, self.reads))}], writes=[{writes}]){flags}"


@dataclass(frozen=True)
class Submit:
    graph: int
    after: tuple[int, ...] = ()
    """Earlier admitted submissions, counted back from the latest (0 = the latest)."""
    fresh: bool = False
    """Prepare the graph again for this submission instead of replaying its prepared form."""


@dataclass(frozen=True)
class Cancel:
    target: int
    """Counted back from the latest admitted submission."""


@dataclass(frozen=True)
class CancelLater:
    target: int
    delay_ms: int
    """0: after one checkpoint."""


@dataclass(frozen=True)
class Checkpoint:
    count: int


@dataclass(frozen=True)
class Sleep:
    ms: int


@dataclass(frozen=True)
class Await:
    target: int


Step = Submit | Cancel | CancelLater | Checkpoint | Sleep | Await


@dataclass(frozen=True)
class Program:
    sizes: tuple[tuple[str, int], ...]
    seed: int
    max_submissions: int
    graphs: tuple[tuple[Node, ...], ...]
    steps: tuple[Step, ...]
    gpus: int = 1
    """GPUs of the runtime; with two, g1 is on the second and copies cross between them."""

    @property
    def size(self) -> dict[str, int]:
        return dict(self.sizes)

    def for_backend(self, backend: str) -> Program:
        """On a real GPU a failing kernel loses the device: failures go through host functions
        and NPU kernels (the sim NPU) only. Real GPUs: two only where HRX_STATEFUL_GPUS=2
        says the machine has them."""
        if backend == "sim":
            return self
        gpus = min(self.gpus, int(os.environ.get("HRX_STATEFUL_GPUS", "1")))
        graphs = tuple(
            tuple(
                dataclasses.replace(n, fail=False, slow=False) if n.kind == "gpu" else n
                for n in nodes
            )
            for nodes in self.graphs
        )
        return dataclasses.replace(self, graphs=graphs, gpus=gpus)

    def describe(self) -> str:
        lines = [
            f"buffers: {', '.join(f'{n}={placement(n, self.gpus)}:{s}B' for n, s in self.sizes)}"
            f"; gpus={self.gpus}; max_submissions={self.max_submissions}; seed={self.seed}"
        ]
        for index, nodes in enumerate(self.graphs):
            lines.append(f"graph {index}:")
            for ni, node in enumerate(nodes):
                lines.append(f"  op {opid_of(index, ni)}: {node!r}")
        lines.append("steps:")
        lines.extend(f"  {step}" for step in self.steps)
        return "\n".join(lines)


def opid_of(graph: int, node: int) -> int:
    """A small id, unique per node of a program (fill values come from it)."""
    return 1 + graph * 8 + node


def fill_value(opid: int) -> int:
    return (opid * 73 + 5) & 0xFF  # a bijection of the bytes: distinct ops, distinct values


# -- what operations compute (the runtime's kernels/functions and the model share these) ----


def kernel_apply(opid: int, rw: bool, src: U8, dst: U8) -> None:
    i = np.arange(dst.size, dtype=np.uint32)
    s = src.astype(np.uint32)
    if rw:
        dst[:] = ((dst.astype(np.uint32) * 5 + s * 3 + opid + i) & 0xFF).astype(np.uint8)
    else:
        dst[:] = ((s * 3 + opid * 5 + i) & 0xFF).astype(np.uint8)


KERNEL_CXX = r"""
extern "C" __global__ void stateful_mix(const unsigned char* src, unsigned char* dst,
                                        unsigned int n, unsigned int k, unsigned int mode) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        unsigned int s = src[i];
        dst[i] = (unsigned char)(mode ? dst[i] * 5u + s * 3u + k + i : s * 3u + k * 5u + i);
    }
}
"""


def host_apply(opid: int, reads: Sequence[bytes], writes: Sequence[tuple[U8, bool]]) -> None:
    """A host function's effect: every write depends on the op and on everything it read."""
    digest = 0
    for position, data in enumerate(reads):
        values = np.frombuffer(data, np.uint8).astype(np.uint32)
        digest += int(
            ((values + 1) * (np.arange(values.size, dtype=np.uint32) + position + 1)).sum()
        )
    digest &= 0xFF
    for m, (array, rw) in enumerate(writes):
        i = np.arange(array.size, dtype=np.uint32)
        if rw:
            value = array.astype(np.uint32) * 3 + opid + digest + i
        else:
            value = opid * 7 + digest + m * 13 + i * 3
        array[:] = (value & 0xFF).astype(np.uint8)


class RunLog:
    """Start and end of every host function and kernel, totally ordered across threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 0
        self.entries: list[tuple[int, str, int, Any]] = []

    def record(self, event: str, opid: int, payload: Any = None) -> None:
        with self._lock:
            self.entries.append((self._next, event, opid, payload))
            self._next += 1


# -- strategies ------------------------------------------------------------------------------


def _chance(one_in: int) -> st.SearchStrategy[bool]:
    """True about once in `one_in` draws; shrinks to False."""
    return st.sampled_from([False] * (one_in - 1) + [True])


@dataclass(frozen=True)
class _Shape:
    """What every operation of one program draws from: the sizes, and a few *hot* buffers
    most accesses go to, so that operations meet on the same bytes often."""

    size: dict[str, int]
    hot: tuple[str, ...]
    gpus: int = 1


@st.composite
def _buffer(draw: st.DrawFn, names: Sequence[str], shape: _Shape) -> str:
    hot = [name for name in names if name in shape.hot]
    if hot and not draw(_chance(4)):
        return draw(st.sampled_from(hot))
    return draw(st.sampled_from(names))


@st.composite
def _view(draw: st.DrawFn, buf: str, shape: _Shape) -> V:
    n = shape.size[buf]
    if buf == "s0" or draw(_chance(3)):
        return V(buf, 0, n)
    offset = draw(st.integers(0, n - 1))
    return V(buf, offset, draw(st.integers(1, n - offset)))


@st.composite
def _pair(draw: st.DrawFn, names: Sequence[str], shape: _Shape) -> tuple[V, V] | None:
    """Two disjoint views of equal length on `names`: (dst, src)."""
    size = shape.size
    dst, src = draw(_buffer(names, shape)), draw(_buffer(names, shape))
    if "s0" in (dst, src):
        n = SHARED_SIZE
    elif draw(_chance(3)):
        n = min(size[dst], size[src])
    else:
        n = draw(st.integers(1, min(size[dst], size[src])))
    doff = 0 if dst == "s0" else draw(st.integers(0, size[dst] - n))
    soff = 0 if src == "s0" else draw(st.integers(0, size[src] - n))
    d, s = V(dst, doff, n), V(src, soff, n)
    if d.overlaps(s):
        if doff + 2 * n <= size[src]:
            s = V(src, doff + n, n)
        elif doff - n >= 0:
            s = V(src, doff - n, n)
        else:
            return None
    return d, s


def _whole(view: V, size: dict[str, int]) -> bool:
    return view.offset == 0 and view.nbytes == size[view.buf]


@st.composite
def _node(draw: st.DrawFn, shape: _Shape) -> Node:
    size = shape.size
    kind = draw(st.sampled_from(["fill", "copy", "gpu", "host", "npu"]))
    fail, slow = draw(_chance(5)), draw(_chance(4))
    if kind in ("copy", "gpu", "npu"):
        names = {"copy": BUFFER_NAMES, "gpu": GPU_BINDABLE, "npu": NPU_BINDABLE}[kind]
        pair = draw(_pair(names, shape))
        if pair is not None:
            dst, src = pair
            if kind == "copy":
                return Node("copy", dst=dst, src=src)
            if shape.gpus == 2 and {dst.buf, src.buf} == set(GPU_BUFFERS):
                return Node("fill", dst=dst)  # a kernel runs on one GPU's memory
            # A kernel never purely writes a whole allocation: whether that clears poison
            # is not a rule these programs test.
            rw = draw(st.booleans()) or _whole(dst, size)
            return Node(kind, dst=dst, src=src, rw=rw, fail=fail, slow=slow)
        kind = "fill"
    if kind == "fill":
        return Node("fill", dst=draw(_view(draw(_buffer(BUFFER_NAMES, shape)), shape)))
    buffers = _buffer(HOST_MAPPABLE, shape)
    reads = [draw(_view(b, shape)) for b in draw(st.lists(buffers, max_size=2))]
    wanted = [
        (draw(_view(b, shape)), draw(st.booleans()))
        for b in draw(st.lists(buffers, min_size=1, max_size=2))
    ]
    writes: list[tuple[V, bool]] = []
    for view, rw in wanted:
        if not any(view.overlaps(w) for w, _ in writes):
            writes.append((view, rw or _whole(view, size)))
    reads = [r for r in reads if not any(r.overlaps(w) for w, _ in writes)]
    return Node(
        "host",
        reads=tuple(reads),
        writes=tuple(writes),
        fail=fail,
        slow=slow,
        is_async=draw(_chance(3)),
    )


_STEP_KINDS = ["submit"] * 5 + ["cancel", "cancel_later", "checkpoint", "sleep", "await"]


@st.composite
def _step(draw: st.DrawFn) -> Step:
    kind = draw(st.sampled_from(_STEP_KINDS))  # half the steps submit
    target = st.integers(0, 6)
    if kind == "submit":
        after = draw(st.one_of(st.just(()), st.lists(target, max_size=2).map(tuple)))
        return Submit(draw(st.integers(0, 7)), after, draw(_chance(4)))
    if kind == "cancel":
        return Cancel(draw(target))
    if kind == "cancel_later":
        return CancelLater(draw(target), draw(st.integers(0, 3)))
    if kind == "checkpoint":
        return Checkpoint(draw(st.integers(1, 4)))
    if kind == "sleep":
        return Sleep(draw(st.integers(1, 4)))
    return Await(draw(target))


@st.composite
def programs(draw: st.DrawFn, max_steps: int = 24) -> Program:
    sizes = tuple(
        (name, SHARED_SIZE if name == "s0" else draw(st.sampled_from(SIZES)))
        for name in BUFFER_NAMES
    )
    hot = draw(st.lists(st.sampled_from(BUFFER_NAMES), min_size=1, max_size=3, unique=True))
    gpus = draw(st.sampled_from([1, 2]))
    shape = _Shape(dict(sizes), tuple(hot), gpus)
    graphs = [
        tuple(draw(st.lists(_node(shape), min_size=n, max_size=n)))
        for n in draw(st.lists(st.integers(1, 4), min_size=1, max_size=5))
    ]
    count = draw(st.integers(1, max_steps))
    steps = draw(st.lists(_step(), min_size=count, max_size=count))
    steps = [
        dataclasses.replace(s, graph=s.graph % len(graphs)) if isinstance(s, Submit) else s
        for s in steps
    ]
    return Program(
        sizes=sizes,
        seed=draw(st.integers(0, 2**32 - 1)),
        max_submissions=draw(st.integers(1, 8)),
        graphs=tuple(graphs),
        steps=tuple(steps),
        gpus=gpus,
    )


# -- regions (the rule of graph.py, restated) ------------------------------------------------


def _lane(node: Node, gpus: int) -> tuple[str, int]:
    """The node's lane and device; a copy between two GPUs is alone, on the destination's
    upload lane."""
    if node.kind in ("npu", "host"):
        return (node.kind, 0)
    assert node.dst is not None
    to = gpu_of(node.dst.buf, gpus)
    if node.kind == "fill":
        return ("compute", to or 0)
    if node.kind == "gpu":
        assert node.src is not None
        of = gpu_of(node.src.buf, gpus)
        return ("compute", to if to is not None else of or 0)
    assert node.src is not None
    of = gpu_of(node.src.buf, gpus)
    if to is not None and of is not None and to != of:
        return ("peer", to)
    device = to if to is not None else of or 0
    host_side = ("h0", "h1", "n0")
    src_host, dst_host = node.src.buf in host_side, node.dst.buf in host_side
    if src_host and not dst_host:
        return ("upload", device)
    if dst_host and not src_host:
        return ("download", device)
    return ("compute", device)


def cut_regions(nodes: Sequence[Node], gpus: int = 1) -> list[tuple[int, ...]]:
    """Maximal runs of consecutive nodes on one lane of one device; NPU nodes, host nodes
    and copies between GPUs alone."""
    groups: list[list[int]] = []
    for index, node in enumerate(nodes):
        lane = _lane(node, gpus)
        alone = lane[0] in ("npu", "host", "peer")
        if groups and not alone and _lane(nodes[groups[-1][0]], gpus) == lane:
            groups[-1].append(index)
        else:
            groups.append([index])
    return [tuple(g) for g in groups]


def _conflict(a: Sequence[tuple[V, bool, bool]], b: Sequence[tuple[V, bool, bool]]) -> bool:
    return any((wa or wb) and va.overlaps(vb) for va, _, wa in a for vb, _, wb in b)


@dataclass
class RegionInfo:
    index: int
    nodes: tuple[int, ...]
    reads: list[V]
    writes: list[V]
    accesses: list[tuple[V, bool, bool]]
    conflicts_before: list[int]
    logged: bool
    """Running it logs (it holds a host function or a kernel that logs)."""


@dataclass
class GraphInfo:
    nodes: tuple[Node, ...]
    regions: list[RegionInfo]
    inputs: list[V]
    """Bytes read before the graph itself writes them (one byte per view, merged loosely)."""


def graph_info(nodes: Sequence[Node], logging_kinds: frozenset[str], gpus: int = 1) -> GraphInfo:
    regions: list[RegionInfo] = []
    for index, group in enumerate(cut_regions(nodes, gpus)):
        accesses = [a for n in group for a in nodes[n].accesses()]
        regions.append(
            RegionInfo(
                index=index,
                nodes=group,
                reads=_read_before_written([nodes[n] for n in group]),
                writes=[v for v, _, w in accesses if w],
                accesses=accesses,
                conflicts_before=[r.index for r in regions if _conflict(r.accesses, accesses)],
                logged=any(nodes[n].kind in logging_kinds for n in group),
            )
        )
    return GraphInfo(tuple(nodes), regions, _read_before_written(nodes))


def _read_before_written(nodes: Sequence[Node]) -> list[V]:
    """The bytes `nodes` read (in order) before one of them wrote them (one byte per view)."""
    written: dict[str, set[int]] = {}
    inputs: list[V] = []
    for node in nodes:
        for view in node.read_views():
            seen = written.get(view.buf, set())
            inputs.extend(V(view.buf, b, 1) for b in range(view.offset, view.end) if b not in seen)
        for view, _, writes in node.accesses():
            if writes:
                written.setdefault(view.buf, set()).update(range(view.offset, view.end))
    return inputs


# -- observations ----------------------------------------------------------------------------


@dataclass
class SubmissionRecord:
    """One submit() call, in call order."""

    graph: int
    after: tuple[int, ...]
    """Calls (indices into `Observation.records`) of its `after=` completions."""
    raised: BaseException | None = None
    error: BaseException | None = None
    settled: bool = False
    cancel_called: bool = False


@dataclass
class Observation:
    log: RunLog = field(default_factory=RunLog)
    initial: dict[str, bytes] = field(default_factory=dict)
    final: dict[str, bytes] = field(default_factory=dict)
    poison: dict[str, BaseException | None] = field(default_factory=dict)
    records: list[SubmissionRecord] = field(default_factory=list)
    admitted: list[int] = field(default_factory=list)
    """Indices into `records` of the submissions admitted, in admission order."""
    stage: str = "start"
    problems: list[str] = field(default_factory=list)
    """Harness-level findings (hangs, unexpected exceptions, region shapes)."""
    closed: bool = False


# -- the model -------------------------------------------------------------------------------

RAN, FAILED, REFUSED, SKIPPED = "ran", "failed", "refused", "skipped"


@dataclass(frozen=True)
class Occurrence:
    opid: int
    start: int
    end: int
    reads: tuple[bytes, ...]
    status: str


class ModelFailure(AssertionError):
    pass


def _occurrences(log: RunLog) -> tuple[dict[int, list[Occurrence]], list[str]]:
    """Per op, its runs in log order; and complaints about ops overlapping themselves."""
    problems: list[str] = []
    open_: dict[int, tuple[int, tuple[bytes, ...]]] = {}
    found: dict[int, list[Occurrence]] = {}
    for seq, event, opid, payload in log.entries:
        if event == "start":
            if opid in open_:
                problems.append(f"op {opid} started again (log #{seq}) before its run ended")
            open_[opid] = (seq, payload)
        else:
            started = open_.pop(opid, None)
            if started is None:
                problems.append(f"op {opid} ended (log #{seq}) without a start")
                continue
            found.setdefault(opid, []).append(
                Occurrence(opid, started[0], seq, started[1], payload)
            )
    for opid, (seq, _) in open_.items():
        problems.append(f"op {opid} started (log #{seq}) and never ended")
    return found, problems


class _Budget(Exception):
    pass


@dataclass
class _State:
    data: dict[str, U8]
    poison: dict[str, np.ndarray[Any, np.dtype[np.bool_]]]
    cursors: dict[int, int]
    matched: tuple[tuple[int, Occurrence, tuple[int, int]], ...]
    outcomes: dict[int, list[str]]

    def copy(self) -> _State:
        return _State(
            {k: v.copy() for k, v in self.data.items()},
            {k: v.copy() for k, v in self.poison.items()},
            dict(self.cursors),
            self.matched,
            {k: list(v) for k, v in self.outcomes.items()},
        )

    def poisoned(self, views: Sequence[V]) -> list[V]:
        return [v for v in views if self.poison[v.buf][v.offset : v.end].any()]


def check(program: Program, obs: Observation, backend: str, budget: int = 400_000) -> None:
    """Raise `ModelFailure` (an AssertionError) unless `obs` is a legal run of `program`."""
    program = program.for_backend(backend)
    header = f"program:\n{program.describe()}\n\n{describe_observation(program, obs)}"
    if obs.problems:
        raise ModelFailure("; ".join(obs.problems) + "\n\n" + header)
    kinds = frozenset({"host", "npu", "gpu"} if backend == "sim" else {"host", "npu"})
    infos = [graph_info(nodes, kinds, program.gpus) for nodes in program.graphs]
    occurrences, problems = _occurrences(obs.log)
    accesses_of = {
        opid_of(g, n): node.accesses()
        for g, nodes in enumerate(program.graphs)
        for n, node in enumerate(nodes)
    }
    # 1a. Conflicting operations never overlap in time (whatever their admission order).
    runs = [o for occ in occurrences.values() for o in occ]
    for i, a in enumerate(runs):
        for b in runs[i + 1 :]:
            if (
                a.start < b.end
                and b.start < a.end
                and _conflict(accesses_of[a.opid], accesses_of[b.opid])
            ):
                problems.append(
                    f"conflicting ops {a.opid} (log #{a.start}-#{a.end}) and {b.opid} "
                    f"(log #{b.start}-#{b.end}) overlapped in time"
                )
    if problems:
        raise ModelFailure("; ".join(problems) + "\n\n" + header)

    size = program.size
    state = _State(
        {name: np.frombuffer(obs.initial[name], np.uint8).copy() for name in size},
        {name: np.zeros(size[name], bool) for name in size},
        {},
        (),
        {},
    )
    records = obs.records
    position = {call: pos for pos, call in enumerate(obs.admitted)}

    # The walk: every submit() call in call order; an admitted one region by region, then its
    # completion. Raised ones are checked where they were called.
    items: list[tuple[str, int, int]] = []
    for call, record in enumerate(records):
        if record.raised is not None:
            items.append(("raised", call, -1))
            continue
        for region in infos[record.graph].regions:
            items.append(("region", call, region.index))
        items.append(("end", call, -1))
    remaining_uses: dict[tuple[int, int], int] = {}
    """Per (item position, opid): how many later region items contain that op."""
    later: dict[int, int] = {}
    for pos in range(len(items) - 1, -1, -1):
        kind, call, region_index = items[pos]
        if kind == "region":
            record = records[call]
            for n in infos[record.graph].regions[region_index].nodes:
                opid = opid_of(record.graph, n)
                later[opid] = later.get(opid, 0) + 1
        for opid, count in later.items():
            remaining_uses[(pos, opid)] = count

    # The bytes whose last possible writer is item `pos` are final once it is decided (only
    # writers change or poison bytes), so they are compared there instead of at the end.
    last_writer = {name: np.full(size[name], -1) for name in size}
    for pos, (kind, call, region_index) in enumerate(items):
        if kind == "region":
            for view in infos[records[call].graph].regions[region_index].writes:
                last_writer[view.buf][view.offset : view.end] = pos
    settled_at: dict[int, tuple[tuple[str, ...], tuple[Any, ...]]] = {}
    for pos in {int(p) for array in last_writer.values() for p in np.unique(array)}:
        names = tuple(name for name in size if (last_writer[name] == pos).any())
        settled_at[pos] = (names, tuple(last_writer[name] == pos for name in names))
    settled_at.setdefault(-1, ((), ()))
    dead: set[Any] = set()
    best: list[Any] = [-1, "", ()]
    visits = [0]

    def fail(pos: int, message: str, st_: _State) -> None:
        if pos > best[0]:
            best[0], best[1] = pos, message
            best[2] = tuple((call, tuple(outs)) for call, outs in sorted(st_.outcomes.items()))

    def where(call: int) -> str:
        record = records[call]
        return f"submission #{position.get(call, '?')} (call {call}, graph {record.graph})"

    def walk(pos: int, st_: _State) -> bool:
        # Paths that reach the same state fail alike: what ran is summed up by the bytes,
        # the poison, how many runs of each logged op were used (the order checks depend on
        # nothing else) and the outcomes so far of the submission being walked.
        call = items[pos][1] if pos < len(items) else -1
        key = (
            pos,
            b"".join(st_.data[n].tobytes() + st_.poison[n].tobytes() for n in size),
            tuple(sorted(st_.cursors.items())),
            tuple(st_.outcomes.get(call, ())),
        )
        if key in dead:
            return False
        visits[0] += 1
        if visits[0] > budget:
            raise _Budget
        if walk_on(pos, st_):
            return True
        dead.add(key)
        return False

    def final_bytes(pos: int, st_: _State, names: Sequence[str], masks: Any) -> bool:
        for name, mask in zip(names, masks, strict=True):
            actual = np.frombuffer(obs.final[name], np.uint8)
            wrong = np.flatnonzero(mask & ~st_.poison[name] & (actual != st_.data[name]))
            if wrong.size:
                fail(
                    pos,
                    f"{name} differs from the admission-order replay at bytes "
                    f"{wrong[:12].tolist()}: got {actual[wrong[:12]].tolist()}, model "
                    f"{st_.data[name][wrong[:12]].tolist()} (poisoned in model: "
                    f"{np.flatnonzero(st_.poison[name]).tolist()})",
                    st_,
                )
                return False
        return True

    def walk_on(pos: int, st_: _State) -> bool:
        if pos == 0 and not final_bytes(pos, st_, *settled_at[-1]):
            return False  # bytes nothing writes keep their first value
        if pos == len(items):
            return finish(pos, st_)
        kind, call, region_index = items[pos]
        record = records[call]
        info = infos[record.graph]
        if kind == "raised":
            if not isinstance(record.raised, PoisonedError):
                fail(pos, f"submit() of {where(call)} raised {record.raised!r}", st_)
                return False
            if not st_.poisoned(info.inputs):
                fail(
                    pos,
                    f"submit() of graph {record.graph} (call {call}) raised {record.raised!r}, "
                    "but none of the bytes it reads before writing them is poisoned at that "
                    "point in admission order",
                    st_,
                )
                return False
            return walk(pos + 1, st_)
        if kind == "end":
            if not check_outcome(pos, call, st_):
                return False
            return walk(pos + 1, st_)
        region = info.regions[region_index]
        outs = st_.outcomes.setdefault(call, [])
        deps_failed = [records[d].error for d in record.after if records[d].error is not None]
        options: list[str]
        if deps_failed or any(outs[k] != RAN for k in region.conflicts_before):
            options = [SKIPPED]
        else:
            may_skip = record.cancel_called or len(info.regions) > 1
            options = [REFUSED] if st_.poisoned(region.reads) else [RAN]
            if may_skip:
                options.append(SKIPPED)
        if region.logged:
            first = next(n for n in region.nodes if program.graphs[record.graph][n].logs)
            opid = opid_of(record.graph, first)
            available = len(occurrences.get(opid, ())) - st_.cursors.get(opid, 0)
            later_uses = remaining_uses.get((pos + 1, opid), 0)
            if available > later_uses:
                # Some run of it must be this one.
                options = [o for o in options if o == RAN]
                if not options:
                    fail(
                        pos,
                        f"op {opid} of {where(call)} region {region.index} ran (log), but the "
                        f"model says it must not: "
                        + (
                            f"it reads poisoned bytes {st_.poisoned(region.reads)}"
                            if st_.poisoned(region.reads)
                            else "it is skipped (failed/cancelled dependency or an earlier "
                            "conflicting region of its submission did not run)"
                        ),
                        st_,
                    )
                    return False
            if available == 0:
                if RAN in options and len(options) == 1:
                    fail(
                        pos,
                        f"op {opid} of {where(call)} region {region.index} should have run "
                        "but did not (no log entry left for it)",
                        st_,
                    )
                    return False
                options = [o for o in options if o != RAN]
        for index, option in enumerate(options):
            branch = st_.copy() if index < len(options) - 1 else st_
            branch.outcomes[call].append(option)
            if (
                apply_region(pos, call, region, option, branch)
                and final_bytes(pos, branch, *settled_at.get(pos, ((), ())))
                and walk(pos + 1, branch)
            ):
                return True
        return False

    def apply_region(pos: int, call: int, region: RegionInfo, option: str, st_: _State) -> bool:
        record = records[call]
        nodes = program.graphs[record.graph]
        if option == SKIPPED:
            return True
        if option == REFUSED:
            for view in region.writes:
                st_.poison[view.buf][view.offset : view.end] = True
            return True
        failed = False
        for n in region.nodes:
            node = nodes[n]
            opid = opid_of(record.graph, n)
            if node.kind in kinds:
                cursor = st_.cursors.get(opid, 0)
                runs_of = occurrences.get(opid, [])
                if cursor >= len(runs_of):
                    fail(
                        pos,
                        f"op {opid} (node {n}) of {where(call)} region {region.index} should "
                        "have run (its region started) but has no log entry left",
                        st_,
                    )
                    return False
                occ = runs_of[cursor]
                st_.cursors[opid] = cursor + 1
                expected = tuple(
                    bytes(st_.data[v.buf][v.offset : v.end]) for v in node.read_views()
                )
                if occ.reads != expected:
                    fail(
                        pos,
                        f"op {opid} of {where(call)} read {_hex(occ.reads)} (log #{occ.start}) "
                        f"but in admission order it reads {_hex(expected)}: it ran before or "
                        "after conflicting work it is ordered after or before",
                        st_,
                    )
                    return False
                want = "failed" if node.fail else "ok"
                if occ.status != want:
                    fail(pos, f"op {opid} ended {occ.status!r}, expected {want!r}", st_)
                    return False
                key = (position[call], n)
                for other_opid, other, other_key in st_.matched:
                    if _conflict(accesses_of[other_opid], node.accesses()) and not (
                        other.end < occ.start
                    ):
                        fail(
                            pos,
                            f"op {opid} of {where(call)} (log #{occ.start}) started before "
                            f"conflicting op {other_opid} admitted earlier (submission "
                            f"#{other_key[0]}, ended log #{other.end}) finished",
                            st_,
                        )
                        return False
                st_.matched = (*st_.matched, (opid, occ, key))
            if node.fail:
                failed = True
                break
            run_node(node, opid, st_)
        if failed:
            st_.outcomes[call][-1] = FAILED
            for view in region.writes:
                st_.poison[view.buf][view.offset : view.end] = True
        return True

    def run_node(node: Node, opid: int, st_: _State) -> None:
        data = st_.data

        def arr(view: V) -> U8:
            return data[view.buf][view.offset : view.end]

        if node.kind == "fill":
            assert node.dst is not None
            arr(node.dst)[:] = fill_value(opid)
            if _whole(node.dst, size):
                st_.poison[node.dst.buf][:] = False
        elif node.kind == "copy":
            assert node.dst is not None and node.src is not None
            arr(node.dst)[:] = arr(node.src).copy()
            if _whole(node.dst, size):
                st_.poison[node.dst.buf][:] = False
        elif node.kind in ("gpu", "npu"):
            assert node.dst is not None and node.src is not None
            kernel_apply(opid, node.rw, arr(node.src).copy(), arr(node.dst))
        else:
            reads = [bytes(arr(v)) for v in node.read_views()]
            host_apply(opid, reads, [(arr(v), rw) for v, rw in node.writes])

    def check_outcome(pos: int, call: int, st_: _State) -> bool:
        record = records[call]
        info = infos[record.graph]
        outs = st_.outcomes.get(call, [])
        error = record.error
        deps = [records[d].error for d in record.after if records[d].error is not None]
        failed = [k for k, o in enumerate(outs) if o == FAILED]
        refused = [k for k, o in enumerate(outs) if o == REFUSED]
        skipped = [k for k, o in enumerate(outs) if o == SKIPPED]
        if deps:
            allowed: list[type[BaseException]] = []
            if record.cancel_called or any(isinstance(e, Cancelled) for e in deps):
                allowed.append(Cancelled)
            if any(not isinstance(e, Cancelled) for e in deps):
                allowed.append(DependencyFailed)
            if type(error) in allowed:
                return True
            fail(
                pos,
                f"{where(call)} follows failed/cancelled completions ({deps!r}); expected "
                f"{[a.__name__ for a in allowed]}, got {error!r}",
                st_,
            )
            return False
        if skipped and not (record.cancel_called or failed or refused):
            fail(
                pos,
                f"{where(call)} ended {error!r}, but nothing explains it: no region of it "
                "reads poisoned bytes at its point in admission order or fails, it was not "
                f"cancelled, and regions {skipped} did not run",
                st_,
            )
            return False
        if failed or refused:
            ok = False
            if isinstance(error, ExecutionError) and error.region in failed:
                nodes = program.graphs[record.graph]
                failing = next(n for n in info.regions[error.region].nodes if nodes[n].fail)
                cause = error.__cause__
                ok = isinstance(cause, InjectedFailure) and cause.opid == opid_of(
                    record.graph, failing
                )
            elif isinstance(error, PoisonedError):
                ok = bool(refused)
            if not ok:
                nodes = program.graphs[record.graph]
                notes = [
                    f" (region {k} overwrites {', '.join(sorted(own))} whole before reading "
                    "it; it is still refused, because what a region reads is checked as the "
                    "region starts)"
                    for k in refused
                    if (own := _cleared_then_read([nodes[n] for n in info.regions[k].nodes], size))
                ]
                fail(
                    pos,
                    f"{where(call)}: regions {outs}; expected ExecutionError of region "
                    f"{failed} or PoisonedError (refused {refused}), got {error!r}"
                    + "".join(notes),
                    st_,
                )
            return ok
        if skipped:
            if type(error) is Cancelled:
                return True
            fail(pos, f"{where(call)}: regions {outs}; expected Cancelled, got {error!r}", st_)
            return False
        if error is None:
            return True
        fail(pos, f"{where(call)}: every region ran and succeeded, yet it failed: {error!r}", st_)
        return False

    def finish(pos: int, st_: _State) -> bool:
        for opid, runs_of in occurrences.items():
            if st_.cursors.get(opid, 0) != len(runs_of):
                fail(
                    pos,
                    f"op {opid} ran {len(runs_of)} times but only "
                    f"{st_.cursors.get(opid, 0)} runs are explained by the model",
                    st_,
                )
                return False
        if not final_bytes(pos, st_, list(size), [True] * len(size)):
            return False
        for name in size:
            poisoned = np.flatnonzero(st_.poison[name]).tolist()
            if (obs.poison[name] is not None) != bool(poisoned):
                fail(
                    pos,
                    f"{name}.poison is {obs.poison[name]!r}, but the model has "
                    + (f"poisoned bytes {poisoned}" if poisoned else "no poisoned bytes"),
                    st_,
                )
                return False
        return True

    try:
        ok = walk(0, state)
    except _Budget:
        raise ModelFailure(
            f"model search gave up after {budget} steps (program too ambiguous)\n\n{header}"
        ) from None
    if not ok:
        path = "; ".join(f"call {call}: {list(outs)}" for call, outs in best[2])
        raise ModelFailure(
            f"no legal sequential explanation. Furthest the model got: {best[1]}\n"
            f"(region outcomes on that path: {path})\n\n{header}"
        )


def _cleared_then_read(nodes: Sequence[Node], size: dict[str, int]) -> set[str]:
    """Buffers a fill or copy of `nodes` overwrites whole before a later node reads them."""
    cleared: set[str] = set()
    found: set[str] = set()
    for node in nodes:
        found.update(v.buf for v in node.read_views() if v.buf in cleared)
        if node.kind in ("fill", "copy") and node.dst is not None and _whole(node.dst, size):
            cleared.add(node.dst.buf)
    return found


def _hex(chunks: Sequence[bytes]) -> str:
    return "[" + ", ".join(c.hex() for c in chunks) + "]"


def describe_observation(program: Program, obs: Observation) -> str:
    lines = ["calls (admission order of the admitted ones):"]
    for call, record in enumerate(obs.records):
        if record.raised is not None:
            outcome = f"submit raised {record.raised!r}"
        else:
            outcome = f"-> {record.error!r}" if record.settled else "-> (did not settle)"
        extra = f" after={list(record.after)}" if record.after else ""
        cancel = " cancel()" if record.cancel_called else ""
        lines.append(f"  call {call}: graph {record.graph}{extra}{cancel} {outcome}")
    lines.append(
        "log: "
        + " ".join(
            f"{'S' if e == 'start' else 'E'}{opid}" + ("!" if p == "failed" else "")
            for _, e, opid, p in obs.log.entries
        )
    )
    if obs.final:
        lines.append(
            "poison: "
            + ", ".join(f"{n}={'set' if p is not None else '-'}" for n, p in obs.poison.items())
        )
    return "\n".join(lines)
