"""Runtime: one allocation and scheduling domain.

`async with Runtime() as rt:` opens the backend, starts the lanes in a task
group and, on exit, drains pending work before closing. Everything that
records, prepares or submits is synchronous; only waiting is async.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
import weakref
from collections.abc import Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import anyio
import anyio.abc

from ._core import validate as _validate
from ._core.contract import Access, KernelContract, check_dims
from ._core.graph import Graph, GraphPlan
from ._core.kernels import GpuKernel, KernelSource, NpuKernel
from ._core.lane import Lane
from ._core.memory import (
    GPU_LOCAL,
    Buffer,
    Domain,
    HostMapping,
    MemoryBudget,
    Placement,
    PlacementKind,
    View,
    gpu_local,
)
from ._core.stats import Counters, Statistics
from ._core.trace import ExecutionTrace, TraceRecorder
from ._runtime import interop
from ._runtime.host import HostExecutor
from ._runtime.mappings import HostMappings
from ._runtime.prepared import PreparedGraph
from ._runtime.scheduler import Scheduler
from .backends import GPU_BACKENDS, open_gpu_backend
from .backends.base import Backend
from .backends.sim import SimBackend
from .errors import (
    BackendError,
    BackendUnavailable,
    Busy,
    ContractError,
    DeviceLost,
    RuntimeClosed,
)

NPU_CHOICES = ("auto", "sim", "xrt", None)
_MAX_SIM_NPUS = 64
"""Each sim NPU is a lane task; more than this is a mistake, not a machine."""
_MAX_GPUS = 64
"""Each GPU is three lane tasks; more than this is a mistake, not a machine."""


@dataclass(frozen=True)
class GpuDevice:
    """One of the runtime's GPUs: which backend drives it, its device ordinal (`index`),
    the code target kernels need, and its number in the runtime (`gpu_local(number)`)."""

    backend: str
    index: int
    target: str
    number: int = 0

    @property
    def local(self) -> Placement:
        """This GPU's device memory."""
        return gpu_local(self.number)


class NpuDevice:
    """One NPU of a runtime. Programs are loaded with `load_artifact`."""

    def __init__(self, runtime: Runtime, index: int, target: str) -> None:
        self._runtime = runtime
        self.index = index
        self.target = target

    def load_artifact(
        self, source: KernelSource, name: str, columns: int, contract: KernelContract
    ) -> NpuKernel:
        """Load an NPU program: 1..8 columns, no scalar constants, built for this NPU's target."""
        return self._runtime._load_npu_kernel(self, source, name, columns, contract)

    def __repr__(self) -> str:
        return f"<NpuDevice {self.index} {self.target}>"


class Runtime:
    """One allocation and scheduling domain over a GPU backend and NPUs.

    backend: "auto" (HRX_BACKEND, else cuda, hip, then sim), "sim", "cuda" or "hip".
    device / devices: the GPU ordinal, or several distinct ordinals (one runtime over
    several GPUs: each has its own upload, compute and download lanes, `gpu_local(i)`
    is memory of `devices[i]`, `GPU_LOCAL` of the first; the sim backend simulates as
    many GPUs as listed). Give one or the other.
    npu: "auto" (HRX_NPU, else "xrt" when pyxrt imports and `xrt.device(0)` opens, else
    sim NPUs; `fallback_reasons` says why xrt was skipped), "sim", "xrt" (raises
    `BackendUnavailable` when it cannot open), or None for no NPU.
    memory_budget: None, bytes >= 1, or a MemoryBudget to share (`Residency.budget`: one
    ceiling for allocations and cached values, evicting idle ones).
    max_submissions: >= 1. device: >= 0.
    sim_npus: 0..64. label: a string. Integers may be numpy integers, never bools or
    floats; anything else raises `ContractError`.

    Leaving `async with Runtime() as rt:`

    * normally: waits until the runtime is quiet — every submission finished and every
      `async with view.map_read()/map_write()` (and `gpu_access`) block held by another
      task ended, including work and mappings those tasks start meanwhile — then
      refuses new mappings and closes. Cancelling this wait closes at once, as below.
    * with an exception (cancellation included): cancels submitted work that has not
      started, waits for what runs, and does not wait for mappings.

    Either way, mappings still held when the backend closes — `*_nowait` mappings, and
    on an abnormal exit the `async with` ones — are invalidated first: their memoryviews
    are released (any later use raises `ValueError`), and releasing them afterwards is
    harmless. Native memory still reachable through an object derived from a mapping (a
    slice, a cast, a numpy array over it) is not freed until that object is gone, so
    nothing can write into freed storage.
    """

    def __init__(
        self,
        backend: str = "auto",
        npu: str | None = "auto",
        memory_budget: int | MemoryBudget | None = None,
        max_submissions: int = 64,
        device: int = 0,
        sim_npus: int = 1,
        label: str = "runtime",
        devices: Iterable[int] | None = None,
    ) -> None:
        # Names are checked when the backend opens (`async with`), where HRX_BACKEND is read.
        backend = _validate.text(backend, f"backend (auto, {', '.join(GPU_BACKENDS)})", empty=False)
        npu = _validate.choice(npu, "npu", NPU_CHOICES)
        if memory_budget is not None and not isinstance(memory_budget, MemoryBudget):
            memory_budget = MemoryBudget(
                _validate.integer(memory_budget, "memory_budget (bytes)", 1)
            )
        max_submissions = _validate.integer(max_submissions, "max_submissions", 1)
        device = _validate.integer(device, "device", 0)
        gpus = (device,) if devices is None else _device_list(devices, device)
        sim_npus = _validate.integer(sim_npus, "sim_npus", 0, _MAX_SIM_NPUS)
        label = _validate.text(label, "label")
        self._budget = memory_budget
        self._backend_name = backend
        self._npu_mode = npu
        self._sim_npus = sim_npus if npu is not None else 0
        self._devices = gpus
        self.max_submissions = max_submissions
        self.domain = Domain(label)
        self.fallback_reasons: list[str] = []
        self._counters = Counters()
        self._backend: Backend | None = None
        self._npu_backend: Any = None
        self._host: HostExecutor | None = None
        self._scheduler: Scheduler | None = None
        self._task_group: anyio.abc.TaskGroup | None = None
        self._buffers: weakref.WeakValueDictionary[int, Buffer] = weakref.WeakValueDictionary()
        self._finalizers: dict[int, weakref.finalize[Any, Any]] = {}
        self._host_mappings = HostMappings(self)
        self._trace: TraceRecorder | None = None
        self._lost: BaseException | None = None
        self._entered = False

    # -- lifetime --------------------------------------------------------------

    async def __aenter__(self) -> Runtime:
        if self._entered:
            raise RuntimeClosed("a Runtime can be entered once; create a new one")
        self._entered = True
        backend, reasons = open_gpu_backend(self._backend_name, self._devices)
        self._backend = backend
        self.fallback_reasons = reasons
        try:
            npus = self._open_npus(backend)
        except BaseException:
            backend.close()
            raise
        self._host = HostExecutor(backend.host_array)
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = task_group
        self._scheduler = Scheduler(
            task_group, self._counters, self.max_submissions, self._device_lost
        )
        self._scheduler.start(len(self._devices), npus)
        return self

    def _open_npus(self, backend: Backend) -> int:
        """Choose the NPU backend (see the class docstring); returns how many NPUs it has."""
        mode = self._npu_mode
        if mode == "auto":
            mode = os.environ.get("HRX_NPU", "auto").strip().lower() or "auto"
            if mode == "none":
                mode = None
            elif mode not in NPU_CHOICES:
                raise ContractError(f"HRX_NPU must be one of auto, sim, xrt, none; got {mode!r}")
        if mode in ("auto", "xrt"):
            from .backends import xrt

            try:
                self._npu_backend = xrt.open_npu_backend(0, backend.host_array)
            except BackendUnavailable as exc:
                if mode == "xrt":
                    raise
                self.fallback_reasons.append(f"npu: {exc}; using the sim NPU")
            else:
                return int(self._npu_backend.npu_count())
        if mode is None:
            self._sim_npus = 0
        if isinstance(backend, SimBackend):
            backend._npus = self._sim_npus
            self._npu_backend = backend
        elif self._sim_npus:
            self._npu_backend = SimBackend(self._sim_npus, host_array=backend.host_array)
        return self._sim_npus

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        """Close as the class docstring says: quiet first on a normal exit, then close."""
        scheduler, task_group = self._scheduler, self._task_group
        assert scheduler is not None and task_group is not None
        try:
            if exc is None:
                await self._settle(scheduler)
        finally:
            self._host_mappings.closing = True
            try:
                with anyio.CancelScope(shield=True):
                    try:
                        if exc is not None:
                            scheduler.cancel_all()
                        await scheduler.drain()
                    finally:
                        scheduler.close_lanes()
                # The lanes are closed and drained; the body's own exception (if any)
                # propagates as it is rather than wrapped in the lanes' task group.
                await task_group.__aexit__(None, None, None)
            finally:
                self._close_backends()
        return None

    async def _settle(self, scheduler: Scheduler) -> None:
        """Wait until no submission is in flight and no other task holds an `async with`
        mapping. Draining is shielded as on every exit; waiting for mappings is not."""
        while True:
            with anyio.CancelScope(shield=True):
                await scheduler.drain()
            if not await self._host_mappings.wait_for_other_tasks():
                return

    def _close_backends(self) -> None:
        # Closed before anything that can fail, so a close that fails part-way still
        # refuses every later call; each step below runs even when an earlier one raised.
        self._scheduler = None
        self._host_mappings.closing = True
        with contextlib.ExitStack() as steps:  # runs them last-pushed first
            for closable in (self._backend, self._npu_backend, self._host):
                if closable is not None:
                    steps.callback(closable.close)
            steps.callback(self._release_all)
            steps.callback(self._host_mappings.invalidate)

    def _release_all(self) -> None:
        # The cyclic GC (or another thread) may run finalizers at any point in here, and
        # they pop their own entries: so no iteration over the dict, only atomic pops, and
        # calling a finalizer that already ran does nothing.
        finalizers, failed = self._finalizers, None
        while finalizers:
            try:
                ident, finalizer = finalizers.popitem()
            except KeyError:  # emptied by a finalizer since the test
                break
            buffer = self._buffers.get(ident)
            try:
                finalizer()
            except Exception as exc:  # free the rest first, then say what failed
                failed = failed or exc
            if buffer is not None:
                buffer._mark_released()
        if failed is not None:
            raise failed

    def _scheduler_or_raise(self) -> Scheduler:
        scheduler = self._scheduler
        if scheduler is None:
            state = "closed" if self._entered else "not open yet"
            raise RuntimeClosed(f"the runtime is {state}; use it inside `async with Runtime()`")
        return scheduler

    def _backend_or_raise(self) -> Backend:
        self._scheduler_or_raise()
        assert self._backend is not None
        return self._backend

    def _device_lost(self, error: BaseException) -> None:
        self._lost = error
        scheduler = self._scheduler
        if scheduler is not None:
            scheduler.fail_pending(DeviceLost(f"the device was lost ({error})"))

    @property
    def healthy(self) -> bool:
        """False once a sticky device error has been seen (the runtime then refuses work)."""
        return self._lost is None

    @property
    def backend_name(self) -> str:
        return self._backend_or_raise().name

    @property
    def memory_budget(self) -> MemoryBudget | None:
        return self._budget

    # -- devices and kernels ---------------------------------------------------

    def gpu(self, number: int = 0) -> GpuDevice:
        """The runtime's GPU number `number` (0: the first, whose memory is GPU_LOCAL)."""
        backend = self._backend_or_raise()
        gpus = len(self._devices)
        checked = _validate.as_integer(number)
        if checked is None or not 0 <= checked < gpus:
            raise ContractError(f"GPU number must be in 0..{gpus - 1}, got {number!r}")
        # A several-GPU backend keeps one backend per device, each with its own target.
        each = getattr(backend, "devices", None)
        target = each[checked].target if isinstance(each, tuple) else backend.target
        return GpuDevice(backend.name, self._devices[checked], target, checked)

    def gpus(self) -> tuple[GpuDevice, ...]:
        """Every GPU of the runtime, in `devices` order."""
        return tuple(self.gpu(number) for number in range(len(self._devices)))

    def _check_placement(self, placement: Placement) -> None:
        """The GPU or NPU a placement names must be one of this runtime's."""
        if placement.npu is not None:
            npus = self._npu_backend.npu_count() if self._npu_backend is not None else 0
            if placement.npu >= npus:
                raise ContractError(
                    f"placement {placement} names NPU {placement.npu}; this runtime has {npus}"
                )
        if placement.gpu >= len(self._devices):
            raise ContractError(
                f"placement {placement} names GPU {placement.gpu}; this runtime has "
                f"{len(self._devices)} (Runtime(devices=[...]))"
            )

    def npu(self, index: int = 0) -> NpuDevice:
        self._scheduler_or_raise()
        npus = self._npu_backend.npu_count() if self._npu_backend is not None else 0
        number = _validate.as_integer(index)
        if number is None or not 0 <= number < npus:
            raise ContractError(
                f"NPU index must be in 0..{npus - 1}, got {index!r}"
                if npus
                else "this runtime has no NPU (Runtime(npu=None))"
            )
        assert self._npu_backend is not None
        return NpuDevice(self, number, self._npu_backend.npu_target(number))

    def load_gpu_kernel(
        self,
        source: KernelSource,
        name: str,
        grid: Iterable[int],
        block: Iterable[int],
        contract: KernelContract,
        defines: Mapping[str, str | int] | None = None,
        shared_bytes: int = 0,
    ) -> GpuKernel:
        """Load (compile if needed) a GPU kernel for this runtime's device."""
        backend = self._backend_or_raise()
        _validate.instance(source, KernelSource, "source")
        _validate.text(name, "a kernel name", empty=False)
        grid3, block3 = check_dims("grid", grid), check_dims("block", block)
        _validate.instance(contract, KernelContract, "contract")
        flags = _validate.string_map(defines, "defines")
        shared_bytes = _validate.integer(shared_bytes, "shared_bytes", 0, _validate.MAX_DIM)
        native = backend.load_gpu_kernel(source, name, grid3, block3, contract, flags)
        return GpuKernel(
            name, grid3, block3, contract, source, backend.target, self.domain, native, shared_bytes
        )

    def _load_npu_kernel(
        self,
        npu: NpuDevice,
        source: KernelSource,
        name: str,
        columns: int,
        contract: KernelContract,
    ) -> NpuKernel:
        self._scheduler_or_raise()
        assert self._npu_backend is not None
        _validate.instance(source, KernelSource, "source")
        _validate.text(name, "a kernel name", empty=False)
        columns = _validate.integer(columns, "NPU columns", 1)
        _validate.instance(contract, KernelContract, "contract")
        native = self._npu_backend.load_npu_kernel(npu.index, source, name, columns, contract)
        return NpuKernel(
            name, npu.index, columns, contract, source, npu.target, self.domain, native
        )

    # -- memory ----------------------------------------------------------------

    def allocate(self, nbytes: int, placement: Placement, label: str = "") -> Buffer:
        """Zeroed memory of `nbytes` (an integer in 1..2**62) with `placement`, charged to
        the budget first. `ContractError` for bad arguments, `BudgetExceeded`/`Busy` from
        the budget, `BackendError` (code "out of memory") when the backend has no room;
        nothing is allocated or counted when it raises."""
        backend = self._backend_or_raise()
        nbytes = _validate.integer(nbytes, "allocation size (bytes)", 1, _validate.MAX_ALLOCATION)
        _validate.instance(placement, Placement, "placement", "GPU_LOCAL, HOST_VISIBLE, ...")
        _validate.text(label, "label")
        self._check_placement(placement)
        allocator = self._allocator(backend, placement)
        if self._budget is not None:
            self._budget.charge(nbytes)
        try:
            storage = allocator.allocate(nbytes, placement)
        except BaseException as exc:
            if self._budget is not None:
                self._budget.release(nbytes)
            if isinstance(exc, MemoryError):
                raise BackendError(
                    backend.name,
                    "allocate",
                    "out of memory",
                    f"{nbytes} bytes of {placement} memory do not fit",
                ) from exc
            raise
        buffer = Buffer(self, nbytes, placement, storage, label)
        self._counters.allocated(nbytes)
        if placement.kind is PlacementKind.SHARED:
            self._counters.imports += 1
        self._buffers[buffer.ident] = buffer
        self._finalizers[buffer.ident] = weakref.finalize(
            buffer, self._release_storage, buffer.ident, storage, nbytes
        )
        return buffer

    def _allocator(self, backend: Backend, placement: Placement) -> Any:
        """NPU placements are the NPU backend's memory where it has its own (xrt) and the
        GPU backend's memory is host memory (sim); otherwise the GPU backend's."""
        npu = self._npu_backend
        if (
            placement.npu is not None
            and npu is not None
            and npu is not backend
            and hasattr(npu, "allocate")
            and isinstance(backend, SimBackend)
        ):
            return npu
        return backend

    def _release_storage(self, ident: int, storage: Any, nbytes: int) -> None:
        self._finalizers.pop(ident, None)
        free = self._backend.free if self._backend is not None else None
        self._host_mappings.free_storage(ident, storage, free)
        self._counters.released(nbytes)
        if self._budget is not None:
            self._budget.release(nbytes)
        # Nothing to tell the tracker: pending work and mappings hold views, so a buffer
        # that is released (freed or collected) has no tracked users left.

    def _release_buffer(self, buffer: Buffer) -> None:
        scheduler = self._scheduler
        if scheduler is not None and (
            not scheduler.tracker.untouched(buffer.ident) or self._host_mappings.holds(buffer.ident)
        ):
            raise Busy(f"{buffer.label} is in use by submitted work or a host mapping")
        finalizer = self._finalizers.get(buffer.ident)
        buffer._mark_released()
        if finalizer is not None:
            finalizer()

    def owns(self, view: View | Buffer) -> bool:
        buffer = view.buffer if isinstance(view, View) else view
        if not isinstance(buffer, Buffer):
            raise ContractError(f"owns() takes a View or a Buffer, got {_validate.shown(view)}")
        return buffer.domain is self.domain

    def same_domain(self, other: Runtime) -> bool:
        if not isinstance(other, Runtime):
            raise ContractError(f"same_domain() takes a Runtime, got {_validate.shown(other)}")
        return other.domain is self.domain

    # -- graphs ----------------------------------------------------------------

    def graph(self, label: str = "graph") -> Graph:
        self._scheduler_or_raise()
        return Graph(self.domain, label, self._prepare)

    def _prepare(self, plan: GraphPlan) -> PreparedGraph:
        backend = self._backend_or_raise()
        programs: list[Any] = []
        providers: list[object] = []
        for region in plan.regions:
            provider: Any
            if region.lane is Lane.HOST:
                provider = self._host
            elif region.lane is Lane.NPU:
                provider = self._npu_backend
            else:
                programs.append(backend.prepare_region(region.lane, region.ops, region.gpu))
                providers.append(backend)
                continue
            programs.append(provider.prepare_region(region.lane, region.ops))
            providers.append(provider)
        return PreparedGraph(self, plan, tuple(programs), tuple(providers))

    # -- statistics and trace --------------------------------------------------

    def statistics(self) -> Statistics:
        snapshot = self._counters.snapshot()
        backends = [b for b in (self._backend, self._npu_backend) if b is not None]
        unique = list({id(b): b for b in backends}.values())
        return dataclasses.replace(
            snapshot,
            native_graphs_prepared=sum(b.native_graphs_prepared for b in unique),
            copy_streams_created=sum(b.copy_streams_created for b in unique),
            cache_maintenance_bytes=snapshot.cache_maintenance_bytes
            + sum(getattr(b, "cache_maintenance_bytes", 0) for b in unique),
        )

    def start_trace(self, capacity: int = 65536) -> None:
        """Record one event per finished region into a ring buffer of `capacity` events."""
        scheduler = self._scheduler_or_raise()
        if scheduler.trace is not None:
            raise Busy("a trace is already running; finish_trace() first")
        scheduler.trace = TraceRecorder(capacity)
        scheduler.trace_origin = time.perf_counter()

    def finish_trace(self) -> ExecutionTrace | None:
        """Stop tracing and return the events (None when no trace runs). Does not wait."""
        scheduler = self._scheduler
        if scheduler is None or scheduler.trace is None:
            return None
        recorder, scheduler.trace = scheduler.trace, None
        return recorder.finish()

    async def drain(self) -> None:
        """Wait until every submission made so far has finished."""
        await self._scheduler_or_raise().drain()

    # -- host mappings (hrx_async._runtime.mappings) ------------------------------------

    @property
    def _mapping_count(self) -> int:
        """Live mappings: the scheduler checks conflicts on submit only when nonzero."""
        return self._host_mappings.count

    def _check_mapping_conflicts(self, plan: GraphPlan) -> None:
        self._host_mappings.check_conflicts(plan)

    def _map(self, view: View, write: bool, wait: bool) -> AbstractAsyncContextManager[memoryview]:
        return self._host_mappings.map(view, write, wait)

    def _map_nowait(self, view: View, write: bool) -> HostMapping:
        return self._host_mappings.map_nowait(view, write)

    # -- interop (hrx_async._runtime.interop) -------------------------------------------

    def adopt_gpu_buffer(
        self, obj: Any, placement: Placement = GPU_LOCAL, label: str = ""
    ) -> Buffer:
        """A buffer over another library's GPU array (PyTorch, CuPy: CUDA array interface or
        DLPack), zero-copy. The array is kept alive with the buffer; counted in `imports`;
        charged to the budget unless its bytes are already one of this runtime's buffers.
        Placement GPU_LOCAL or shared(npu) (host-mapped memory only). On sim: host arrays."""
        return interop.adopt_gpu_buffer(self, obj, placement, label)

    def gpu_access(
        self, accesses: Iterable[tuple[View, Access]], stream: int | None = None
    ) -> AbstractAsyncContextManager[interop.GpuAccess]:
        """`async with rt.gpu_access([(view, Access.WRITE), ...]) as access:` hands native code
        `access.stream` and `access.pointers`. Whole allocations are reserved; conflicting
        submitted work finishes first; submits and maps on them are `Busy` inside; later
        work is ordered after the block's stream work by an event. `stream`: queue on this
        raw handle instead of the runtime's own interop stream."""
        return interop.gpu_access(self, accesses, stream)

    def _dlpack(
        self,
        view: View,
        stream: int | None,
        max_version: tuple[int, int] | None,
        dl_device: tuple[int, int] | None,
        copy: bool | None,
    ) -> Any:
        return interop.export_dlpack(self, view, stream, max_version, dl_device, copy)

    def _dlpack_device(self, view: View) -> tuple[int, int]:
        return interop.dlpack_device(self, view)


def _device_list(devices: Iterable[int], device: int) -> tuple[int, ...]:
    if device != 0:
        raise ContractError("give Runtime(device=...) or Runtime(devices=[...]), not both")
    listed = tuple(
        _validate.integer(each, "a device ordinal", 0)
        for each in _validate.items(devices, "devices")
    )
    if not 1 <= len(listed) <= _MAX_GPUS:
        raise ContractError(f"devices lists 1..{_MAX_GPUS} GPU ordinals, got {len(listed)}")
    if len(set(listed)) != len(listed):
        raise ContractError(f"devices lists a GPU twice: {list(listed)}")
    return listed


__all__ = ["Access", "GpuDevice", "NpuDevice", "Runtime"]
