"""Recording graphs and preparing them (pure: no I/O, no event loop, no device).

`Graph` records nodes, validating each at once; `plan()` cuts the nodes into
regions, infers the edges between regions with the access tracker and
summarises each region's accesses. The runtime turns a plan into a
`PreparedGraph` by adding the backend's native artifacts.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..errors import ContractError
from . import validate as _validate
from .contract import Access, KernelContract
from .intervals import Interval, merge_intervals, tracked_range
from .kernels import GpuKernel, NpuKernel
from .lane import Lane
from .memory import Buffer, Domain, View, view_of
from .ops import Copy, External, Fill, HostCall, Launch, NpuLaunch, Op
from .tracker import AccessTracker

P = TypeVar("P")
"""What a graph's preparer makes of its plan: the runtime's `PreparedGraph`."""

_COPY_LANES = (Lane.UPLOAD, Lane.COMPUTE, Lane.DOWNLOAD)


@dataclass(frozen=True, slots=True)
class Node:
    """One recorded operation: its lane, what it does and the bytes it touches."""

    index: int
    lane: Lane
    op: Op
    accesses: tuple[tuple[View, Access], ...]
    npu: int | None = None
    gpu: int = 0
    """The runtime GPU whose lanes run a GPU-lane node (see `Graph.copy`)."""

    @property
    def own_region(self) -> bool:
        """NPU, host and external nodes, and copies between two GPUs, are each a region of
        their own (none of them is captured into one GPU's native graph)."""
        return (
            self.lane in (Lane.NPU, Lane.HOST)
            or isinstance(self.op, External)
            or _between_gpus(self.op)
        )

    @property
    def kind(self) -> str:
        return type(self.op).__name__.lower()


@dataclass(frozen=True, slots=True)
class RegionPlan:
    """A maximal run of consecutive nodes on one lane (NPU and host nodes alone)."""

    index: int
    lane: Lane
    nodes: tuple[int, ...]
    ops: tuple[Op, ...]
    reads: tuple[Interval, ...]
    writes: tuple[Interval, ...]
    copy_bytes: int
    npu: int | None = None
    gpu: int = 0
    joined: tuple[RegionPlan, ...] = ()
    """The regions a single-launch region stands for, in order; empty for any other."""
    copies: tuple[tuple[Lane, int], ...] = dataclasses.field(init=False, default=())
    """Bytes copied, per lane they count on (a single-launch region's: its parts'); worked
    out once here, since every replay's statistics read it."""

    def __post_init__(self) -> None:
        parts = self.joined or (self,)
        copies = tuple((p.counted_lane, p.copy_bytes) for p in parts if p.copy_bytes)
        object.__setattr__(self, "copies", copies)

    @property
    def counted_lane(self) -> Lane:
        """The lane its copies count under in statistics: a copy between GPUs runs on an
        upload lane but is a device copy, not an upload from the host."""
        if self.lane is Lane.UPLOAD and _between_gpus(self.ops[0]):
            return Lane.COMPUTE
        return self.lane

    @property
    def queue_key(self) -> tuple[Lane, int]:
        """Lanes are per device: each GPU has its own upload, compute and download lanes,
        each NPU its own NPU lane; the host lane is one."""
        if self.lane is Lane.NPU:
            return (self.lane, self.npu or 0)
        return (self.lane, self.gpu)


@dataclass(frozen=True, slots=True)
class GraphPlan:
    """Everything preparation decides that does not depend on a backend."""

    label: str
    domain: Domain
    nodes: tuple[Node, ...]
    regions: tuple[RegionPlan, ...]
    edges: frozenset[tuple[int, int]]
    reads: tuple[Interval, ...]
    writes: tuple[Interval, ...]
    overwrites: tuple[Buffer, ...]
    """Buffers some node writes completely before any node of the graph reads them."""

    @property
    def buffers(self) -> tuple[Buffer, ...]:
        seen: dict[int, Buffer] = {}
        for interval in self.reads + self.writes:
            seen.setdefault(interval.buffer.ident, interval.buffer)
        return tuple(seen.values())


class Graph(Generic[P]):
    """Records fills, copies, GPU kernels, NPU kernels and host functions over views.

    Every method validates its input at once and returns the new node's index;
    a rejected call raises `ContractError` and leaves the graph unchanged. Views
    must be live, of this graph's runtime and lists of them ordered (lists, tuples,
    iterators; not sets, mappings or strings).
    """

    def __init__(
        self,
        domain: Domain,
        label: str = "graph",
        preparer: Callable[[GraphPlan], P] | None = None,
    ) -> None:
        self.domain = _validate.instance(domain, Domain, "a graph's domain", "Runtime.graph()")
        self.label = _validate.text(label, "a graph label")
        if preparer is not None:
            _validate.function(preparer, "a graph's preparer")
        self._nodes: list[Node] = []
        self._preparer = preparer

    def __len__(self) -> int:
        return len(self._nodes)

    @property
    def nodes(self) -> tuple[Node, ...]:
        """The nodes recorded so far, in recording order (a snapshot: later calls do not change
        it)."""
        return tuple(self._nodes)

    # -- recording -------------------------------------------------------------------

    def fill(self, view: View, value: int) -> int:
        """Set every byte of `view` to `value` (compute lane)."""
        self._check_view(view, "fill")
        # numpy integers are bytes too; bools and floats are not.
        byte = _validate.as_integer(value)
        if byte is None or not 0 <= byte <= 255:
            raise ContractError(f"fill value must be a byte 0..255, got {_validate.shown(value)}")
        return self._add(
            Lane.COMPUTE, Fill(view, byte), ((view, Access.WRITE),), gpu=_gpu_of((view,))
        )

    def copy(self, dst: View, src: View, lane: Lane | None = None) -> int:
        """Copy `src` into `dst`. The lane follows placements unless forced:
        host-side → GPU-side is upload, GPU-side → host-side download, else compute.
        The GPU is the one whose memory is written, else the one whose memory is read;
        a copy between two GPUs runs on the destination's upload lane, peer to peer
        where the devices allow it."""
        self._check_view(dst, "copy destination")
        self._check_view(src, "copy source")
        if dst.nbytes != src.nbytes:
            raise ContractError(
                f"copy lengths differ: destination {dst.nbytes} bytes, source {src.nbytes} bytes"
            )
        if dst.overlaps(src):
            raise ContractError(f"copy source {src} and destination {dst} overlap")
        if lane is None:
            lane = _copy_lane(dst, src)
        elif not isinstance(lane, Lane) or lane not in _COPY_LANES:
            raise ContractError(
                f"a copy runs on upload, compute or download, not {_validate.shown(lane)}"
            )
        gpu = _gpu_of((dst,)) if dst.buffer.placement.gpu_device is not None else _gpu_of((src,))
        accesses = ((src, Access.READ), (dst, Access.WRITE))
        return self._add(lane, Copy(dst, src), accesses, gpu=gpu)

    def gpu(self, kernel: GpuKernel, views: Sequence[View], allow_alias: bool = False) -> int:
        """Launch a loaded GPU kernel on `views`, one per contract binding (compute lane)."""
        if not isinstance(kernel, GpuKernel):
            raise ContractError(
                f"gpu() takes a kernel from load_gpu_kernel, got {_validate.shown(kernel)}"
            )
        _validate.flag(allow_alias, "allow_alias")
        bound = self._check_kernel(kernel.name, kernel.domain, kernel.contract, views, allow_alias)
        for view in bound:
            if not view.buffer.placement.gpu_bindable:
                raise ContractError(
                    f"GPU kernel {kernel.name!r} cannot bind {view} with placement "
                    f"{view.buffer.placement}: NPU-local memory is not visible to the GPU"
                )
        gpu = _gpu_of(bound)
        if any(v.buffer.placement.gpu_device not in (None, gpu) for v in bound):
            devices = sorted({str(v.buffer.placement) for v in bound})
            raise ContractError(
                f"GPU kernel {kernel.name!r} binds memory of more than one GPU ({devices}); "
                "a kernel runs on one GPU: copy the views onto it first"
            )
        accesses = tuple(zip(bound, (b.access for b in kernel.contract.bindings), strict=True))
        return self._add(Lane.COMPUTE, Launch(kernel, bound), accesses, gpu=gpu)

    def npu(self, kernel: NpuKernel, views: Sequence[View]) -> int:
        """Run a loaded NPU program on `views` (its own region on that NPU's lane)."""
        if not isinstance(kernel, NpuKernel):
            raise ContractError(
                f"npu() takes a kernel from load_artifact, got {_validate.shown(kernel)}"
            )
        bound = self._check_kernel(kernel.name, kernel.domain, kernel.contract, views, False)
        for view in bound:
            if not view.buffer.placement.npu_bindable(kernel.npu):
                raise ContractError(
                    f"NPU kernel {kernel.name!r} on NPU {kernel.npu} cannot bind {view} with "
                    f"placement {view.buffer.placement}: use npu_local({kernel.npu}) or "
                    f"shared({kernel.npu})"
                )
        accesses = tuple(zip(bound, (b.access for b in kernel.contract.bindings), strict=True))
        return self._add(Lane.NPU, NpuLaunch(kernel, bound), accesses, npu=kernel.npu)

    def host(self, fn: Callable[..., Any], accesses: Iterable[tuple[View, Access]]) -> int:
        """Run `fn(*arrays)` on the host lane, one uint8 array per access (read-only for READ).

        `fn` may be a plain function (run in a worker thread) or an `async def`
        function (awaited on the event loop). Views must be host-mappable.
        """
        if not callable(fn):
            raise ContractError(f"host() takes a callable, got {_validate.shown(fn)}")
        pairs = _validate.items(accesses, "host() accesses")
        for pair in pairs:
            if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[1], Access)):
                raise ContractError(
                    f"host() accesses are (view, Access) pairs, got {_validate.shown(pair)}"
                )
            view = pair[0]
            self._check_view(view, "host function access")
            if not view.buffer.placement.host_mappable:
                raise ContractError(
                    f"host function cannot access {view}: {view.buffer.placement} memory is not "
                    "host-mappable; copy it to HOST_VISIBLE memory first"
                )
        _check_aliasing("host function", [(v, a.writes) for v, a in pairs], allow=False)
        views = tuple(v for v, _ in pairs)
        return self._add(Lane.HOST, HostCall(fn, views, tuple(a for _, a in pairs)), pairs)

    def external(
        self,
        fn: Callable[..., Any],
        accesses: Iterable[tuple[View, Access]],
        *,
        prepare: Callable[..., Any] | None = None,
    ) -> int:
        """Work another library issues (PyTorch, CuPy, a native library) as a region of its
        own on the compute lane, ordered by byte range like any kernel.

        Each replay calls `fn(stream, tensors)` when the region is issued, on the event
        loop's thread: `stream` is the lane's raw stream handle (an int; for PyTorch,
        `torch.cuda.ExternalStream(stream)`), `tensors` one uint8 tensor per access over its
        view, exporting DLPack (`torch.from_dlpack`) and, on CUDA, the CUDA array interface.
        `fn` must only *enqueue* work on `stream` and return (no waiting, no await): the
        region's fence is recorded on that stream right after it returns. On `sim`,
        `stream` is None and the tensors are uint8 numpy arrays (read-only for READ), so
        the same graph runs everywhere. An exception from `fn` fails the region
        (`ExecutionError`) and poisons what it writes. Views must be GPU-visible memory of
        one GPU.

        `prepare`, optional, builds the work once instead (a captured graph, a plan, tensors
        made once): a stream backend calls `prepare(stream, tensors)` when the graph is
        prepared, with the stream handle and tensors its replays get, and each replay of
        that prepared graph then calls the function it returns, `work(stream, tensors)`,
        in place of `fn`. Nothing is ordered at that time, so the hook must not run work on
        the tensors' memory (capturing, which runs nothing, is fine); its failure fails
        `prepare()` with `ContractError`. `sim` has no stream to prepare for: it runs `fn`.
        """
        _check_plain_function(fn, "external()")
        if prepare is not None:
            _check_plain_function(prepare, "external(prepare=...)")
        pairs = _validate.items(accesses, "external() accesses")
        for pair in pairs:
            if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[1], Access)):
                raise ContractError(
                    f"external() accesses are (view, Access) pairs, got {_validate.shown(pair)}"
                )
            view = self._check_view(pair[0], "external access")
            if not view.buffer.placement.gpu_bindable:
                raise ContractError(
                    f"external work cannot access {view}: {view.buffer.placement} memory is "
                    "not visible to the GPU"
                )
        views = tuple(v for v, _ in pairs)
        gpu = _gpu_of(views)
        if any(v.buffer.placement.gpu_device not in (None, gpu) for v in views):
            devices = sorted({str(v.buffer.placement) for v in views})
            raise ContractError(
                f"external work accesses memory of more than one GPU ({devices}); it runs on "
                "one GPU's stream: copy the views onto it first"
            )
        _check_aliasing("external work", [(v, a.writes) for v, a in pairs], allow=False)
        op = External(fn, views, tuple(a for _, a in pairs), prepare)
        return self._add(Lane.COMPUTE, op, pairs, gpu=gpu)

    # -- preparation -----------------------------------------------------------------

    def plan(self) -> GraphPlan:
        """Regions, edges and access summaries of the nodes recorded so far."""
        if not self._nodes:
            raise ContractError(f"graph {self.label!r} is empty: record at least one operation")
        for node in self._nodes:
            for view, _ in node.accesses:
                view.buffer.check_alive()
        return plan_graph(self.label, self.domain, self._nodes)

    def prepare(self, single_launch: bool = False) -> P:
        """Validate, plan and build the backend's artifacts. The graph can still be extended
        and prepared again; prepared graphs are independent of it.

        `single_launch=True` (for small, latency-bound replays): a graph of fills, copies
        and GPU kernels becomes one region on the compute lane, every node in recording
        order, prepared as one program (on CUDA and HIP one native graph, or the copy
        itself when that is all: a replay is one launch and one fence; on sim one worker
        job). Its copies then queue behind the compute lane's work, so they no longer
        overlap kernels of other submissions or replays. Admission order, byte-range
        ordering, failure, poison and cancellation are those of any region, applied to the
        whole graph. A graph with NPU or host nodes raises `ContractError` and stays as it
        was.
        """
        if self._preparer is None:
            raise ContractError("this graph has no runtime; record it with Runtime.graph()")
        _validate.flag(single_launch, "single_launch")
        plan = self.plan()
        return self._preparer(single_launch_plan(plan) if single_launch else plan)

    # -- validation ------------------------------------------------------------------

    def _add(
        self,
        lane: Lane,
        op: Op,
        accesses: tuple[tuple[View, Access], ...],
        npu: int | None = None,
        gpu: int = 0,
    ) -> int:
        index = len(self._nodes)
        self._nodes.append(Node(index, lane, op, accesses, npu, gpu))
        return index

    def _check_view(self, view: object, what: str) -> View:
        return view_of(view, self.domain, what)

    def _check_kernel(
        self,
        name: str,
        domain: Domain,
        contract: KernelContract,
        views: Sequence[View],
        allow_alias: bool,
    ) -> tuple[View, ...]:
        if domain is not self.domain:
            raise ContractError(f"kernel {name!r} was loaded by another runtime")
        bound = _validate.items(views, f"kernel {name!r} views")
        bindings = contract.bindings
        if len(bound) != len(bindings):
            raise ContractError(
                f"kernel {name!r} takes {len(bindings)} views (one per binding), got {len(bound)}"
            )
        for index, (view, binding) in enumerate(zip(bound, bindings, strict=True)):
            what = f"kernel {name!r} {binding.describe(index)}"
            self._check_view(view, what)
            if view.nbytes < binding.nbytes:
                raise ContractError(
                    f"{what} needs at least {binding.nbytes} bytes, got a {view.nbytes}-byte view"
                )
            if view.offset % binding.alignment:
                raise ContractError(
                    f"{what} needs {binding.alignment}-byte alignment, got offset {view.offset}"
                )
        pairs = [(v, b.access.writes) for v, b in zip(bound, bindings, strict=True)]
        _check_aliasing(f"kernel {name!r}", pairs, allow=allow_alias)
        return bound


def _gpu_of(views: Iterable[View]) -> int:
    """The GPU of the first view in GPU memory; 0 (the first GPU) for host-mapped memory."""
    for view in views:
        device = view.buffer.placement.gpu_device
        if device is not None:
            return device
    return 0


def _between_gpus(op: Op) -> bool:
    return isinstance(op, Copy) and _gpus_differ(op.dst, op.src)


def _gpus_differ(dst: View, src: View) -> bool:
    to, of = dst.buffer.placement.gpu_device, src.buffer.placement.gpu_device
    return to is not None and of is not None and to != of


def _copy_lane(dst: View, src: View) -> Lane:
    if _gpus_differ(dst, src):
        return Lane.UPLOAD
    src_host, dst_host = src.buffer.placement.host_side, dst.buffer.placement.host_side
    if src_host and not dst_host:
        return Lane.UPLOAD
    if dst_host and not src_host:
        return Lane.DOWNLOAD
    return Lane.COMPUTE


def _check_plain_function(fn: Any, what: str) -> None:
    """External work and its prepare hook run on the loop's thread and must return without
    waiting: plain callables, never `async def` ones."""
    if not callable(fn):
        raise ContractError(f"{what} takes a callable, got {_validate.shown(fn)}")
    if inspect.iscoroutinefunction(fn):
        raise ContractError(
            f"{what} takes a plain function that enqueues work and returns; "
            f"{fn!r} is an async def function (use host() to await on the loop)"
        )


def _check_aliasing(what: str, pairs: Sequence[tuple[View, bool]], allow: bool) -> None:
    if allow:
        return
    for i, (first, first_writes) in enumerate(pairs):
        for second, second_writes in pairs[i + 1 :]:
            if (first_writes or second_writes) and first.overlaps(second):
                raise ContractError(
                    f"{what}: {first} and {second} overlap and one of them is written; "
                    "pass disjoint views (or allow_alias=True for a kernel that handles it)"
                )


def _cut_regions(nodes: Sequence[Node]) -> list[list[Node]]:
    groups: list[list[Node]] = []
    for node in nodes:
        last = groups[-1] if groups else None
        if (
            last is None
            or node.own_region
            or last[0].own_region
            or last[0].lane != node.lane
            or last[0].gpu != node.gpu
        ):
            groups.append([node])
        else:
            last.append(node)
    return groups


_Span = tuple[Buffer, int, int, bool, bool]
"""A tracked byte range of one access: buffer, start, end, reads, writes."""


def _summarise(spans: Iterable[_Span]) -> tuple[tuple[Interval, ...], tuple[Interval, ...]]:
    reads: dict[int, list[tuple[int, int]]] = {}
    writes: dict[int, list[tuple[int, int]]] = {}
    buffers: dict[int, Buffer] = {}
    for buffer, start, end, is_read, is_write in spans:
        buffers[buffer.ident] = buffer
        if is_read:
            reads.setdefault(buffer.ident, []).append((start, end))
        if is_write:
            writes.setdefault(buffer.ident, []).append((start, end))

    def flatten(table: dict[int, list[tuple[int, int]]]) -> tuple[Interval, ...]:
        return tuple(
            Interval(buffers[key], start, end)
            for key, spans in table.items()
            for start, end in merge_intervals(spans)
        )

    return flatten(reads), flatten(writes)


def plan_graph(label: str, domain: Domain, nodes: Sequence[Node]) -> GraphPlan:
    """Cut `nodes` into regions and infer the edges between them. O(nodes)."""
    tracker: AccessTracker[int] = AccessTracker()
    record = tracker.record
    region_of: list[int] = []
    regions: list[RegionPlan] = []
    edges: set[tuple[int, int]] = set()
    for region_index, group in enumerate(_cut_regions(nodes)):
        # Each access's tracked range is worked out once, here, and reused by the summary.
        spans: list[_Span] = []
        for node in group:
            region_of.append(region_index)
            for view, access in node.accesses:
                buffer = view.buffer
                start, end = tracked_range(view)
                writes_ = access is not Access.READ
                spans.append((buffer, start, end, access is not Access.WRITE, writes_))
                for dep in record(buffer.ident, start, end, writes_, node.index):
                    source = region_of[dep]
                    if source != region_index:
                        edges.add((source, region_index))
        reads, writes = _summarise(spans)
        copy_bytes = sum(n.op.dst.nbytes for n in group if isinstance(n.op, Copy))
        regions.append(
            RegionPlan(
                index=region_index,
                lane=group[0].lane,
                nodes=tuple(n.index for n in group),
                ops=tuple(n.op for n in group),
                reads=reads,
                writes=writes,
                copy_bytes=copy_bytes,
                npu=group[0].npu,
                gpu=group[0].gpu,
            )
        )
    # The graph's summary is the union of its regions' (already merged, so fewer) intervals.
    all_reads, all_writes = _summarise(
        (i.buffer, i.start, i.end, is_read, not is_read)
        for region in regions
        for intervals, is_read in ((region.reads, True), (region.writes, False))
        for i in intervals
    )
    return GraphPlan(
        label=label,
        domain=domain,
        nodes=tuple(nodes),
        regions=tuple(regions),
        edges=frozenset(edges),
        reads=all_reads,
        writes=all_writes,
        overwrites=_overwritten_before_read(nodes),
    )


def _overwritten_before_read(nodes: Sequence[Node]) -> tuple[Buffer, ...]:
    read: set[int] = set()
    cleared: dict[int, Buffer] = {}
    for node in nodes:
        for view, access in node.accesses:
            key = view.buffer.ident
            if access.reads and key not in cleared:
                read.add(key)
        for view, access in node.accesses:
            whole = view.offset == 0 and view.nbytes == view.buffer.nbytes
            if access is Access.WRITE and whole and view.buffer.ident not in read:
                cleared.setdefault(view.buffer.ident, view.buffer)
    return tuple(cleared.values())


_JOINED_FIELDS = frozenset(
    ("index", "lane", "nodes", "ops", "reads", "writes", "copy_bytes", "joined", "copies")
)
"""What a single-launch region takes from the regions it joins; every other field of
theirs (the device they run on) must be the same."""


def single_launch_plan(plan: GraphPlan) -> GraphPlan:
    """`plan` with one region on the compute lane in place of its regions (see
    `Graph.prepare`): every node in recording order, which orders every dependency the
    edges expressed, reading and writing the union of what they read and write.

    Only fills, copies and GPU kernels of one device join; `ContractError` otherwise.
    """
    refused = [node for node in plan.nodes if node.own_region]
    if refused:
        named = ", ".join(
            f"node {node.index} ({node.kind}) "
            + ("between GPUs" if _between_gpus(node.op) else f"on the {node.lane.label} lane")
            for node in refused[:3]
        )
        more = f" and {len(refused) - 3} more" if len(refused) > 3 else ""
        raise ContractError(
            f"graph {plan.label!r} cannot be prepared with single_launch=True: {named}{more}; "
            "one launch holds only fills, copies and GPU kernels of one GPU (prepare it without "
            "single_launch, or move that work to a graph of its own)"
        )
    first = plan.regions[0]
    for field in dataclasses.fields(RegionPlan):
        if field.name in _JOINED_FIELDS:
            continue
        values = [getattr(region, field.name) for region in plan.regions]
        if any(value != values[0] for value in values):
            raise ContractError(
                f"graph {plan.label!r} cannot be prepared with single_launch=True: its "
                f"regions differ in {field.name} ({sorted(set(map(repr, values)))}); one "
                "launch runs on one device"
            )
    region = dataclasses.replace(
        first,
        index=0,
        lane=Lane.COMPUTE,
        nodes=tuple(node.index for node in plan.nodes),
        ops=tuple(node.op for node in plan.nodes),
        reads=plan.reads,
        writes=plan.writes,
        copy_bytes=sum(part.copy_bytes for part in plan.regions),
        joined=plan.regions,
    )
    return dataclasses.replace(plan, regions=(region,), edges=frozenset())
