"""The serving stack above graphs: plan cache, residency, jobs, tensors, artifacts, models.

Public names come through `hrx_async`; these modules build only on the runtime's public
API (runtimes, buffers, views, graphs, prepared graphs, completions, slots).
"""

from .artifacts import (
    ArtifactError,
    MislabeledArtifact,
    OversizedArtifact,
    TruncatedArtifact,
    Weights,
    load_safetensors,
    read_safetensors_header,
    write_safetensors,
)
from .chain import Inference, SlotLease
from .context import ModelContext, SlotIO
from .device import DeviceTensor, LeasedView
from .fragment import ModelDefinition, ModelFragment
from .inference import ModelSlot, PreparedModel
from .jobs import Job, Jobs, JobState
from .plan_cache import PlanCache, PlanCacheStats, PlanHandle
from .region import Dispatch, Fill, Region, RegionBinding
from .residency import Lease, Pin, Residency, ResidencyStats, UnitBudget
from .session import ModelSession
from .tensor import DType, Layout, Tensor, TensorDesc, bf16_from_f32, f32_from_bf16

__all__ = [
    "ArtifactError",
    "DType",
    "DeviceTensor",
    "Dispatch",
    "Fill",
    "Inference",
    "Job",
    "JobState",
    "Jobs",
    "Layout",
    "Lease",
    "LeasedView",
    "MislabeledArtifact",
    "ModelContext",
    "ModelDefinition",
    "ModelFragment",
    "ModelSession",
    "ModelSlot",
    "OversizedArtifact",
    "Pin",
    "PlanCache",
    "PlanCacheStats",
    "PlanHandle",
    "PreparedModel",
    "Region",
    "RegionBinding",
    "Residency",
    "ResidencyStats",
    "SlotIO",
    "SlotLease",
    "Tensor",
    "TensorDesc",
    "TruncatedArtifact",
    "UnitBudget",
    "Weights",
    "bf16_from_f32",
    "f32_from_bf16",
    "load_safetensors",
    "read_safetensors_header",
    "write_safetensors",
]
