"""The serving stack above graphs: plan cache, residency, jobs, tensors, artifacts, models.

Public names come through `hrx_async`; these modules build only on the runtime's public
API (runtimes, buffers, views, graphs, prepared graphs, completions, slots).
"""

from .jobs import Job, Jobs, JobState
from .plan_cache import PlanCache, PlanCacheStats, PlanHandle
from .residency import Lease, Residency, ResidencyStats
from .tensor import DType, Layout, Tensor, TensorDesc, bf16_from_f32, f32_from_bf16

__all__ = [
    "DType",
    "Job",
    "JobState",
    "Jobs",
    "Layout",
    "Lease",
    "PlanCache",
    "PlanCacheStats",
    "PlanHandle",
    "Residency",
    "ResidencyStats",
    "Tensor",
    "TensorDesc",
    "bf16_from_f32",
    "f32_from_bf16",
]
