"""Stream-based GPU backends (CUDA, HIP) written once over a small driver table.

A `DriverTable` is the handful of native calls a stream backend needs; each
method raises `BackendError` on failure (with `.sticky` set for errors that
corrupt the device context). `StreamBackend` builds everything else on it:

* memory: device memory for GPU_LOCAL, pinned host memory mapped into the
  device's address space for every other placement, zeroed;
* one non-blocking stream per lane; device-side cross-lane waits
  (`stream_wait_event` on the producer's fence);
* programs: a region with one copy runs as that copy on its lane's stream;
  every other region is captured once into a native graph and replayed with
  one graph launch;
* fences: an event recorded after the program, kept per stream in issue order
  (`StreamFences`; fences of one stream finish in order). While the event
  loop watches a stream it sweeps the finished head fences itself, once per
  loop iteration; when it stops watching, a Python-owned waiter thread blocks
  in the native event wait on the oldest unfinished fence and finishes every
  completed one in one batch. No Python callable is ever handed to the
  driver.

Kernel argument convention: every binding is passed as its own pointer
parameter (device address of the view), in contract order, followed by the
contract's constant bytes split into the kernel's remaining parameters by the
sizes the driver reports for them (`cuFuncGetParamInfo`). When the driver
cannot report parameter sizes, the constants are passed as one trailing
by-value parameter (declare a packed struct). The packed arguments are built
once at prepare time and captured into the region's graph.

Threads: `LaneQueue.submit`, `prepare_region` and the interop calls are made
from one thread (the event loop's); fences finish on that thread or on waiter
threads. Events are pooled: only the submitting thread re-records an event,
and an event goes back to the pool only once no waiter is blocked on it.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from ..contract import KernelContract
from ..errors import BackendError, Cancelled, ContractError, HrxError, Unsupported
from ..kernel_cache import KernelCache
from ..kernels import KernelSource
from ..lanes.lane import Lane
from ..memory import Placement, PlacementKind
from ..ops import Copy, Fill, Launch, Op
from ._threads import Preflight, ThreadFence
from .base import Fence, QueueKey

ByteArray = np.ndarray[Any, np.dtype[np.uint8]]

POINTER_BYTES = 8
DEFAULT_POLL_BUDGET_US = 30.0
"""Beyond a region's usual duration, how long an otherwise idle loop keeps sweeping a
stream before leaving the wait to the stream's waiter thread."""

DLPACK_CPU = 1
DLPACK_CUDA = 2
DLPACK_ROCM = 10


def make_error(
    backend: str,
    operation: str,
    code: str,
    message: str,
    sticky_codes: frozenset[str],
) -> BackendError:
    """A `BackendError` marked sticky when `code` is one that leaves the context unusable."""
    error = BackendError(backend, operation, code, message)
    error.sticky = code in sticky_codes  # type: ignore[attr-defined]
    return error


class DriverTable(Protocol):
    """The native calls of one GPU API. Handles are whatever the bindings return.

    Every method raises `BackendError` (from `make_error`) when the call fails,
    except `event_query`, which returns False while the event is pending.
    """

    name: str
    """The backend name used in errors ("cuda", "hip")."""
    dlpack_device_type: int
    """The DLPack device type of device memory (2 for CUDA, 10 for ROCm)."""

    def set_device(self, device: int) -> None:
        """Make `device` current on the calling thread (each thread calls this once)."""
        ...

    def malloc(self, nbytes: int) -> int: ...

    def free(self, pointer: int) -> None: ...

    def host_alloc(self, nbytes: int) -> int:
        """Pinned host memory, mapped into the device address space and portable."""
        ...

    def host_free(self, pointer: int) -> None: ...

    def host_device_pointer(self, pointer: int) -> int:
        """The device address of mapped pinned host memory."""
        ...

    def pointer_kind(self, pointer: int) -> tuple[str, int]:
        """("device" | "host" | "managed" | "unregistered", device index) of an address."""
        ...

    def memset_async(self, pointer: int, value: int, nbytes: int, stream: Any) -> None: ...

    def memcpy_async(self, dst: int, src: int, nbytes: int, stream: Any) -> None:
        """A copy between any two addresses (unified addressing works out the direction)."""
        ...

    def stream_create(self) -> Any:
        """A non-blocking stream (no implicit sync with the legacy default stream)."""
        ...

    def stream_destroy(self, stream: Any) -> None: ...

    def stream_synchronize(self, stream: Any) -> None: ...

    def stream_handle(self, stream: Any) -> int:
        """The raw handle, for native code."""
        ...

    def event_create(self, blocking: bool) -> Any:
        """An event without timing; `blocking` makes its wait sleep instead of spin."""
        ...

    def event_destroy(self, event: Any) -> None: ...

    def event_record(self, event: Any, stream: Any) -> None: ...

    def event_query(self, event: Any) -> bool:
        """True once the work before the event finished, False while pending."""
        ...

    def event_synchronize(self, event: Any) -> None:
        """Block the calling thread until the event finished (releases the GIL)."""
        ...

    def stream_wait_event(self, stream: Any, event: Any) -> None: ...

    def begin_capture(self, stream: Any) -> None: ...

    def end_capture(self, stream: Any) -> Any:
        """The captured graph."""
        ...

    def abort_capture(self, stream: Any) -> None:
        """End a capture that failed half-way and drop what it captured."""
        ...

    def graph_instantiate(self, graph: Any) -> Any: ...

    def graph_launch(self, graph_exec: Any, stream: Any) -> None: ...

    def graph_destroy(self, graph: Any) -> None: ...

    def graph_exec_destroy(self, graph_exec: Any) -> None: ...

    def module_load(self, image: bytes) -> Any: ...

    def module_unload(self, module: Any) -> None: ...

    def module_function(self, module: Any, name: str) -> Any: ...

    def function_param_sizes(self, function: Any) -> list[int] | None:
        """Byte sizes of the kernel's parameters, or None when the driver cannot tell."""
        ...

    def function_max_threads(self, function: Any) -> int: ...

    def function_set_dynamic_shared(self, function: Any, nbytes: int) -> None: ...

    def launch(
        self,
        function: Any,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_bytes: int,
        stream: Any,
        params_address: int,
    ) -> None:
        """Launch with `params_address` pointing at an array of pointers to each argument."""
        ...

    def compile_options(self, target: str, defines: dict[str, str]) -> list[str]:
        """The runtime compiler's options for `target` and `-D` defines (stable order)."""
        ...

    def compiler_version(self) -> str: ...

    def compile(self, source: str, name: str, options: list[str]) -> bytes:
        """Compile to loadable code; raises `CompileError` with the compiler's log."""
        ...

    def describe(self, device: int) -> dict[str, Any]: ...


# -- memory ------------------------------------------------------------------------------


class NativeStorage:
    """One allocation: its host address (pinned memory) and its device address."""

    __slots__ = ("__weakref__", "_array", "device_pointer", "host", "nbytes", "owner", "pointer")

    def __init__(
        self, pointer: int, device_pointer: int, nbytes: int, host: bool, owner: Any = None
    ) -> None:
        self.pointer = pointer
        self.device_pointer = device_pointer
        self.nbytes = nbytes
        self.host = host
        self.owner = owner
        """What keeps adopted memory alive (None for memory this backend allocated)."""
        self._array: ByteArray | None = None

    def array(self) -> ByteArray:
        """The whole allocation as a uint8 numpy array (host memory only), made once."""
        if self._array is None:
            raw = (ctypes.c_uint8 * self.nbytes).from_address(self.pointer)
            self._array = np.frombuffer(memoryview(raw).cast("B"), dtype=np.uint8)
        return self._array

    def __repr__(self) -> str:
        kind = "host" if self.host else "device"
        return f"<NativeStorage {kind} 0x{self.device_pointer:x} {self.nbytes} B>"


# -- fences ------------------------------------------------------------------------------


class StreamFence:
    """An event recorded after a program on one stream; finished by its `StreamFences`."""

    __slots__ = (
        "_callbacks",
        "_done",
        "_error",
        "_event",
        "_thread_event",
        "_track",
        "finished_at",
        "issued_at",
        "started_at",
    )

    def __init__(self, track: StreamFences, event: Any, issued_at: float) -> None:
        self._track = track
        self._event = event
        self._callbacks: list[Callable[[Any], None]] | None = None
        self._done = False
        self._error: BaseException | None = None
        self._thread_event: threading.Event | None = None
        self.issued_at = issued_at
        self.started_at: float | None = None
        self.finished_at: float | None = None

    def pending_event(self) -> Any:
        """The event to wait on device-side, or None once finished."""
        return None if self._done else self._event

    def query(self) -> bool:
        if self._done:
            return True
        try:
            if not self._track.table.event_query(self._event):
                return False
        except BackendError as exc:
            self._track.finish_early(self, exc)
            return True
        self._track.finish_early(self, None)
        return True

    def wait(self, timeout: float | None = None) -> bool:
        with self._track.lock:
            if self._done:
                return True
            if self._thread_event is None:
                self._thread_event = threading.Event()
            waiter = self._thread_event
        return waiter.wait(timeout)

    def error(self) -> BaseException | None:
        return self._error

    def skipped(self) -> bool:
        return False

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        with self._track.lock:
            if not self._done:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(callback)
                return
        callback(self)

    def _mark(
        self, error: BaseException | None, started_at: float, now: float
    ) -> list[Callable[[Any], None]] | None:
        """Finish under the track's lock; returns the callbacks to run outside it."""
        self._error = error
        self.started_at = started_at
        self.finished_at = now
        self._done = True
        callbacks, self._callbacks = self._callbacks, None
        if self._thread_event is not None:
            self._thread_event.set()
        return callbacks


def finished_fence(refusal: BaseException) -> ThreadFence:
    """A fence for a program that never ran: skipped when cancelled, else failed."""
    fence = ThreadFence()
    if isinstance(refusal, Cancelled):
        fence.finish(skipped=True)
    else:
        fence.finish(refusal)
    return fence


class EventPool:
    """Reusable events, taken by the loop thread and given back by whoever finishes a fence."""

    def __init__(self, table: DriverTable, blocking: bool) -> None:
        self._table = table
        self._blocking = blocking
        self._free: collections.deque[Any] = collections.deque()
        self._all: list[Any] = []

    def take(self) -> Any:
        try:
            return self._free.pop()
        except IndexError:
            event = self._table.event_create(self._blocking)
            self._all.append(event)
            return event

    def give(self, event: Any) -> None:
        self._free.append(event)

    def close(self) -> None:
        for event in self._all:
            _quietly(self._table.event_destroy, event)
        self._all.clear()
        self._free.clear()


class StreamFences:
    """The unfinished fences of one stream, in issue order, and the thread that waits on them.

    Fences of one stream finish in order, so finishing always works from the head.
    Two parties finish them. While the event loop *watches* the stream it sweeps
    the head itself (`sweep()`, once per loop iteration): a short wait then costs
    no thread hop and no contention for the interpreter lock. Otherwise a waiter
    thread blocks in the native wait on the oldest unfinished fence and finishes
    every completed one in one batch. The lock guards the deque and each fence's
    state; callbacks always run outside it.

    An event goes back to the pool once its fence is finished and the waiter
    is not blocked on it, so a fence's event is never re-recorded under a wait.
    """

    def __init__(self, table: DriverTable, device: int, pool: EventPool, name: str) -> None:
        self.table = table
        self.pool = pool
        self.lock = threading.Lock()
        self.pending: collections.deque[StreamFence] = collections.deque()
        self.watched = False
        self._last_finished = 0.0
        self._waiting_on: StreamFence | None = None
        self._parked = False
        """The waiter's fence was finished meanwhile: the waiter gives back its event."""
        self._waiter = FenceWaiter(self, device, name)

    def add(self, fence: StreamFence) -> None:
        self.pending.append(fence)
        if not self.watched:
            self._waiter.wake()

    def watch(self) -> None:
        """The loop sweeps this stream from now on; the waiter stays away."""
        self.watched = True

    def unwatch(self) -> None:
        """The loop stops sweeping: the waiter takes over whatever is unfinished."""
        self.watched = False
        if self.pending:
            self._waiter.wake()

    def sweep(self, limit: int) -> tuple[int, bool]:
        """Finish up to `limit` fences whose work completed, from the head: (how many
        were finished, whether any remain)."""
        with self.lock:
            finished = self._collect(None, None, limit)
        _run_callbacks(finished)
        return len(finished), bool(self.pending)

    def finish_early(self, fence: StreamFence, error: BaseException | None) -> None:
        """`fence` was found complete out of order; it leaves the deque at the next sweep."""
        with self.lock:
            if fence._done:
                return
            callbacks = fence._mark(error, fence.issued_at, time.perf_counter())
        _run_callbacks([(fence, callbacks)])

    def _collect(
        self, head: StreamFence | None, head_error: BaseException | None, limit: int = -1
    ) -> list[tuple[StreamFence, list[Callable[[Any], None]] | None]]:
        """Under the lock: pop and finish completed fences (`head` is known complete), at
        most `limit` of them when it is positive."""
        finished: list[tuple[StreamFence, list[Callable[[Any], None]] | None]] = []
        pending = self.pending
        table = self.table
        now = time.perf_counter()
        while pending and limit:
            limit -= 1
            fence = pending[0]
            callbacks = None
            if not fence._done:
                error: BaseException | None = None
                if fence is head:
                    error = head_error
                else:
                    try:
                        if not table.event_query(fence._event):
                            break
                    except BackendError as exc:
                        error = exc
                # A fence cannot start before the previous one on its stream finished.
                started = max(fence.issued_at, self._last_finished)
                callbacks = fence._mark(error, started, now)
                self._last_finished = now
            pending.popleft()
            if fence is self._waiting_on:
                self._parked = True
            else:
                self.pool.give(fence._event)
            if callbacks:
                finished.append((fence, callbacks))
        return finished

    # -- the waiter thread's side --------------------------------------------------------

    def next_to_wait(self) -> StreamFence | None:
        """The oldest unfinished fence, unless the loop watches the stream (or none is left)."""
        with self.lock:
            if self.watched:
                return None
            finished = self._collect(None, None)
            head = self.pending[0] if self.pending else None
            self._waiting_on = head
        _run_callbacks(finished)
        return head

    def waited(self, head: StreamFence, error: BaseException | None) -> None:
        """The native wait on `head` returned: finish it and everything completed after it."""
        with self.lock:
            self._waiting_on = None
            if self._parked:
                self._parked = False
                self.pool.give(head._event)
            finished = self._collect(head, error)
        _run_callbacks(finished)

    def close(self) -> None:
        self._waiter.close()


def _run_callbacks(
    finished: list[tuple[StreamFence, list[Callable[[Any], None]] | None]],
) -> None:
    for fence, callbacks in finished:
        if callbacks:
            for callback in callbacks:
                callback(fence)


class FenceWaiter:
    """The thread that waits natively for one stream's fences the loop is not watching."""

    def __init__(self, track: StreamFences, device: int, name: str) -> None:
        self._track = track
        self._device = device
        # A lock used as a binary semaphore: released to wake the idle thread (one futex op).
        self._wake = threading.Lock()
        self._wake.acquire()
        self._idle = False
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        # The thread sets _idle before its last look for work, so either it sees the new
        # work or we see _idle and release it.
        if self._idle:
            with contextlib.suppress(RuntimeError):  # already released: it is awake
                self._wake.release()

    def close(self) -> None:
        self._closing = True
        with contextlib.suppress(RuntimeError):
            self._wake.release()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        track = self._track
        table = track.table
        with contextlib.suppress(BackendError):  # the waits below report the device's state
            table.set_device(self._device)
        while not self._closing:
            head = track.next_to_wait()
            if head is None:
                self._idle = True
                if track.next_to_wait() is None and not self._closing:
                    self._wake.acquire()
                self._idle = False
                continue
            error: BaseException | None = None
            try:
                table.event_synchronize(head._event)
            except BackendError as exc:
                error = exc
            track.waited(head, error)


# -- programs ----------------------------------------------------------------------------


class GraphProgram:
    """A region captured into one native graph, replayed with one launch."""

    __slots__ = ("__weakref__", "graph_exec", "keepalive", "native_graph")

    def __init__(self, graph_exec: Any, keepalive: tuple[Any, ...]) -> None:
        self.graph_exec = graph_exec
        self.keepalive = keepalive
        self.native_graph = True

    def launch(self, table: DriverTable, stream: Any) -> None:
        table.graph_launch(self.graph_exec, stream)


class CopyProgram:
    """A region of one copy, issued directly on its lane's stream."""

    __slots__ = ("dst", "native_graph", "nbytes", "src")

    def __init__(self, dst: int, src: int, nbytes: int) -> None:
        self.dst = dst
        self.src = src
        self.nbytes = nbytes
        self.native_graph = False

    def launch(self, table: DriverTable, stream: Any) -> None:
        table.memcpy_async(self.dst, self.src, self.nbytes, stream)


class NativeKernel:
    """A loaded kernel: its module, function and parameter sizes (None if unknown)."""

    __slots__ = ("block", "function", "module", "name", "param_sizes")

    def __init__(
        self,
        name: str,
        module: Any,
        function: Any,
        param_sizes: list[int] | None,
        block: tuple[int, int, int],
    ) -> None:
        self.name = name
        self.module = module
        self.function = function
        self.param_sizes = param_sizes
        self.block = block

    def __repr__(self) -> str:
        return f"<NativeKernel {self.name!r} params={self.param_sizes}>"


class KernelArguments:
    """Argument storage and the pointer array a launch reads, built once per launch node."""

    __slots__ = ("pointers", "values")

    def __init__(self, pointers: list[int], constants: bytes, sizes: list[int]) -> None:
        head = len(pointers) * POINTER_BYTES
        self.values = np.zeros(max(1, head + len(constants)), dtype=np.uint8)
        self.values[:head].view(np.uint64)[:] = pointers
        self.values[head : head + len(constants)] = np.frombuffer(constants, dtype=np.uint8)
        base = self.values.ctypes.data
        addresses = [base + POINTER_BYTES * i for i in range(len(pointers))]
        cursor = head
        for size in sizes:
            addresses.append(base + cursor)
            cursor += size
        self.pointers = np.array(addresses, dtype=np.uint64)

    @property
    def address(self) -> int:
        return int(self.pointers.ctypes.data)


def check_kernel_metadata(
    name: str,
    contract: KernelContract,
    block: tuple[int, int, int],
    param_sizes: list[int] | None,
    max_threads: int,
) -> None:
    """Load-time checks of a contract against what the driver reports about the kernel."""
    threads = block[0] * block[1] * block[2]
    if threads > max_threads:
        raise ContractError(
            f"kernel {name!r}: block {block} has {threads} threads; the loaded code allows at "
            f"most {max_threads} per block"
        )
    if param_sizes is None:
        return
    bindings = len(contract.bindings)
    if len(param_sizes) < bindings:
        raise ContractError(
            f"kernel {name!r} metadata and contract disagree: the kernel takes "
            f"{len(param_sizes)} parameters, the contract has {bindings} bindings"
        )
    for index, size in enumerate(param_sizes[:bindings]):
        if size != POINTER_BYTES:
            raise ContractError(
                f"kernel {name!r} metadata and contract disagree: parameter {index} is "
                f"{size} bytes, but binding {index} is passed as a {POINTER_BYTES}-byte pointer"
            )
    scalar_sizes = param_sizes[bindings:]
    if sum(scalar_sizes) != len(contract.constants):
        raise ContractError(
            f"kernel {name!r} metadata and contract disagree: its scalar parameters take "
            f"{sum(scalar_sizes)} bytes (sizes {scalar_sizes}), the contract's constants are "
            f"{len(contract.constants)} bytes"
        )


def constant_sizes(kernel: NativeKernel, bindings: int, constants: bytes) -> list[int]:
    """How the constant bytes split into parameters (see the module docstring)."""
    if kernel.param_sizes is not None:
        return kernel.param_sizes[bindings:]
    return [len(constants)] if constants else []


def _quietly(call: Callable[..., Any], *args: Any) -> None:
    """Release calls during shutdown: a lost device makes them fail, and that is fine."""
    with contextlib.suppress(HrxError):
        call(*args)


# -- queues ------------------------------------------------------------------------------


class StreamQueue:
    """One lane's in-order stream."""

    def __init__(self, backend: StreamBackend, stream: Any, fences: StreamFences) -> None:
        self._table = backend.table
        self._pool = backend.events
        self.stream = stream
        self.fences = fences

    def submit(self, program: Any, waits: Sequence[Fence], preflight: Preflight) -> Fence:
        refusal = preflight()
        if refusal is not None:
            return finished_fence(refusal)
        table = self._table
        stream = self.stream
        issued_at = time.perf_counter()
        try:
            for fence in waits:
                if isinstance(fence, StreamFence):
                    event = fence.pending_event()
                    if event is not None:
                        table.stream_wait_event(stream, event)
            program.launch(table, stream)
            event = self._pool.take()
            table.event_record(event, stream)
        except BackendError as exc:
            return finished_fence(exc)
        fence = StreamFence(self.fences, event, issued_at)
        self.fences.add(fence)
        return fence

    # The loop's side of `StreamFences` (see `WatchedQueue`).

    def watch(self) -> None:
        self.fences.watch()

    def unwatch(self) -> None:
        self.fences.unwatch()

    def sweep(self, limit: int) -> tuple[int, bool]:
        return self.fences.sweep(limit)

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
                _quietly(table.free, pointer)
                raise
            return NativeStorage(pointer, pointer, nbytes, host=False)
        pointer = table.host_alloc(nbytes)
        try:
            device_pointer = table.host_device_pointer(pointer)
        except BaseException:
            _quietly(table.host_free, pointer)
            raise
        ctypes.memset(pointer, 0, nbytes)
        return NativeStorage(pointer, device_pointer, nbytes, host=True)

    def free(self, storage: Any) -> None:
        if not isinstance(storage, NativeStorage) or self._closed:
            return
        if storage.owner is not None:
            storage.owner = None
        elif storage.host:
            _quietly(self.table.host_free, storage.pointer)
        else:
            _quietly(self.table.free, storage.pointer)
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

    def prepare_region(self, lane: Lane, ops: Sequence[Op]) -> GraphProgram | CopyProgram:
        if len(ops) == 1 and isinstance(ops[0], Copy):
            op = ops[0]
            return CopyProgram(_address(op.dst), _address(op.src), op.dst.nbytes)
        return self._capture(ops)

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
            _quietly(table.graph_destroy, graph)
            raise
        program = GraphProgram(graph_exec, tuple(keepalive))
        key = id(program)
        self._graphs[key] = (graph, graph_exec)
        self._graph_finalizers.append(weakref.finalize(program, self._release_graph, key))
        self.native_graphs_prepared += 1
        return program

    def _release_graph(self, key: int) -> None:
        entry = self._graphs.pop(key, None)
        if entry is None or self._closed:
            return
        graph, graph_exec = entry
        # An executable graph still in flight is freed by the driver when it completes.
        _quietly(self.table.graph_exec_destroy, graph_exec)
        _quietly(self.table.graph_destroy, graph)

    def _issue(self, op: Op, stream: Any, keepalive: list[Any]) -> None:
        table = self.table
        if isinstance(op, Fill):
            table.memset_async(_address(op.dst), op.value, op.dst.nbytes, stream)
        elif isinstance(op, Copy):
            table.memcpy_async(_address(op.dst), _address(op.src), op.dst.nbytes, stream)
        elif isinstance(op, Launch):
            kernel = op.kernel
            native = kernel.native
            if not isinstance(native, NativeKernel):
                raise Unsupported(
                    f"kernel {kernel.name!r} was not loaded by the {self.name} backend"
                )
            constants = kernel.contract.constants
            arguments = KernelArguments(
                [_address(view) for view in op.views],
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
            _quietly(table.module_unload, module)
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
        return NativeStorage(pointer, device_pointer, nbytes, host=host, owner=owner)

    def interop_stream(self) -> int:
        """A stream of the runtime's own for native code (`Runtime.gpu_access`)."""
        if self._interop_stream is None:
            self._interop_stream = self.table.stream_create()
            handle = self.table.stream_handle(self._interop_stream)
            self._streams[handle] = self._interop_stream
        return self.table.stream_handle(self._interop_stream)

    def fence_on_stream(self, handle: int) -> StreamFence:
        """A fence for everything queued so far on the raw stream `handle`."""
        event = self.events.take()
        table = self.table
        issued_at = time.perf_counter()
        try:
            table.event_record(event, handle)
        except BaseException:
            self.events.give(event)
            raise
        fences = self._fences_of(handle)
        fence = StreamFence(fences, event, issued_at)
        fences.add(fence)
        return fence

    def wait_on_stream(self, handle: int, fences: Sequence[Fence]) -> bool:
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
        return info

    def close(self) -> None:
        if self._closed:
            return
        table = self.table
        for stream in self._streams.values():
            _quietly(table.stream_synchronize, stream)
        for fences in self._fences.values():
            fences.close()
        self._fences.clear()
        for finalizer in self._graph_finalizers:
            finalizer()
        self._graph_finalizers.clear()
        for module in self._modules:
            _quietly(table.module_unload, module)
        self._modules.clear()
        for stream in self._streams.values():
            _quietly(table.stream_destroy, stream)
        self._streams.clear()
        self._queues.clear()
        if self._setup_stream is not None:
            _quietly(table.stream_destroy, self._setup_stream)
            self._setup_stream = None
        self.events.close()
        self._closed = True


def _address(view: Any) -> int:
    storage = view.buffer.storage
    if not isinstance(storage, NativeStorage):
        raise ContractError(f"{view} is not memory of a stream backend")
    return storage.device_pointer + int(view.offset)


__all__ = [
    "DLPACK_CPU",
    "DLPACK_CUDA",
    "DLPACK_ROCM",
    "CopyProgram",
    "DriverTable",
    "EventPool",
    "FenceWaiter",
    "GraphProgram",
    "KernelArguments",
    "NativeKernel",
    "NativeStorage",
    "StreamBackend",
    "StreamFence",
    "StreamFences",
    "StreamQueue",
    "check_kernel_metadata",
    "constant_sizes",
    "finished_fence",
    "make_error",
]
