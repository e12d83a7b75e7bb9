"""The driver table of a stream backend: the native calls of one GPU API, and its errors.

A `DriverTable` is the handful of native calls `StreamBackend` (`_stream.py`)
needs; `cuda.py` and `hip.py` each implement one. Every method raises
`BackendError` on failure, made with `make_error`, which sets `.sticky` for
errors that corrupt the device context. `quietly` makes the release calls of
shutdown, where a lost device is expected to fail them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import BackendError, HrxError

if TYPE_CHECKING:
    from ._stream_calls import ReplayCalls


def make_error(
    backend: str,
    operation: str,
    code: str,
    message: str,
    sticky_codes: frozenset[str],
) -> BackendError:
    """A `BackendError` marked sticky when `code` is one that leaves the context unusable."""
    error = BackendError(backend, operation, code, message)
    error.sticky = code in sticky_codes  # type: ignore[attr-defined]
    return error


class DriverTable(Protocol):
    """The native calls of one GPU API. Handles are whatever the bindings return.

    Every method raises `BackendError` (from `make_error`) when the call fails,
    except `event_query`, which returns False while the event is pending.
    """

    name: str
    """The backend name used in errors ("cuda", "hip")."""
    dlpack_device_type: int
    """The DLPack device type of device memory (2 for CUDA, 10 for ROCm)."""
    replay_calls: ReplayCalls
    """The calls every replay makes (launch, copy, record, wait, query), straight to the
    bindings: the stream queues and fences use these, the methods below are for
    everything else and raise the same errors."""

    def set_device(self, device: int) -> None:
        """Make `device` current on the calling thread (each thread calls this once)."""
        ...

    def can_access_peer(self, device: int, peer: int) -> bool:
        """Whether `device` can reach `peer`'s memory directly (NVLink, PCIe peer-to-peer)."""
        ...

    def enable_peer_access(self, peer: int) -> None:
        """Let the current device reach `peer`'s memory directly; enabling twice is fine."""
        ...

    def malloc(self, nbytes: int) -> int: ...

    def free(self, pointer: int) -> None: ...

    def host_alloc(self, nbytes: int) -> int:
        """Pinned host memory, mapped into the device address space and portable."""
        ...

    def host_free(self, pointer: int) -> None: ...

    def host_device_pointer(self, pointer: int) -> int:
        """The device address of mapped pinned host memory."""
        ...

    def pointer_kind(self, pointer: int) -> tuple[str, int]:
        """("device" | "host" | "managed" | "unregistered", device index) of an address."""
        ...

    def memset_async(self, pointer: int, value: int, nbytes: int, stream: Any) -> None: ...

    def memcpy_async(self, dst: int, src: int, nbytes: int, stream: Any) -> None:
        """A copy between any two addresses (unified addressing works out the direction)."""
        ...

    def stream_create(self) -> Any:
        """A non-blocking stream (no implicit sync with the legacy default stream)."""
        ...

    def stream_destroy(self, stream: Any) -> None: ...

    def stream_synchronize(self, stream: Any) -> None: ...

    def stream_handle(self, stream: Any) -> int:
        """The raw handle, for native code."""
        ...

    def event_create(self, blocking: bool) -> Any:
        """An event without timing; `blocking` makes its wait sleep instead of spin."""
        ...

    def event_destroy(self, event: Any) -> None: ...

    def event_record(self, event: Any, stream: Any) -> None: ...

    def event_query(self, event: Any) -> bool:
        """True once the work before the event finished, False while pending."""
        ...

    def event_synchronize(self, event: Any) -> None:
        """Block the calling thread until the event finished (releases the GIL)."""
        ...

    def stream_wait_event(self, stream: Any, event: Any) -> None: ...

    def begin_capture(self, stream: Any) -> None: ...

    def end_capture(self, stream: Any) -> Any:
        """The captured graph."""
        ...

    def abort_capture(self, stream: Any) -> None:
        """End a capture that failed half-way and drop what it captured."""
        ...

    def graph_instantiate(self, graph: Any) -> Any: ...

    def graph_launch(self, graph_exec: Any, stream: Any) -> None: ...

    def graph_destroy(self, graph: Any) -> None: ...

    def graph_exec_destroy(self, graph_exec: Any) -> None: ...

    def module_load(self, image: bytes) -> Any: ...

    def module_unload(self, module: Any) -> None: ...

    def module_function(self, module: Any, name: str) -> Any: ...

    def function_param_sizes(self, function: Any) -> list[int] | None:
        """Byte sizes of the kernel's parameters, or None when the driver cannot tell."""
        ...

    def function_max_threads(self, function: Any) -> int: ...

    def function_set_dynamic_shared(self, function: Any, nbytes: int) -> None: ...

    def launch(
        self,
        function: Any,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_bytes: int,
        stream: Any,
        params_address: int,
    ) -> None:
        """Launch with `params_address` pointing at an array of pointers to each argument."""
        ...

    def compile_options(self, target: str, defines: dict[str, str]) -> list[str]:
        """The runtime compiler's options for `target` and `-D` defines (stable order)."""
        ...

    def compiler_version(self) -> str: ...

    def compile(self, source: str, name: str, options: list[str]) -> bytes:
        """Compile to loadable code; raises `CompileError` with the compiler's log."""
        ...

    def describe(self, device: int) -> dict[str, Any]: ...


class Lifetime:
    """A token that lives exactly as long as the one object holding it: a weak reference to
    it, or a finalizer on it, follows that object where the object's class is compiled and
    takes no weak references itself (a stream backend's captured graphs)."""

    __slots__ = ("__weakref__",)


def quietly(call: Callable[..., Any], *args: Any) -> None:
    """Release calls during shutdown: a lost device makes them fail, and that is fine."""
    with contextlib.suppress(HrxError):
        call(*args)


__all__ = ["DriverTable", "Lifetime", "make_error", "quietly"]
