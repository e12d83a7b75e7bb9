"""Session: the opened state of one runtime.

`Runtime` is the public handle: it checks arguments and holds its settings. Entering it
(`async with Runtime() as rt:`) opens a `Session`: the GPU and NPU backends, the host
lane, the task group the lanes run in, the scheduler, the book of host mappings, interop,
and the buffers allocated meanwhile. Everything that needs the opened state goes through
the session; leaving the runtime closes it, and it then refuses work (`RuntimeClosed`)
while the buffers still alive are freed as they go.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc

from .._core.counters import AdmissionMarks, Counters
from .._core.graph import GraphPlan, RegionPlan
from .._core.lane import Lane
from .._core.memory import Buffer, BufferOwner, Domain, MemoryBudget, Placement, PlacementKind
from .._core.ops import External
from ..backends import open_gpu_backend
from ..backends.base import Backend, GpuInterop
from ..backends.sim import SimBackend
from ..errors import (
    BackendError,
    BackendUnavailable,
    Busy,
    ContractError,
    DeviceLost,
    RuntimeClosed,
)
from .capsules import ExternalTensor
from .host import HostExecutor
from .interop import Interop
from .mappings import HostMappings
from .prepared import PreparedGraph
from .scheduler import Scheduler

NPU_CHOICES = ("auto", "sim", "xrt", None)


class Session:
    """The backends, lanes, scheduler, mappings and interop of one opened runtime.

    Made by `Session.open` only (from `Runtime.__aenter__`); `scheduler` is None once it
    has closed. `owner` is the runtime handle its buffers belong to.
    """

    def __init__(
        self,
        owner: BufferOwner,
        devices: tuple[int, ...],
        budget: MemoryBudget | None,
        counters: Counters,
        backend: Backend,
        npu_backend: Any,
    ) -> None:
        self.owner = owner
        self.domain: Domain = owner.domain
        self.devices = devices
        self.budget = budget
        self.counters = counters
        self.backend = backend
        self.npu_backend = npu_backend
        self.host: HostExecutor | None = HostExecutor(backend.host_array)
        self.task_group: anyio.abc.TaskGroup | None = None
        self.scheduler: Scheduler | None = None
        self.buffers: weakref.WeakValueDictionary[int, Buffer] = weakref.WeakValueDictionary()
        self.finalizers: dict[int, weakref.finalize[Any, Any]] = {}
        self.marks = AdmissionMarks()
        """Buffers freed so far and host mappings live, as admission reads them."""
        self.mappings = HostMappings(self, self.marks)
        self.interop = Interop(self)
        self.lost: BaseException | None = None

    # -- opening -------------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        owner: BufferOwner,
        backend_name: str,
        npu_mode: str | None,
        sim_npus: int,
        devices: tuple[int, ...],
        budget: MemoryBudget | None,
        counters: Counters,
        max_submissions: int,
        fallback_reasons: list[str],
    ) -> Session:
        """Open the backends, start the lanes; `fallback_reasons` gets why a backend was
        skipped. Nothing stays open when it raises."""
        backend, reasons = open_gpu_backend(backend_name, devices)
        fallback_reasons.extend(reasons)
        try:
            npu_backend, npus = _open_npus(backend, npu_mode, sim_npus, fallback_reasons)
        except BaseException:
            backend.close()
            raise
        session = cls(owner, devices, budget, counters, backend, npu_backend)
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        session.task_group = task_group
        session.scheduler = Scheduler(task_group, counters, max_submissions, session.device_lost)
        session.scheduler.start(len(devices), npus)
        return session

    # -- closing -------------------------------------------------------------------------

    async def close(self, exc: BaseException | None) -> None:
        """Close as `Runtime` says: quiet first on a normal exit (`exc` None), then close."""
        scheduler, task_group = self.scheduler, self.task_group
        assert scheduler is not None and task_group is not None
        try:
            if exc is None:
                await self._settle(scheduler)
        finally:
            self.mappings.closing = True
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

    async def _settle(self, scheduler: Scheduler) -> None:
        """Wait until no submission is in flight and no other task holds an `async with`
        mapping. Draining is shielded as on every exit; waiting for mappings is not."""
        while True:
            with anyio.CancelScope(shield=True):
                await scheduler.drain()
            if not await self.mappings.wait_for_other_tasks():
                return

    def _close_backends(self) -> None:
        # Closed before anything that can fail, so a close that fails part-way still
        # refuses every later call; each step below runs even when an earlier one raised.
        self.scheduler = None
        self.mappings.closing = True
        with contextlib.ExitStack() as steps:  # runs them last-pushed first
            for closable in (self.backend, self.npu_backend, self.host):
                if closable is not None:
                    steps.callback(closable.close)
            steps.callback(self._release_all)
            steps.callback(self.mappings.invalidate)

    def _release_all(self) -> None:
        # The cyclic GC (or another thread) may run finalizers at any point in here, and
        # they pop their own entries: so no iteration over the dict, only atomic pops, and
        # calling a finalizer that already ran does nothing.
        finalizers, failed = self.finalizers, None
        while finalizers:
            try:
                ident, finalizer = finalizers.popitem()
            except KeyError:  # emptied by a finalizer since the test
                break
            buffer = self.buffers.get(ident)
            try:
                finalizer()
            except Exception as exc:  # free the rest first, then say what failed
                failed = failed or exc
            if buffer is not None:
                buffer._mark_released()
                self.marks.frees += 1
        if failed is not None:
            raise failed

    # -- state -----------------------------------------------------------------------------

    def scheduler_or_raise(self) -> Scheduler:
        scheduler = self.scheduler
        if scheduler is None:
            raise RuntimeClosed("the runtime is closed; use it inside `async with Runtime()`")
        return scheduler

    def backend_or_raise(self) -> Backend:
        self.scheduler_or_raise()
        return self.backend

    def device_lost(self, error: BaseException) -> None:
        self.lost = error
        scheduler = self.scheduler
        if scheduler is not None:
            scheduler.fail_pending(DeviceLost(f"the device was lost ({error})"))

    def npu_count(self) -> int:
        return int(self.npu_backend.npu_count()) if self.npu_backend is not None else 0

    def check_placement(self, placement: Placement) -> None:
        """The GPU or NPU a placement names must be one of this runtime's."""
        if placement.npu is not None:
            npus = self.npu_count()
            if placement.npu >= npus:
                raise ContractError(
                    f"placement {placement} names NPU {placement.npu}; this runtime has {npus}"
                )
        if placement.gpu >= len(self.devices):
            raise ContractError(
                f"placement {placement} names GPU {placement.gpu}; this runtime has "
                f"{len(self.devices)} (Runtime(devices=[...]))"
            )

    # -- memory ------------------------------------------------------------------------------

    def allocate(self, nbytes: int, placement: Placement, label: str) -> Buffer:
        """See `Runtime.allocate` (which checks the arguments first)."""
        backend = self.backend_or_raise()
        self.check_placement(placement)
        allocator = self._allocator(backend, placement)
        if self.budget is not None:
            self.budget.charge(nbytes)
        try:
            storage = allocator.allocate(nbytes, placement)
        except BaseException as exc:
            if self.budget is not None:
                self.budget.release(nbytes)
            if isinstance(exc, MemoryError):
                raise BackendError(
                    backend.name,
                    "allocate",
                    "out of memory",
                    f"{nbytes} bytes of {placement} memory do not fit",
                ) from exc
            raise
        buffer = Buffer(self.owner, nbytes, placement, storage, label)
        self.counters.allocated(nbytes)
        if placement.kind is PlacementKind.SHARED:
            self.counters.imports += 1
        self.buffers[buffer.ident] = buffer
        self.finalizers[buffer.ident] = weakref.finalize(
            buffer, self._release_storage, buffer.ident, storage, nbytes
        )
        return buffer

    def _allocator(self, backend: Backend, placement: Placement) -> Any:
        """NPU placements are the NPU backend's memory where it has its own (xrt) and the
        GPU backend's memory is host memory (sim); otherwise the GPU backend's."""
        npu = self.npu_backend
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
        self.finalizers.pop(ident, None)
        free: Callable[[Any], None] | None = self.backend.free
        self.mappings.free_storage(ident, storage, free)
        self.counters.released(nbytes)
        if self.budget is not None:
            self.budget.release(nbytes)
        # Nothing to tell the tracker: pending work and mappings hold views, so a buffer
        # that is released (freed or collected) has no tracked users left.

    def release_buffer(self, buffer: Buffer) -> None:
        scheduler = self.scheduler
        if scheduler is not None and (
            not scheduler.tracker.untouched(buffer.ident) or self.mappings.holds(buffer.ident)
        ):
            raise Busy(f"{buffer.label} is in use by submitted work or a host mapping")
        finalizer = self.finalizers.get(buffer.ident)
        buffer._mark_released()
        self.marks.frees += 1
        if finalizer is not None:
            finalizer()

    # -- graphs --------------------------------------------------------------------------------

    def prepare(self, plan: GraphPlan) -> PreparedGraph:
        backend = self.backend_or_raise()
        programs: list[Any] = []
        providers: list[object] = []
        for region in plan.regions:
            provider: Any
            if region.lane is Lane.HOST:
                provider = self.host
            elif region.lane is Lane.NPU:
                provider = self.npu_backend
            else:
                programs.append(self._prepare_gpu_region(backend, region))
                providers.append(backend)
                continue
            programs.append(provider.prepare_region(region.lane, region.ops))
            providers.append(provider)
        return PreparedGraph(self.owner, self, plan, tuple(programs), tuple(providers))

    @staticmethod
    def _prepare_gpu_region(backend: Backend, region: RegionPlan) -> Any:
        ops = region.ops
        if len(ops) == 1 and isinstance(ops[0], External) and isinstance(backend, GpuInterop):
            op = ops[0]
            tensors = [
                ExternalTensor(
                    backend.device_pointer(view.buffer.storage) + view.offset,
                    view.nbytes,
                    backend.dlpack_device(view.buffer.storage),
                    not access.writes,
                    view,
                )
                for view, access in zip(op.views, op.accesses, strict=True)
            ]
            return backend.prepare_external(op.fn, tensors, region.gpu, op.prepare)
        return backend.prepare_region(region.lane, ops, region.gpu)

    def backends(self) -> list[Any]:
        """The GPU backend and the NPU backend, each once."""
        found = [b for b in (self.backend, self.npu_backend) if b is not None]
        return list({id(b): b for b in found}.values())


def _open_npus(
    backend: Backend, mode: str | None, sim_npus: int, fallback_reasons: list[str]
) -> tuple[Any, int]:
    """Choose the NPU backend (see `Runtime`); returns it (None for none) and how many NPUs
    it has."""
    if mode == "auto":
        mode = os.environ.get("HRX_NPU", "auto").strip().lower() or "auto"
        if mode == "none":
            mode = None
        elif mode not in NPU_CHOICES:
            raise ContractError(f"HRX_NPU must be one of auto, sim, xrt, none; got {mode!r}")
    if mode in ("auto", "xrt"):
        from ..backends import xrt

        try:
            npu_backend = xrt.open_npu_backend(0, backend.host_array)
        except BackendUnavailable as exc:
            if mode == "xrt":
                raise
            fallback_reasons.append(f"npu: {exc}; using the sim NPU")
        else:
            return npu_backend, int(npu_backend.npu_count())
    if mode is None:
        sim_npus = 0
    if isinstance(backend, SimBackend):
        backend.serve_npus(sim_npus)
        return backend, sim_npus
    if sim_npus:
        return SimBackend(sim_npus, host_array=backend.host_array), sim_npus
    return None, sim_npus


__all__ = ["NPU_CHOICES", "Session"]
