"""The operations a backend executes, as plain records.

Graph preparation turns recorded nodes into these; backends prepare and run
them without knowing anything about graphs, lanes or admission.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ContractError, HrxError
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
    one tensor per access (on sim: `fn(None, uint8_arrays)`, read-only for READ).

    `prepare`, when set, is called once per prepared graph by a stream backend as
    `prepare(stream, tensors)`; the function it returns replaces `fn` for that graph's
    replays (see `prepared_work`)."""

    fn: Callable[..., Any]
    views: tuple[View, ...]
    accesses: tuple[Access, ...]
    prepare: Callable[..., Any] | None = None


def enqueued_only(fn: Callable[..., Any], result: Any) -> None:
    """`fn`, external work, returned `result`: refuse an awaitable (it must enqueue and
    return; a coroutine is closed so it does not warn as never awaited)."""
    if result is not None and inspect.isawaitable(result):  # (None, the usual, costs nothing)
        if inspect.iscoroutine(result):
            result.close()
        raise TypeError(f"external work {fn!r} returned an awaitable; it must enqueue and return")


def prepared_work(
    prepare: Callable[..., Any], stream: Any, tensors: list[Any]
) -> Callable[..., Any]:
    """The function each replay of a region of external work calls, as its `prepare` hook
    makes it for `stream` and `tensors`. The graph is being prepared, so a hook that fails
    or returns something a replay cannot call is bad input: `ContractError`, the hook's own
    exception chained (an `HrxError` it raises passes as it is)."""
    try:
        work: object = prepare(stream, tensors)
    except HrxError:
        raise
    except Exception as exc:
        raise ContractError(f"the prepare hook {prepare!r} of external work failed: {exc}") from exc
    if inspect.isawaitable(work):
        if inspect.iscoroutine(work):
            work.close()
        raise ContractError(
            f"the prepare hook {prepare!r} of external work returned an awaitable; it must "
            "return the plain function each replay calls"
        )
    if not callable(work) or inspect.iscoroutinefunction(work):
        raise ContractError(
            f"the prepare hook {prepare!r} of external work must return the plain function "
            f"each replay calls, got {work!r}"
        )
    return work


Op = Fill | Copy | Launch | NpuLaunch | HostCall | External
