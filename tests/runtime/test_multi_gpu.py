"""One runtime over several GPUs, on the sim backend's simulated GPUs.

Each GPU has its own upload, compute and download lanes; `gpu_local(i)` is the memory of
the runtime's GPU i; a copy between GPUs is a region of its own on the destination's
upload lane; the byte-range tracker orders work across GPUs as within one. The
correctness state machine (tests/runtime/test_stateful.py) also runs programs over two GPUs.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

import hrx_async as hrx
from hrx_async._core.memory import PlacementKind
from hrx_async._core.trace import ExecutionTrace
from hrx_async.errors import ContractError, ExecutionError

pytestmark = pytest.mark.anyio

N = 4096


def two_gpus() -> hrx.Runtime:
    return hrx.Runtime(backend="sim", devices=[0, 1], npu=None)


def kernel(
    rt: hrx.Runtime, name: str, body: Any, bindings: list[hrx.Binding] | None = None
) -> hrx.GpuKernel:
    contract = hrx.KernelContract(bindings or [hrx.Binding(N, hrx.Access.WRITE)])

    def run(arrays: list[np.ndarray], constants: bytes) -> None:
        body(*arrays)

    return rt.load_gpu_kernel(hrx.KernelSource(host=run), name, (1,), (1,), contract)


async def read(buffer: hrx.Buffer) -> bytes:
    async with buffer.map_read() as memory:
        return bytes(memory)


# -- placements and the runtime's devices ----------------------------------------------------


def test_gpu_local_names_the_runtimes_gpu() -> None:
    assert hrx.gpu_local(0) == hrx.GPU_LOCAL and hrx.gpu_local() == hrx.GPU_LOCAL
    assert str(hrx.gpu_local(1)) == "gpu_local(1)" and str(hrx.GPU_LOCAL) == "gpu_local"
    assert hrx.gpu_local(1).gpu_device == 1 and hrx.HOST_VISIBLE.gpu_device is None
    for bad in (-1, True, 1.0, "1"):
        with pytest.raises(ContractError, match="GPU number"):
            hrx.gpu_local(bad)  # type: ignore[arg-type]
    with pytest.raises(ContractError, match="belongs to no GPU"):
        hrx.Placement(PlacementKind.HOST_VISIBLE, gpu=1)


@pytest.mark.parametrize(
    ("devices", "device", "message"),
    [
        ([], 0, "1..64"),
        ([0, 0], 0, "twice"),
        ([0, -1], 0, "device ordinal"),
        ([0, True], 0, "device ordinal"),
        ({0, 1}, 0, "ordered"),
        ([0, 1], 1, "not both"),
        (5, 0, "iterable"),
    ],
)
def test_bad_device_lists_are_refused(devices: Any, device: int, message: str) -> None:
    with pytest.raises(ContractError, match=message):
        hrx.Runtime(backend="sim", devices=devices, device=device)


async def test_the_runtime_lists_its_gpus_and_refuses_others() -> None:
    async with hrx.Runtime(backend="sim", devices=[3, 5], npu=None) as rt:
        gpus = rt.gpus()
        assert [(g.index, g.number, g.local) for g in gpus] == [
            (3, 0, hrx.GPU_LOCAL),
            (5, 1, hrx.gpu_local(1)),
        ]
        assert rt.gpu() == gpus[0] and rt.gpu(1) == gpus[1]
        with pytest.raises(ContractError, match=r"0\.\.1"):
            rt.gpu(2)
        before = rt.statistics()
        with pytest.raises(ContractError, match="names GPU 2; this runtime has 2"):
            rt.allocate(N, hrx.gpu_local(2))
        assert rt.statistics() == before
        assert rt.allocate(N, hrx.gpu_local(1)).placement == hrx.gpu_local(1)


async def test_one_gpu_runtime_refuses_the_second_gpus_memory() -> None:
    async with hrx.Runtime(backend="sim", npu=None) as rt:
        with pytest.raises(ContractError, match="names GPU 1; this runtime has 1"):
            rt.allocate(N, hrx.gpu_local(1))


# -- regions and lanes -----------------------------------------------------------------------


async def test_each_gpu_has_its_own_lanes_and_copies_between_gpus_stand_alone() -> None:
    async with two_gpus() as rt:
        a, b = rt.allocate(N, hrx.GPU_LOCAL), rt.allocate(N, hrx.gpu_local(1))
        c, h = rt.allocate(N, hrx.gpu_local(1)), rt.allocate(N, hrx.HOST_VISIBLE)
        graph = rt.graph("lanes")
        graph.fill(a.view(), 1)  # compute of GPU 0
        graph.fill(b.view(), 2)  # compute of GPU 1: another region
        graph.copy(c.view(), a.view())  # between GPUs: upload of GPU 1, alone
        graph.copy(b.view(0, 8), h.view(0, 8))  # an upload to GPU 1: not joined to the copy
        graph.copy(h.view(), c.view())  # download of GPU 1
        prepared = graph.prepare()
        keys = [region.queue_key for region in prepared.regions]
        assert keys == [
            (hrx.Lane.COMPUTE, 0),
            (hrx.Lane.COMPUTE, 1),
            (hrx.Lane.UPLOAD, 1),
            (hrx.Lane.UPLOAD, 1),
            (hrx.Lane.DOWNLOAD, 1),
        ]
        before = rt.statistics()
        await prepared.submit()
        assert await read(h) == b"\x01" * N
        after = rt.statistics()
        assert after.device_copied_bytes - before.device_copied_bytes == N  # between GPUs
        assert after.uploaded_bytes - before.uploaded_bytes == 8


async def test_a_kernel_runs_on_one_gpus_memory() -> None:
    async with two_gpus() as rt:
        a, b = rt.allocate(N, hrx.GPU_LOCAL), rt.allocate(N, hrx.gpu_local(1))
        copy = kernel(
            rt,
            "copy",
            lambda src, dst: dst.__setitem__(slice(None), src),
            [hrx.Binding(N, hrx.Access.READ), hrx.Binding(N, hrx.Access.WRITE)],
        )
        graph = rt.graph("mixed")
        with pytest.raises(ContractError, match="more than one GPU"):
            graph.gpu(copy, [a.view(), b.view()])
        assert len(graph) == 0
        graph.gpu(copy, [b.view(), rt.allocate(N, hrx.gpu_local(1)).view()])
        assert [r.queue_key for r in graph.prepare().regions] == [(hrx.Lane.COMPUTE, 1)]


async def test_the_two_gpus_compute_lanes_run_at_once() -> None:
    """Each kernel waits at a barrier for the other: only two lanes running together pass."""
    barrier = threading.Barrier(2, timeout=5)

    def meet(out: np.ndarray) -> None:
        barrier.wait()
        out[:] = 9

    async with two_gpus() as rt:
        meeting = kernel(rt, "meet", meet)
        a, b = rt.allocate(N, hrx.GPU_LOCAL), rt.allocate(N, hrx.gpu_local(1))
        graph = rt.graph("both")
        graph.gpu(meeting, [a.view()])
        graph.gpu(meeting, [b.view()])
        prepared = graph.prepare()
        assert prepared.edges == frozenset()
        rt.start_trace()
        await prepared.submit()
        trace = rt.finish_trace()
    assert trace is not None
    assert {(e.lane, e.device) for e in trace.events} == {
        (hrx.Lane.COMPUTE, 0),
        (hrx.Lane.COMPUTE, 1),
    }
    assert trace.overlap_us(hrx.Lane.COMPUTE, hrx.Lane.COMPUTE, 0, 1) > 0


# -- ordering across GPUs --------------------------------------------------------------------


def slow_fill(value: int, seconds: float = 0.05) -> Any:
    def body(out: np.ndarray) -> None:
        time.sleep(seconds)
        out[:] = value

    return body


async def test_work_on_the_second_gpu_waits_for_the_first_gpus_writer() -> None:
    """Submission 1 writes GPU 0's memory slowly; submission 2 copies it to GPU 1 and
    computes there; submission 3 overwrites the source. The copy sees 5, never 7 or 0."""
    async with two_gpus() as rt:
        a, b = rt.allocate(N, hrx.GPU_LOCAL), rt.allocate(N, hrx.gpu_local(1))
        out = rt.allocate(N, hrx.HOST_VISIBLE)
        first = rt.graph("write")
        first.gpu(kernel(rt, "five", slow_fill(5)), [a.view()])
        second = rt.graph("move")
        second.copy(b.view(), a.view())
        add = kernel(
            rt,
            "add",
            lambda x: x.__iadd__(1),
            [hrx.Binding(N, hrx.Access.READ_WRITE)],
        )
        second.gpu(add, [b.view()])
        second.copy(out.view(), b.view())
        third = rt.graph("overwrite")
        third.gpu(kernel(rt, "seven", slow_fill(7, 0.0)), [a.view()])
        done = [first.prepare().submit(), second.prepare().submit(), third.prepare().submit()]
        for completion in done:
            await completion
        assert await read(out) == b"\x06" * N
        move_regions = second.prepare().regions
        assert [r.queue_key for r in move_regions] == [
            (hrx.Lane.UPLOAD, 1),
            (hrx.Lane.COMPUTE, 1),
            (hrx.Lane.DOWNLOAD, 1),
        ]


async def test_a_failure_on_one_gpu_poisons_what_the_other_gpu_reads() -> None:
    def boom(out: np.ndarray) -> None:
        raise RuntimeError("kernel fault")

    async with two_gpus() as rt:
        a, b = rt.allocate(N, hrx.GPU_LOCAL), rt.allocate(N, hrx.gpu_local(1))
        failing = rt.graph("fail")
        failing.gpu(kernel(rt, "boom", boom), [a.view()])
        move = rt.graph("move")
        move.copy(b.view(), a.view())
        fail, moved = failing.prepare().submit(), move.prepare().submit()
        with pytest.raises(ExecutionError):
            await fail
        with pytest.raises(hrx.HrxError):
            await moved
        assert a.poison is not None and b.poison is not None


async def test_traces_name_each_lanes_device_and_read_back() -> None:
    async with two_gpus() as rt:
        a, b = rt.allocate(N, hrx.GPU_LOCAL), rt.allocate(N, hrx.gpu_local(1))
        h = rt.allocate(N, hrx.HOST_VISIBLE)
        graph = rt.graph("trace")
        graph.copy(b.view(), a.view())
        graph.copy(h.view(), b.view())
        rt.start_trace()
        await graph.prepare().submit()
        trace = rt.finish_trace()
    assert trace is not None
    assert [e.lane_name for e in trace.events] == ["upload:1", "download:1"]
    chrome = trace.to_chrome()
    threads = {e["tid"]: e["args"]["name"] for e in chrome["traceEvents"] if e["ph"] == "M"}
    assert threads[int(hrx.Lane.UPLOAD) + 16] == "upload:1"
    again = ExecutionTrace.from_chrome(chrome)
    assert [(e.lane, e.device) for e in again.events] == [
        (hrx.Lane.UPLOAD, 1),
        (hrx.Lane.DOWNLOAD, 1),
    ]


async def test_single_launch_joins_one_gpus_work_only() -> None:
    async with two_gpus() as rt:
        a, b = rt.allocate(N, hrx.GPU_LOCAL), rt.allocate(N, hrx.gpu_local(1))
        h = rt.allocate(N, hrx.HOST_VISIBLE)
        spread = rt.graph("spread")
        spread.fill(a.view(), 1)
        spread.fill(b.view(), 2)
        with pytest.raises(ContractError, match="one device"):
            spread.prepare(single_launch=True)
        peer = rt.graph("peer")
        peer.copy(b.view(), a.view())
        with pytest.raises(ContractError, match="between GPUs"):
            peer.prepare(single_launch=True)
        local = rt.graph("local")
        local.fill(b.view(), 3)
        local.copy(h.view(), b.view())
        prepared = local.prepare(single_launch=True)
        assert [r.queue_key for r in prepared.regions] == [(hrx.Lane.COMPUTE, 1)]
        await prepared.submit()
        assert await read(h) == b"\x03" * N


async def test_gpu_access_takes_one_gpus_memory_and_names_it() -> None:
    async with two_gpus() as rt:
        a, b = rt.allocate(N, hrx.GPU_LOCAL), rt.allocate(N, hrx.gpu_local(1))
        with pytest.raises(ContractError, match="one GPU at a time"):
            async with rt.gpu_access([(a.view(), hrx.Access.READ), (b.view(), hrx.Access.WRITE)]):
                pass
        async with rt.gpu_access([(b.view(), hrx.Access.WRITE)]) as access:
            assert access.gpu == 1
            assert access.arrays is not None
            access.arrays[0][:] = 5
        h = rt.allocate(N, hrx.HOST_VISIBLE)
        graph = rt.graph("after-access")
        graph.copy(h.view(), b.view())
        await graph.prepare().submit()
        assert await read(h) == b"\x05" * N
