"""What a backend implements. The runtime owns ordering; a backend only executes.

A backend allocates native storage per placement, prepares a region's
operations into a replayable program once, and runs programs on per-lane
in-order queues. Every submitted program yields a `Fence`. A queue can be
told to wait on the device for fences of the same backend before it runs a
program; waits on anything else are the runtime's, on the host.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .._core.contract import KernelContract
from .._core.kernels import GpuKernel, KernelSource, NpuKernel
from .._core.lane import Lane, QueueKey
from .._core.memory import Placement
from .._core.ops import Op
from .fence import Fence
from .watched import WatchedQueue

HostArray = Callable[[Any, int, int], np.ndarray[Any, np.dtype[np.uint8]]]
"""(storage, offset, nbytes) -> a uint8 numpy array over host-mapped storage, zero-copy."""


class Program(Protocol):
    """A region's operations prepared once for replay."""

    native_graph: bool
    """True when the region became one native graph launch."""


class LaneQueue(Protocol):
    """An in-order queue of one lane on one backend."""

    def submit(
        self,
        program: Any,
        waits: Sequence[Fence],
        preflight: Callable[[], BaseException | None] | None,
    ) -> Fence:
        """Enqueue device-side waits on `waits` (fences of this backend), then `program`.

        Never blocks. `preflight()` is asked as late as the backend can (sim: on
        the worker, right before the program starts; native streams: now): None
        runs the program, a `Cancelled` skips it, another error fails its fence
        without running it. No `preflight` (None): nothing can refuse it.
        """
        ...

    def close(self) -> None: ...


class Backend(Protocol):
    """A device layer: memory, queues, programs and kernels."""

    name: str
    target: str
    """The GPU code target kernels are built for ("sm_90", "gfx1151", "sim")."""

    @property
    def native_graphs_prepared(self) -> int: ...

    @property
    def copy_streams_created(self) -> int: ...

    poll_budget_us: float
    """Beyond a region's usual duration, how long an otherwise idle loop sweeps a
    `WatchedQueue` before leaving the wait to the queue; 0 turns watching off."""

    def allocate(self, nbytes: int, placement: Placement) -> Any:
        """Zeroed native storage of `nbytes` for `placement`."""
        ...

    def free(self, storage: Any) -> None: ...

    def host_array(
        self, storage: Any, offset: int, nbytes: int
    ) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """Host-mapped bytes of storage whose placement is host-mappable (zero-copy)."""
        ...

    def queue(self, key: QueueKey) -> LaneQueue:
        """The queue serving `key`, created on first use."""
        ...

    def prepare_region(self, lane: Lane, ops: Sequence[Op], gpu: int = 0) -> Program:
        """Turn a region's operations into a program replayed by `LaneQueue.submit`, on
        the runtime's GPU number `gpu` (whose queues `(lane, gpu)` will run it)."""
        ...

    def load_gpu_kernel(
        self,
        source: KernelSource,
        name: str,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        contract: KernelContract,
        defines: dict[str, str],
    ) -> Any:
        """The native handle of a GPU kernel (compiled or loaded for `target`)."""
        ...

    def describe(self) -> dict[str, Any]:
        """Devices, versions and targets, for `hrx-async info`."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class GpuInterop(Protocol):
    """Device memory and streams shared with native code and other GPU libraries.

    Implemented by the stream backends (CUDA, HIP); the sim backend's memory is
    plain host memory and interop there goes through numpy.
    """

    device: int

    def device_pointer(self, storage: Any) -> int:
        """The device address of an allocation."""
        ...

    def dlpack_device(self, storage: Any) -> tuple[int, int]:
        """(DLPack device type, device index) of an allocation."""
        ...

    def adopt_pointer(self, pointer: int, nbytes: int, placement: Placement, owner: Any) -> Any:
        """Storage over memory another library owns; `owner` is kept alive with it."""
        ...

    def interop_stream(self, gpu: int = 0) -> int:
        """A raw stream handle of the backend's own for native code, on the runtime's GPU
        number `gpu` (the streams of the next two calls are that GPU's too)."""
        ...

    def fence_on_stream(self, handle: int, gpu: int = 0) -> Fence:
        """A fence for the work queued so far on the raw stream `handle`."""
        ...

    def wait_on_stream(self, handle: int, fences: Sequence[Fence], gpu: int = 0) -> bool:
        """Make stream `handle` wait for `fences` on the device (False: not this backend's)."""
        ...

    def prepare_external(
        self,
        fn: Callable[..., Any],
        tensors: list[Any],
        gpu: int = 0,
        prepare: Callable[..., Any] | None = None,
    ) -> Any:
        """The program of a region of external work: `fn(stream_handle, tensors)` on the
        region's lane stream of GPU `gpu` when it is launched (`Graph.external`); with a
        `prepare` hook, the function `prepare(stream_handle, tensors)` returns, called here
        once with that same stream, replaces `fn`."""
        ...


class NpuBackend(Protocol):
    """NPU devices: each has a target and runs programs on its own lane."""

    name: str

    def npu_count(self) -> int: ...

    def npu_target(self, npu: int) -> str: ...

    def load_npu_kernel(
        self, npu: int, source: KernelSource, name: str, columns: int, contract: KernelContract
    ) -> Any: ...

    def queue(self, key: QueueKey) -> LaneQueue: ...

    def prepare_region(self, lane: Lane, ops: Sequence[Op]) -> Program: ...

    def close(self) -> None: ...


__all__ = [
    "Backend",
    "Fence",
    "GpuInterop",
    "GpuKernel",
    "HostArray",
    "LaneQueue",
    "NpuBackend",
    "NpuKernel",
    "Program",
    "QueueKey",
    "WatchedQueue",
]
