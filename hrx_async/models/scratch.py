"""Best-fit reuse of private scratch memory across the steps of one graph.

    planner = ScratchPlanner()
    a = planner.add(4096, first=0, last=1)        # bytes, first and last step using it
    b = planner.add(1024, first=1, last=2)
    plan = planner.plan()                          # plan.slot[a], plan.sizes

Why: fragments composed into one graph each need temporary memory; giving every one its
own allocation multiplies the footprint by the number of fragments. A scratch request may
take an earlier allocation only once that allocation's last use is over (strictly before
the request's first step: a step both reading the old contents and writing the new would
race), of the same placement, and the smallest such one that is big enough (best fit);
otherwise it gets a new allocation. IO and weights are never planned here.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._core.memory import GPU_LOCAL, Placement
from ..errors import ContractError
from . import _check


@dataclass(frozen=True, slots=True)
class ScratchPlan:
    """`slot[i]`: the allocation request `i` uses; `sizes[j]`, `placements[j]`: allocation `j`."""

    slot: tuple[int, ...]
    sizes: tuple[int, ...]
    placements: tuple[Placement, ...]

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)


class ScratchPlanner:
    """Scratch requests with their live step ranges; `plan()` assigns allocations."""

    def __init__(self) -> None:
        self._requests: list[tuple[int, int, int, Placement]] = []

    def add(self, nbytes: int, first: int, last: int, placement: Placement = GPU_LOCAL) -> int:
        """A request for `nbytes` (>= 1) used from step `first` to `last` (inclusive)."""
        nbytes = _check.integer(nbytes, "scratch size (bytes)", 1)
        first = _check.integer(first, "first use (step)", 0)
        last = _check.integer(last, "last use (step)", 0)
        if last < first:
            raise ContractError(f"scratch last use {last} is before its first use {first}")
        if not isinstance(placement, Placement):
            raise ContractError(
                f"a scratch placement is a Placement, got {_check.shown(placement)}"
            )
        self._requests.append((nbytes, first, last, placement))
        return len(self._requests) - 1

    def plan(self) -> ScratchPlan:
        order = sorted(range(len(self._requests)), key=lambda i: self._requests[i][1])
        sizes: list[int] = []
        placements: list[Placement] = []
        busy_until: list[int] = []
        slot = [0] * len(self._requests)
        for i in order:
            nbytes, first, last, placement = self._requests[i]
            free = [
                j
                for j in range(len(sizes))
                if placements[j] == placement and busy_until[j] < first and sizes[j] >= nbytes
            ]
            if free:
                j = min(free, key=lambda k: (sizes[k], k))
            else:
                j = len(sizes)
                sizes.append(nbytes)
                placements.append(placement)
                busy_until.append(last)
            busy_until[j] = last
            slot[i] = j
        return ScratchPlan(tuple(slot), tuple(sizes), tuple(placements))


__all__ = ["ScratchPlan", "ScratchPlanner"]
