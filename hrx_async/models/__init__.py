"""The serving stack above graphs: plan cache, residency, jobs, tensors, artifacts, models.

Public names come through `hrx_async`; these modules build only on the runtime's public
API (runtimes, buffers, views, graphs, prepared graphs, completions, slots).
"""

from .jobs import Job, Jobs, JobState
from .plan_cache import PlanCache, PlanCacheStats, PlanHandle
from .residency import Lease, Residency, ResidencyStats

__all__ = [
    "Job",
    "JobState",
    "Jobs",
    "Lease",
    "PlanCache",
    "PlanCacheStats",
    "PlanHandle",
    "Residency",
    "ResidencyStats",
]
