"""Stream-based GPU backends (CUDA, HIP) written once over a small driver table.

`StreamBackend` builds a whole backend on a `DriverTable` (the native calls of
one GPU API; `cuda.py` and `hip.py` each provide one):

* memory: device memory for GPU_LOCAL, pinned host memory mapped into the
  device's address space for every other placement, zeroed
  (`_stream_memory.py`);
* one non-blocking stream per lane (`StreamQueue`); device-side cross-lane
  waits (`stream_wait_event` on the producer's fence);
* programs: a region with one copy runs as that copy on its lane's stream;
  every other region is captured once into a native graph and replayed with
  one graph launch; kernel arguments are packed once at prepare time
  (`_stream_programs.py`, which states the argument convention);
* fences: an event recorded after the program, kept per stream in issue order,
  finished by the event loop's sweep or by a waiter thread
  (`_stream_fences.py`).

The driver table's protocol and error mapping are in `_stream_driver.py`.

Threads: `StreamQueue.submit`, `prepare_region` and the interop calls are made
from one thread (the event loop's); fences finish on that thread or on waiter
threads.
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from .._core.clock import perf_counter
from .._core.contract import KernelContract
from .._core.dlpack import DLPACK_CPU
from .._core.kernels import KernelSource
from .._core.lane import Lane
from .._core.memory import Placement, PlacementKind
from .._core.ops import Copy, Fill, Launch, Op, prepared_work
from ..errors import BackendError, ContractError, Unsupported
from ._stream_calls import ReplayCalls
from ._stream_driver import (
    DriverTable,
    quietly,
)
from ._stream_fences import EventPool, Implied, StreamFence, StreamFences, finished_fence
from ._stream_memory import ByteArray, NativeStorage, device_address
from ._stream_programs import (
    CopyProgram,
    DeviceKernels,
    ExternalProgram,
    GraphProgram,
    KernelArguments,
    NativeKernel,
    StreamProgram,
    check_kernel_metadata,
    constant_sizes,
)
from .base import Fence, QueueKey
from .kernel_cache import KernelCache
from .watched import WatchedQueue
from .worker import Preflight

DEFAULT_POLL_BUDGET_US = 30.0
"""Beyond a region's usual duration, how long an otherwise idle loop keeps sweeping a
stream before leaving the wait to the stream's waiter thread."""


class StreamQueue(WatchedQueue):
    """One lane's in-order stream."""

    def __init__(self, backend: StreamBackend, stream: Any, fences: StreamFences) -> None:
        super().__init__()
        self._calls: ReplayCalls = backend.table.replay_calls
        self._pool = backend.events
        self.stream = stream
        self.fences = fences

    # The loop's side (see `WatchedQueue`) is its fences'.
    def watch(self) -> None:
        self.fences.watch()

    def unwatch(self) -> None:
        self.fences.unwatch()

    def sweep(self, limit: int) -> tuple[int, bool]:
        return self.fences.sweep(limit)

    def submit(self, program: StreamProgram, waits: Sequence[Fence], preflight: Preflight) -> Fence:
        if preflight is not None:
            refusal = preflight()
            if refusal is not None:
                return finished_fence(refusal)
        calls = self._calls
        stream = self.stream
        issued_at = perf_counter()
        implies: Implied = None
        try:
            if waits:
                implies = self._wait_for(waits)
            program.launch(calls, stream)
            event = self._pool.take()
            calls.event_record(event, stream)
        except BackendError as exc:
            return finished_fence(exc)
        fence = StreamFence(self.fences, event, issued_at, implies)
        self.fences.add(fence)
        return fence

    def _wait_for(self, waits: Sequence[Fence]) -> Implied:
        """Make the stream wait for `waits` on the device, with as few waits as order allows;
        the fences it waited for (what the fence recorded next proves finished).

        A stream runs in issue order, so a fence of this stream needs no wait, and of the
        fences of another stream only the latest one does (a wait costs a driver call, and
        a replay behind earlier ones on the same bytes often follows several regions of
        each other stream).
        """
        own = self.fences
        calls = self._calls
        stream = self.stream
        if len(waits) == 1:
            fence = waits[0]
            if isinstance(fence, StreamFence) and fence.track is not own:
                event = fence.pending_event()
                if event is not None:
                    calls.stream_wait_event(stream, event)
                    return fence
            return None
        # The latest fence per other stream: a list scanned in place, not a dictionary
        # (there are a few streams at most, and compiled, a list's operations are direct).
        latest: list[StreamFence] = []
        for fence in waits:
            if isinstance(fence, StreamFence):
                track = fence.track
                if track is not own:
                    seen = False
                    for index in range(len(latest)):
                        known = latest[index]
                        if known.track is track:
                            seen = True
                            if fence.sequence > known.sequence:
                                latest[index] = fence
                            break
                    if not seen:
                        latest.append(fence)
        waited: list[StreamFence] = []
        for fence in latest:
            event = fence.pending_event()
            if event is not None:
                calls.stream_wait_event(stream, event)
                waited.append(fence)
        return waited or None

    def close(self) -> None:
        """Streams are owned and destroyed by the backend."""


# -- the backend -------------------------------------------------------------------------


class StreamBackend:
    """A GPU backend over a driver table: memory, lane streams, programs and kernels."""

    def __init__(
        self,
        table: DriverTable,
        device: int,
        target: str,
        blocking_sync: bool = False,
        poll_budget_us: float = DEFAULT_POLL_BUDGET_US,
        cache: KernelCache | None = None,
    ) -> None:
        self.table = table
        self.name = table.name
        self.device = device
        self.target = target
        self.poll_budget_us = poll_budget_us
        self.blocking_sync = blocking_sync
        self.native_graphs_prepared = 0
        self.copy_streams_created = 0
        self.events = EventPool(table, blocking_sync)
        self._cache = cache
        self._queues: dict[QueueKey, StreamQueue] = {}
        self._streams: dict[int, Any] = {}
        self._fences: dict[int, StreamFences] = {}
        self._setup_stream: Any = None
        self._interop_stream: Any = None
        self._graphs: dict[int, tuple[Any, Any]] = {}
        self._graph_finalizers: list[weakref.finalize[Any, Any]] = []
        self._modules: list[Any] = []
        self._closed = False

    # -- memory --------------------------------------------------------------------------

    def allocate(self, nbytes: int, placement: Placement) -> NativeStorage:
        table = self.table
        if placement.kind is PlacementKind.GPU_LOCAL:
            pointer = table.malloc(nbytes)
            try:
                stream = self._setup()
                table.memset_async(pointer, 0, nbytes, stream)
                table.stream_synchronize(stream)
            except BaseException:
                quietly(table.free, pointer)
                raise
            return NativeStorage(pointer, pointer, nbytes, host=False, device=self.device)
        pointer = table.host_alloc(nbytes)
        try:
            device_pointer = table.host_device_pointer(pointer)
        except BaseException:
            quietly(table.host_free, pointer)
            raise
        ctypes.memset(pointer, 0, nbytes)
        return NativeStorage(pointer, device_pointer, nbytes, host=True, device=self.device)

    def free(self, storage: Any) -> None:
        if not isinstance(storage, NativeStorage) or self._closed:
            return
        if storage.owner is not None:
            storage.owner = None
        elif storage.host:
            quietly(self.table.host_free, storage.pointer)
        else:
            quietly(self.table.free, storage.pointer)
        storage._array = None

    def host_array(self, storage: Any, offset: int, nbytes: int) -> ByteArray:
        if not isinstance(storage, NativeStorage) or not storage.host:
            raise Unsupported(f"{storage!r} is device memory; only pinned host memory maps")
        array: ByteArray = storage.array()[offset : offset + nbytes]
        return array

    def _setup(self) -> Any:
        if self._setup_stream is None:
            self._setup_stream = self.table.stream_create()
        return self._setup_stream

    # -- execution -----------------------------------------------------------------------

    def _fences_of(self, handle: int) -> StreamFences:
        fences = self._fences.get(handle)
        if fences is None:
            fences = StreamFences(
                self.table, self.device, self.events, f"hrx-{self.name}-fences-{len(self._fences)}"
            )
            self._fences[handle] = fences
        return fences

    def queue(self, key: QueueKey) -> StreamQueue:
        queue = self._queues.get(key)
        if queue is None:
            lane, _ = key
            stream = self.table.stream_create()
            handle = self.table.stream_handle(stream)
            self._streams[handle] = stream
            if lane in (Lane.UPLOAD, Lane.DOWNLOAD):
                self.copy_streams_created += 1
            queue = StreamQueue(self, stream, self._fences_of(handle))
            self._queues[key] = queue
        return queue

    def prepare_region(
        self, lane: Lane, ops: Sequence[Op], gpu: int = 0
    ) -> GraphProgram | CopyProgram:
        """`gpu` is the runtime's GPU number: one backend serves one device, so it is 0
        here (`MultiGpuBackend` passes its own devices' regions on)."""
        if len(ops) == 1 and isinstance(ops[0], Copy):
            op = ops[0]
            return CopyProgram(device_address(op.dst), device_address(op.src), op.dst.nbytes)
        return self._capture(ops)

    def prepare_external(
        self,
        fn: Callable[..., Any],
        tensors: list[Any],
        gpu: int = 0,
        prepare: Callable[..., Any] | None = None,
    ) -> ExternalProgram:
        """A region of external work (`Graph.external`) over `tensors` the runtime made.

        A `prepare` hook gets the compute lane's own stream, the one every replay of the
        region is launched on, so what it binds to the stream (a captured graph's launch, a
        library plan) is right for each replay; making that stream now, before the first
        submission would, changes nothing else."""
        if prepare is not None:
            stream = self.queue((Lane.COMPUTE, 0)).stream
            fn = prepared_work(prepare, self.table.stream_handle(stream), tensors)
        return ExternalProgram(fn, tensors, self.table.stream_handle)

    def _capture(self, ops: Sequence[Op]) -> GraphProgram:
        table = self.table
        stream = self._setup()
        keepalive: list[Any] = []
        table.begin_capture(stream)
        try:
            for op in ops:
                self._issue(op, stream, keepalive)
        except BaseException:
            table.abort_capture(stream)
            raise
        graph = table.end_capture(stream)
        try:
            graph_exec = table.graph_instantiate(graph)
        except BaseException:
            quietly(table.graph_destroy, graph)
            raise
        program = GraphProgram(graph_exec, tuple(keepalive))
        key = id(program)
        self._graphs[key] = (graph, graph_exec)
        self._graph_finalizers.append(
            weakref.finalize(program.lifetime, self._release_graph, key)
        )
        self.native_graphs_prepared += 1
        return program

    def _release_graph(self, key: int) -> None:
        entry = self._graphs.pop(key, None)
        if entry is None or self._closed:
            return
        graph, graph_exec = entry
        # An executable graph still in flight is freed by the driver when it completes.
        quietly(self.table.graph_exec_destroy, graph_exec)
        quietly(self.table.graph_destroy, graph)

    def _issue(self, op: Op, stream: Any, keepalive: list[Any]) -> None:
        table = self.table
        if isinstance(op, Fill):
            table.memset_async(device_address(op.dst), op.value, op.dst.nbytes, stream)
        elif isinstance(op, Copy):
            table.memcpy_async(
                device_address(op.dst), device_address(op.src), op.dst.nbytes, stream
            )
        elif isinstance(op, Launch):
            kernel = op.kernel
            native = kernel.native
            if isinstance(native, DeviceKernels):
                native = native.on(self.device)
            if not isinstance(native, NativeKernel):
                raise Unsupported(
                    f"kernel {kernel.name!r} was not loaded by the {self.name} backend"
                )
            constants = kernel.contract.constants
            arguments = KernelArguments(
                [device_address(view) for view in op.views],
                constants,
                constant_sizes(native, len(op.views), constants),
            )
            if kernel.shared_bytes > 0:
                table.function_set_dynamic_shared(native.function, kernel.shared_bytes)
            table.launch(
                native.function,
                kernel.grid,
                kernel.block,
                kernel.shared_bytes,
                stream,
                arguments.address,
            )
            keepalive.append(arguments)
            keepalive.append(native)
        else:
            raise Unsupported(
                f"the {self.name} backend does not run {type(op).__name__} operations"
            )

    # -- kernels -------------------------------------------------------------------------

    def load_gpu_kernel(
        self,
        source: KernelSource,
        name: str,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        contract: KernelContract,
        defines: dict[str, str],
    ) -> NativeKernel:
        if not isinstance(name, str) or not name:
            raise ContractError(f"kernel name must be a non-empty string, got {name!r}")
        image = self._kernel_image(source, name, defines)
        table = self.table
        module = table.module_load(image)
        try:
            function = table.module_function(module, name)
            sizes = table.function_param_sizes(function)
            check_kernel_metadata(
                name, contract, block, sizes, table.function_max_threads(function)
            )
        except BaseException:
            quietly(table.module_unload, module)
            raise
        self._modules.append(module)
        return NativeKernel(name, module, function, sizes, block)

    def _kernel_image(self, source: KernelSource, name: str, defines: dict[str, str]) -> bytes:
        if self.target in source.binary:
            path = source.binary[self.target]
            try:
                with open(path, "rb") as handle:
                    image = handle.read()
            except OSError as exc:
                raise ContractError(
                    f"kernel {name!r}: cannot read binary for {self.target} at {str(path)!r}: "
                    f"{exc.strerror}"
                ) from None
            if not image:
                raise ContractError(f"kernel {name!r}: binary {str(path)!r} is empty")
            # PTX is text and the loader wants it NUL-terminated.
            if image.lstrip()[:1] in (b"/", b".") and not image.endswith(b"\0"):
                image += b"\0"
            return image
        if source.cxx is None:
            offered = sorted(source.binary) if source.binary else "a host callable only"
            raise Unsupported(
                f"kernel {name!r} has no C++ source and no binary for {self.target} "
                f"(it offers {offered})"
            )
        table = self.table
        options = table.compile_options(self.target, defines)
        cxx = source.cxx
        cache = self._cache if self._cache is not None else KernelCache()
        return cache.get_or_build(
            cxx,
            options,
            self.target,
            table.compiler_version(),
            lambda: table.compile(cxx, name, options),
        )

    # -- interop -------------------------------------------------------------------------

    def device_pointer(self, storage: Any) -> int:
        if not isinstance(storage, NativeStorage):
            raise Unsupported(f"{storage!r} is not {self.name} memory")
        return storage.device_pointer

    def dlpack_device(self, storage: Any) -> tuple[int, int]:
        if isinstance(storage, NativeStorage) and not storage.host:
            return (self.table.dlpack_device_type, self.device)
        return (DLPACK_CPU, 0)

    def adopt_pointer(
        self, pointer: int, nbytes: int, placement: Placement, owner: Any
    ) -> NativeStorage:
        """Wrap memory another library owns; `owner` is kept alive with the storage."""
        kind, device = self.table.pointer_kind(pointer)
        if kind in ("device", "managed") and device != self.device:
            raise Unsupported(
                f"memory at 0x{pointer:x} is on {self.name} device {device}; this runtime "
                f"drives device {self.device}"
            )
        host = kind == "host"
        if placement.kind is PlacementKind.SHARED and not host:
            raise Unsupported(
                f"shared({placement.npu}) memory must be host-mapped for the NPU; memory at "
                f"0x{pointer:x} is {kind} memory (adopt it as GPU_LOCAL)"
            )
        if kind == "unregistered":
            raise Unsupported(
                f"memory at 0x{pointer:x} is not known to {self.name}: adopt device memory "
                "or pinned host memory"
            )
        device_pointer = self.table.host_device_pointer(pointer) if host else pointer
        return NativeStorage(
            pointer, device_pointer, nbytes, host=host, owner=owner, device=self.device
        )

    def interop_stream(self, gpu: int = 0) -> int:
        """A stream of the runtime's own for native code (`Runtime.gpu_access`)."""
        if self._interop_stream is None:
            self._interop_stream = self.table.stream_create()
            handle = self.table.stream_handle(self._interop_stream)
            self._streams[handle] = self._interop_stream
        return self.table.stream_handle(self._interop_stream)

    def fence_on_stream(self, handle: int, gpu: int = 0) -> StreamFence:
        """A fence for everything queued so far on the raw stream `handle`."""
        event = self.events.take()
        table = self.table
        issued_at = perf_counter()
        try:
            table.event_record(event, handle)
        except BaseException:
            self.events.give(event)
            raise
        fences = self._fences_of(handle)
        fence = StreamFence(fences, event, issued_at)
        fences.add(fence)
        return fence

    def wait_on_stream(self, handle: int, fences: Sequence[Fence], gpu: int = 0) -> bool:
        """Make the raw stream `handle` wait for `fences` on the device.

        False (and nothing queued) when one of them is not a fence of this backend.
        """
        events = []
        for fence in fences:
            if not isinstance(fence, StreamFence):
                return False
            event = fence.pending_event()
            if event is not None:
                events.append(event)
        for event in events:
            self.table.stream_wait_event(handle, event)
        return True

    # -- lifetime ------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        info = {"backend": self.name, "target": self.target, "device": self.device}
        info.update(self.table.describe(self.device))
        info["fence_wait"] = "blocking" if self.blocking_sync else "spin"
        info["poll_budget_us"] = self.poll_budget_us
        fences = list(self._fences.values())
        # Which party finished the fences so far: the loop's sweeps, or the waiter threads
        # (after a stream was handed back); a latency-bound service wants the first.
        info["fences_finished_by_loop"] = sum(f.by_loop for f in fences)
        info["fences_finished_by_waiter"] = sum(f.by_waiter for f in fences)
        info["fences_finished_by_proof"] = sum(f.by_proof for f in fences)
        return info

    def close(self) -> None:
        if self._closed:
            return
        table = self.table
        for stream in self._streams.values():
            quietly(table.stream_synchronize, stream)
        for fences in self._fences.values():
            fences.close()
        self._fences.clear()
        for finalizer in self._graph_finalizers:
            finalizer()
        self._graph_finalizers.clear()
        for module in self._modules:
            quietly(table.module_unload, module)
        self._modules.clear()
        for stream in self._streams.values():
            quietly(table.stream_destroy, stream)
        self._streams.clear()
        self._queues.clear()
        if self._setup_stream is not None:
            quietly(table.stream_destroy, self._setup_stream)
            self._setup_stream = None
        self.events.close()
        self._closed = True


__all__ = ["DEFAULT_POLL_BUDGET_US", "StreamBackend", "StreamQueue"]
