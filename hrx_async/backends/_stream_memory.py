"""The memory of a stream backend: one allocation's host and device addresses.

Device memory backs GPU_LOCAL; pinned host memory, mapped into the device's
address space, backs every other placement. `device_address` is where a view
starts on the device, as kernels, copies and fills are given it.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from ..errors import ContractError

ByteArray = np.ndarray[Any, np.dtype[np.uint8]]


class NativeStorage:
    """One allocation: its host address (pinned memory) and its device address."""

    __slots__ = (
        "__weakref__",
        "_array",
        "device",
        "device_pointer",
        "host",
        "nbytes",
        "owner",
        "pointer",
    )

    def __init__(
        self,
        pointer: int,
        device_pointer: int,
        nbytes: int,
        host: bool,
        owner: Any = None,
        device: int = 0,
    ) -> None:
        self.pointer = pointer
        self.device_pointer = device_pointer
        self.nbytes = nbytes
        self.host = host
        self.device = device
        """The device ordinal whose backend made (and frees) this storage."""
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


def device_address(view: Any) -> int:
    """The device address of `view`'s first byte."""
    storage = view.buffer.storage
    if not isinstance(storage, NativeStorage):
        raise ContractError(f"{view} is not memory of a stream backend")
    return storage.device_pointer + int(view.offset)


__all__ = ["ByteArray", "NativeStorage", "device_address"]
