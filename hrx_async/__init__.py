"""hrx_async: an asyncio- and trio-native coordination runtime for GPU and NPU work.

Allocate buffers, record graphs of fills, copies, GPU kernels, NPU kernels and
host functions over declared accesses, prepare them once and replay them with
`await prepared.submit()`. Dependencies are inferred from the accesses, byte
range by byte range, within and across submissions.
"""

from .blocking import BlockingPreparedGraph, BlockingRuntime
from .budget import Reservation
from .completion import Completion, CompletionProfile
from .contract import Access, Binding, Constants, KernelContract
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
from .graph import Graph
from .image import ImageOps, ImageStats
from .kernels import GpuKernel, KernelSource, NpuKernel
from .lanes.lane import Lane
from .memory import (
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
from .models import (
    ArtifactError,
    DType,
    Job,
    Jobs,
    JobState,
    Layout,
    Lease,
    MislabeledArtifact,
    ModelContext,
    ModelSlot,
    OversizedArtifact,
    Pin,
    PlanCache,
    PlanCacheStats,
    PlanHandle,
    PreparedModel,
    Residency,
    ResidencyStats,
    SlotIO,
    Tensor,
    TensorDesc,
    TruncatedArtifact,
    UnitBudget,
    Weights,
    bf16_from_f32,
    f32_from_bf16,
    load_safetensors,
    read_safetensors_header,
    write_safetensors,
)
from .prepared import PreparedGraph
from .runtime import GpuDevice, NpuDevice, Runtime
from .serve import RuntimeService
from .slots import Batcher, Slot, SlotPool
from .stats import Statistics
from .trace import ExecutionTrace, TraceEvent

__version__ = "0.1.0"

__all__ = [
    "GPU_LOCAL",
    "HOST_VISIBLE",
    "Access",
    "ArtifactError",
    "BackendError",
    "BackendUnavailable",
    "Batcher",
    "Binding",
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
    "DType",
    "DependencyFailed",
    "DeviceLost",
    "ExecutionError",
    "ExecutionTrace",
    "GpuDevice",
    "GpuKernel",
    "Graph",
    "HostMapping",
    "HrxError",
    "ImageOps",
    "ImageStats",
    "Job",
    "JobState",
    "Jobs",
    "KernelContract",
    "KernelSource",
    "Lane",
    "Layout",
    "Lease",
    "MemoryBudget",
    "MislabeledArtifact",
    "ModelContext",
    "ModelSlot",
    "NpuDevice",
    "NpuKernel",
    "OversizedArtifact",
    "Pin",
    "Placement",
    "PlanCache",
    "PlanCacheStats",
    "PlanHandle",
    "PoisonedError",
    "PreparedGraph",
    "PreparedModel",
    "Reservation",
    "Residency",
    "ResidencyStats",
    "Runtime",
    "RuntimeClosed",
    "RuntimeService",
    "Slot",
    "SlotIO",
    "SlotPool",
    "Statistics",
    "Tensor",
    "TensorDesc",
    "TraceEvent",
    "TruncatedArtifact",
    "UnitBudget",
    "Unsupported",
    "View",
    "Weights",
    "__version__",
    "bf16_from_f32",
    "f32_from_bf16",
    "gpu_local",
    "load_safetensors",
    "npu_local",
    "read_safetensors_header",
    "shared",
    "write_safetensors",
]
