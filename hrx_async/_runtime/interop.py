"""Sharing buffers and streams with native code, PyTorch and CuPy.

* `adopt_gpu_buffer`: a `Buffer` over memory another library owns, read
  through `__cuda_array_interface__` or DLPack (on the sim backend: any
  C-contiguous host array). The owner is kept alive with the buffer; the
  statistic `imports` counts it; the memory budget is charged unless the bytes
  already belong to one of the runtime's own buffers.
* `View.__dlpack__` / `__dlpack_device__`: device memory is exported as a
  zero-copy CUDA (or ROCm) DLPack tensor of bytes; host memory (every
  placement on sim, pinned memory on GPU backends) through numpy. Pending
  writes to the bytes are ordered before the consumer's stream on the device,
  or refused with `Busy` when that cannot be done. The exported tensor keeps
  its buffer alive, but not the runtime: do not use it after the runtime closes.
* `gpu_access`: hands native code a stream and device pointers under the
  original's rules: whole allocations are reserved, a live host mapping is
  `Busy`, conflicting submitted work finishes first, submits and maps on those
  allocations are `Busy` while the block runs, and afterwards later work is
  ordered after everything the block queued on the stream by an event, not a
  host synchronize.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .._core import validate as _validate
from .._core.contract import Access
from .._core.dlpack import DLPACK_CPU, DLPACK_CUDA
from .._core.graph import RegionPlan
from .._core.intervals import Interval
from .._core.lane import Lane
from .._core.memory import Buffer, Domain, Placement, PlacementKind, View
from ..backends.base import Fence, GpuInterop
from ..errors import Busy, ContractError, HrxError, PoisonedError, Unsupported
from .capsules import from_cuda_array_interface, from_dlpack, make_capsule
from .mappings import MappingToken
from .region import DONE, FAILED, ISSUED, RegionRun, Submission

if TYPE_CHECKING:
    from .._core.counters import Counters
    from .._core.memory import BufferOwner, MemoryBudget
    from ..backends.base import Backend
    from .mappings import HostMappings
    from .scheduler import Scheduler

ByteArray = np.ndarray[Any, np.dtype[np.uint8]]


@dataclass(frozen=True)
class GpuAccess:
    """What native code gets inside `Runtime.gpu_access`.

    `stream`: raw stream handle to queue work on (None on sim, where the block
    runs on the host), a stream of the views' GPU; `pointers`: the device address of each
    view, in order; `arrays`: on sim, each view as a uint8 numpy array (read-only for
    READ); `gpu`: the runtime's GPU number of the views (make its device current before
    queuing on `stream`, e.g. `torch.cuda.device(rt.gpu(access.gpu).index)`).
    """

    views: tuple[View, ...]
    stream: int | None
    pointers: tuple[int, ...]
    arrays: tuple[ByteArray, ...] | None = None
    gpu: int = 0


class InteropOwner(Protocol):
    """What interop needs of the session it belongs to (`session.Session`)."""

    @property
    def owner(self) -> BufferOwner:
        """The runtime handle adopted buffers belong to."""
        ...

    @property
    def domain(self) -> Domain: ...

    @property
    def budget(self) -> MemoryBudget | None: ...

    @property
    def counters(self) -> Counters: ...

    @property
    def buffers(self) -> weakref.WeakValueDictionary[int, Buffer]: ...

    @property
    def finalizers(self) -> dict[int, weakref.finalize[Any, Any]]: ...

    @property
    def mappings(self) -> HostMappings: ...

    @property
    def backend(self) -> Backend: ...

    @property
    def scheduler(self) -> Scheduler | None: ...

    def scheduler_or_raise(self) -> Scheduler: ...

    def backend_or_raise(self) -> Backend: ...

    def check_placement(self, placement: Placement) -> None: ...


class Interop:
    """The interop of one session: adopting arrays, exporting views, native access."""

    __slots__ = ("_session",)

    def __init__(self, session: InteropOwner) -> None:
        self._session = session

    def adopt_gpu_buffer(self, obj: Any, placement: Placement, label: str = "") -> Buffer:
        return adopt_gpu_buffer(self._session, obj, placement, label)

    def gpu_access(
        self, accesses: Iterable[tuple[View, Access]], stream: int | None = None
    ) -> AbstractAsyncContextManager[GpuAccess]:
        return gpu_access(self._session, accesses, stream)

    def export_dlpack(
        self,
        view: View,
        stream: int | None,
        max_version: tuple[int, int] | None,
        dl_device: tuple[int, int] | None,
        copy: bool | None,
    ) -> Any:
        return export_dlpack(self._session, view, stream, max_version, dl_device, copy)

    def dlpack_device(self, view: View) -> tuple[int, int]:
        return dlpack_device(self._session, view)


class _ExternalToken(MappingToken):
    """An allocation reserved by a `gpu_access` block."""

    __slots__ = ()

    def conflict(self, label: str, start: int, end: int) -> str:
        return (
            f"{label}[{start}:{end}] is reserved by a gpu_access block for "
            f"{'writing' if self.write else 'reading'}; leave the block before submitting "
            "work on those bytes"
        )


def _finish_external(scheduler: Scheduler, run: RegionRun) -> None:
    if run.state >= DONE:
        return
    fence = run.fence
    error = fence.error() if fence is not None else None
    scheduler.tracker.forget(run)
    if error is None:
        run.state = DONE
    else:
        run.state = FAILED
        run.error = error
        scheduler.poison(run.plan, error)
        scheduler.note_failure(error)
    scheduler.wake_waiters(run)


def _order_after(
    session: InteropOwner,
    backend: Any,
    fence: Fence,
    uses: Sequence[tuple[Buffer, bool]],
    label: str,
) -> None:
    """Make later work on `uses` (buffer, writes) wait for `fence`."""
    scheduler = session.scheduler_or_raise()
    reads = tuple(Interval(b, 0, b.nbytes) for b, writes in uses if not writes)
    writes = tuple(Interval(b, 0, b.nbytes) for b, writes in uses if writes)
    plan = RegionPlan(0, Lane.COMPUTE, (), (), reads, writes, 0)
    # Work queued on a stream outside the session, tracked like a region: later regions on
    # the same backend wait for its fence on the device; others (and host mappings) wait
    # for it on the host.
    run = RegionRun(Submission(scheduler, label, ()), plan, None, backend, [0.0], plan.queue_key)
    run.state = ISSUED
    run.fence = fence
    for buffer, writes_buffer in uses:
        scheduler.tracker.record(buffer.ident, 0, buffer.nbytes, writes_buffer, run)
    notifier = scheduler.notifier
    fence.add_done_callback(lambda _: notifier.post(partial(_finish_external, scheduler), run))


# -- adopting ------------------------------------------------------------------------------


def adopt_gpu_buffer(
    session: InteropOwner, obj: Any, placement: Placement, label: str = ""
) -> Buffer:
    """See `Runtime.adopt_gpu_buffer`."""
    backend = session.backend_or_raise()
    if not isinstance(placement, Placement) or placement.kind not in (
        PlacementKind.GPU_LOCAL,
        PlacementKind.SHARED,
    ):
        raise ContractError(
            f"adopted memory is GPU_LOCAL or shared(npu); got placement {placement!r}"
        )
    session.check_placement(placement)
    stream: int | None = None
    interop = backend if isinstance(backend, GpuInterop) else None
    if interop is not None:
        pointer, nbytes, owner, stream = _gpu_array(obj, interop, placement.gpu)
        storage = interop.adopt_pointer(pointer, nbytes, placement, owner)
    else:
        array = _host_array(obj)
        storage, nbytes, pointer = array, array.nbytes, int(array.ctypes.data)
    charged = 0 if _covered(session, backend, pointer, nbytes) else nbytes
    budget = session.budget
    if budget is not None and charged:
        budget.charge(charged)
    buffer = Buffer(session.owner, nbytes, placement, storage, label)
    session.counters.imports += 1
    session.buffers[buffer.ident] = buffer
    session.finalizers[buffer.ident] = weakref.finalize(
        buffer, _release_adopted, session, buffer.ident, storage, charged
    )
    if interop is not None and stream is not None:
        # The producer may still be writing on its stream: order our work after it.
        fence = interop.fence_on_stream(stream, placement.gpu)
        _order_after(session, backend, fence, [(buffer, True)], f"adopt {buffer.label}")
    return buffer


def _release_adopted(session: InteropOwner, ident: int, storage: Any, charged: int) -> None:
    session.finalizers.pop(ident, None)
    if session.backend is not None:
        session.backend.free(storage)
    if session.budget is not None and charged:
        session.budget.release(charged)
    # Like the runtime's own release: no tracker update, this may run on any thread.


def _covered(session: InteropOwner, backend: Any, pointer: int, nbytes: int) -> bool:
    """Whether [pointer, pointer + nbytes) lies inside one of the runtime's live buffers."""
    for buffer in list(session.buffers.values()):
        storage = buffer.storage
        if storage is None:
            continue
        base = _storage_address(backend, storage)
        if base is not None and base <= pointer and pointer + nbytes <= base + buffer.nbytes:
            return True
    return False


def _storage_address(backend: Any, storage: Any) -> int | None:
    if isinstance(backend, GpuInterop):
        try:
            return backend.device_pointer(storage)
        except HrxError:
            return None
    if isinstance(storage, np.ndarray):
        return int(storage.ctypes.data)
    return None


def _host_array(obj: Any) -> ByteArray:
    """A C-contiguous host array's bytes (the sim backend's adoption)."""
    if hasattr(obj, "__cuda_array_interface__") and not hasattr(obj, "__array_interface__"):
        raise Unsupported(
            "the sim backend's memory is host memory; adopting a CUDA array needs "
            "Runtime(backend='cuda')"
        )
    try:
        array = np.asarray(obj)
    except Exception as exc:
        raise ContractError(f"cannot adopt {type(obj).__name__}: not an array ({exc})") from None
    if array.dtype.hasobject or not array.flags.c_contiguous or array.nbytes < 1:
        raise ContractError(
            f"adopted arrays must be non-empty, C-contiguous and hold plain numbers; got "
            f"{type(obj).__name__} with dtype {array.dtype}, shape {array.shape}"
        )
    if not array.flags.writeable:
        raise ContractError(f"cannot adopt a read-only {type(obj).__name__}")
    bytes_view: ByteArray = array.reshape(-1).view(np.uint8)
    return bytes_view


def _gpu_array(obj: Any, backend: GpuInterop, gpu: int) -> tuple[int, int, Any, int | None]:
    """(pointer, nbytes, owner, producer stream) of a CUDA array (CAI first, then DLPack) on
    the runtime's GPU number `gpu`."""
    interface = getattr(obj, "__cuda_array_interface__", None)
    if isinstance(interface, dict):
        return from_cuda_array_interface(obj, interface)
    if hasattr(obj, "__dlpack__"):
        return from_dlpack(obj, backend, gpu)
    raise ContractError(
        f"cannot adopt {type(obj).__name__}: it has neither __cuda_array_interface__ nor "
        "__dlpack__ (pass a PyTorch or CuPy GPU array)"
    )


def dlpack_device(session: InteropOwner, view: View) -> tuple[int, int]:
    """See `View.__dlpack_device__`."""
    backend = session.backend_or_raise()
    storage = _live_storage(view)
    if isinstance(backend, GpuInterop):
        return backend.dlpack_device(storage)
    return (DLPACK_CPU, 0)


def export_dlpack(
    session: InteropOwner,
    view: View,
    stream: int | None = None,
    max_version: tuple[int, int] | None = None,
    dl_device: tuple[int, int] | None = None,
    copy: bool | None = None,
) -> Any:
    """See `View.__dlpack__`."""
    backend = session.backend_or_raise()
    storage = _live_storage(view)
    buffer = view.buffer
    if buffer.poison is not None:
        raise PoisonedError(buffer.label, buffer.poison)
    if copy:
        raise BufferError("hrx views export their memory zero-copy only (copy=True asked)")
    device = dlpack_device(session, view)
    if dl_device is not None and tuple(dl_device) != device:
        raise BufferError(f"{view} lives on DLPack device {device}, not {tuple(dl_device)}")
    pending = _pending_writers(session, view)
    if device[0] == DLPACK_CPU:
        if pending:
            raise Busy(f"{view} has pending writes; await them before exporting host memory")
        array = session.backend_or_raise().host_array(storage, view.offset, view.nbytes)
        options: dict[str, Any] = {}
        if max_version is not None:
            options["max_version"] = max_version
        return array.__dlpack__(**options)
    assert isinstance(backend, GpuInterop)
    if pending:
        fences = [run.fence for run in pending]
        # DLPack's "no stream given": the legacy default stream, which is 1 on CUDA and 0
        # (the null stream) on ROCm, where 1 is not a valid stream.
        default_stream = 1 if device[0] == DLPACK_CUDA else 0
        consumer = default_stream if stream is None else stream
        if (
            consumer == -1
            or any(f is None for f in fences)
            or not backend.wait_on_stream(
                consumer, [f for f in fences if f is not None], buffer.placement.gpu
            )
        ):
            raise Busy(
                f"{view} has pending writes that cannot be ordered before the consumer's stream; "
                "await them first"
            )
    versioned = max_version is not None and int(max_version[0]) >= 1
    pointer = backend.device_pointer(storage) + view.offset
    return make_capsule(pointer, view.nbytes, device, view, versioned)


def _live_storage(view: View) -> Any:
    if not isinstance(view, View):
        raise ContractError(f"expected a View, got {view!r}")
    view.buffer.check_alive()
    return view.buffer.storage


def _pending_writers(session: InteropOwner, view: View) -> list[RegionRun]:
    scheduler = session.scheduler_or_raise()
    deps = scheduler.tracker.dependencies(view.buffer.ident, view.offset, view.end, False)
    return [dep for dep in deps if isinstance(dep, RegionRun) and not dep.finished]


# -- native access --------------------------------------------------------------------------


def _check_accesses(session: InteropOwner, accesses: Iterable[Any]) -> list[tuple[View, Access]]:
    pairs: list[tuple[View, Access]] = []
    for item in _validate.items(accesses, "gpu_access's (view, Access) pairs"):
        if not (
            isinstance(item, tuple)
            and len(item) == 2
            and isinstance(item[0], View)
            and isinstance(item[1], Access)
        ):
            raise ContractError(f"gpu_access takes (view, Access) pairs, got {item!r}")
        view, access = item
        if view.buffer.domain is not session.domain:
            raise ContractError(f"{view} is not a view of this runtime")
        view.buffer.check_alive()
        if not view.buffer.placement.gpu_bindable:
            raise ContractError(
                f"{view} has placement {view.buffer.placement}, which the GPU cannot access"
            )
        pairs.append((view, access))
    if not pairs:
        raise ContractError("gpu_access needs at least one (view, Access) pair")
    return pairs


@asynccontextmanager
async def gpu_access(
    session: InteropOwner, accesses: Iterable[tuple[View, Access]], stream: int | None = None
) -> AsyncIterator[GpuAccess]:
    """See `Runtime.gpu_access`."""
    scheduler = session.scheduler_or_raise()
    backend = session.backend_or_raise()
    native = isinstance(backend, GpuInterop)
    pairs = _check_accesses(session, accesses)
    if stream is not None and (
        not native or isinstance(stream, bool) or not isinstance(stream, int) or stream < 0
    ):
        raise ContractError(
            f"stream must be a raw stream handle (int >= 0) of the {backend.name} backend, "
            f"got {stream!r}"
        )
    mappings = session.mappings
    uses: dict[int, list[Any]] = {}
    for view, mode in pairs:
        entry = uses.setdefault(view.buffer.ident, [view.buffer, False, False])
        entry[1] = entry[1] or mode.writes
        entry[2] = entry[2] or mode.reads
    gpus = {buffer.placement.gpu for buffer, _, _ in uses.values()}
    if len(gpus) > 1:
        raise ContractError(
            f"gpu_access takes the memory of one GPU at a time (its stream is that GPU's); "
            f"got GPUs {sorted(gpus)}"
        )
    gpu = gpus.pop()
    for buffer, _writes, reads in uses.values():
        if reads and buffer.poison is not None:
            raise PoisonedError(buffer.label, buffer.poison)
        if mappings.holds(buffer.ident):
            raise Busy(f"{buffer.label} has a live host mapping or gpu_access; release it first")
    tracker = scheduler.tracker
    tokens = [_ExternalToken(buffer.view(), writes) for buffer, writes, _ in uses.values()]
    pending: dict[int, RegionRun] = {}
    for token in tokens:
        for dep in tracker.dependencies(token.view.buffer.ident, 0, token.end, token.write):
            if isinstance(dep, RegionRun) and not dep.finished:
                pending[id(dep)] = dep
    for token in tokens:
        tracker.record(token.view.buffer.ident, 0, token.end, token.write, token)
        mappings.add(token)
    handle: int | None = None
    try:
        for dep in pending.values():
            await dep.wait_finished()
        for buffer, _writes, reads in uses.values():
            if reads and buffer.poison is not None:
                raise PoisonedError(buffer.label, buffer.poison)
        if native:
            assert isinstance(backend, GpuInterop)
            handle = stream if stream is not None else backend.interop_stream(gpu)
            pointers = tuple(
                backend.device_pointer(view.buffer.storage) + view.offset for view, _ in pairs
            )
            access = GpuAccess(tuple(v for v, _ in pairs), handle, pointers, gpu=gpu)
        else:
            arrays = []
            for view, mode in pairs:
                array = backend.host_array(view.buffer.storage, view.offset, view.nbytes)
                if not mode.writes:
                    array = array.view()
                    array.flags.writeable = False
                arrays.append(array)
            access = GpuAccess(
                tuple(v for v, _ in pairs),
                None,
                tuple(int(a.ctypes.data) for a in arrays),
                tuple(arrays),
                gpu,
            )
        yield access
    finally:
        for token in tokens:
            mappings.drop(token)
            tracker.forget(token)
        if handle is not None and session.scheduler is not None:
            assert isinstance(backend, GpuInterop)
            fence = backend.fence_on_stream(handle, gpu)
            _order_after(
                session,
                backend,
                fence,
                [(buffer, writes) for buffer, writes, _ in uses.values()],
                "gpu_access",
            )


__all__ = [
    "GpuAccess",
    "Interop",
    "InteropOwner",
    "adopt_gpu_buffer",
    "dlpack_device",
    "export_dlpack",
    "gpu_access",
]
