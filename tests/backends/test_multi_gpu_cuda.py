"""Several CUDA GPUs in one runtime. Skipped without CUDA; the runtime tests need two
devices, the backend test runs on one (two per-device backends over the same GPU check the
routing, the event waits between devices' streams and the per-device kernels)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest

import hrx_async as hrx
from hrx_async._core.lane import Lane
from hrx_async.backends import probe

pytestmark = [pytest.mark.cuda, pytest.mark.anyio]

N = 1 << 16
ADD_CXX = r"""
extern "C" __global__ void add(const unsigned char* x, unsigned char* y, unsigned int n,
                               unsigned int k) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = (unsigned char)(x[i] + k);
}
"""


@functools.cache
def cuda_devices() -> int:
    try:
        if not probe("cuda").get("available"):
            return 0
        from cuda.bindings import runtime

        status, count = runtime.cudaGetDeviceCount()
        return int(count) if not status else 0
    except Exception:
        return 0


needs_cuda = pytest.mark.skipif(cuda_devices() < 1, reason="no CUDA device answers here")
needs_two = pytest.mark.skipif(cuda_devices() < 2, reason="fewer than two CUDA devices here")


def add_kernel(rt: hrx.Runtime, k: int) -> hrx.GpuKernel:
    contract = hrx.KernelContract(
        [hrx.Binding(N, hrx.Access.READ), hrx.Binding(N, hrx.Access.WRITE)],
        hrx.Constants().u32(N).u32(k),
    )
    source = hrx.KernelSource(cxx=ADD_CXX)
    return rt.load_gpu_kernel(source, "add", ((N + 255) // 256,), (256,), contract)


async def write(buffer: hrx.Buffer, data: bytes) -> None:
    async with buffer.map_write() as memory:
        memory[:] = data


async def read(buffer: hrx.Buffer) -> bytes:
    async with buffer.map_read() as memory:
        return bytes(memory)


@needs_two
async def test_a_pipeline_across_two_gpus_is_ordered_and_correct() -> None:
    rng = np.random.default_rng(7)
    data = rng.integers(0, 200, N, dtype=np.uint8).tobytes()
    async with hrx.Runtime(backend="cuda", devices=[0, 1], npu=None) as rt:
        assert [g.index for g in rt.gpus()] == [0, 1]
        host_in, host_out = rt.allocate(N, hrx.HOST_VISIBLE), rt.allocate(N, hrx.HOST_VISIBLE)
        a0, b0 = rt.allocate(N, hrx.GPU_LOCAL), rt.allocate(N, hrx.GPU_LOCAL)
        a1, b1 = rt.allocate(N, hrx.gpu_local(1)), rt.allocate(N, hrx.gpu_local(1))
        add = add_kernel(rt, 3)
        graph = rt.graph("two-gpus")
        graph.copy(a0.view(), host_in.view())
        graph.gpu(add, [a0.view(), b0.view()])  # on GPU 0
        graph.copy(a1.view(), b0.view())  # GPU 0 -> GPU 1
        graph.gpu(add, [a1.view(), b1.view()])  # on GPU 1
        graph.copy(host_out.view(), b1.view())
        prepared = graph.prepare()
        assert [r.queue_key for r in prepared.regions] == [
            (Lane.UPLOAD, 0),
            (Lane.COMPUTE, 0),
            (Lane.UPLOAD, 1),
            (Lane.COMPUTE, 1),
            (Lane.DOWNLOAD, 1),
        ]
        expected = (np.frombuffer(data, np.uint8) + 6).tobytes()
        for round_ in range(20):
            payload = data if round_ % 2 == 0 else bytes(reversed(data))
            await write(host_in, payload)
            await prepared.submit()
            assert await read(host_out) == (
                expected if round_ % 2 == 0 else (np.frombuffer(payload, np.uint8) + 6).tobytes()
            )
        info = rt._backend.describe() if rt._backend is not None else {}
        assert len(info["devices"]) == 2


@needs_two
async def test_native_code_and_adopted_arrays_on_the_second_gpu() -> None:
    cupy = pytest.importorskip("cupy")
    async with hrx.Runtime(backend="cuda", devices=[0, 1], npu=None) as rt:
        second, host = rt.allocate(N, hrx.gpu_local(1)), rt.allocate(N, hrx.HOST_VISIBLE)
        async with rt.gpu_access([(second.view(), hrx.Access.WRITE)]) as access:
            assert access.gpu == 1 and access.stream is not None
            with cupy.cuda.Device(rt.gpu(access.gpu).index):
                memory = cupy.cuda.UnownedMemory(access.pointers[0], N, second, device_id=1)
                array = cupy.ndarray((N,), cupy.uint8, cupy.cuda.MemoryPointer(memory, 0))
                with cupy.cuda.ExternalStream(access.stream):
                    array.fill(9)  # queued on GPU 1's interop stream, ordered before below
        graph = rt.graph("after-native")
        graph.copy(host.view(), second.view())
        await graph.prepare().submit()
        assert await read(host) == b"\x09" * N
        with cupy.cuda.Device(1):
            foreign = cupy.full((N,), 4, dtype=cupy.uint8)
        adopted = rt.adopt_gpu_buffer(foreign, hrx.gpu_local(1))
        graph = rt.graph("adopted")
        graph.copy(host.view(), adopted.view())
        await graph.prepare().submit()
        assert await read(host) == b"\x04" * N


@needs_cuda
def test_the_several_gpu_backend_routes_and_waits_between_devices() -> None:
    from hrx_async._core.ops import Copy, Fill
    from hrx_async.backends.cuda import open_backend
    from hrx_async.backends.multi_gpu import MultiGpuBackend

    backend = MultiGpuBackend([open_backend(0), open_backend(0)])
    try:

        class Buffer:
            def __init__(self, storage: Any) -> None:
                self.storage = storage

        class View:
            def __init__(self, storage: Any) -> None:
                self.buffer = Buffer(storage)
                self.offset = 0
                self.nbytes = N

        first = backend.allocate(N, hrx.GPU_LOCAL)
        second = backend.allocate(N, hrx.gpu_local(1))
        host = backend.allocate(N, hrx.HOST_VISIBLE)
        fill = backend.prepare_region(Lane.COMPUTE, [Fill(View(first), 42)], 0)  # type: ignore[arg-type]
        move = backend.prepare_region(Lane.UPLOAD, [Copy(View(second), View(first))], 1)  # type: ignore[arg-type]
        down = backend.prepare_region(Lane.DOWNLOAD, [Copy(View(host), View(second))], 1)  # type: ignore[arg-type]
        queues = [
            backend.queue((Lane.COMPUTE, 0)),
            backend.queue((Lane.UPLOAD, 1)),
            backend.queue((Lane.DOWNLOAD, 1)),
        ]
        assert queues[0] is backend.queue((Lane.COMPUTE, 0))
        fence = queues[0].submit(fill, [], lambda: None)
        fence = queues[1].submit(move, [fence], lambda: None)
        fence = queues[2].submit(down, [fence], lambda: None)
        assert fence.wait(10) and fence.error() is None
        assert bytes(backend.host_array(host, 0, N)) == b"\x2a" * N
        assert second.device == 0 and backend.native_graphs_prepared == 1
        for storage in (first, second, host):
            backend.free(storage)
    finally:
        backend.close()
