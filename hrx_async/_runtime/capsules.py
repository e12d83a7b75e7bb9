"""Arrays in and out of native code: reading `__cuda_array_interface__` and DLPack
capsules of arrays a runtime adopts, and making the DLPack capsules views export.

The ctypes mirrors of dlpack.h's structures live here, with the capsule destructors that
free an export once its consumer (or the capsule, unconsumed) lets go of it.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._core.dlpack import DLPACK_CUDA, DLPACK_CUDA_HOST, DLPACK_CUDA_MANAGED, GPU_DLPACK_DEVICES
from ..backends.base import GpuInterop
from ..errors import ContractError, Unsupported

_UINT = 1


def contiguous(shape: Sequence[int], strides: Sequence[int] | None, itemsize: int) -> bool:
    if strides is None:
        return True
    expected = itemsize
    for size, stride in zip(reversed(shape), reversed(strides), strict=True):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def from_cuda_array_interface(
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
    if not contiguous(shape, interface.get("strides"), itemsize):
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
def _kept_forever(obj: Any) -> Any:
    """`obj` with one reference that is never given back. A consumer (PyTorch, CuPy, NumPy)
    may hold an export past the interpreter's teardown of this module, and call its deleter
    then: the registry, the structs in it and the deleter's C entry point must still exist
    (freed, the consumer would read and call freed memory)."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
    return obj


_exports: dict[int, tuple[Any, ...]] = _kept_forever({})
"""Exported tensors by the address of their managed struct: what keeps them valid."""


def _release_export(address: int | None, exports: dict[int, Any] = _exports) -> None:
    # (The registry is bound here: at teardown the module's own name for it may be gone.)
    if address:
        exports.pop(address, None)


_deleter = _kept_forever(_DELETER(_release_export))
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


def _destroy_capsule(
    capsule: int | None,
    names: tuple[bytes, ...] = (_LEGACY_NAME, _VERSIONED_NAME),
    is_valid: Any = _capsule_is_valid,
    get_pointer: Any = _capsule_get_pointer,
    release: Any = _release_export,
) -> None:
    # A capsule nobody consumed (still carrying its original name) owns the tensor. What
    # it calls is bound here, for a capsule that outlives the module (`_kept_forever`).
    for name in names:
        if capsule and is_valid(capsule, name):
            release(get_pointer(capsule, name))
            return


_capsule_destructor = _kept_forever(_CAPSULE_DESTRUCTOR(_destroy_capsule))


def make_capsule(
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


class ExternalTensor:
    """One access of external work (`Graph.external`): `nbytes` uint8 at `pointer` on a GPU,
    made once when the graph is prepared. Exports DLPack (any number of times: each call
    makes a fresh capsule) and, for CUDA memory, the CUDA array interface; keeps its view's
    buffer alive while a consumer holds an export."""

    __slots__ = ("device", "nbytes", "pointer", "readonly", "view")

    def __init__(
        self, pointer: int, nbytes: int, device: tuple[int, int], readonly: bool, view: Any
    ) -> None:
        self.pointer = pointer
        self.nbytes = nbytes
        self.device = device
        self.readonly = readonly
        self.view = view

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        # `stream` needs no wait: the work runs in order on the stream the function was given.
        if copy:
            raise BufferError("external tensors export their memory zero-copy only")
        if dl_device is not None and tuple(dl_device) != self.device:
            raise BufferError(f"the tensor lives on DLPack device {self.device}, not {dl_device}")
        versioned = max_version is not None and int(max_version[0]) >= 1
        return make_capsule(self.pointer, self.nbytes, self.device, self.view, versioned)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        if self.device[0] not in (DLPACK_CUDA, DLPACK_CUDA_HOST, DLPACK_CUDA_MANAGED):
            raise AttributeError("__cuda_array_interface__ is for CUDA memory")
        return {
            "shape": (self.nbytes,),
            "typestr": "|u1",
            "data": (self.pointer, self.readonly),
            "strides": None,
            "version": 3,
        }

    def __repr__(self) -> str:
        return f"<ExternalTensor {self.nbytes} B at {self.pointer:#x} on {self.device}>"


def from_dlpack(obj: Any, backend: GpuInterop, gpu: int) -> tuple[int, int, Any, int | None]:
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
    if not contiguous(shape, strides, itemsize):
        raise ContractError(f"adopted arrays must be C-contiguous; strides {strides}")
    nbytes = math.prod(shape) * itemsize
    if nbytes < 1 or not tensor.data:
        raise ContractError(f"cannot adopt an empty {type(obj).__name__}")
    # Not renaming the capsule leaves the producer's deleter to its destructor, which runs
    # when the buffer drops its owner.
    return int(tensor.data) + int(tensor.byte_offset), nbytes, (obj, capsule), stream


__all__ = ["contiguous", "from_cuda_array_interface", "from_dlpack", "make_capsule"]
