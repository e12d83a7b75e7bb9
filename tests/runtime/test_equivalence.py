"""Random graphs submitted concurrently give the bytes of a sequential replay in admission order."""

from __future__ import annotations

import random
from dataclasses import dataclass

import anyio
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hrx_async as hrx
from tests.helpers import load_mix, load_npu_mix, mix_numpy, read_bytes, write_bytes

SIZE = 96
KERNEL_SIZES = (8, 16, 32)
PLACEMENTS = {
    "h0": hrx.HOST_VISIBLE,
    "h1": hrx.HOST_VISIBLE,
    "g0": hrx.GPU_LOCAL,
    "g1": hrx.GPU_LOCAL,
    "n0": hrx.npu_local(0),
    "s0": hrx.shared(0),
}
GPU_BINDABLE = ["h0", "h1", "g0", "g1", "s0"]
NPU_BINDABLE = ["n0", "s0"]
HOST_MAPPABLE = ["h0", "h1", "n0", "s0"]


@dataclass(frozen=True)
class Op:
    kind: str
    dst: str
    dst_offset: int
    nbytes: int
    src: str = ""
    src_offset: int = 0
    value: int = 0


def _disjoint(a: str, ao: int, b: str, bo: int, n: int) -> bool:
    return a != b or ao + n <= bo or bo + n <= ao


@st.composite
def ops(draw: st.DrawFn) -> Op:
    kind = draw(st.sampled_from(["fill", "copy", "gpu", "npu", "host"]))
    if kind in ("gpu", "npu"):
        names = GPU_BINDABLE if kind == "gpu" else NPU_BINDABLE
        n = draw(st.sampled_from(KERNEL_SIZES))
    else:
        names = list(PLACEMENTS) if kind != "host" else HOST_MAPPABLE
        n = draw(st.integers(1, 40))
    dst = draw(st.sampled_from(names))
    dst_offset = draw(st.integers(0, SIZE - n))
    if kind in ("fill", "host"):
        return Op(kind, dst, dst_offset, n, value=draw(st.integers(0, 255)))
    src = draw(st.sampled_from(names))
    src_offset = draw(st.integers(0, SIZE - n))
    if not _disjoint(dst, dst_offset, src, src_offset, n):
        src_offset = (dst_offset + n) % (SIZE - n + 1)
        if not _disjoint(dst, dst_offset, src, src_offset, n):
            return Op("fill", dst, dst_offset, n, value=draw(st.integers(0, 255)))
    return Op(kind, dst, dst_offset, n, src, src_offset)


graphs = st.lists(st.lists(ops(), min_size=1, max_size=6), min_size=1, max_size=6)


def apply(memory: dict[str, np.ndarray], op: Op) -> None:
    dst = memory[op.dst][op.dst_offset : op.dst_offset + op.nbytes]
    if op.kind == "fill":
        dst[:] = op.value
    elif op.kind == "host":
        dst += np.uint8(op.value)
    else:
        src = memory[op.src][op.src_offset : op.src_offset + op.nbytes].copy()
        if op.kind == "copy":
            dst[:] = src
        else:
            mix_numpy(src, dst)


def _add_value(value: int) -> object:
    def host_add(array: np.ndarray) -> None:
        array += np.uint8(value)

    return host_add


async def run_case(
    backend: str, graph_ops: list[list[Op]], seed: int, single_launch: frozenset[int] = frozenset()
) -> None:
    """`single_launch`: the graphs (by index) prepared with `single_launch=True`."""
    rng = random.Random(seed)
    async with hrx.Runtime(backend=backend) as rt:
        buffers = {name: rt.allocate(SIZE, p, label=name) for name, p in PLACEMENTS.items()}
        initial = {name: np.zeros(SIZE, np.uint8) for name in PLACEMENTS}
        for name in HOST_MAPPABLE:
            initial[name] = np.frombuffer(rng.randbytes(SIZE), np.uint8).copy()
            await write_bytes(buffers[name], initial[name].tobytes())
        gpu_kernels = {n: load_mix(rt, n) for n in KERNEL_SIZES}
        npu_kernels = {n: load_npu_mix(rt, n) for n in KERNEL_SIZES}

        def view(name: str, offset: int, n: int) -> hrx.View:
            return buffers[name].view(offset, n)

        prepared = []
        for index, graph_ops_i in enumerate(graph_ops):
            graph = rt.graph(f"g{index}")
            for op in graph_ops_i:
                dst = view(op.dst, op.dst_offset, op.nbytes)
                if op.kind == "fill":
                    graph.fill(dst, op.value)
                elif op.kind == "host":
                    graph.host(_add_value(op.value), [(dst, hrx.Access.READ_WRITE)])  # type: ignore[arg-type]
                elif op.kind == "copy":
                    graph.copy(dst, view(op.src, op.src_offset, op.nbytes))
                elif op.kind == "gpu":
                    graph.gpu(gpu_kernels[op.nbytes], [view(op.src, op.src_offset, op.nbytes), dst])
                else:
                    graph.npu(npu_kernels[op.nbytes], [view(op.src, op.src_offset, op.nbytes), dst])
            prepared.append(graph.prepare(single_launch=index in single_launch))

        admitted: list[int] = []
        completions: list[hrx.Completion] = []
        plans = [[rng.randrange(len(prepared)) for _ in range(rng.randint(1, 6))] for _ in range(8)]

        async def submitter(plan: list[int], task_seed: int) -> None:
            local = random.Random(task_seed)
            for graph_index in plan:
                completion = prepared[graph_index].submit()
                admitted.append(graph_index)
                completions.append(completion)
                if local.random() < 0.5:
                    await anyio.sleep(0)
                if local.random() < 0.2:
                    await completion

        async with anyio.create_task_group() as tg:
            for task_index, plan in enumerate(plans):
                tg.start_soon(submitter, plan, seed + task_index)
        for completion in completions:
            await completion

        expected = {name: array.copy() for name, array in initial.items()}
        for graph_index in admitted:
            for op in graph_ops[graph_index]:
                apply(expected, op)
        for name, buffer in buffers.items():
            actual = np.frombuffer(await read_bytes(rt, buffer), np.uint8)
            mismatch = np.flatnonzero(actual != expected[name])
            assert mismatch.size == 0, f"{name} differs at bytes {mismatch[:8]} (order {admitted})"


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(graph_ops=graphs, seed=st.integers(0, 2**32 - 1))
def test_random_graphs_match_sequential_replay(
    hrx_backend: str, loop: str, graph_ops: list[list[Op]], seed: int
) -> None:
    anyio.run(run_case, hrx_backend, graph_ops, seed, backend=loop)
