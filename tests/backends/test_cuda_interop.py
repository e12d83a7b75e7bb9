"""Adopting and exporting buffers, and handing streams to native code.

The sim parts run everywhere; the PyTorch/CuPy/CUDA parts need a CUDA device.
"""

from __future__ import annotations

import gc
import importlib.util
import threading
from typing import Any

import anyio
import numpy as np
import pytest

import hrx_async as hrx
from hrx_async._runtime.interop import GpuAccess
from hrx_async.backends import probe

pytestmark = pytest.mark.anyio

U8 = np.ndarray[Any, np.dtype[np.uint8]]


def _cuda_usable() -> bool:
    try:
        return bool(probe("cuda").get("available"))
    except Exception:
        return False


cuda_only = pytest.mark.skipif(not _cuda_usable(), reason="no CUDA device answers here")


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


async def _fill(rt: hrx.Runtime, view: hrx.View, value: int) -> None:
    graph = rt.graph("fill")
    graph.fill(view, value)
    await graph.prepare().submit()


# -- sim ---------------------------------------------------------------------------------


async def test_sim_adopts_host_arrays_zero_copy_and_counts_imports() -> None:
    async with hrx.Runtime(backend="sim", memory_budget=1 << 20) as rt:
        array = np.zeros(1000, dtype=np.int32)
        before = rt.statistics()
        buffer = rt.adopt_gpu_buffer(array, label="adopted")
        after = rt.statistics()
        assert buffer.nbytes == 4000 and buffer.placement == hrx.GPU_LOCAL
        assert after.imports == before.imports + 1
        assert after.allocations == before.allocations
        assert rt.memory_budget is not None and rt.memory_budget.reserved_bytes == 4000
        await _fill(rt, buffer.view(0, 8), 1)
        assert array[0] == array[1] == 0x01010101 and array[2] == 0
        buffer.free()
        assert rt.memory_budget.reserved_bytes == 0


async def test_sim_adopting_own_memory_is_not_charged_twice() -> None:
    async with hrx.Runtime(backend="sim", memory_budget=8192) as rt:
        own = rt.allocate(4096, hrx.GPU_LOCAL)
        alias = rt.adopt_gpu_buffer(np.from_dlpack(own.view(1024, 1024)))
        assert rt.memory_budget is not None and rt.memory_budget.reserved_bytes == 4096
        await _fill(rt, alias.view(), 9)
        exported = np.from_dlpack(own.view())
        assert (exported[1024:2048] == 9).all() and not exported[:1024].any()


async def test_sim_adopt_rejects_bad_input_and_changes_nothing() -> None:
    class CudaOnly:
        @property
        def __cuda_array_interface__(self) -> dict[str, Any]:
            return {"shape": (4,), "typestr": "<f4", "data": (1, False)}

    async with hrx.Runtime(backend="sim", memory_budget=1 << 20) as rt:
        before = rt.statistics()
        with pytest.raises(hrx.Unsupported, match="backend='cuda'"):
            rt.adopt_gpu_buffer(CudaOnly())
        with pytest.raises(hrx.ContractError, match="C-contiguous"):
            rt.adopt_gpu_buffer(np.zeros((4, 4), np.float32)[:, 1])
        with pytest.raises(hrx.ContractError, match="read-only"):
            frozen = np.zeros(4)
            frozen.flags.writeable = False
            rt.adopt_gpu_buffer(frozen)
        with pytest.raises(hrx.ContractError, match="GPU_LOCAL or shared"):
            rt.adopt_gpu_buffer(np.zeros(4), hrx.HOST_VISIBLE)
        with pytest.raises(hrx.ContractError, match="names NPU 3"):
            rt.adopt_gpu_buffer(np.zeros(4), hrx.shared(3))
        assert rt.statistics() == before
        assert rt.memory_budget is not None and rt.memory_budget.reserved_bytes == 0


async def test_sim_exports_views_through_dlpack_zero_copy() -> None:
    async with hrx.Runtime(backend="sim") as rt:
        buffer = rt.allocate(64, hrx.HOST_VISIBLE)
        view = buffer.view(16, 32)
        assert view.__dlpack_device__() == (1, 0)
        exported = np.from_dlpack(view)
        assert exported.shape == (32,) and exported.dtype == np.uint8
        await _fill(rt, buffer.view(), 5)
        assert (exported == 5).all()
        async with buffer.map_write() as memory:
            memory[16] = 77
        assert exported[0] == 77
        with pytest.raises(BufferError, match="zero-copy"):
            view.__dlpack__(copy=True)


async def test_sim_gpu_access_waits_reserves_and_releases() -> None:
    async with hrx.Runtime(backend="sim") as rt:
        buffer = rt.allocate(4096, hrx.shared(0))
        other = rt.allocate(4096, hrx.GPU_LOCAL)
        release = threading.Event()

        def slow_write(arrays: list[U8], constants: bytes) -> None:
            release.wait(5)
            arrays[0][:] = 3

        kernel = rt.load_gpu_kernel(
            hrx.KernelSource(host=slow_write),
            "slow",
            (1,),
            (1,),
            hrx.KernelContract([hrx.Binding(4096, hrx.Access.WRITE)]),
        )
        graph = rt.graph("slow")
        graph.gpu(kernel, [buffer.view()])
        pending = graph.prepare().submit()
        entered: list[GpuAccess] = []

        async def native() -> None:
            async with rt.gpu_access(
                [(buffer.view(0, 16), hrx.Access.READ_WRITE), (other.view(), hrx.Access.READ)]
            ) as access:
                entered.append(access)
                assert access.stream is None and access.arrays is not None
                assert (access.arrays[0] == 3).all()  # the pending write finished first
                access.arrays[0][:] = 8
                assert not access.arrays[1].flags.writeable
                fill = rt.graph("conflict")
                fill.fill(buffer.view(2048, 16), 1)
                with pytest.raises(hrx.Busy, match="gpu_access"):
                    fill.prepare().submit()
                with pytest.raises(hrx.Busy):
                    buffer.map_read_nowait()

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(native)
            await anyio.sleep(0.05)
            assert not entered
            release.set()
        await pending
        assert entered and entered[0].arrays is not None
        assert entered[0].pointers[0] == entered[0].arrays[0].ctypes.data
        staging = rt.allocate(16, hrx.HOST_VISIBLE)
        copy = rt.graph("read")
        copy.copy(staging.view(), buffer.view(0, 16))
        await copy.prepare().submit()
        async with staging.map_read() as memory:
            assert bytes(memory) == bytes([8]) * 16


async def test_gpu_access_rejects_bad_input() -> None:
    async with (
        hrx.Runtime(backend="sim") as rt,
        hrx.Runtime(backend="sim") as other,
    ):
        buffer = rt.allocate(64, hrx.HOST_VISIBLE)
        local = rt.allocate(64, hrx.npu_local(0))
        foreign = other.allocate(64, hrx.GPU_LOCAL)
        cases: list[tuple[Any, str]] = [
            ([], "at least one"),
            ([buffer.view()], "pairs"),
            ([(foreign.view(), hrx.Access.READ)], "not a view of this runtime"),
            ([(local.view(), hrx.Access.READ)], "GPU cannot access"),
        ]
        for accesses, message in cases:
            with pytest.raises(hrx.ContractError, match=message):
                async with rt.gpu_access(accesses):
                    pass
        with pytest.raises(hrx.ContractError, match="stream"):
            async with rt.gpu_access([(buffer.view(), hrx.Access.READ)], stream=5):
                pass
        async with buffer.map_write():
            with pytest.raises(hrx.Busy, match="host mapping"):
                async with rt.gpu_access([(buffer.view(), hrx.Access.READ)]):
                    pass
        assert rt._mapping_count == 0


# -- CUDA with PyTorch and CuPy -----------------------------------------------------------


def _device_pointer(buffer: hrx.Buffer) -> int:
    return int(buffer.storage.device_pointer)


@pytest.mark.cuda
@cuda_only
@pytest.mark.skipif(not _has("torch"), reason="PyTorch is not installed")
async def test_torch_round_trips_zero_copy() -> None:
    import torch

    async with hrx.Runtime(backend="cuda") as rt:
        tensor = torch.arange(1024, dtype=torch.int32, device="cuda")
        pointer = tensor.data_ptr()
        before = rt.statistics()
        adopted = rt.adopt_gpu_buffer(tensor)
        assert rt.statistics().imports == before.imports + 1
        assert _device_pointer(adopted) == pointer and adopted.nbytes == 4096
        del tensor
        gc.collect()  # the buffer keeps the tensor's memory alive
        await _fill(rt, adopted.view(0, 16), 0xFF)

        exported = torch.from_dlpack(adopted.view())
        assert exported.device.type == "cuda" and exported.data_ptr() == pointer
        as_int = exported.view(torch.int32)
        assert as_int[:4].tolist() == [-1] * 4 and as_int[4:8].tolist() == [4, 5, 6, 7]

        own = rt.allocate(4096, hrx.GPU_LOCAL)
        await _fill(rt, own.view(), 2)
        mirror = torch.from_dlpack(own.view(1024, 1024))
        assert mirror.data_ptr() == _device_pointer(own) + 1024
        assert bool((mirror == 2).all())
        mirror.fill_(6)
        torch.cuda.synchronize()
        staging = rt.allocate(4096, hrx.HOST_VISIBLE)
        graph = rt.graph("read")
        graph.copy(staging.view(), own.view())
        await graph.prepare().submit()
        async with staging.map_read() as memory:
            data = np.frombuffer(memory, np.uint8)
            assert (data[1024:2048] == 6).all() and (data[:1024] == 2).all()


@pytest.mark.cuda
@cuda_only
@pytest.mark.skipif(not _has("cupy"), reason="CuPy is not installed")
async def test_cupy_round_trips_zero_copy_and_via_dlpack_only() -> None:
    import cupy

    class DlpackOnly:
        """Exposes an array through DLPack alone, like libraries without the CUDA interface."""

        def __init__(self, array: Any) -> None:
            self._array = array

        def __dlpack__(self, stream: Any = None) -> Any:
            return self._array.__dlpack__(stream=stream)

        def __dlpack_device__(self) -> Any:
            return self._array.__dlpack_device__()

    async with hrx.Runtime(backend="cuda", memory_budget=1 << 20) as rt:
        array = cupy.arange(256, dtype=cupy.float32)
        adopted = rt.adopt_gpu_buffer(array)
        assert _device_pointer(adopted) == array.data.ptr
        await _fill(rt, adopted.view(0, 4), 0)
        assert float(array[0]) == 0.0 and float(array[1]) == 1.0

        through_dlpack = cupy.zeros(64, dtype=cupy.uint8)
        adopted_dlpack = rt.adopt_gpu_buffer(DlpackOnly(through_dlpack))
        assert _device_pointer(adopted_dlpack) == through_dlpack.data.ptr
        await _fill(rt, adopted_dlpack.view(), 7)
        assert int(through_dlpack.sum()) == 7 * 64
        assert rt.statistics().imports == 2
        assert rt.memory_budget is not None and rt.memory_budget.reserved_bytes == 1024 + 64

        exported = cupy.from_dlpack(adopted_dlpack.view(8, 8))
        assert exported.data.ptr == through_dlpack.data.ptr + 8
        own = rt.allocate(512, hrx.GPU_LOCAL)
        reserved = rt.memory_budget.reserved_bytes
        rt.adopt_gpu_buffer(cupy.from_dlpack(own.view(0, 256)))
        assert rt.memory_budget.reserved_bytes == reserved  # not charged twice


@pytest.mark.cuda
@cuda_only
async def test_gpu_access_hands_a_stream_and_orders_later_work_by_event() -> None:
    from cuda.bindings import runtime as cudart

    n = 64 << 20
    async with hrx.Runtime(backend="cuda") as rt:
        device = rt.allocate(n, hrx.GPU_LOCAL)
        host = rt.allocate(4096, hrx.HOST_VISIBLE)
        await _fill(rt, device.view(), 1)
        read_back = rt.graph("read-back")
        read_back.copy(host.view(), device.view(n - 4096, 4096))
        read = read_back.prepare()
        for value in (2, 3, 4):
            async with rt.gpu_access([(device.view(), hrx.Access.WRITE)]) as access:
                assert isinstance(access.stream, int) and access.pointers == (
                    _device_pointer(device),
                )
                # Big enough that the read-back would see old bytes without ordering.
                (status,) = cudart.cudaMemsetAsync(access.pointers[0], value, n, access.stream)
                assert not status
                with pytest.raises(hrx.Busy, match="gpu_access"):
                    read.submit()
            await read.submit()  # ordered after the memset on the device, not by the host
            async with host.map_read() as memory:
                assert bytes(memory) == bytes([value]) * 4096
