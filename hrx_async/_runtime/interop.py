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

import ctypes
import math
import weakref
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .._core import validate as _validate
from .._core.contract import Access
from .._core.dlpack import DLPACK_CPU, DLPACK_CUDA, GPU_DLPACK_DEVICES
from .._core.graph import RegionPlan
from .._core.intervals import Interval
from .._core.lane import Lane
from .._core.memory import Buffer, Placement, PlacementKind, View
from ..backends.base import Fence, GpuInterop
from ..errors import Busy, ContractError, HrxError, PoisonedError, Unsupported
from .mappings import MappingToken
from .region import DONE, FAILED, ISSUED, RegionRun, Submission

if TYPE_CHECKING:
    from ..runtime import Runtime

ByteArray = np.ndarray[Any, np.dtype[np.uint8]]

_UINT = 1


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


class _ExternalToken(MappingToken):
    """An allocation reserved by a `gpu_access` block."""

    __slots__ = ()

    def conflict(self, label: str, start: int, end: int) -> str:
        return (
            f"{label}[{start}:{end}] is reserved by a gpu_access block for "
            f"{'writing' if self.write else 'reading'}; leave the block before submitting "
            "work on those bytes"
        )


def _finish_external(run: RegionRun) -> None:
    if run.state >= DONE:
        return
    scheduler = run.submission.scheduler
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
    runtime: Runtime, backend: Any, fence: Fence, uses: Sequence[tuple[Buffer, bool]], label: str
) -> None:
    """Make later work on `uses` (buffer, writes) wait for `fence`."""
    scheduler = runtime._scheduler_or_raise()
    reads = tuple(Interval(b, 0, b.nbytes) for b, writes in uses if not writes)
    writes = tuple(Interval(b, 0, b.nbytes) for b, writes in uses if writes)
    plan = RegionPlan(0, Lane.COMPUTE, (), (), reads, writes, 0)
    # Work queued on a stream outside the runtime, tracked like a region: later regions on
    # the same backend wait for its fence on the device; others (and host mappings) wait
    # for it on the host.
    run = RegionRun(Submission(scheduler, label, ()), plan, None, backend, [0.0], plan.queue_key)
    run.state = ISSUED
    run.fence = fence
    for buffer, writes_buffer in uses:
        scheduler.tracker.record(buffer.ident, 0, buffer.nbytes, writes_buffer, run)
    notifier = scheduler.notifier
    fence.add_done_callback(lambda _: notifier.post(_finish_external, run))


# -- adopting ------------------------------------------------------------------------------


def adopt_gpu_buffer(runtime: Runtime, obj: Any, placement: Placement, label: str = "") -> Buffer:
    """See `Runtime.adopt_gpu_buffer`."""
    backend = runtime._backend_or_raise()
    if not isinstance(placement, Placement) or placement.kind not in (
        PlacementKind.GPU_LOCAL,
        PlacementKind.SHARED,
    ):
        raise ContractError(
            f"adopted memory is GPU_LOCAL or shared(npu); got placement {placement!r}"
        )
    runtime._check_placement(placement)
    stream: int | None = None
    interop = backend if isinstance(backend, GpuInterop) else None
    if interop is not None:
        pointer, nbytes, owner, stream = _gpu_array(obj, interop, placement.gpu)
        storage = interop.adopt_pointer(pointer, nbytes, placement, owner)
    else:
        array = _host_array(obj)
        storage, nbytes, pointer = array, array.nbytes, int(array.ctypes.data)
    charged = 0 if _covered(runtime, backend, pointer, nbytes) else nbytes
    budget = runtime._budget
    if budget is not None and charged:
        budget.charge(charged)
    buffer = Buffer(runtime, nbytes, placement, storage, label)
    runtime._counters.imports += 1
    runtime._buffers[buffer.ident] = buffer
    runtime._finalizers[buffer.ident] = weakref.finalize(
        buffer, _release_adopted, runtime, buffer.ident, storage, charged
    )
    if interop is not None and stream is not None:
        # The producer may still be writing on its stream: order our work after it.
        fence = interop.fence_on_stream(stream, placement.gpu)
        _order_after(runtime, backend, fence, [(buffer, True)], f"adopt {buffer.label}")
    return buffer


def _release_adopted(runtime: Runtime, ident: int, storage: Any, charged: int) -> None:
    runtime._finalizers.pop(ident, None)
    if runtime._backend is not None:
        runtime._backend.free(storage)
    if runtime._budget is not None and charged:
        runtime._budget.release(charged)
    # Like the runtime's own release: no tracker update, this may run on any thread.


def _covered(runtime: Runtime, backend: Any, pointer: int, nbytes: int) -> bool:
    """Whether [pointer, pointer + nbytes) lies inside one of the runtime's live buffers."""
    for buffer in list(runtime._buffers.values()):
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
        return _from_cuda_array_interface(obj, interface)
    if hasattr(obj, "__dlpack__"):
        return _from_dlpack(obj, backend, gpu)
    raise ContractError(
        f"cannot adopt {type(obj).__name__}: it has neither __cuda_array_interface__ nor "
        "__dlpack__ (pass a PyTorch or CuPy GPU array)"
    )


def _contiguous(shape: Sequence[int], strides: Sequence[int] | None, itemsize: int) -> bool:
    if strides is None:
        return True
    expected = itemsize
    for size, stride in zip(reversed(shape), reversed(strides), strict=True):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _from_cuda_array_interface(
    obj: Any, interface: dict[str, Any]
) -> tuple[int, int, Any, int | None]:
    try:
        shape = tuple(int(n) for n in interface["shape"])
        itemsize = np.dtype(interface["typestr"]).itemsize
        pointer, readonly = interface["data"]
    except (KeyError, TypeError, ValueError) as exc:
        raise ContractError(
            f"malformed __cuda_array_interface__ on {type(obj).__name__}: {exc}"
        ) from None
    if interface.get("mask") is not None:
        raise ContractError("masked CUDA arrays cannot be adopted")
    if readonly:
        raise ContractError(f"cannot adopt a read-only {type(obj).__name__}")
    if not _contiguous(shape, interface.get("strides"), itemsize):
        raise ContractError(
            f"adopted arrays must be C-contiguous; {type(obj).__name__} has strides "
            f"{interface.get('strides')} for shape {shape}"
        )
    nbytes = math.prod(shape) * itemsize
    if nbytes < 1 or not pointer:
        raise ContractError(f"cannot adopt an empty {type(obj).__name__} (shape {shape})")
    stream = interface.get("stream")
    return int(pointer), nbytes, obj, int(stream) if stream else None


# -- DLPack ---------------------------------------------------------------------------------


class _DLDevice(ctypes.Structure):
    _fields_ = (("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32))


class _DLDataType(ctypes.Structure):
    _fields_ = (("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16))


class _DLTensor(ctypes.Structure):
    _fields_ = (
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    )


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _DLManagedTensor(ctypes.Structure):
    _fields_ = (("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER))


class _DLPackVersion(ctypes.Structure):
    _fields_ = (("major", ctypes.c_uint32), ("minor", ctypes.c_uint32))


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = (
        ("version", _DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", _DELETER),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _DLTensor),
    )


_LEGACY_NAME = b"dltensor"
_VERSIONED_NAME = b"dltensor_versioned"
_exports: dict[int, tuple[Any, ...]] = {}
"""Exported tensors by the address of their managed struct: what keeps them valid."""


def _release_export(address: int | None) -> None:
    if address:
        _exports.pop(address, None)


_deleter = _DELETER(_release_export)
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _capsule_api() -> tuple[Any, Any, Any]:
    # Indexing (not attribute access) gives fresh function objects, so these signatures do
    # not change anyone else's use of ctypes.pythonapi.
    api = ctypes.pythonapi
    new = api["PyCapsule_New"]
    new.restype = ctypes.py_object
    new.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
    is_valid = api["PyCapsule_IsValid"]
    is_valid.restype = ctypes.c_int
    is_valid.argtypes = (ctypes.c_void_p, ctypes.c_char_p)
    get_pointer = api["PyCapsule_GetPointer"]
    get_pointer.restype = ctypes.c_void_p
    get_pointer.argtypes = (ctypes.c_void_p, ctypes.c_char_p)
    return new, is_valid, get_pointer


_capsule_new, _capsule_is_valid, _capsule_get_pointer = _capsule_api()
_object_capsule_pointer = ctypes.pythonapi["PyCapsule_GetPointer"]
_object_capsule_pointer.restype = ctypes.c_void_p
_object_capsule_pointer.argtypes = (ctypes.py_object, ctypes.c_char_p)


def _destroy_capsule(capsule: int | None) -> None:
    # A capsule nobody consumed (still carrying its original name) owns the tensor.
    for name in (_LEGACY_NAME, _VERSIONED_NAME):
        if capsule and _capsule_is_valid(capsule, name):
            _release_export(_capsule_get_pointer(capsule, name))
            return


_capsule_destructor = _CAPSULE_DESTRUCTOR(_destroy_capsule)


def _make_capsule(
    pointer: int, nbytes: int, device: tuple[int, int], keepalive: Any, versioned: bool
) -> Any:
    """A DLPack capsule of `nbytes` uint8 at `pointer` on `device`, keeping `keepalive` alive."""
    shape = (ctypes.c_int64 * 1)(nbytes)
    tensor = _DLTensor(
        ctypes.c_void_p(pointer),
        _DLDevice(*device),
        1,
        _DLDataType(_UINT, 8, 1),
        shape,
        None,
        0,
    )
    managed: _DLManagedTensor | _DLManagedTensorVersioned
    if versioned:
        managed = _DLManagedTensorVersioned(_DLPackVersion(1, 0), None, _deleter, 0, tensor)
        name = _VERSIONED_NAME
    else:
        managed = _DLManagedTensor(tensor, None, _deleter)
        name = _LEGACY_NAME
    address = ctypes.addressof(managed)
    _exports[address] = (managed, shape, keepalive)
    destructor = ctypes.cast(_capsule_destructor, ctypes.c_void_p).value
    return _capsule_new(address, name, destructor)


def _from_dlpack(obj: Any, backend: GpuInterop, gpu: int) -> tuple[int, int, Any, int | None]:
    try:
        device_type, _ = obj.__dlpack_device__()
    except Exception as exc:
        raise ContractError(f"{type(obj).__name__}.__dlpack_device__() failed: {exc}") from None
    if device_type not in GPU_DLPACK_DEVICES:
        raise Unsupported(
            f"{type(obj).__name__} lives on DLPack device type {device_type}; adopt GPU arrays "
            "(copy host data into a buffer instead)"
        )
    stream = backend.interop_stream(gpu)
    try:
        capsule = obj.__dlpack__(stream=stream)
    except TypeError:
        capsule = obj.__dlpack__()
    try:
        address = _object_capsule_pointer(capsule, _LEGACY_NAME)
    except ValueError:
        raise ContractError(
            f"{type(obj).__name__}.__dlpack__() did not return an unconsumed DLPack capsule"
        ) from None
    tensor = _DLManagedTensor.from_address(address).dl_tensor
    shape = [tensor.shape[i] for i in range(tensor.ndim)]
    itemsize = tensor.dtype.bits * tensor.dtype.lanes // 8
    strides = [tensor.strides[i] * itemsize for i in range(tensor.ndim)] if tensor.strides else None
    if not _contiguous(shape, strides, itemsize):
        raise ContractError(f"adopted arrays must be C-contiguous; strides {strides}")
    nbytes = math.prod(shape) * itemsize
    if nbytes < 1 or not tensor.data:
        raise ContractError(f"cannot adopt an empty {type(obj).__name__}")
    # Not renaming the capsule leaves the producer's deleter to its destructor, which runs
    # when the buffer drops its owner.
    return int(tensor.data) + int(tensor.byte_offset), nbytes, (obj, capsule), stream


def dlpack_device(runtime: Runtime, view: View) -> tuple[int, int]:
    """See `View.__dlpack_device__`."""
    backend = runtime._backend_or_raise()
    storage = _live_storage(view)
    if isinstance(backend, GpuInterop):
        return backend.dlpack_device(storage)
    return (DLPACK_CPU, 0)


def export_dlpack(
    runtime: Runtime,
    view: View,
    stream: int | None = None,
    max_version: tuple[int, int] | None = None,
    dl_device: tuple[int, int] | None = None,
    copy: bool | None = None,
) -> Any:
    """See `View.__dlpack__`."""
    backend = runtime._backend_or_raise()
    storage = _live_storage(view)
    buffer = view.buffer
    if buffer.poison is not None:
        raise PoisonedError(buffer.label, buffer.poison)
    if copy:
        raise BufferError("hrx views export their memory zero-copy only (copy=True asked)")
    device = dlpack_device(runtime, view)
    if dl_device is not None and tuple(dl_device) != device:
        raise BufferError(f"{view} lives on DLPack device {device}, not {tuple(dl_device)}")
    pending = _pending_writers(runtime, view)
    if device[0] == DLPACK_CPU:
        if pending:
            raise Busy(f"{view} has pending writes; await them before exporting host memory")
        array = runtime._backend_or_raise().host_array(storage, view.offset, view.nbytes)
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
    return _make_capsule(pointer, view.nbytes, device, view, versioned)


def _live_storage(view: View) -> Any:
    if not isinstance(view, View):
        raise ContractError(f"expected a View, got {view!r}")
    view.buffer.check_alive()
    return view.buffer.storage


def _pending_writers(runtime: Runtime, view: View) -> list[RegionRun]:
    scheduler = runtime._scheduler_or_raise()
    deps = scheduler.tracker.dependencies(view.buffer.ident, view.offset, view.end, False)
    return [dep for dep in deps if isinstance(dep, RegionRun) and not dep.finished]


# -- native access --------------------------------------------------------------------------


def _check_accesses(runtime: Runtime, accesses: Iterable[Any]) -> list[tuple[View, Access]]:
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
        if view.buffer.domain is not runtime.domain:
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
    runtime: Runtime, accesses: Iterable[tuple[View, Access]], stream: int | None = None
) -> AsyncIterator[GpuAccess]:
    """See `Runtime.gpu_access`."""
    scheduler = runtime._scheduler_or_raise()
    backend = runtime._backend_or_raise()
    native = isinstance(backend, GpuInterop)
    pairs = _check_accesses(runtime, accesses)
    if stream is not None and (
        not native or isinstance(stream, bool) or not isinstance(stream, int) or stream < 0
    ):
        raise ContractError(
            f"stream must be a raw stream handle (int >= 0) of the {backend.name} backend, "
            f"got {stream!r}"
        )
    mappings = runtime._host_mappings
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
        if handle is not None and runtime._scheduler is not None:
            assert isinstance(backend, GpuInterop)
            fence = backend.fence_on_stream(handle, gpu)
            _order_after(
                runtime,
                backend,
                fence,
                [(buffer, writes) for buffer, writes, _ in uses.values()],
                "gpu_access",
            )


__all__ = ["GpuAccess", "adopt_gpu_buffer", "dlpack_device", "export_dlpack", "gpu_access"]
