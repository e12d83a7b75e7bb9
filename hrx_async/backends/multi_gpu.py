"""Several GPUs of one stream API (CUDA or HIP) behind one backend.

Each device keeps its own `StreamBackend` (its streams, fences, graphs and
modules); this class routes by the runtime's GPU number: memory by its
placement, queues by their key, regions by their GPU, storage by the device
that made it. Kernels are loaded on every device. Fences of all devices are
`StreamFence`s, so a queue of one device waits on another's work on the
device (a stream wait on the other device's event), and the tracker orders
work across devices exactly as within one.

The stream APIs keep a current device per thread, and every call this backend
forwards is made on the event loop's thread: it makes the right device current
before each one (one driver call; not cached, since code sharing the loop, such as
a `gpu_access` block, may change it). Fence waiter threads make their own device
current once; finishing fences (event queries) needs no current device.

Peer access is enabled between every pair of devices that allow it, so a copy
between GPUs goes peer to peer; otherwise the driver stages it through host
memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .._core.contract import KernelContract
from .._core.kernels import KernelSource
from .._core.lane import Lane
from .._core.memory import Placement
from .._core.ops import Op
from ..errors import ContractError, Unsupported
from ._stream import StreamBackend, StreamQueue
from ._stream_memory import NativeStorage
from ._stream_programs import CopyProgram, DeviceKernels, GraphProgram, NativeKernel
from .base import Fence, QueueKey
from .watched import WatchedQueue
from .worker import Preflight


class DeviceQueue(WatchedQueue):
    """A device's lane queue that makes its device current before each call."""

    def __init__(self, owner: MultiGpuBackend, gpu: int, queue: StreamQueue) -> None:
        super().__init__()
        self._enter = owner.enter
        self._gpu = gpu
        self._queue = queue

    def submit(self, program: Any, waits: Sequence[Fence], preflight: Preflight) -> Fence:
        self._enter(self._gpu)
        return self._queue.submit(program, waits, preflight)

    def watch(self) -> None:
        self._queue.watch()

    def unwatch(self) -> None:
        self._queue.unwatch()

    def sweep(self, limit: int) -> tuple[int, bool]:
        return self._queue.sweep(limit)

    def close(self) -> None:
        self._queue.close()


class MultiGpuBackend:
    """One backend over `StreamBackend`s of several devices; GPU number i is `devices[i]`."""

    def __init__(self, devices: Sequence[StreamBackend]) -> None:
        if len(devices) < 2:
            raise ContractError("a several-GPU backend needs at least two devices")
        self.devices = tuple(devices)
        first = self.devices[0]
        self.name = first.name
        self.target = first.target
        self.device = first.device
        self.poll_budget_us = first.poll_budget_us
        self._position = {backend.device: gpu for gpu, backend in enumerate(self.devices)}
        self._queues: dict[QueueKey, DeviceQueue] = {}
        self.peers: list[tuple[int, int]] = []
        """(GPU number, GPU number) pairs with direct peer access enabled."""
        for gpu, backend in enumerate(self.devices):
            for peer, other in enumerate(self.devices):
                if peer != gpu and backend.table.can_access_peer(backend.device, other.device):
                    self.enter(gpu)
                    backend.table.enable_peer_access(other.device)
                    self.peers.append((gpu, peer))

    def enter(self, gpu: int) -> StreamBackend:
        """Make GPU number `gpu` current on the calling (loop) thread; its backend."""
        backend = self.devices[gpu]
        backend.table.set_device(backend.device)
        return backend

    @property
    def native_graphs_prepared(self) -> int:
        return sum(backend.native_graphs_prepared for backend in self.devices)

    @property
    def copy_streams_created(self) -> int:
        return sum(backend.copy_streams_created for backend in self.devices)

    # -- memory --------------------------------------------------------------------------

    def allocate(self, nbytes: int, placement: Placement) -> NativeStorage:
        """Device memory on its GPU; host-mapped memory (portable) through the first."""
        return self.enter(placement.gpu_device or 0).allocate(nbytes, placement)

    def free(self, storage: Any) -> None:
        if isinstance(storage, NativeStorage):
            self.enter(self._position.get(storage.device, 0)).free(storage)

    def host_array(self, storage: Any, offset: int, nbytes: int) -> Any:
        return self.devices[0].host_array(storage, offset, nbytes)

    # -- execution -----------------------------------------------------------------------

    def queue(self, key: QueueKey) -> DeviceQueue:
        queue = self._queues.get(key)
        if queue is None:
            lane, gpu = key
            native = self.enter(gpu).queue((lane, 0))
            queue = self._queues[key] = DeviceQueue(self, gpu, native)
        return queue

    def prepare_region(
        self, lane: Lane, ops: Sequence[Op], gpu: int = 0
    ) -> GraphProgram | CopyProgram:
        return self.enter(gpu).prepare_region(lane, ops)

    def prepare_external(
        self,
        fn: Callable[..., Any],
        tensors: list[Any],
        gpu: int = 0,
        prepare: Callable[..., Any] | None = None,
    ) -> Any:
        return self.enter(gpu).prepare_external(fn, tensors, prepare=prepare)

    def load_gpu_kernel(
        self,
        source: KernelSource,
        name: str,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        contract: KernelContract,
        defines: dict[str, str],
    ) -> DeviceKernels:
        """The kernel loaded on every device (each compiles for its own target)."""
        kernels: dict[int, NativeKernel] = {}
        for gpu, backend in enumerate(self.devices):
            self.enter(gpu)
            kernels[backend.device] = backend.load_gpu_kernel(
                source, name, grid, block, contract, defines
            )
        return DeviceKernels(kernels)

    # -- interop: each GPU's own streams ---------------------------------------------------

    def device_pointer(self, storage: Any) -> int:
        return self.devices[0].device_pointer(storage)

    def dlpack_device(self, storage: Any) -> tuple[int, int]:
        if isinstance(storage, NativeStorage) and not storage.host:
            return (self.devices[0].table.dlpack_device_type, storage.device)
        return self.devices[0].dlpack_device(storage)

    def adopt_pointer(self, pointer: int, nbytes: int, placement: Placement, owner: Any) -> Any:
        gpu = placement.gpu_device or 0
        if gpu >= len(self.devices):
            raise Unsupported(f"this runtime has {len(self.devices)} GPUs, not {placement}")
        return self.enter(gpu).adopt_pointer(pointer, nbytes, placement, owner)

    def interop_stream(self, gpu: int = 0) -> int:
        return self.enter(gpu).interop_stream()

    def fence_on_stream(self, handle: int, gpu: int = 0) -> Fence:
        return self.enter(gpu).fence_on_stream(handle)

    def wait_on_stream(self, handle: int, fences: Sequence[Fence], gpu: int = 0) -> bool:
        return self.enter(gpu).wait_on_stream(handle, fences)

    # -- lifetime ------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "target": self.target,
            "devices": [self.enter(gpu).describe() for gpu in range(len(self.devices))],
            "peer_access": [list(pair) for pair in self.peers],
        }

    def close(self) -> None:
        for gpu in range(len(self.devices)):
            self.enter(gpu).close()


__all__ = ["DeviceQueue", "MultiGpuBackend"]
