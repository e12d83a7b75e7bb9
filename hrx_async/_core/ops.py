"""The operations a backend executes, as plain records.

Graph preparation turns recorded nodes into these; backends prepare and run
them without knowing anything about graphs, lanes or admission.
"""

from __future__ import annotations

import inspect
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


def enqueued_only(fn: Callable[..., Any], result: Any) -> None:
    """`fn`, external work, returned `result`: refuse an awaitable (it must enqueue and
    return; a coroutine is closed so it does not warn as never awaited)."""
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()
        raise TypeError(f"external work {fn!r} returned an awaitable; it must enqueue and return")


Op = Fill | Copy | Launch | NpuLaunch | HostCall | External
