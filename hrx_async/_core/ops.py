"""The operations a backend executes, as plain records.

Graph preparation turns recorded nodes into these; backends prepare and run
them without knowing anything about graphs, lanes or admission.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .contract import Access
from .kernels import GpuKernel, NpuKernel
from .memory import View


@dataclass(frozen=True, slots=True)
class Fill:
    dst: View
    value: int


@dataclass(frozen=True, slots=True)
class Copy:
    dst: View
    src: View


@dataclass(frozen=True, slots=True)
class Launch:
    kernel: GpuKernel
    views: tuple[View, ...]


@dataclass(frozen=True, slots=True)
class NpuLaunch:
    kernel: NpuKernel
    views: tuple[View, ...]


@dataclass(frozen=True, slots=True)
class HostCall:
    """A host function; it receives one writable or read-only uint8 array per access."""

    fn: Callable[..., Any]
    views: tuple[View, ...]
    accesses: tuple[Access, ...]


@dataclass(frozen=True, slots=True)
class External:
    """Work another library issues onto the compute lane's stream: `fn(stream, tensors)`,
    one tensor per access (on sim: `fn(None, uint8_arrays)`, read-only for READ)."""

    fn: Callable[..., Any]
    views: tuple[View, ...]
    accesses: tuple[Access, ...]


Op = Fill | Copy | Launch | NpuLaunch | HostCall | External
