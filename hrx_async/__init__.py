"""hrx_async: an asyncio- and trio-native coordination runtime for GPU and NPU work.

Allocate buffers, record graphs of fills, copies, GPU kernels, NPU kernels and
host functions over declared accesses, prepare them once and replay them with
`await prepared.submit()`. Dependencies are inferred from the accesses, byte
range by byte range, within and across submissions.
"""

from ._core.budget import Reservation
from ._core.contract import Access, Binding, Constants, KernelContract
from ._core.graph import Graph
from ._core.kernels import GpuKernel, KernelSource, NpuKernel
from ._core.lane import Lane
from ._core.memory import (
    GPU_LOCAL,
    HOST_VISIBLE,
    Buffer,
    HostMapping,
    MemoryBudget,
    Placement,
    View,
    gpu_local,
    npu_local,
    shared,
)
from ._core.stats import Statistics
from ._core.trace import ExecutionTrace, TraceEvent
from ._runtime.completion import Completion, CompletionProfile
from ._runtime.native import NativeSession
from ._runtime.prepared import PreparedGraph
from .blocking import BlockingNativeSession, BlockingPreparedGraph, BlockingRuntime
from .errors import (
    BackendError,
    BackendUnavailable,
    BudgetExceeded,
    Busy,
    Cancelled,
    CompileError,
    ContractError,
    DependencyFailed,
    DeviceLost,
    ExecutionError,
    HrxError,
    PoisonedError,
    RuntimeClosed,
    Unsupported,
)
from .runtime import GpuDevice, NpuDevice, Runtime

__version__ = "0.1.0"

__all__ = [
    "GPU_LOCAL",
    "HOST_VISIBLE",
    "Access",
    "BackendError",
    "BackendUnavailable",
    "Binding",
    "BlockingNativeSession",
    "BlockingPreparedGraph",
    "BlockingRuntime",
    "BudgetExceeded",
    "Buffer",
    "Busy",
    "Cancelled",
    "CompileError",
    "Completion",
    "CompletionProfile",
    "Constants",
    "ContractError",
    "DependencyFailed",
    "DeviceLost",
    "ExecutionError",
    "ExecutionTrace",
    "GpuDevice",
    "GpuKernel",
    "Graph",
    "HostMapping",
    "HrxError",
    "KernelContract",
    "KernelSource",
    "Lane",
    "MemoryBudget",
    "NativeSession",
    "NpuDevice",
    "NpuKernel",
    "Placement",
    "PoisonedError",
    "PreparedGraph",
    "Reservation",
    "Runtime",
    "RuntimeClosed",
    "Statistics",
    "TraceEvent",
    "Unsupported",
    "View",
    "__version__",
    "gpu_local",
    "npu_local",
    "shared",
]
