"""The CUDA backend on a real GPU: memory, native graphs, NVRTC kernels, fences, errors.

Skipped where no CUDA device answers (CI). The parts that need no GPU (how an
unavailable backend is reported) run everywhere.
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hrx_async as hrx
from hrx_async._core.lane import Lane
from hrx_async.backends import open_gpu_backend, probe
from hrx_async.backends.kernel_cache import KernelCache

U8 = np.ndarray[Any, np.dtype[np.uint8]]


@functools.cache
def cuda_usable() -> bool:
    try:
        return bool(probe("cuda").get("available"))
    except Exception:
        return False


cuda_only = pytest.mark.skipif(not cuda_usable(), reason="no CUDA device answers here")

SCALE_CXX = r"""
extern "C" __global__ void scale(const float* x, float* y, unsigned int n, float a,
                                 unsigned long long tag) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * a + (float)(tag % 7ull) + OFFSET;
}
"""


def scale_contract(n: int, a: float = 2.0, tag: int = 10) -> hrx.KernelContract:
    return hrx.KernelContract(
        [hrx.Binding(n * 4, hrx.Access.READ), hrx.Binding(n * 4, hrx.Access.WRITE)],
        hrx.Constants().u32(n).f32(a).u64(tag),
    )


def load_scale(rt: hrx.Runtime, n: int, **changes: Any) -> hrx.GpuKernel:
    options: dict[str, Any] = {
        "grid": ((n + 255) // 256,),
        "block": (256,),
        "contract": scale_contract(n),
        "defines": {"OFFSET": "0.5f"},
    }
    options.update(changes)
    return rt.load_gpu_kernel(hrx.KernelSource(cxx=SCALE_CXX), "scale", **options)


@pytest.fixture
def kernel_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "hrx_async"


def test_unavailable_cuda_says_why_and_auto_falls_back() -> None:
    if cuda_usable():
        pytest.skip("a CUDA device answers here")
    with pytest.raises(hrx.BackendUnavailable) as caught:
        open_gpu_backend("cuda")
    assert caught.value.backend == "cuda" and caught.value.reason
    backend, skipped = open_gpu_backend("auto")
    try:
        assert backend.name in ("sim", "hip")
        assert any("cuda" in reason for reason in skipped)
    finally:
        backend.close()
    info = probe("cuda")
    assert info["available"] is False and info["reason"]


pytestmark = pytest.mark.anyio


@pytest.mark.cuda
@cuda_only
async def test_describe_names_the_device() -> None:
    async with hrx.Runtime(backend="cuda") as rt:
        info = rt._backend_or_raise().describe()
        major, minor = info["compute_capability"].split(".")
        assert rt.gpu().target == f"sm_{major}{minor}" == info["target"]
        assert info["name"] and info["memory_total_bytes"] > 0
        assert info["driver_version"] and info["cuda_bindings"]


def _apply(n: int, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return x * np.float32(2.0) + np.float32(10 % 7) + np.float32(0.5)


@pytest.mark.cuda
@cuda_only
@pytest.mark.usefixtures("kernel_cache_dir")
async def test_upload_kernel_download_in_native_graphs_with_constants_split() -> None:
    n = 10_000
    async with hrx.Runtime(backend="cuda") as rt:
        host_in = rt.allocate(n * 4, hrx.HOST_VISIBLE)
        host_out = rt.allocate(n * 4, hrx.HOST_VISIBLE)
        x = rt.allocate(n * 4, hrx.GPU_LOCAL)
        y = rt.allocate(n * 4, hrx.GPU_LOCAL)
        kernel = load_scale(rt, n)
        graph = rt.graph("step")
        graph.copy(x.view(), host_in.view())
        graph.fill(y.view(), 0)
        graph.gpu(kernel, [x.view(), y.view()])
        graph.copy(host_out.view(), y.view())
        before = rt.statistics()
        step = graph.prepare()
        stats = rt.statistics()
        assert [r.lane for r in step.regions] == [Lane.UPLOAD, Lane.COMPUTE, Lane.DOWNLOAD]
        assert stats.native_graphs_prepared == before.native_graphs_prepared + 1
        assert [p.native_graph for p in step.programs] == [False, True, False]
        for round_ in range(3):
            values = np.arange(n, dtype=np.float32) * (round_ + 1)
            async with host_in.map_write() as memory:
                np.frombuffer(memory, np.float32)[:] = values
            await step.submit()
            async with host_out.map_read() as memory:
                out = np.frombuffer(memory, np.float32).copy()
            np.testing.assert_array_equal(out, _apply(n, values))
        stats = rt.statistics()
        assert stats.copy_streams_created == 2
        assert stats.uploaded_bytes == stats.downloaded_bytes == 3 * n * 4


@pytest.mark.cuda
@cuda_only
async def test_memory_starts_zeroed_and_fills_reach_every_placement() -> None:
    async with hrx.Runtime(backend="cuda") as rt:
        buffers = [
            rt.allocate(4096, placement)
            for placement in (hrx.GPU_LOCAL, hrx.HOST_VISIBLE, hrx.shared(0), hrx.npu_local(0))
        ]
        staging = rt.allocate(4096, hrx.HOST_VISIBLE)
        for buffer in buffers[1:]:
            async with buffer.map_read() as memory:
                assert bytes(memory) == bytes(4096)
        for value, buffer in enumerate(buffers, start=1):
            graph = rt.graph("fill")
            graph.fill(buffer.view(100, 1000), value)
            graph.copy(staging.view(), buffer.view(), lane=Lane.COMPUTE)
            await graph.prepare().submit()
            async with staging.map_read() as memory:
                data = np.frombuffer(memory, np.uint8)
                assert (data[100:1100] == value).all() and not data[:100].any()
                assert not data[1100:].any()


@pytest.mark.cuda
@cuda_only
async def test_shared_memory_is_used_by_gpu_and_sim_npu_without_copies() -> None:
    n = 8192
    async with hrx.Runtime(backend="cuda") as rt:
        shared = rt.allocate(n, hrx.shared(0))
        result = rt.allocate(n, hrx.npu_local(0))

        def double(arrays: list[U8], constants: bytes) -> None:
            arrays[1][:] = arrays[0] * 2

        contract = hrx.KernelContract(
            [hrx.Binding(n, hrx.Access.READ, 1), hrx.Binding(n, hrx.Access.WRITE, 1)]
        )
        npu_kernel = rt.npu(0).load_artifact(hrx.KernelSource(host=double), "double", 1, contract)
        graph = rt.graph("shared")
        graph.fill(shared.view(), 21)
        graph.npu(npu_kernel, [shared.view(), result.view()])
        before = rt.statistics()
        prepared = graph.prepare()
        await prepared.submit()
        async with result.map_read() as memory:
            assert bytes(memory) == bytes([42]) * n
        after = rt.statistics()
        assert after.copied_bytes == before.copied_bytes == 0
        assert after.imports == 1


@pytest.mark.cuda
@cuda_only
async def test_kernels_load_from_cache_and_from_binaries(kernel_cache_dir: Path) -> None:
    from hrx_async.backends import cuda

    n = 256
    async with hrx.Runtime(backend="cuda") as rt:
        target = rt.gpu().target
        load_scale(rt, n)
        cache = KernelCache()
        (entry,) = cache.entries()
        assert entry.parent.parent == kernel_cache_dir
        entry.write_bytes(entry.read_bytes()[:-3])  # truncated: must be rebuilt
        load_scale(rt, n)
        assert cache.load(entry.stem) is not None
        load_scale(rt, n, defines={"OFFSET": "1.5f"})
        assert len(cache.entries()) == 2

        options = cuda.compile_options(target, {"OFFSET": "0.0f"})
        cubin = cuda.compile_cxx(SCALE_CXX, "scale", options)
        path = kernel_cache_dir.parent / "scale.cubin"
        path.write_bytes(cubin)
        kernel = rt.load_gpu_kernel(
            hrx.KernelSource(binary={target: path}),
            "scale",
            grid=(1,),
            block=(n,),
            contract=scale_contract(n, a=3.0, tag=0),
        )
        host = rt.allocate(n * 4, hrx.HOST_VISIBLE)
        out = rt.allocate(n * 4, hrx.HOST_VISIBLE)
        async with host.map_write() as memory:
            np.frombuffer(memory, np.float32)[:] = np.arange(n)
        graph = rt.graph("binary")
        graph.gpu(kernel, [host.view(), out.view()])
        await graph.prepare().submit()
        async with out.map_read() as memory:
            np.testing.assert_array_equal(
                np.frombuffer(memory, np.float32), np.arange(n, dtype=np.float32) * 3
            )


@pytest.mark.cuda
@cuda_only
@pytest.mark.usefixtures("kernel_cache_dir")
async def test_contract_is_checked_against_kernel_metadata() -> None:
    n = 256
    async with hrx.Runtime(backend="cuda") as rt:
        short = hrx.KernelContract(
            [hrx.Binding(n * 4, hrx.Access.READ), hrx.Binding(n * 4, hrx.Access.WRITE)],
            hrx.Constants().u32(n).f32(1.0),
        )
        with pytest.raises(hrx.ContractError, match=r"metadata and contract disagree.*16 bytes"):
            load_scale(rt, n, contract=short)
        too_many = hrx.KernelContract([hrx.Binding(n * 4, hrx.Access.READ)] * 6)
        with pytest.raises(hrx.ContractError, match="takes 5 parameters, the contract has 6"):
            load_scale(rt, n, contract=too_many)
        scalar_as_pointer = hrx.KernelContract([hrx.Binding(n * 4, hrx.Access.READ)] * 3)
        with pytest.raises(hrx.ContractError, match="parameter 2 is 4 bytes"):
            load_scale(rt, n, contract=scalar_as_pointer)
        with pytest.raises(hrx.ContractError, match="at most"):
            load_scale(rt, n, block=(2048,))
        with pytest.raises(hrx.ContractError, match='extern "C"'):
            rt.load_gpu_kernel(
                hrx.KernelSource(cxx=SCALE_CXX),
                "scale_",
                (1,),
                (32,),
                scale_contract(n),
                defines={"OFFSET": "0"},
            )
        with pytest.raises(hrx.CompileError) as caught:
            rt.load_gpu_kernel(
                hrx.KernelSource(cxx=SCALE_CXX), "scale", (1,), (32,), scale_contract(n)
            )
        assert "OFFSET" in caught.value.diagnostics
        with pytest.raises(hrx.Unsupported, match="no C\\+\\+ source"):
            rt.load_gpu_kernel(
                hrx.KernelSource(host=lambda a, c: None), "scale", (1,), (32,), scale_contract(n)
            )


@pytest.mark.cuda
@cuda_only
async def test_failed_native_call_is_a_clear_backend_error_and_changes_nothing() -> None:
    async with hrx.Runtime(backend="cuda", memory_budget=1 << 62) as rt:
        before = rt.statistics()
        with pytest.raises(hrx.BackendError) as caught:
            rt.allocate(1 << 60, hrx.GPU_LOCAL)
        error = caught.value
        assert (error.backend, error.operation) == ("cuda", "cudaMalloc")
        assert str(error.code).startswith("cudaError") and error.message
        assert getattr(error, "sticky", None) is False
        assert rt.statistics() == before
        assert rt.memory_budget is not None and rt.memory_budget.reserved_bytes == 0
        assert rt.healthy


@pytest.mark.cuda
@cuda_only
async def test_fences_finish_by_query_or_waiter_thread_once() -> None:
    async with hrx.Runtime(backend="cuda") as rt:
        backend = rt._backend_or_raise()
        assert backend.poll_budget_us > 0
        buffer = rt.allocate(1 << 20, hrx.GPU_LOCAL)
        graph = rt.graph("fill")
        graph.fill(buffer.view(), 3)
        prepared = graph.prepare()
        queue = backend.queue((Lane.COMPUTE, 0))
        calls: list[str] = []
        fences = [queue.submit(prepared.programs[0], [], lambda: None) for _ in range(50)]
        for fence in fences:
            fence.add_done_callback(lambda f: calls.append(threading.current_thread().name))
        assert fences[-1].wait(10)
        while not all(f.query() for f in fences):
            pass
        assert len(calls) == 50
        assert all(f.error() is None and not f.skipped() for f in fences)
        assert all(f.finished_at is not None and f.started_at is not None for f in fences)
        late: list[object] = []
        fences[0].add_done_callback(late.append)
        assert late == [fences[0]]
        skipped = queue.submit(
            prepared.programs[0], [], lambda: hrx.Cancelled("cancelled before it started")
        )
        failed = queue.submit(prepared.programs[0], [], lambda: RuntimeError("refused"))
        assert skipped.query() and skipped.skipped() and skipped.error() is None
        assert failed.query() and isinstance(failed.error(), RuntimeError)


@pytest.mark.cuda
@cuda_only
async def test_cross_lane_chains_pipeline_in_order() -> None:
    n = 1 << 16
    async with hrx.Runtime(backend="cuda") as rt:
        host = rt.allocate(n, hrx.HOST_VISIBLE)
        result = rt.allocate(n, hrx.HOST_VISIBLE)
        device = rt.allocate(n, hrx.GPU_LOCAL)
        steps = []
        for value in range(1, 9):
            graph = rt.graph(f"v{value}")
            graph.fill(device.view(), value)
            graph.copy(result.view(), device.view())
            graph.copy(host.view(n // 2, n // 2), result.view(0, n // 2), lane=Lane.UPLOAD)
            steps.append(graph.prepare())
        completions = [step.submit() for step in steps for _ in range(4)]
        for completion in completions:
            await completion
        async with result.map_read() as memory:
            assert bytes(memory) == bytes([8]) * n
        async with host.map_read() as memory:
            assert bytes(memory)[n // 2 :] == bytes([8]) * (n // 2)


@pytest.mark.cuda
@cuda_only
async def test_external_pytorch_work_runs_on_the_lane_stream_in_order() -> None:
    """`Graph.external` with PyTorch: the work is enqueued on the compute lane's stream through
    `torch.cuda.ExternalStream` over DLPack tensors, between the upload and the download."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device")
    n = 1 << 16
    async with hrx.Runtime(backend="cuda", npu=None) as rt:
        host_in = rt.allocate(n, hrx.HOST_VISIBLE)
        host_out = rt.allocate(n, hrx.HOST_VISIBLE)
        x = rt.allocate(n, hrx.GPU_LOCAL)
        y = rt.allocate(n, hrx.GPU_LOCAL)

        def triple(stream: int, tensors: list[Any]) -> None:
            with torch.cuda.stream(torch.cuda.ExternalStream(stream)):
                source, target = (torch.from_dlpack(t) for t in tensors)
                torch.mul(source, 3, out=target)

        graph = rt.graph("torch-region")
        graph.copy(x.view(), host_in.view())
        graph.external(triple, [(x.view(), hrx.Access.READ), (y.view(), hrx.Access.WRITE)])
        graph.copy(host_out.view(), y.view())
        prepared = graph.prepare()
        pattern = (np.arange(n) % 81).astype(np.uint8)
        for shift in (0, 1):
            async with host_in.map_write() as memory:
                np.frombuffer(memory, np.uint8)[:] = pattern + shift
            await prepared.submit()
            async with host_out.map_read() as memory:
                got = np.frombuffer(memory, np.uint8).copy()
            np.testing.assert_array_equal(got, ((pattern + shift) * 3).astype(np.uint8))
