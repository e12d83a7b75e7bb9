"""Runtime: one allocation and scheduling domain.

`async with Runtime() as rt:` opens the backend, starts the lanes in a task
group and, on exit, drains pending work before closing. Everything that
records, prepares or submits is synchronous; only waiting is async.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from ._core import validate as _validate
from ._core.contract import Access, KernelContract, check_dims
from ._core.counters import Counters
from ._core.graph import Graph, GraphPlan
from ._core.kernels import GpuKernel, KernelSource, NpuKernel
from ._core.memory import (
    GPU_LOCAL,
    Buffer,
    Domain,
    HostMapping,
    MemoryBudget,
    Placement,
    View,
    gpu_local,
)
from ._core.stats import Statistics
from ._core.trace import ExecutionTrace, TraceRecorder
from ._runtime.completion import Completion
from ._runtime.interop import GpuAccess
from ._runtime.native import NativeSession
from ._runtime.prepared import PreparedGraph
from ._runtime.scheduler import Scheduler
from ._runtime.session import NPU_CHOICES, Session
from .backends import GPU_BACKENDS
from .backends.base import Backend
from .errors import (
    Busy,
    ContractError,
    RuntimeClosed,
)

T = TypeVar("T")

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
        # The name is checked here; what "auto" means (HRX_BACKEND) when the backend opens.
        backend = _validate.text(backend, f"backend (auto, {', '.join(GPU_BACKENDS)})", empty=False)
        if backend != "auto" and backend not in GPU_BACKENDS:
            raise ContractError(
                f"backend must be one of auto, {', '.join(GPU_BACKENDS)}; got {backend!r}"
            )
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
        self._session: Session | None = None
        """The opened state (`_runtime.session.Session`): made on entering, kept after
        closing (buffers still alive are freed through it)."""
        self._entered = False

    # -- lifetime --------------------------------------------------------------

    async def __aenter__(self) -> Runtime:
        if self._entered:
            raise RuntimeClosed("a Runtime can be entered once; create a new one")
        self._entered = True
        self.fallback_reasons = []
        self._session = await Session.open(
            self,
            self._backend_name,
            self._npu_mode,
            self._sim_npus,
            self._devices,
            self._budget,
            self._counters,
            self.max_submissions,
            self.fallback_reasons,
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        """Close as the class docstring says: quiet first on a normal exit, then close."""
        assert self._session is not None
        await self._session.close(exc)
        return None

    def _opened(self) -> Session:
        """The session, open or closed; `RuntimeClosed` before `async with`."""
        session = self._session
        if session is None:
            raise RuntimeClosed("the runtime is not open yet; use it inside `async with Runtime()`")
        return session

    def _scheduler_or_raise(self) -> Scheduler:
        return self._opened().scheduler_or_raise()

    def _backend_or_raise(self) -> Backend:
        return self._opened().backend_or_raise()

    @property
    def _scheduler(self) -> Scheduler | None:
        return self._session.scheduler if self._session is not None else None

    @property
    def _backend(self) -> Backend | None:
        return self._session.backend if self._session is not None else None

    @property
    def _npu_backend(self) -> Any:
        return self._session.npu_backend if self._session is not None else None

    @property
    def healthy(self) -> bool:
        """False once a sticky device error has been seen (the runtime then refuses work)."""
        return self._session is None or self._session.lost is None

    @property
    def backend_name(self) -> str:
        """The GPU backend this runtime opened (`sim`, `cuda`, `hip`). `RuntimeClosed` outside
        `async with`."""
        return self._backend_or_raise().name

    @property
    def memory_budget(self) -> MemoryBudget | None:
        """The `MemoryBudget` every allocation is charged to, or None when the runtime has no
        ceiling."""
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

    def native_session(
        self, state: T, fence: Callable[[T], Any], gpu: int = 0, label: str = "native-session"
    ) -> NativeSession[T]:
        """A third-party stage (a library with its own streams and memory) run in this
        runtime's order on GPU `gpu`'s compute lane: `await session.run(stage)` (see
        `NativeSession`). `fence(state)` must drain every stream `state` uses; it runs after
        every stage, failed ones too."""
        self.gpu(gpu)  # checks the number
        if not isinstance(label, str):
            raise ContractError(f"label must be a str, got {label!r}")
        return NativeSession(self._scheduler_or_raise, id(self), state, fence, gpu, label)

    def gpus(self) -> tuple[GpuDevice, ...]:
        """Every GPU of the runtime, in `devices` order."""
        return tuple(self.gpu(number) for number in range(len(self._devices)))

    def npu(self, index: int = 0) -> NpuDevice:
        """NPU `index` of this runtime, to load NPU programs on (`load_artifact`).

        `ContractError` when `index` is not an int in `range(npus)` or the runtime has no NPU;
        `RuntimeClosed` outside `async with`."""
        session = self._opened()
        session.scheduler_or_raise()
        npus = session.npu_count()
        number = _validate.as_integer(index)
        if number is None or not 0 <= number < npus:
            raise ContractError(
                f"NPU index must be in 0..{npus - 1}, got {index!r}"
                if npus
                else "this runtime has no NPU (Runtime(npu=None))"
            )
        return NpuDevice(self, number, session.npu_backend.npu_target(number))

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
        session = self._opened()
        session.scheduler_or_raise()
        _validate.instance(source, KernelSource, "source")
        _validate.text(name, "a kernel name", empty=False)
        columns = _validate.integer(columns, "NPU columns", 1)
        _validate.instance(contract, KernelContract, "contract")
        native = session.npu_backend.load_npu_kernel(npu.index, source, name, columns, contract)
        return NpuKernel(
            name, npu.index, columns, contract, source, npu.target, self.domain, native
        )

    # -- memory ----------------------------------------------------------------

    def allocate(self, nbytes: int, placement: Placement, label: str = "") -> Buffer:
        """Zeroed memory of `nbytes` (an integer in 1..2**62) with `placement`, charged to
        the budget first. `ContractError` for bad arguments, `BudgetExceeded`/`Busy` from
        the budget, `BackendError` (code "out of memory") when the backend has no room;
        nothing is allocated or counted when it raises."""
        session = self._opened()
        session.backend_or_raise()
        nbytes = _validate.integer(nbytes, "allocation size (bytes)", 1, _validate.MAX_ALLOCATION)
        _validate.instance(placement, Placement, "placement", "GPU_LOCAL, HOST_VISIBLE, ...")
        _validate.text(label, "label")
        return session.allocate(nbytes, placement, label)

    def _release_buffer(self, buffer: Buffer) -> None:
        self._opened().release_buffer(buffer)

    def owns(self, view: View | Buffer | Completion) -> bool:
        """Whether `view` (a `View` or a `Buffer`) was allocated by this runtime's domain, or
        a `Completion` came from a submission to this runtime (what `after=` accepts; False
        before `async with` and for one of an earlier opening).

        `ContractError` for anything else."""
        if isinstance(view, Completion):
            scheduler = self._scheduler
            return scheduler is not None and view.owner is scheduler
        buffer = view.buffer if isinstance(view, View) else view
        if not isinstance(buffer, Buffer):
            raise ContractError(
                f"owns() takes a View, a Buffer or a Completion, got {_validate.shown(view)}"
            )
        return buffer.domain is self.domain

    def same_domain(self, other: Runtime) -> bool:
        """Whether `other` shares this runtime's allocation and scheduling domain.

        `ContractError` when `other` is not a `Runtime`."""
        if not isinstance(other, Runtime):
            raise ContractError(f"same_domain() takes a Runtime, got {_validate.shown(other)}")
        return other.domain is self.domain

    # -- graphs ----------------------------------------------------------------

    def graph(self, label: str = "graph") -> Graph[PreparedGraph]:
        """A new, empty `Graph` to record fills, copies, kernels and host functions into.

        Each recording call checks its arguments at once; `prepare()` returns a `PreparedGraph`
        of this runtime. `RuntimeClosed` outside `async with` or after closing."""
        session = self._opened()
        session.scheduler_or_raise()
        return Graph(self.domain, label, session.prepare)

    def _prepare(self, plan: GraphPlan) -> PreparedGraph:
        return self._opened().prepare(plan)

    # -- statistics and trace --------------------------------------------------

    def statistics(self) -> Statistics:
        """A frozen snapshot of the 13 counters (allocations, copies, submissions, native graphs,
        ...); `to_dict()`/`to_json()` serialize it. Never waits and works after closing too."""
        snapshot = self._counters.snapshot()
        unique = self._session.backends() if self._session is not None else []
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

    # -- host mappings and interop (the session's) -----------------------------------

    @property
    def _mapping_count(self) -> int:
        """Live mappings: the scheduler checks conflicts on submit only when nonzero."""
        return self._session.mappings.count if self._session is not None else 0

    def _map(self, view: View, write: bool, wait: bool) -> AbstractAsyncContextManager[memoryview]:
        return self._opened().mappings.map(view, write, wait)

    def _map_nowait(self, view: View, write: bool) -> HostMapping:
        return self._opened().mappings.map_nowait(view, write)

    def adopt_gpu_buffer(
        self, obj: Any, placement: Placement = GPU_LOCAL, label: str = ""
    ) -> Buffer:
        """A buffer over another library's GPU array (PyTorch, CuPy: CUDA array interface or
        DLPack), zero-copy. The array is kept alive with the buffer; counted in `imports`;
        charged to the budget unless its bytes are already one of this runtime's buffers.
        Placement GPU_LOCAL or shared(npu) (host-mapped memory only). On sim: host arrays."""
        return self._opened().interop.adopt_gpu_buffer(obj, placement, label)

    def gpu_access(
        self, accesses: Iterable[tuple[View, Access]], stream: int | None = None
    ) -> AbstractAsyncContextManager[GpuAccess]:
        """`async with rt.gpu_access([(view, Access.WRITE), ...]) as access:` hands native code
        `access.stream` and `access.pointers`. Whole allocations are reserved; conflicting
        submitted work finishes first; submits and maps on them are `Busy` inside; later
        work is ordered after the block's stream work by an event. `stream`: queue on this
        raw handle instead of the runtime's own interop stream."""
        return self._opened().interop.gpu_access(accesses, stream)

    def _dlpack(
        self,
        view: View,
        stream: int | None,
        max_version: tuple[int, int] | None,
        dl_device: tuple[int, int] | None,
        copy: bool | None,
    ) -> Any:
        return self._opened().interop.export_dlpack(view, stream, max_version, dl_device, copy)

    def _dlpack_device(self, view: View) -> tuple[int, int]:
        return self._opened().interop.dlpack_device(view)


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


__all__ = ["GpuDevice", "NpuDevice", "Runtime"]
