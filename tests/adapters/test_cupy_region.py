"""`hrx_async.cupy.region`: CuPy work over typed views, on `sim` (numpy arrays over the
runtime's memory) and, marked `cuda`, on a GPU, checked against numpy. Skipped where CuPy
is missing."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

import hrx_async as hrx
from tests.helpers import read_bytes, write_bytes

cupy = pytest.importorskip("cupy")
hrx_cupy = pytest.importorskip("hrx_async.cupy")

pytestmark = pytest.mark.anyio


def needs_cupy_for(backend: str) -> None:
    if backend == "hip":
        pytest.skip("the CuPy adapter drives CUDA streams")
    if backend == "cuda":
        try:
            if cupy.cuda.runtime.getDeviceCount() < 1:
                pytest.skip("CuPy sees no GPU")
        except cupy.cuda.runtime.CUDARuntimeError:
            pytest.skip("CuPy sees no GPU")


def affine(x: Any, scale: Any, y: Any) -> None:
    """Written once for numpy (sim) and CuPy (CUDA); the temporary `x * scale` comes from the
    array library's own allocator."""
    xp = cupy.get_array_module(x)
    xp.add(x * scale[0], 7, out=y)


async def test_a_region_computes_what_numpy_does_between_hrx_copies(hrx_backend: str) -> None:
    needs_cupy_for(hrx_backend)
    rows, cols = 64, 256
    nbytes = rows * cols * 4
    async with hrx.Runtime(backend=hrx_backend, npu=None) as rt:
        host_in, host_out = (rt.allocate(nbytes, hrx.HOST_VISIBLE) for _ in range(2))
        host_scale = rt.allocate(8, hrx.HOST_VISIBLE)
        x, y = rt.allocate(nbytes, hrx.GPU_LOCAL), rt.allocate(nbytes, hrx.GPU_LOCAL)
        scale = rt.allocate(8, hrx.GPU_LOCAL)
        graph = rt.graph("cupy-between")
        graph.copy(x.view(), host_in.view())
        graph.copy(scale.view(), host_scale.view())
        hrx_cupy.region(
            graph,
            affine,
            reads=[(x.view(), np.float32, (rows, cols)), (scale.view(), "float64")],
            writes=[(y.view(), np.float32, (rows, cols))],
        )
        graph.copy(host_out.view(), y.view())
        prepared = graph.prepare()
        rng = np.random.default_rng(11)
        for factor in (2.0, -0.5):
            values = rng.standard_normal((rows, cols)).astype(np.float32)
            await write_bytes(host_in, values.tobytes())
            await write_bytes(host_scale, np.float64(factor).tobytes())
            await prepared.submit()
            got = np.frombuffer(await read_bytes(rt, host_out), np.float32).reshape(rows, cols)
            np.testing.assert_allclose(got, values * factor + 7, rtol=1e-6, atol=1e-5)


async def test_a_failing_region_fails_with_execution_error_and_poisons_its_writes(
    hrx_backend: str,
) -> None:
    needs_cupy_for(hrx_backend)
    async with hrx.Runtime(backend=hrx_backend, npu=None) as rt:
        x, y = rt.allocate(256, hrx.GPU_LOCAL), rt.allocate(256, hrx.GPU_LOCAL)

        def broken(source: Any, target: Any) -> None:
            target[...] = source.reshape(3, -1)  # 64 elements are no 3 rows

        graph = rt.graph("broken-cupy")
        hrx_cupy.region(graph, broken, reads=[(x.view(), "f4")], writes=[(y.view(), "f4")])
        with pytest.raises(hrx.ExecutionError, match="broken-cupy"):
            await graph.prepare().submit()
        assert y.poison is not None and x.poison is None


@pytest.mark.cuda
async def test_fn_runs_on_the_lane_stream_and_the_callers_stream_comes_back() -> None:
    """On CUDA, `fn` sees the lane's stream as CuPy's current stream on every replay, the
    caller's is current again afterwards, and making CuPy's stream object warns of nothing
    (CuPy deprecates `ExternalStream`, with a warning on every use)."""
    needs_cupy_for("cuda")
    async with hrx.Runtime(backend="cuda", npu=None) as rt:
        x, y = rt.allocate(1024, hrx.GPU_LOCAL), rt.allocate(1024, hrx.GPU_LOCAL)
        seen: list[int] = []

        def add(source: Any, target: Any) -> None:
            seen.append(cupy.cuda.get_current_stream().ptr)
            cupy.add(source, 1, out=target)

        graph = rt.graph("cupy-stream")
        hrx_cupy.region(graph, add, reads=[(x.view(), "f4")], writes=[(y.view(), "f4")])
        mine = cupy.cuda.Stream(non_blocking=True)
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            prepared = graph.prepare()
            await prepared.submit()
            with mine:
                await prepared.submit()
                assert cupy.cuda.get_current_stream().ptr == mine.ptr
        assert cupy.cuda.get_current_stream().ptr == cupy.cuda.Stream.null.ptr
        assert len(seen) == 2 and seen[0] == seen[1]
        assert seen[0] not in (cupy.cuda.Stream.null.ptr, mine.ptr)  # the lane's own stream
        got = np.frombuffer(await read_bytes(rt, y), np.float32)
        np.testing.assert_array_equal(got, np.ones(256, np.float32))


async def test_bad_declarations_are_refused_and_record_nothing() -> None:
    async with hrx.Runtime(backend="sim", npu=None) as rt:
        x = rt.allocate(64, hrx.GPU_LOCAL)
        graph = rt.graph("refusals")
        cases: list[tuple[dict[str, Any], str]] = [
            ({"writes": [(x.view(), None)]}, "None is not a dtype it knows"),
            ({"writes": [(x.view(), "no-such-type")]}, "not a dtype it knows"),
            ({"writes": [(x.view(), np.float64, 4)]}, "64 bytes, but float64 of shape"),
            ({}, "at least one of reads, updates or writes"),
        ]
        for options, message in cases:
            with pytest.raises(hrx.ContractError, match=message):
                hrx_cupy.region(graph, affine, **options)
        assert len(graph) == 0


async def test_read_arrays_on_sim_are_read_only_views_of_the_runtime_memory() -> None:
    async with hrx.Runtime(backend="sim", npu=None) as rt:
        x, y = rt.allocate(64, hrx.GPU_LOCAL), rt.allocate(64, hrx.GPU_LOCAL)
        seen: list[tuple[bool, bool, tuple[int, ...]]] = []

        def look(source: Any, target: Any) -> None:
            seen.append((source.flags.writeable, target.flags.writeable, target.shape))
            target[...] = source.astype(np.int32) - 1

        graph = rt.graph("sim-arrays")
        graph.fill(x.view(), 3)
        hrx_cupy.region(
            graph,
            look,
            reads=[(x.view(0, 16), np.uint8, (4, 4))],
            writes=[(y.view(), np.int32, (4, 4))],
        )
        await graph.prepare().submit()
        assert seen == [(False, True, (4, 4))]
        got = np.frombuffer(await read_bytes(rt, y), np.int32)
        np.testing.assert_array_equal(got, np.full(16, 2))
