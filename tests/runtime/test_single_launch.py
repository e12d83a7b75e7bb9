"""`prepare(single_launch=True)`: a graph of fills, copies and GPU kernels as one region.

The same graphs run in both modes and must give the same bytes; single-launch
submissions are ordered against earlier and later conflicting submissions of
either mode byte range by byte range; they fail, poison, refuse and cancel as
one region; graphs with NPU or host nodes are refused and stay usable. Sim
kernels log their start and end with one shared counter (`Log`), so "ran
before" is exact, not a timing guess. The CUDA test at the end runs only where
a CUDA device answers.
"""

from __future__ import annotations

import functools
import random
import threading
from typing import Any

import anyio
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hrx_async as hrx
from hrx_async._core.graph import Node, plan_graph, single_launch_plan
from hrx_async._core.lane import Lane
from hrx_async._core.ops import Copy
from hrx_async.backends import probe
from hrx_async.errors import Cancelled, ContractError, ExecutionError, PoisonedError
from tests.helpers import load_mix, load_npu_mix, mix_numpy
from tests.runtime.test_equivalence import graphs, run_case
from tests.runtime.test_ordering_rules import Log

pytestmark = pytest.mark.anyio

N = 64
U8 = np.ndarray[Any, np.dtype[np.uint8]]


def add_kernel(
    rt: hrx.Runtime,
    log: Log | None = None,
    name: str = "add",
    seconds: float = 0.0,
    broken: threading.Event | None = None,
) -> hrx.GpuKernel:
    """dst = src + 5 over N bytes; optionally logged, slow, or raising while `broken` is set."""

    def body(arrays: list[U8], constants: bytes) -> None:
        if log is not None:
            log.mark(name)
        if seconds:
            threading.Event().wait(seconds)
        if broken is not None and broken.is_set():
            raise RuntimeError("injected kernel failure")
        arrays[1][:] = arrays[0] + np.uint8(5)
        if log is not None:
            log.mark(name)

    contract = hrx.KernelContract(
        [hrx.Binding(N, hrx.Access.READ), hrx.Binding(N, hrx.Access.WRITE)]
    )
    return rt.load_gpu_kernel(hrx.KernelSource(host=body), name, (1,), (1,), contract)


class Chain:
    """Upload → kernel → download over buffers of its own, in either mode."""

    def __init__(self, rt: hrx.Runtime, kernel: hrx.GpuKernel, label: str) -> None:
        self.host_in = rt.allocate(N, hrx.HOST_VISIBLE, label=f"{label}-in")
        self.host_out = rt.allocate(N, hrx.HOST_VISIBLE, label=f"{label}-out")
        self.dev_in = rt.allocate(N, hrx.GPU_LOCAL, label=f"{label}-dev-in")
        self.dev_out = rt.allocate(N, hrx.GPU_LOCAL, label=f"{label}-dev-out")
        self.graph = rt.graph(label)
        self.graph.copy(self.dev_in.view(), self.host_in.view())
        self.graph.gpu(kernel, [self.dev_in.view(), self.dev_out.view()])
        self.graph.copy(self.host_out.view(), self.dev_out.view())


async def read(buffer: hrx.Buffer) -> U8:
    async with buffer.map_read() as memory:
        return np.frombuffer(memory, np.uint8).copy()


async def write(buffer: hrx.Buffer, values: U8) -> None:
    async with buffer.map_write() as memory:
        np.frombuffer(memory, np.uint8)[:] = values


def record_mixed(rt: hrx.Runtime, prefix: str) -> tuple[hrx.Graph, dict[str, hrx.Buffer]]:
    """Every kind of node the GPU lanes run, over parts of buffers, on all three lanes."""
    b = {
        "in": rt.allocate(2 * N, hrx.HOST_VISIBLE, label=f"{prefix}in"),
        "out": rt.allocate(2 * N, hrx.HOST_VISIBLE, label=f"{prefix}out"),
        "x": rt.allocate(2 * N, hrx.GPU_LOCAL, label=f"{prefix}x"),
        "y": rt.allocate(2 * N, hrx.GPU_LOCAL, label=f"{prefix}y"),
    }
    kernel = load_mix(rt, N)
    g = rt.graph(f"{prefix}mixed")
    g.copy(b["x"].view(0, N), b["in"].view(N, N))  # upload
    g.fill(b["x"].view(N, N), 9)  # compute
    g.gpu(kernel, [b["x"].view(0, N), b["y"].view(N, N)])
    g.copy(b["y"].view(0, N), b["x"].view(N, N))  # device to device (compute)
    g.copy(b["out"].view(), b["y"].view())  # download
    g.fill(b["in"].view(0, 8), 1)  # compute lane again, on host memory
    return g, b


def mixed_reference(host_in: U8) -> tuple[U8, U8]:
    """What `record_mixed` leaves in `out` and `in`, from `in` as it was."""
    x = np.zeros(2 * N, np.uint8)
    y = np.zeros(2 * N, np.uint8)
    x[:N] = host_in[N:]
    x[N:] = 9
    mix_numpy(x[:N], y[N:])
    y[:N] = x[N:]
    after_in = host_in.copy()
    after_in[:8] = 1
    return y.copy(), after_in


# -- the plan ---------------------------------------------------------------------------


async def test_plan_is_one_compute_region_of_every_node_in_order() -> None:
    async with hrx.Runtime(backend="sim", npu=None) as rt:
        g, _ = record_mixed(rt, "")
        default = g.prepare()
        single = g.prepare(single_launch=True)
        assert [r.lane for r in default.regions] == [
            Lane.UPLOAD,
            Lane.COMPUTE,
            Lane.DOWNLOAD,
            Lane.COMPUTE,
        ]
        assert default.edges
        (region,) = single.regions
        assert region.lane is Lane.COMPUTE and region.index == 0
        assert region.nodes == tuple(range(len(g)))
        assert region.ops == tuple(node.op for node in g.nodes)
        assert region.reads == default.reads == single.reads
        assert region.writes == default.writes == single.writes
        assert region.joined == default.regions
        assert region.copy_bytes == sum(r.copy_bytes for r in default.regions)
        assert region.copies == ((Lane.UPLOAD, N), (Lane.COMPUTE, N), (Lane.DOWNLOAD, 2 * N))
        assert single.edges == frozenset()
        assert single.plan.overwrites == default.plan.overwrites
        assert single.input_reads == default.input_reads
        assert len(single.programs) == 1
        # The graph itself is unchanged and prepares in the default mode as before.
        assert len(g.prepare().regions) == 4


async def test_plan_of_one_node_moves_to_the_compute_lane() -> None:
    async with hrx.Runtime(backend="sim", npu=None) as rt:
        host, dev = rt.allocate(N, hrx.HOST_VISIBLE), rt.allocate(N, hrx.GPU_LOCAL)
        g = rt.graph("upload")
        g.copy(dev.view(), host.view())
        (region,) = g.prepare(single_launch=True).regions
        assert region.lane is Lane.COMPUTE and region.copies == ((Lane.UPLOAD, N),)


async def test_regions_of_different_devices_are_not_joined() -> None:
    """A single launch joins nodes of one device: regions that differ in anything but what
    they join (here the device number a node carries) are refused."""
    async with hrx.Runtime(backend="sim", npu=None) as rt:
        host, dev = rt.allocate(N, hrx.HOST_VISIBLE), rt.allocate(N, hrx.GPU_LOCAL)
        up = Copy(dev.view(), host.view())
        down = Copy(host.view(), dev.view())
        nodes = [
            Node(
                0, Lane.UPLOAD, up, ((host.view(), hrx.Access.READ), (dev.view(), hrx.Access.WRITE))
            ),
            Node(
                1,
                Lane.DOWNLOAD,
                down,
                ((dev.view(), hrx.Access.READ), (host.view(), hrx.Access.WRITE)),
                npu=1,
            ),
        ]
        plan = plan_graph("two devices", rt.domain, nodes)
        with pytest.raises(ContractError, match="differ in npu"):
            single_launch_plan(plan)
        nodes[1] = Node(1, Lane.DOWNLOAD, down, nodes[1].accesses)
        assert len(single_launch_plan(plan_graph("one device", rt.domain, nodes)).regions) == 1


# -- values ------------------------------------------------------------------------------


async def test_results_equal_the_default_mode() -> None:
    rng = np.random.default_rng(7)
    async with hrx.Runtime(backend="sim", npu=None) as rt:
        g_default, b_default = record_mixed(rt, "d-")
        g_single, b_single = record_mixed(rt, "s-")
        default, single = g_default.prepare(), g_single.prepare(single_launch=True)
        for _ in range(4):
            values = rng.integers(0, 256, 2 * N, dtype=np.uint8)
            await write(b_default["in"], values)
            await write(b_single["in"], values)
            before = rt.statistics()
            await default.submit()
            middle = rt.statistics()
            await single.submit()
            after = rt.statistics()
            expected_out, expected_in = mixed_reference(values)
            for b in (b_default, b_single):
                np.testing.assert_array_equal(await read(b["out"]), expected_out)
                np.testing.assert_array_equal(await read(b["in"]), expected_in)
            for name in (
                "copied_bytes",
                "uploaded_bytes",
                "downloaded_bytes",
                "device_copied_bytes",
            ):
                by_default = getattr(middle, name) - getattr(before, name)
                assert getattr(after, name) - getattr(middle, name) == by_default > 0, name


@pytest.mark.parametrize("in_flight", [1, 8])
async def test_replays_in_flight_chain_through_the_same_buffers(in_flight: int) -> None:
    """Replays not awaited one by one still run in admission order (each reads what the
    one before it wrote)."""
    async with hrx.Runtime(backend="sim", npu=None) as rt:
        buf = rt.allocate(N, hrx.HOST_VISIBLE)
        dev = rt.allocate(N, hrx.GPU_LOCAL)
        g = rt.graph("accumulate")
        g.copy(dev.view(), buf.view())
        g.gpu(add_kernel(rt), [dev.view(), buf.view()])
        step = g.prepare(single_launch=True)
        pending: list[hrx.Completion] = []
        for _ in range(24):
            pending.append(step.submit())
            if len(pending) >= in_flight:
                await pending.pop(0)
        for completion in pending:
            await completion
        assert (await read(buf) == 24 * 5).all()


# -- ordering against other submissions ---------------------------------------------------
#
# The slow side and the other one run on different lanes (a single-launch graph on the
# compute lane, a default-mode host function on the host lane), so only the byte-range
# ordering keeps them apart.


def host_add(log: Log, name: str, seconds: float = 0.0) -> Any:
    """A host function dst = src + 5, logged, sleeping before it reads."""

    def body(src: U8, dst: U8) -> None:
        log.mark(name)
        threading.Event().wait(seconds)
        dst[:] = src + np.uint8(5)
        log.mark(name)

    return body


@pytest.mark.parametrize("writer_single", [True, False], ids=["single-writes", "default-writes"])
async def test_read_after_a_slow_write_of_the_other_mode(writer_single: bool) -> None:
    log = Log()
    async with hrx.Runtime(backend="sim", npu=None) as rt:
        src, mid, out = (rt.allocate(N, hrx.HOST_VISIBLE, label=n) for n in ("src", "mid", "out"))
        dev = rt.allocate(N, hrx.GPU_LOCAL)
        values = np.arange(N, dtype=np.uint8)
        await write(src, values)
        writer = rt.graph("writer")
        reader = rt.graph("reader")
        if writer_single:
            writer.copy(dev.view(), src.view())
            writer.gpu(add_kernel(rt, log, "writer", 0.05), [dev.view(), mid.view()])
            reader.host(
                host_add(log, "reader"),
                [(mid.view(), hrx.Access.READ), (out.view(), hrx.Access.WRITE)],
            )
        else:
            writer.host(
                host_add(log, "writer", 0.05),
                [(src.view(), hrx.Access.READ), (mid.view(), hrx.Access.WRITE)],
            )
            reader.copy(dev.view(), mid.view())
            reader.gpu(add_kernel(rt, log, "reader"), [dev.view(), out.view()])
        first = writer.prepare(single_launch=writer_single).submit()
        second = reader.prepare(single_launch=not writer_single).submit()
        await first
        await second
        assert log.before("writer", "reader")
        np.testing.assert_array_equal(await read(out), values + 10)


@pytest.mark.parametrize("reader_single", [True, False], ids=["single-reads", "default-reads"])
async def test_write_after_a_slow_read_of_the_other_mode(reader_single: bool) -> None:
    log = Log()
    async with hrx.Runtime(backend="sim", npu=None) as rt:
        shared, out = rt.allocate(N, hrx.HOST_VISIBLE), rt.allocate(N, hrx.HOST_VISIBLE)
        dev = rt.allocate(N, hrx.GPU_LOCAL)
        values = np.arange(N, dtype=np.uint8)
        await write(shared, values)

        def overwrite(a: U8) -> None:
            log.mark("writer")
            a.fill(200)
            log.mark("writer")

        reader = rt.graph("reader")
        writer = rt.graph("writer")
        if reader_single:
            reader.fill(dev.view(), 1)
            reader.gpu(add_kernel(rt, log, "reader", 0.05), [shared.view(), out.view()])
            writer.host(overwrite, [(shared.view(), hrx.Access.WRITE)])
        else:
            reader.host(
                host_add(log, "reader", 0.05),
                [(shared.view(), hrx.Access.READ), (out.view(), hrx.Access.WRITE)],
            )
            writer.fill(shared.view(), 200)
            writer.copy(dev.view(), shared.view())
        first = reader.prepare(single_launch=reader_single).submit()
        second = writer.prepare(single_launch=not reader_single).submit()
        await first
        await second
        if reader_single:
            assert log.before("reader", "writer")
        np.testing.assert_array_equal(await read(out), values + 5)
        assert (await read(shared) == 200).all()


async def test_disjoint_bytes_do_not_wait() -> None:
    """A single-launch graph on other bytes of a buffer does not wait for slow work."""
    async with hrx.Runtime(backend="sim", npu=None) as rt:
        shared = rt.allocate(2 * N, hrx.HOST_VISIBLE)
        other = rt.allocate(N, hrx.HOST_VISIBLE)
        gate = threading.Event()

        def blocked_writer(a: U8) -> None:
            gate.wait(10)
            a.fill(1)

        g = rt.graph("blocked")
        g.host(blocked_writer, [(shared.view(0, N), hrx.Access.WRITE)])
        blocked = g.prepare().submit()
        g = rt.graph("quick")
        g.fill(other.view(), 3)
        g.copy(shared.view(N, N), other.view(), lane=Lane.UPLOAD)
        try:
            with anyio.fail_after(5):
                await g.prepare(single_launch=True).submit()
        finally:
            gate.set()
        await blocked
        assert (await read(shared)).tolist() == [1] * N + [3] * N


# -- failure, poison, cancellation ---------------------------------------------------------


async def test_failure_poisons_everything_the_region_writes() -> None:
    broken = threading.Event()
    broken.set()
    async with hrx.Runtime(backend="sim", npu=None) as rt:
        chain = Chain(rt, add_kernel(rt, broken=broken), "chain")
        step = chain.graph.prepare(single_launch=True)
        with pytest.raises(ExecutionError) as info:
            await step.submit()
        assert info.value.graph == "chain" and info.value.region == 0
        assert isinstance(info.value.__cause__, RuntimeError)
        # One region: what it writes is poisoned, the upload that ran before the kernel too.
        for buffer in (chain.dev_in, chain.dev_out, chain.host_out):
            assert buffer.poison is not None, buffer.label
        assert chain.host_in.poison is None
        with pytest.raises(PoisonedError):
            await read(chain.host_out)
        g = rt.graph("reads the output")
        g.copy(rt.allocate(N, hrx.HOST_VISIBLE).view(), chain.host_out.view())
        reader = g.prepare(single_launch=True)
        with pytest.raises(PoisonedError):
            reader.submit()  # refused by submit(): nothing admitted would clear it
        # A replay that runs overwrites every output whole and clears the poison.
        broken.clear()
        await write(chain.host_in, np.full(N, 2, np.uint8))
        await step.submit()
        for buffer in (chain.dev_in, chain.dev_out, chain.host_out):
            assert buffer.poison is None, buffer.label
        assert (await read(chain.host_out) == 7).all()
        await reader.submit()


async def test_poisoned_input_refuses_a_single_launch_graph_admitted_before_the_failure() -> None:
    log = Log()
    async with hrx.Runtime(backend="sim", npu=None) as rt:
        chain = Chain(rt, add_kernel(rt), "chain")
        step = chain.graph.prepare(single_launch=True)

        def failing_writer(arrays: list[U8], constants: bytes) -> None:
            log.mark("fail")
            threading.Event().wait(0.05)
            raise RuntimeError("injected writer failure")

        contract = hrx.KernelContract([hrx.Binding(N, hrx.Access.WRITE)])
        kernel = rt.load_gpu_kernel(
            hrx.KernelSource(host=failing_writer), "w", (1,), (1,), contract
        )
        g = rt.graph("writer")
        g.gpu(kernel, [chain.host_in.view()])
        writer = g.prepare().submit()
        replay = step.submit()  # admitted while the writer runs: refused when its turn comes
        with pytest.raises(ExecutionError):
            await writer
        with pytest.raises(PoisonedError):
            await replay
        # Refused for poisoned input, it poisons what it writes.
        assert chain.host_out.poison is not None
        with pytest.raises(PoisonedError):
            step.submit()


async def test_cancel_before_it_starts_skips_it_and_keeps_order() -> None:
    log = Log()
    async with hrx.Runtime(backend="sim", npu=None) as rt:
        target = rt.allocate(N, hrx.HOST_VISIBLE)
        contract = hrx.KernelContract([hrx.Binding(N, hrx.Access.WRITE)])

        def slow_one(arrays: list[U8], constants: bytes) -> None:
            log.mark("W")
            threading.Event().wait(0.1)
            arrays[0][:] = 1
            log.mark("W")

        kernel = rt.load_gpu_kernel(hrx.KernelSource(host=slow_one), "W", (1,), (1,), contract)
        g = rt.graph("W")
        g.gpu(kernel, [target.view()])
        w = g.prepare().submit()
        source = rt.allocate(N, hrx.GPU_LOCAL)
        g = rt.graph("X")
        g.fill(source.view(), 2)
        g.copy(target.view(), source.view())
        x = g.prepare(single_launch=True).submit()
        x.cancel()

        def last(a: U8) -> None:
            log.mark("Y")
            a[:] = 3
            log.mark("Y")

        g = rt.graph("Y")
        g.host(last, [(target.view(), hrx.Access.WRITE)])
        y = g.prepare().submit()
        await w
        with pytest.raises(Cancelled):
            await x
        await y
        assert log.before("W", "Y")  # Y follows X, X follows W: Y may not overtake W
        assert (await read(target) == 3).all()
        assert target.poison is None and source.poison is None


async def test_cancel_while_it_runs_lets_the_whole_region_finish() -> None:
    """One region: once started, cancelling skips nothing, so every node runs."""
    log = Log()
    async with hrx.Runtime(backend="sim", npu=None) as rt:
        chain = Chain(rt, add_kernel(rt, log, "kernel", 0.05), "chain")
        await write(chain.host_in, np.full(N, 4, np.uint8))
        c = chain.graph.prepare(single_launch=True).submit()
        with anyio.fail_after(10):
            while not log.ran("kernel"):
                await anyio.sleep(0.001)
        c.cancel()
        await c  # nothing was skipped
        assert (await read(chain.host_out) == 9).all()


async def test_cancel_while_waiting_for_admission() -> None:
    async with hrx.Runtime(backend="sim", npu=None, max_submissions=1) as rt:
        chain = Chain(rt, add_kernel(rt, seconds=0.05), "chain")
        await write(chain.host_in, np.full(N, 1, np.uint8))
        step = chain.graph.prepare(single_launch=True)
        first = step.submit()
        second = step.submit()  # waits for admission
        second.cancel()
        with anyio.fail_after(10):
            await first
            with pytest.raises(Cancelled):
                await second
        assert (await read(chain.host_out) == 6).all()
        assert chain.host_out.poison is None


# -- refusals -------------------------------------------------------------------------------


async def test_npu_and_host_nodes_are_refused_and_the_graph_stays_usable() -> None:
    async with hrx.Runtime(backend="sim") as rt:
        host = rt.allocate(N, hrx.HOST_VISIBLE)
        npu_in, npu_out = rt.allocate(N, hrx.npu_local(0)), rt.allocate(N, hrx.npu_local(0))
        g = rt.graph("mixed engines")
        g.fill(host.view(), 3)
        g.copy(npu_in.view(), host.view())
        g.npu(load_npu_mix(rt, N), [npu_in.view(), npu_out.view()])
        g.copy(host.view(), npu_out.view())
        g.host(lambda a: None, [(host.view(), hrx.Access.READ)])
        before = rt.statistics()
        with pytest.raises(ContractError, match=r"node 2 \(npulaunch\) on the npu lane") as info:
            g.prepare(single_launch=True)
        assert "node 4 (hostcall) on the host lane" in str(info.value)
        with pytest.raises(ContractError, match="single_launch must be True or False"):
            g.prepare(single_launch=1)  # type: ignore[arg-type]
        assert len(g) == 5 and rt.statistics() == before
        await g.prepare().submit()
        expected = np.zeros(N, np.uint8)
        mix_numpy(np.full(N, 3, np.uint8), expected)
        np.testing.assert_array_equal(await read(host), expected)

        only_host = rt.graph("host only")
        only_host.host(lambda a: a.fill(8), [(host.view(), hrx.Access.WRITE)])
        with pytest.raises(ContractError, match=r"node 0 .* host lane"):
            only_host.prepare(single_launch=True)
        await only_host.prepare().submit()
        assert (await read(host) == 8).all()


def test_blocking_runtime_prepares_single_launch_graphs() -> None:
    with hrx.BlockingRuntime(backend="sim", npu=None) as brt:
        host = brt.allocate(N, hrx.HOST_VISIBLE)
        dev = brt.allocate(N, hrx.GPU_LOCAL)
        g = brt.graph("blocking")
        g.fill(dev.view(), 6)
        g.copy(host.view(), dev.view())
        step = g.prepare(single_launch=True)
        assert len(step.regions) == 1
        step.run()
        with host.map_read_nowait() as memory:
            assert bytes(memory) == bytes([6]) * N


# -- what statistics and the trace show --------------------------------------------------


async def test_trace_and_statistics_show_one_region() -> None:
    async with hrx.Runtime(backend="sim", npu=None) as rt:
        chain = Chain(rt, add_kernel(rt), "traced")
        step = chain.graph.prepare(single_launch=True)
        before = rt.statistics()
        rt.start_trace()
        for _ in range(3):
            await step.submit()
        trace = rt.finish_trace()
        after = rt.statistics()
        assert trace is not None
        assert [(e.graph, e.region, e.lane) for e in trace.events] == [
            ("traced", 0, Lane.COMPUTE)
        ] * 3
        assert all(e.copied_bytes == 2 * N and not e.failed for e in trace.events)
        assert after.submissions - before.submissions == 3
        assert after.uploaded_bytes - before.uploaded_bytes == 3 * N
        assert after.downloaded_bytes - before.downloaded_bytes == 3 * N
        assert after.device_copied_bytes == before.device_copied_bytes
        assert (after.native_graphs_prepared, after.copy_streams_created) == (0, 0)  # sim


# -- random graphs of both modes -------------------------------------------------------------


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(graph_ops=graphs, seed=st.integers(0, 2**32 - 1), mask=st.integers(0, 63))
def test_random_graphs_of_both_modes_match_sequential_replay(
    hrx_backend: str, loop: str, graph_ops: list[Any], seed: int, mask: int
) -> None:
    """The random-graph equivalence test with some graphs (those of GPU-lane nodes only,
    picked by `mask`) prepared with single_launch=True."""
    single = frozenset(
        index
        for index, ops in enumerate(graph_ops)
        if mask >> index & 1 and all(op.kind in ("fill", "copy", "gpu") for op in ops)
    )
    anyio.run(run_case, hrx_backend, graph_ops, seed, single, backend=loop)


# -- CUDA ------------------------------------------------------------------------------------


@functools.cache
def cuda_usable() -> bool:
    try:
        return bool(probe("cuda").get("available"))
    except Exception:
        return False


@pytest.mark.cuda
@pytest.mark.skipif(not cuda_usable(), reason="no CUDA device answers here")
async def test_cuda_upload_kernel_download_is_one_native_graph() -> None:
    n = 64 << 10
    rng = random.Random(3)
    async with hrx.Runtime(backend="cuda", npu=None) as rt:
        host_in, host_out = rt.allocate(n, hrx.HOST_VISIBLE), rt.allocate(n, hrx.HOST_VISIBLE)
        dev_in, dev_out = rt.allocate(n, hrx.GPU_LOCAL), rt.allocate(n, hrx.GPU_LOCAL)
        g = rt.graph("single")
        g.copy(dev_in.view(), host_in.view())
        g.gpu(load_mix(rt, n), [dev_in.view(), dev_out.view()])
        g.copy(host_out.view(), dev_out.view())
        before = rt.statistics()
        step = g.prepare(single_launch=True)
        stats = rt.statistics()
        assert [r.lane for r in step.regions] == [Lane.COMPUTE]
        assert [p.native_graph for p in step.programs] == [True]
        assert stats.native_graphs_prepared == before.native_graphs_prepared + 1
        expected = np.zeros(n, np.uint8)
        for _ in range(3):
            values = np.frombuffer(rng.randbytes(n), np.uint8).copy()
            await write(host_in, values)
            await step.submit()
            mix_numpy(values, expected)
            np.testing.assert_array_equal(await read(host_out), expected)
        assert rt.statistics().copy_streams_created == 0  # everything ran on the compute lane
        # Interleaved with a default-mode graph over the same bytes, not awaited one by one:
        # the default graph reads what each replay wrote and the next replay waits for it.
        g = rt.graph("default")
        g.copy(dev_out.view(), host_out.view())
        g.gpu(load_mix(rt, n), [dev_out.view(), dev_in.view()])
        g.copy(host_in.view(), dev_in.view())
        other = g.prepare()
        values = np.frombuffer(rng.randbytes(n), np.uint8).copy()
        await write(host_in, values)
        pending = [c for _ in range(5) for c in (step.submit(), other.submit())]
        for completion in pending:
            await completion
        for _ in range(10):
            mix_numpy(values, values)
        np.testing.assert_array_equal(await read(host_in), values)
        stats = rt.statistics()
        assert stats.copy_streams_created == 2  # the default-mode graph's, none for single
        assert stats.uploaded_bytes - before.uploaded_bytes == 13 * n
        assert stats.downloaded_bytes - before.downloaded_bytes == 13 * n
