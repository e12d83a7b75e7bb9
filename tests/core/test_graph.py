"""Tests of graph recording and preparation (pure: no event loop for most of them).

* Every validation rule with its bad input: the call raises `ContractError` and the graph is
  left exactly as it was (same nodes, same plan).
* Region cutting and edges for the shapes of the original's example programs.
* Regions, edges and access summaries of random small graphs against a brute-force model
  that tracks every byte on its own.

Buffers are made directly with a tiny owner standing in for the runtime (it owns a domain
and marks buffers released), and kernels are the plain loaded-kernel records; the last
tests go through a sim `Runtime`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hrx_async as hrx
from hrx_async._core.contract import Access, Binding, KernelContract
from hrx_async._core.graph import Graph, GraphPlan
from hrx_async._core.intervals import Interval
from hrx_async._core.kernels import GpuKernel, KernelSource, NpuKernel
from hrx_async._core.lane import Lane
from hrx_async._core.memory import (
    GPU_LOCAL,
    HOST_VISIBLE,
    Buffer,
    Domain,
    HostMapping,
    Placement,
    View,
    npu_local,
    shared,
)
from hrx_async.errors import ContractError


class Owner:
    """The least a buffer needs from a runtime: a domain and a way to be released."""

    def __init__(self, label: str) -> None:
        self.domain = Domain(label)

    def _release_buffer(self, buffer: Buffer) -> None:
        buffer._mark_released()

    def _map(self, view: View, write: bool, wait: bool) -> AbstractAsyncContextManager[memoryview]:
        raise NotImplementedError("pure tests do not map")

    def _map_nowait(self, view: View, write: bool) -> HostMapping:
        raise NotImplementedError("pure tests do not map")


def _no_op(arrays: list[Any], constants: bytes) -> None:
    del arrays, constants


class World:
    """One domain with helpers to make buffers, kernel records and graphs in it."""

    def __init__(self, label: str = "world") -> None:
        self.owner = Owner(label)
        self.domain = self.owner.domain

    def buffer(self, nbytes: int, placement: Placement = GPU_LOCAL, label: str = "") -> Buffer:
        return Buffer(self.owner, nbytes, placement, storage=object(), label=label)

    def gpu_kernel(self, *bindings: Binding, name: str = "k") -> GpuKernel:
        return GpuKernel(
            name,
            (1, 1, 1),
            (64, 1, 1),
            KernelContract(bindings),
            KernelSource(host=_no_op),
            "test",
            self.domain,
        )

    def npu_kernel(self, *bindings: Binding, npu: int = 0, name: str = "npu_k") -> NpuKernel:
        return NpuKernel(
            name, npu, 1, KernelContract(bindings), KernelSource(host=_no_op), "test", self.domain
        )

    def graph(self, label: str = "g") -> Graph:
        return Graph(self.domain, label)


R, W, RW = Access.READ, Access.WRITE, Access.READ_WRITE


def snapshot(graph: Graph) -> tuple[int, tuple[Any, ...], GraphPlan | None]:
    return (len(graph), graph.nodes, graph.plan() if len(graph) else None)


@contextmanager
def rejected(graph: Graph, match: str) -> Iterator[None]:
    """The body must raise `ContractError` matching `match` and leave `graph` as it was."""
    before = snapshot(graph)
    with pytest.raises(ContractError, match=match):
        yield
    assert snapshot(graph) == before


@dataclass
class Setup:
    world: World
    graph: Graph
    gpu: Buffer
    host: Buffer
    npu: Buffer
    shared: Buffer
    other_npu: Buffer
    foreign: Buffer
    kernel: GpuKernel
    npu_kernel: NpuKernel


@pytest.fixture
def setup() -> Setup:
    """A graph that already holds a few nodes, so "unchanged" means something."""
    world = World()
    gpu, host = world.buffer(256, GPU_LOCAL, "gpu"), world.buffer(256, HOST_VISIBLE, "host")
    npu, sh = world.buffer(256, npu_local(0), "npu"), world.buffer(256, shared(0), "shared")
    other_npu = world.buffer(256, npu_local(1), "npu1")
    foreign = World("elsewhere").buffer(256, GPU_LOCAL, "foreign")
    kernel = world.gpu_kernel(Binding(64, R, alignment=16), Binding(64, W))
    npu_kernel = world.npu_kernel(Binding(64, R), Binding(64, W))
    graph = world.graph()
    graph.copy(gpu.view(), host.view())
    graph.gpu(kernel, [gpu[0:64], gpu[64:128]])
    graph.npu(npu_kernel, [npu[0:64], sh[0:64]])
    return Setup(world, graph, gpu, host, npu, sh, other_npu, foreign, kernel, npu_kernel)


# -- validation: every rule with its bad input -------------------------------------------


def test_wrong_binding_count(setup: Setup) -> None:
    g, gpu = setup.graph, setup.gpu
    with rejected(g, "takes 2 views .* got 1"):
        g.gpu(setup.kernel, [gpu[0:64]])
    with rejected(g, "takes 2 views .* got 3"):
        g.gpu(setup.kernel, [gpu[0:64], gpu[64:128], gpu[128:192]])
    with rejected(g, "takes 2 views .* got 0"):
        g.npu(setup.npu_kernel, [])


def test_short_view(setup: Setup) -> None:
    g, gpu = setup.graph, setup.gpu
    with rejected(g, "binding 1 needs at least 64 bytes, got a 63-byte view"):
        g.gpu(setup.kernel, [gpu[0:64], gpu[64:127]])
    with rejected(g, "needs at least 64 bytes"):
        g.npu(setup.npu_kernel, [setup.npu[0:32], setup.npu[64:128]])


def test_longer_views_than_the_minimum_are_fine(setup: Setup) -> None:
    node = setup.graph.gpu(setup.kernel, [setup.gpu[0:128], setup.gpu[128:256]])
    assert node == 3


def test_misaligned_offset(setup: Setup) -> None:
    g, gpu = setup.graph, setup.gpu
    with rejected(g, "binding 0 needs 16-byte alignment, got offset 8"):
        g.gpu(setup.kernel, [gpu[8:72], gpu[128:192]])
    with rejected(g, "binding 1 needs 4-byte alignment, got offset 130"):
        g.gpu(setup.kernel, [gpu[0:64], gpu[130:194]])
    layout = setup.world.gpu_kernel(Binding(8, R, alignment=8, layout="f64[1]"), name="lay")
    with rejected(g, r"binding 0 \(f64\[1\]\) needs 8-byte alignment, got offset 4"):
        g.gpu(layout, [gpu[4:12]])


def test_overlapping_copy(setup: Setup) -> None:
    g, gpu = setup.graph, setup.gpu
    with rejected(g, "overlap"):
        g.copy(gpu[0:64], gpu[32:96])
    with rejected(g, "overlap"):
        g.copy(gpu[0:64], gpu[0:64])
    # Neighbouring ranges of one buffer are fine.
    assert g.copy(gpu[0:64], gpu[64:128]) == 3


def test_unequal_copy_lengths(setup: Setup) -> None:
    with rejected(setup.graph, "destination 64 bytes, source 32 bytes"):
        setup.graph.copy(setup.gpu[0:64], setup.host[0:32])


@pytest.mark.parametrize(
    ("offset", "nbytes"), [(0, 0), (16, 0), (-4, 8), (250, 8), (0, 257), (256, 1)]
)
def test_empty_or_out_of_range_views(setup: Setup, offset: int, nbytes: int) -> None:
    g = setup.graph
    # Neither slicing nor building a View by hand can make these.
    with rejected(g, "integer offset >= 0 and an integer length >= 1|outside its 256-byte"):
        View(setup.gpu, offset, nbytes)
    # A view record changed after it was made is still refused by recording.
    bad = setup.gpu[0:1]
    object.__setattr__(bad, "offset", offset)
    object.__setattr__(bad, "nbytes", nbytes)
    with rejected(g, "outside its 256-byte buffer or empty"):
        g.fill(bad, 0)
    with rejected(g, "outside its 256-byte buffer or empty"):
        g.copy(bad, setup.host[0:1])
    with rejected(g, "outside its 256-byte buffer or empty"):
        g.gpu(setup.kernel, [setup.gpu[0:64], bad])


def test_writable_aliasing(setup: Setup) -> None:
    g, gpu = setup.graph, setup.gpu
    with rejected(g, "overlap and one of them is written"):
        g.gpu(setup.kernel, [gpu[0:64], gpu[32:96]])
    with rejected(g, "overlap and one of them is written"):
        g.npu(setup.npu_kernel, [setup.shared[0:64], setup.shared[0:64]])
    with rejected(g, "host function: .* overlap and one of them is written"):
        g.host(_no_op, [(setup.host[0:16], R), (setup.host[8:24], RW)])
    # Overlapping reads are no conflict; a kernel that handles aliasing may opt in.
    reader = setup.world.gpu_kernel(Binding(64, R), Binding(64, R), name="reads")
    assert g.gpu(reader, [gpu[0:64], gpu[0:64]]) == 3
    assert g.gpu(setup.kernel, [gpu[0:64], gpu[32:96]], allow_alias=True) == 4
    assert g.host(_no_op, [(setup.host[0:16], R), (setup.host[8:24], R)]) == 5


def test_npu_local_memory_cannot_bind_to_a_gpu_kernel(setup: Setup) -> None:
    with rejected(setup.graph, "NPU-local memory is not visible to the GPU"):
        setup.graph.gpu(setup.kernel, [setup.gpu[0:64], setup.npu[0:64]])


@pytest.mark.parametrize("which", ["gpu", "host", "other_npu"])
def test_npu_kernel_binds_only_its_npu_memory(setup: Setup, which: str) -> None:
    view = getattr(setup, which)[0:64]
    with rejected(setup.graph, r"use npu_local\(0\) or shared\(0\)"):
        setup.graph.npu(setup.npu_kernel, [setup.npu[0:64], view])


def test_gpu_local_memory_cannot_reach_a_host_function(setup: Setup) -> None:
    with rejected(setup.graph, "not host-mappable"):
        setup.graph.host(_no_op, [(setup.host[0:16], R), (setup.gpu[0:16], W)])
    # NPU-local and shared memory are host-mapped storage.
    assert setup.graph.host(_no_op, [(setup.npu[0:16], R), (setup.shared[0:16], W)]) == 3


def test_views_from_another_domain(setup: Setup) -> None:
    g, foreign = setup.graph, setup.foreign
    with rejected(g, "belongs to another runtime"):
        g.fill(foreign.view(), 1)
    with rejected(g, "copy destination .* belongs to another runtime"):
        g.copy(foreign[0:64], setup.host[0:64])
    with rejected(g, "copy source .* belongs to another runtime"):
        g.copy(setup.gpu[0:64], foreign[0:64])
    with rejected(g, "belongs to another runtime"):
        g.gpu(setup.kernel, [setup.gpu[0:64], foreign[0:64]])
    with rejected(g, "belongs to another runtime"):
        g.host(_no_op, [(foreign[0:8], R)])


def test_kernels_from_another_domain(setup: Setup) -> None:
    elsewhere = World("elsewhere")
    kernel = elsewhere.gpu_kernel(Binding(4, R))
    npu_kernel = elsewhere.npu_kernel(Binding(4, R))
    with rejected(setup.graph, "loaded by another runtime"):
        setup.graph.gpu(kernel, [setup.gpu[0:4]])
    with rejected(setup.graph, "loaded by another runtime"):
        setup.graph.npu(npu_kernel, [setup.npu[0:4]])


def test_wrong_kernel_kinds_and_arguments(setup: Setup) -> None:
    g = setup.graph
    with rejected(g, "load_gpu_kernel"):
        g.gpu(setup.npu_kernel, [setup.gpu[0:64], setup.gpu[64:128]])  # type: ignore[arg-type]
    with rejected(g, "load_artifact"):
        g.npu(setup.kernel, [setup.npu[0:64], setup.npu[64:128]])  # type: ignore[arg-type]
    with rejected(g, "must be a View"):
        g.fill(setup.gpu, 0)  # type: ignore[arg-type]
    with rejected(g, "must be a View"):
        g.gpu(setup.kernel, [setup.gpu[0:64], "view"])  # type: ignore[list-item]
    with rejected(g, "takes a callable"):
        g.host("fn", [(setup.host[0:8], R)])  # type: ignore[arg-type]
    with rejected(g, r"\(view, Access\) pairs"):
        g.host(_no_op, [(setup.host[0:8], "read")])  # type: ignore[list-item]
    with rejected(g, r"\(view, Access\) pairs"):
        g.host(_no_op, [setup.host[0:8]])  # type: ignore[list-item]


@pytest.mark.parametrize("value", [-1, 256, 1000, 1.0, "a", None, True])
def test_bad_fill_byte(setup: Setup, value: object) -> None:
    with rejected(setup.graph, "fill value must be a byte 0..255"):
        setup.graph.fill(setup.gpu.view(), value)  # type: ignore[arg-type]


def test_fill_accepts_every_byte_including_numpy_integers(setup: Setup) -> None:
    g = setup.graph
    assert g.fill(setup.gpu[0:4], 0) == 3
    assert g.fill(setup.gpu[0:4], 255) == 4
    assert g.fill(setup.gpu[0:4], np.uint8(0x5A)) == 5  # type: ignore[arg-type]
    assert g.nodes[5].op.value == 0x5A  # type: ignore[union-attr]
    assert type(g.nodes[5].op.value) is int  # type: ignore[union-attr]


@pytest.mark.parametrize("lane", [Lane.NPU, Lane.HOST, "upload", 0, 7])
def test_forced_copy_lane_must_be_a_copy_lane(setup: Setup, lane: object) -> None:
    with rejected(setup.graph, "a copy runs on upload, compute or download"):
        setup.graph.copy(setup.gpu[0:64], setup.host[0:64], lane=lane)  # type: ignore[arg-type]


def test_freed_buffers(setup: Setup) -> None:
    g = setup.graph
    scratch = setup.world.buffer(64, GPU_LOCAL, "scratch")
    stale = scratch.view()  # taken while the buffer was alive
    scratch.free()
    with rejected(g, "scratch was freed"):
        g.fill(stale, 0)
    with rejected(g, "scratch was freed"):
        g.copy(setup.gpu[0:64], stale)
    with rejected(g, "scratch was freed"):
        g.gpu(setup.kernel, [setup.gpu[0:64], stale])
    with rejected(g, "scratch was freed"):
        g.copy(setup.gpu[0:64], scratch.view())


def test_buffer_freed_after_recording_fails_plan_and_changes_nothing(setup: Setup) -> None:
    g = setup.graph
    late = setup.world.buffer(64, HOST_VISIBLE, "late")
    g.fill(late.view(), 3)
    nodes = g.nodes
    late.free()
    with pytest.raises(ContractError, match="late was freed"):
        g.plan()
    assert g.nodes == nodes


def test_empty_graph() -> None:
    world = World()
    with pytest.raises(ContractError, match="graph 'lonely' is empty"):
        world.graph("lonely").plan()
    with pytest.raises(ContractError, match="no runtime"):
        world.graph().prepare()


def test_a_rejected_call_does_not_disturb_later_recording(setup: Setup) -> None:
    g = setup.graph
    with pytest.raises(ContractError):
        g.copy(setup.gpu[0:64], setup.host[0:32])
    assert g.fill(setup.gpu[0:8], 1) == 3
    assert [n.index for n in g.nodes] == [0, 1, 2, 3]


# -- lanes and region cutting ------------------------------------------------------------

COPY_LANES = [
    # (destination placement, source placement, lane): host-side memory is host-visible and
    # NPU-local storage; GPU-side memory is GPU-local and shared (a GPU allocation).
    (GPU_LOCAL, HOST_VISIBLE, Lane.UPLOAD),
    (GPU_LOCAL, npu_local(0), Lane.UPLOAD),
    (shared(0), HOST_VISIBLE, Lane.UPLOAD),
    (HOST_VISIBLE, GPU_LOCAL, Lane.DOWNLOAD),
    (npu_local(0), shared(0), Lane.DOWNLOAD),
    (GPU_LOCAL, GPU_LOCAL, Lane.COMPUTE),
    (shared(0), GPU_LOCAL, Lane.COMPUTE),
    (HOST_VISIBLE, HOST_VISIBLE, Lane.COMPUTE),
    (HOST_VISIBLE, npu_local(0), Lane.COMPUTE),
]


@pytest.mark.parametrize(("dst", "src", "lane"), COPY_LANES)
def test_copy_lane_follows_placements(dst: Placement, src: Placement, lane: Lane) -> None:
    world = World()
    g = world.graph()
    g.copy(world.buffer(32, dst).view(), world.buffer(32, src).view())
    assert g.nodes[0].lane is lane


def test_forced_copy_lane() -> None:
    world = World()
    g = world.graph()
    for lane in (Lane.UPLOAD, Lane.COMPUTE, Lane.DOWNLOAD):
        g.copy(world.buffer(8).view(), world.buffer(8).view(), lane=lane)
    assert [n.lane for n in g.nodes] == [Lane.UPLOAD, Lane.COMPUTE, Lane.DOWNLOAD]


def test_consecutive_nodes_on_one_lane_share_a_region() -> None:
    world = World()
    gpu, host = world.buffer(64), world.buffer(64, HOST_VISIBLE)
    npu = world.buffer(64, npu_local(0))
    kernel = world.gpu_kernel(Binding(8, RW))
    npu_kernel = world.npu_kernel(Binding(8, RW))
    g = world.graph()
    g.copy(gpu[0:8], host[0:8])  # 0 upload
    g.copy(gpu[8:16], host[8:16])  # 1 upload
    g.fill(gpu[16:24], 1)  # 2 compute
    g.gpu(kernel, [gpu[24:32]])  # 3 compute
    g.npu(npu_kernel, [npu[0:8]])  # 4 npu: alone
    g.npu(npu_kernel, [npu[8:16]])  # 5 npu: alone again
    g.host(_no_op, [(host[32:40], W)])  # 6 host: alone
    g.host(_no_op, [(host[40:48], W)])  # 7 host: alone again
    g.fill(gpu[32:40], 2)  # 8 compute
    g.copy(host[48:56], gpu[40:48])  # 9 download
    g.copy(gpu[48:56], host[56:64])  # 10 upload
    plan = g.plan()
    assert [(r.lane, r.nodes) for r in plan.regions] == [
        (Lane.UPLOAD, (0, 1)),
        (Lane.COMPUTE, (2, 3)),
        (Lane.NPU, (4,)),
        (Lane.NPU, (5,)),
        (Lane.HOST, (6,)),
        (Lane.HOST, (7,)),
        (Lane.COMPUTE, (8,)),
        (Lane.DOWNLOAD, (9,)),
        (Lane.UPLOAD, (10,)),
    ]
    assert [r.index for r in plan.regions] == list(range(9))
    assert plan.edges == frozenset(), "every node touched its own bytes"
    assert [r.copy_bytes for r in plan.regions] == [16, 0, 0, 0, 0, 0, 0, 8, 8]
    assert plan.regions[0].ops == (g.nodes[0].op, g.nodes[1].op)


def test_npu_regions_queue_per_npu() -> None:
    world = World()
    first, second = world.buffer(8, npu_local(0)), world.buffer(8, npu_local(1))
    g = world.graph()
    g.npu(world.npu_kernel(Binding(8, W), npu=0), [first.view()])
    g.npu(world.npu_kernel(Binding(8, W), npu=1), [second.view()])
    g.fill(world.buffer(8).view(), 0)
    keys = [r.queue_key for r in g.plan().regions]
    assert keys == [(Lane.NPU, 0), (Lane.NPU, 1), (Lane.COMPUTE, 0)]


def intervals(items: Sequence[Interval]) -> set[tuple[str, int, int]]:
    return {(i.buffer.label, i.start, i.end) for i in items}


def test_shared_roundtrip_shape() -> None:
    """fill(a, 0x5a) -> NPU copy a->c -> copy result <- c, all on shared buffers.

    Regions: 0 = compute [fill], 1 = NPU [copy kernel], 2 = compute [copy] (shared to shared
    is GPU-side to GPU-side). Edges: 0 -> 1 (the kernel reads what the fill wrote) and 1 -> 2
    (the copy reads what the kernel wrote); no 0 -> 2 since the copy never touches a.
    """
    world = World()
    nbytes = 4096
    a, c, result = (world.buffer(nbytes, shared(0), name) for name in ("a", "c", "result"))
    copy_kernel = world.npu_kernel(Binding(nbytes, R), Binding(nbytes, W), name="npu_copy")
    g = world.graph("shared_roundtrip")
    g.fill(a.view(), 0x5A)
    g.npu(copy_kernel, [a.view(), c.view()])
    g.copy(result.view(), c.view())
    plan = g.plan()
    assert [(r.lane, r.nodes) for r in plan.regions] == [
        (Lane.COMPUTE, (0,)),
        (Lane.NPU, (1,)),
        (Lane.COMPUTE, (2,)),
    ]
    assert plan.edges == {(0, 1), (1, 2)}
    assert intervals(plan.reads) == {("a", 0, nbytes), ("c", 0, nbytes)}
    assert intervals(plan.writes) == {("a", 0, nbytes), ("c", 0, nbytes), ("result", 0, nbytes)}
    assert {b.label for b in plan.overwrites} == {"a", "c", "result"}
    assert plan.regions[2].copy_bytes == nbytes


def test_gpu_npu_parallel_shape() -> None:
    """GPU `out = in*3 + 7` and an NPU GEMM on disjoint buffers: 2 regions, no edge.

    The upload and download graphs of the same program each hold one copy region.
    """
    world = World()
    n = 1024
    gpu_in, gpu_out = world.buffer(n * 4, GPU_LOCAL, "in"), world.buffer(n * 4, GPU_LOCAL, "out")
    host_in, host_out = world.buffer(n * 4, HOST_VISIBLE), world.buffer(n * 4, HOST_VISIBLE)
    matrices = 16
    a, b = world.buffer(matrices * 128, npu_local(0)), world.buffer(matrices * 128, npu_local(0))
    c = world.buffer(matrices * 256, npu_local(0))
    affine = world.gpu_kernel(Binding(n * 4, R), Binding(n * 4, W), name="affine")
    gemm = world.npu_kernel(
        Binding(matrices * 128, R), Binding(matrices * 128, R), Binding(matrices * 256, W)
    )
    parallel = world.graph("parallel")
    parallel.gpu(affine, [gpu_in.view(), gpu_out.view()])
    parallel.npu(gemm, [a.view(), b.view(), c.view()])
    plan = parallel.plan()
    assert [(r.lane, r.nodes) for r in plan.regions] == [(Lane.COMPUTE, (0,)), (Lane.NPU, (1,))]
    assert plan.edges == frozenset()

    upload = world.graph("upload")
    upload.copy(gpu_in.view(), host_in.view())
    download = world.graph("download")
    download.copy(host_out.view(), gpu_out.view())
    assert [(r.lane, r.copy_bytes) for r in upload.plan().regions] == [(Lane.UPLOAD, n * 4)]
    assert [(r.lane, r.copy_bytes) for r in download.plan().regions] == [(Lane.DOWNLOAD, n * 4)]


def test_gemm_pipeline_shape() -> None:
    """fill A, GPU prep (A read-write, ones read), NPU GEMM (A, weights -> C), GPU epilogue (C).

    All buffers are shared(0). Regions: 0 = compute [fill, prep] (consecutive compute nodes),
    1 = NPU [gemm], 2 = compute [epilogue]. Edges: 0 -> 1 (the GEMM reads A, written in
    region 0) and 1 -> 2 (the epilogue updates C, written by the GEMM). No 0 -> 2: the
    epilogue touches only C. The fill inside region 0 orders before prep by lane order,
    so it makes no edge. The graph reads A, ones, weights and C, writes A and C, and
    overwrites A (the fill) and C (the GEMM's write-only output) before reading them.
    """
    world = World()
    m, k, n = 64, 64, 64
    a_bytes, b_bytes, c_bytes = m * k * 2, k * n * 2, m * n * 4
    weights = world.buffer(b_bytes, shared(0), "weights")
    ones = world.buffer(a_bytes, shared(0), "ones")
    a, c = world.buffer(a_bytes, shared(0), "A"), world.buffer(c_bytes, shared(0), "C")
    gemm = world.npu_kernel(Binding(a_bytes, R), Binding(b_bytes, R), Binding(c_bytes, W))
    prep = world.gpu_kernel(Binding(a_bytes, RW), Binding(a_bytes, R), name="prep")
    epilogue = world.gpu_kernel(Binding(c_bytes, RW), name="epilogue")
    g = world.graph("gemm_pipeline")
    g.fill(a.view(), 0)
    g.gpu(prep, [a.view(), ones.view()])
    g.npu(gemm, [a.view(), weights.view(), c.view()])
    g.gpu(epilogue, [c.view()])
    plan = g.plan()
    assert [(r.lane, r.nodes) for r in plan.regions] == [
        (Lane.COMPUTE, (0, 1)),
        (Lane.NPU, (2,)),
        (Lane.COMPUTE, (3,)),
    ]
    assert plan.edges == {(0, 1), (1, 2)}
    assert intervals(plan.reads) == {
        ("A", 0, a_bytes),
        ("ones", 0, a_bytes),
        ("weights", 0, b_bytes),
        ("C", 0, c_bytes),
    }
    assert intervals(plan.writes) == {("A", 0, a_bytes), ("C", 0, c_bytes)}
    assert {b.label for b in plan.overwrites} == {"A", "C"}
    assert sum(r.copy_bytes for r in plan.regions) == 0


def test_shared_memory_is_ordered_as_a_whole() -> None:
    world = World()
    sh, gpu = world.buffer(64, shared(0), "sh"), world.buffer(64, GPU_LOCAL, "gpu")
    g = world.graph()
    g.fill(sh[0:8], 1)  # region 0 (compute)
    g.npu(world.npu_kernel(Binding(8, R)), [sh[32:40]])  # region 1: disjoint bytes, same buffer
    g.fill(gpu[0:8], 1)  # region 2 (compute)
    g.npu(world.npu_kernel(Binding(8, W)), [sh[48:56]])  # region 3
    g.host(_no_op, [(world.buffer(8, HOST_VISIBLE).view(), R)])  # region 4: unrelated
    plan = g.plan()
    assert plan.edges == {(0, 1), (0, 3), (1, 3)}
    assert intervals(plan.regions[1].reads) == {("sh", 0, 64)}


def test_plan_is_repeatable_and_the_graph_can_grow() -> None:
    world = World()
    buf = world.buffer(64)
    g = world.graph()
    g.fill(buf[0:32], 1)
    first = g.plan()
    assert g.plan() == first
    g.copy(buf[32:64], buf[0:32], lane=Lane.UPLOAD)
    second = g.plan()
    assert len(first.regions) == 1 and len(second.regions) == 2
    assert second.edges == {(0, 1)}
    assert first.nodes == second.nodes[:1]


# -- random graphs against a brute-force per-byte model ------------------------------------

PLACEMENTS = [GPU_LOCAL, HOST_VISIBLE, npu_local(0), shared(0)]


@dataclass
class ModelNode:
    lane: Lane
    accesses: list[tuple[Buffer, int, int, Access]]


@dataclass
class Model:
    """What a graph should plan to, worked out byte by byte."""

    nodes: list[ModelNode] = field(default_factory=list)

    @staticmethod
    def span(buffer: Buffer, start: int, end: int) -> range:
        # Shared memory is one allocation both devices use: ordered as a whole.
        return range(buffer.nbytes) if buffer.placement == shared(0) else range(start, end)

    def regions(self) -> list[tuple[Lane, tuple[int, ...]]]:
        out: list[tuple[Lane, list[int]]] = []
        for index, node in enumerate(self.nodes):
            alone = node.lane in (Lane.NPU, Lane.HOST)
            if out and not alone and out[-1][0] is node.lane:
                out[-1][1].append(index)
            else:
                out.append((node.lane, [index]))
        return [(lane, tuple(nodes)) for lane, nodes in out]

    def dependencies(self) -> list[set[int]]:
        writer: dict[tuple[int, int], int] = {}
        readers: dict[tuple[int, int], set[int]] = {}
        deps: list[set[int]] = []
        for index, node in enumerate(self.nodes):
            mine: set[int] = set()
            for buffer, start, end, access in node.accesses:
                for byte in self.span(buffer, start, end):
                    key = (buffer.ident, byte)
                    if key in writer:
                        mine.add(writer[key])
                    if access.writes:
                        mine.update(readers.get(key, ()))
                        writer[key] = index
                        readers[key] = set()
                    else:
                        readers.setdefault(key, set()).add(index)
            mine.discard(index)
            deps.append(mine)
        return deps

    def edges(self) -> set[tuple[int, int]]:
        region_of = {n: r for r, (_, nodes) in enumerate(self.regions()) for n in nodes}
        return {
            (region_of[d], region_of[n])
            for n, found in enumerate(self.dependencies())
            for d in found
            if region_of[d] != region_of[n]
        }

    def touched(self, nodes: Sequence[int], writes: bool) -> dict[str, set[int]]:
        found: dict[str, set[int]] = {}
        for index in nodes:
            for buffer, start, end, access in self.nodes[index].accesses:
                if access.writes if writes else access.reads:
                    found.setdefault(buffer.label, set()).update(self.span(buffer, start, end))
        return found

    def conflict(self, first: int, second: int) -> bool:
        """Whether two nodes touch a common byte and at least one of them writes it."""
        writes = self.touched([first], True), self.touched([second], True)
        reads = self.touched([first], False), self.touched([second], False)
        pairs = ((writes[0], writes[1]), (writes[0], reads[1]), (reads[0], writes[1]))
        return any(a[label] & b.get(label, set()) for a, b in pairs for label in a)

    def overwrites(self) -> set[str]:
        read: set[str] = set()
        cleared: set[str] = set()
        for node in self.nodes:
            for buffer, _, _, access in node.accesses:
                if access.reads and buffer.label not in cleared:
                    read.add(buffer.label)
            for buffer, start, end, access in node.accesses:
                whole = (start, end) == (0, buffer.nbytes)
                if access is Access.WRITE and whole and buffer.label not in read:
                    cleared.add(buffer.label)
        return cleared


def bytes_of(items: Sequence[Interval]) -> dict[str, set[int]]:
    found: dict[str, set[int]] = {}
    for item in items:
        found.setdefault(item.buffer.label, set()).update(range(item.start, item.end))
    return found


def model_copy_lane(dst: Placement, src: Placement) -> Lane:
    host_side = (HOST_VISIBLE, npu_local(0))
    if src in host_side and dst not in host_side:
        return Lane.UPLOAD
    if dst in host_side and src not in host_side:
        return Lane.DOWNLOAD
    return Lane.COMPUTE


def is_merged(items: Sequence[Interval]) -> bool:
    """Per buffer, sorted intervals that neither overlap nor touch."""
    by_buffer: dict[int, list[tuple[int, int]]] = {}
    for item in items:
        by_buffer.setdefault(item.buffer.ident, []).append((item.start, item.end))
    return all(
        all(prev[1] < nxt[0] for prev, nxt in pairwise(spans)) and spans == sorted(spans)
        for spans in by_buffer.values()
    )


@st.composite
def random_views(
    draw: st.DrawFn, buffers: Sequence[Buffer], allowed: Callable[[Buffer], bool]
) -> View:
    usable = [b for b in buffers if allowed(b)]
    buffer = draw(st.sampled_from(usable))
    start = draw(st.integers(0, buffer.nbytes - 1))
    end = draw(st.integers(start + 1, min(buffer.nbytes, start + 24)))
    return buffer[start:end]


OPS = ["fill", "copy", "gpu", "npu", "host"]


@given(st.data())
@settings(max_examples=250, deadline=None)
def test_random_graphs_match_the_byte_model(data: st.DataObject) -> None:
    world = World()
    buffers = [
        world.buffer(data.draw(st.integers(8, 40)), placement, f"b{i}")
        for i, placement in enumerate(
            PLACEMENTS + data.draw(st.lists(st.sampled_from(PLACEMENTS), max_size=2))
        )
    ]
    g = world.graph()
    model = Model()
    any_view = random_views(buffers, lambda b: True)
    for _ in range(data.draw(st.integers(1, 14))):
        kind = data.draw(st.sampled_from(OPS))
        before = snapshot(g)
        try:
            if kind == "fill":
                view = data.draw(any_view)
                g.fill(view, data.draw(st.integers(0, 255)))
                node = ModelNode(Lane.COMPUTE, [(view.buffer, view.offset, view.end, W)])
            elif kind == "copy":
                src = data.draw(any_view)
                dst = data.draw(random_views(buffers, lambda b, n=src.nbytes: b.nbytes >= n))
                dst = dst.buffer.view(min(dst.offset, dst.buffer.nbytes - src.nbytes), src.nbytes)
                forced = data.draw(
                    st.sampled_from([None, Lane.UPLOAD, Lane.COMPUTE, Lane.DOWNLOAD])
                )
                g.copy(dst, src, lane=forced)
                lane = (
                    forced
                    if forced is not None
                    else model_copy_lane(dst.buffer.placement, src.buffer.placement)
                )
                node = ModelNode(
                    lane,
                    [(src.buffer, src.offset, src.end, R), (dst.buffer, dst.offset, dst.end, W)],
                )
            elif kind in ("gpu", "npu"):
                allowed = (
                    (lambda b: b.placement != npu_local(0))
                    if kind == "gpu"
                    else (lambda b: b.placement in (npu_local(0), shared(0)))
                )
                views = data.draw(st.lists(random_views(buffers, allowed), min_size=1, max_size=3))
                access = data.draw(
                    st.lists(st.sampled_from([R, W, RW]), min_size=len(views), max_size=len(views))
                )
                bindings = [Binding(1, a, alignment=1) for a in access]
                if kind == "gpu":
                    g.gpu(world.gpu_kernel(*bindings), views, allow_alias=data.draw(st.booleans()))
                else:
                    g.npu(world.npu_kernel(*bindings), views)
                node = ModelNode(
                    Lane.COMPUTE if kind == "gpu" else Lane.NPU,
                    [(v.buffer, v.offset, v.end, a) for v, a in zip(views, access, strict=True)],
                )
            else:
                views = data.draw(
                    st.lists(
                        random_views(buffers, lambda b: b.placement != GPU_LOCAL),
                        min_size=0,
                        max_size=3,
                    )
                )
                access = data.draw(
                    st.lists(st.sampled_from([R, W, RW]), min_size=len(views), max_size=len(views))
                )
                g.host(_no_op, list(zip(views, access, strict=True)))
                node = ModelNode(
                    Lane.HOST,
                    [(v.buffer, v.offset, v.end, a) for v, a in zip(views, access, strict=True)],
                )
        except ContractError:
            # Random choices may break a rule (overlapping copy, aliasing writes): such a
            # call must change nothing.
            assert snapshot(g) == before
            continue
        model.nodes.append(node)

    if not model.nodes:
        with pytest.raises(ContractError, match="empty"):
            g.plan()
        return
    plan = g.plan()

    regions = model.regions()
    assert [(r.lane, r.nodes) for r in plan.regions] == regions
    assert plan.edges == model.edges()
    assert all(src < dst for src, dst in plan.edges), "edges point forward in recording order"

    # Every conflicting pair of nodes in different regions is ordered through the edges.
    region_of = {n: r for r, (_, nodes) in enumerate(regions) for n in nodes}
    reach = {r: {r} for r in range(len(regions))}
    for r in reach:
        # Edges sorted by source: everything reaching a source is known before its edges.
        for src, dst in sorted(plan.edges):
            if src in reach[r]:
                reach[r].add(dst)
    for later in range(len(model.nodes)):
        for earlier in range(later):
            if model.conflict(earlier, later):
                assert region_of[later] in reach[region_of[earlier]]

    assert bytes_of(plan.reads) == model.touched(range(len(model.nodes)), False)
    assert bytes_of(plan.writes) == model.touched(range(len(model.nodes)), True)
    assert is_merged(plan.reads) and is_merged(plan.writes)
    for region, (_, nodes) in zip(plan.regions, regions, strict=True):
        assert bytes_of(region.reads) == model.touched(nodes, False)
        assert bytes_of(region.writes) == model.touched(nodes, True)
        assert is_merged(region.reads) and is_merged(region.writes)
    assert {b.label for b in plan.overwrites} == model.overwrites()
    assert {b.label for b in plan.buffers} == set(
        model.touched(range(len(model.nodes)), False)
    ) | set(model.touched(range(len(model.nodes)), True))


# -- through a runtime -------------------------------------------------------------------


@pytest.mark.anyio
async def test_runtime_prepares_the_plan_and_rejects_empty_and_foreign_graphs() -> None:
    async with hrx.Runtime(backend="sim") as rt, hrx.Runtime(backend="sim") as other:
        with pytest.raises(ContractError, match="empty"):
            rt.graph("nothing").prepare()
        host = rt.allocate(64, HOST_VISIBLE)
        device = rt.allocate(64, GPU_LOCAL)
        g = rt.graph("step")
        g.copy(device.view(), host.view())
        g.fill(device[0:16], 7)
        g.copy(host.view(), device.view())
        foreign = other.allocate(64, GPU_LOCAL)
        with rejected(g, "belongs to another runtime"):
            g.copy(foreign.view(), host.view())
        prepared = g.prepare()
        assert [(r.lane, r.nodes) for r in prepared.regions] == [
            (Lane.UPLOAD, (0,)),
            (Lane.COMPUTE, (1,)),
            (Lane.DOWNLOAD, (2,)),
        ]
        assert prepared.edges == {(0, 1), (1, 2), (0, 2)}
        assert prepared.plan == g.plan()
        async with host.map_write() as memory:
            memory[:] = bytes(range(64))
        await prepared.submit()
        async with host.map_read() as memory:
            assert bytes(memory) == bytes([7] * 16) + bytes(range(16, 64))
