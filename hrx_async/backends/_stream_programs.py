"""What a stream backend runs for a region, and how it passes kernel arguments.

A region with one copy runs as that copy on its lane's stream (`CopyProgram`);
every other region is captured once into a native graph and replayed with one
graph launch (`GraphProgram`). Capture takes every operation a region may hold,
in order on one stream: copies in any direction (host memory is pinned and
mapped, so host-to-device and device-to-host copies become memcpy nodes), fills
and kernels; a single-launch graph's one region (`Graph.prepare`) is one such
graph.

Kernel argument convention: every binding is passed as its own pointer
parameter (device address of the view), in contract order, followed by the
contract's constant bytes split into the kernel's remaining parameters by the
sizes the driver reports for them (`cuFuncGetParamInfo`). When the driver
cannot report parameter sizes, the constants are passed as one trailing
by-value parameter (declare a packed struct). The packed arguments
(`KernelArguments`) are built once at prepare time and captured into the
region's graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .._core.contract import KernelContract
from .._core.ops import enqueued_only
from ..errors import ContractError
from ._stream_calls import ReplayCalls
from ._stream_driver import Lifetime

POINTER_BYTES = 8


class StreamProgram:
    """What a stream queue launches for a region, once per replay.

    A base class, not a protocol: the module is compiled, and the queue, compiled too,
    then launches each region with a native call instead of a method looked up by name.
    """

    __slots__ = ("native_graph",)

    native_graph: bool
    """True when the region became one native graph launch."""

    def launch(self, calls: ReplayCalls, stream: Any) -> None:
        """Enqueue the region's work on `stream`."""
        raise NotImplementedError


class GraphProgram(StreamProgram):
    """A region captured into one native graph, replayed with one launch."""

    __slots__ = ("graph_exec", "keepalive", "lifetime")

    def __init__(self, graph_exec: Any, keepalive: tuple[Any, ...]) -> None:
        self.graph_exec = graph_exec
        self.keepalive = keepalive
        self.native_graph = True
        self.lifetime = Lifetime()
        """What the backend's finalizer of the native graph follows (a compiled class
        takes no weak references)."""

    def launch(self, calls: ReplayCalls, stream: Any) -> None:
        calls.graph_launch(self.graph_exec, stream)


class ExternalProgram(StreamProgram):
    """A region of work another library issues: `fn(stream, tensors)` with the lane's raw
    stream handle, called where the region is launched (see `Graph.external`)."""

    __slots__ = ("_handle", "_handle_of", "_stream", "fn", "tensors")

    def __init__(
        self, fn: Callable[..., Any], tensors: list[Any], handle_of: Callable[[Any], int]
    ) -> None:
        self.fn = fn
        self.tensors = tensors
        self._handle_of = handle_of
        """The driver table's `stream_handle`."""
        self.native_graph = False
        self._stream: Any = None
        self._handle = 0
        """The raw handle of `_stream`, the stream it was last launched on (a region's
        replays all go to its lane's stream, so it is looked up once)."""

    def launch(self, calls: ReplayCalls, stream: Any) -> None:
        if stream is not self._stream:
            self._handle = self._handle_of(stream)
            self._stream = stream
        enqueued_only(self.fn, self.fn(self._handle, self.tensors))


class CopyProgram(StreamProgram):
    """A region of one copy, issued directly on its lane's stream."""

    __slots__ = ("dst", "nbytes", "src")

    def __init__(self, dst: int, src: int, nbytes: int) -> None:
        self.dst = dst
        self.src = src
        self.nbytes = nbytes
        self.native_graph = False

    def launch(self, calls: ReplayCalls, stream: Any) -> None:
        calls.memcpy_async(self.dst, self.src, self.nbytes, stream)


class NativeKernel:
    """A loaded kernel: its module, function and parameter sizes (None if unknown)."""

    __slots__ = ("block", "function", "module", "name", "param_sizes")

    def __init__(
        self,
        name: str,
        module: Any,
        function: Any,
        param_sizes: list[int] | None,
        block: tuple[int, int, int],
    ) -> None:
        self.name = name
        self.module = module
        self.function = function
        self.param_sizes = param_sizes
        self.block = block

    def __repr__(self) -> str:
        return f"<NativeKernel {self.name!r} params={self.param_sizes}>"


class DeviceKernels:
    """One kernel loaded on each device of a several-GPU runtime, by device ordinal."""

    __slots__ = ("kernels",)

    def __init__(self, kernels: dict[int, NativeKernel]) -> None:
        self.kernels = kernels

    def on(self, device: int) -> NativeKernel:
        return self.kernels[device]


class KernelArguments:
    """Argument storage and the pointer array a launch reads, built once per launch node."""

    __slots__ = ("pointers", "values")

    def __init__(self, pointers: list[int], constants: bytes, sizes: list[int]) -> None:
        head = len(pointers) * POINTER_BYTES
        self.values = np.zeros(max(1, head + len(constants)), dtype=np.uint8)
        self.values[:head].view(np.uint64)[:] = pointers
        self.values[head : head + len(constants)] = np.frombuffer(constants, dtype=np.uint8)
        base = self.values.ctypes.data
        addresses = [base + POINTER_BYTES * i for i in range(len(pointers))]
        cursor = head
        for size in sizes:
            addresses.append(base + cursor)
            cursor += size
        self.pointers = np.array(addresses, dtype=np.uint64)

    @property
    def address(self) -> int:
        return int(self.pointers.ctypes.data)


def check_kernel_metadata(
    name: str,
    contract: KernelContract,
    block: tuple[int, int, int],
    param_sizes: list[int] | None,
    max_threads: int,
) -> None:
    """Load-time checks of a contract against what the driver reports about the kernel."""
    threads = block[0] * block[1] * block[2]
    if threads > max_threads:
        raise ContractError(
            f"kernel {name!r}: block {block} has {threads} threads; the loaded code allows at "
            f"most {max_threads} per block"
        )
    if param_sizes is None:
        return
    bindings = len(contract.bindings)
    if len(param_sizes) < bindings:
        raise ContractError(
            f"kernel {name!r} metadata and contract disagree: the kernel takes "
            f"{len(param_sizes)} parameters, the contract has {bindings} bindings"
        )
    for index, size in enumerate(param_sizes[:bindings]):
        if size != POINTER_BYTES:
            raise ContractError(
                f"kernel {name!r} metadata and contract disagree: parameter {index} is "
                f"{size} bytes, but binding {index} is passed as a {POINTER_BYTES}-byte pointer"
            )
    scalar_sizes = param_sizes[bindings:]
    if sum(scalar_sizes) != len(contract.constants):
        raise ContractError(
            f"kernel {name!r} metadata and contract disagree: its scalar parameters take "
            f"{sum(scalar_sizes)} bytes (sizes {scalar_sizes}), the contract's constants are "
            f"{len(contract.constants)} bytes"
        )


def constant_sizes(kernel: NativeKernel, bindings: int, constants: bytes) -> list[int]:
    """How the constant bytes split into parameters (see the module docstring)."""
    if kernel.param_sizes is not None:
        return kernel.param_sizes[bindings:]
    return [len(constants)] if constants else []


__all__ = [
    "POINTER_BYTES",
    "CopyProgram",
    "DeviceKernels",
    "GraphProgram",
    "KernelArguments",
    "NativeKernel",
    "StreamProgram",
    "check_kernel_metadata",
    "constant_sizes",
]
