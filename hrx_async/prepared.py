"""PreparedGraph: a validated graph with its backend programs, ready to replay."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .completion import Completion
from .graph import GraphPlan, Interval, Node, RegionPlan

if TYPE_CHECKING:
    from .runtime import Runtime


class PreparedGraph:
    """Replay with `await p.submit()`; `submit()` itself never blocks.

    Replay does O(regions) Python work and allocates no native memory.
    """

    __slots__ = ("buffers", "estimates", "plan", "programs", "providers", "runtime")

    def __init__(
        self,
        runtime: Runtime,
        plan: GraphPlan,
        programs: tuple[Any, ...],
        providers: tuple[object, ...],
    ) -> None:
        self.runtime = runtime
        self.plan = plan
        self.programs = programs
        self.providers = providers
        self.buffers = plan.buffers
        self.estimates = [0.0] * len(programs)
        """Smoothed observed duration of each region, seconds: how long to poll its fence."""

    @property
    def label(self) -> str:
        return self.plan.label

    @property
    def nodes(self) -> tuple[Node, ...]:
        return self.plan.nodes

    @property
    def regions(self) -> tuple[RegionPlan, ...]:
        return self.plan.regions

    @property
    def edges(self) -> frozenset[tuple[int, int]]:
        """(producer region, consumer region) pairs inferred from the accesses."""
        return self.plan.edges

    @property
    def reads(self) -> tuple[Interval, ...]:
        """Per buffer, the merged byte intervals the graph reads."""
        return self.plan.reads

    @property
    def writes(self) -> tuple[Interval, ...]:
        return self.plan.writes

    def submit(self, after: Iterable[Completion] = ()) -> Completion:
        """Admit one replay now (in call order) and return its completion.

        Work on bytes that earlier submissions use waits for them, byte range by
        byte range; `after` adds explicit dependencies on other submissions.
        Beyond `max_submissions` in flight, the replay waits for admission in order.
        """
        return self.runtime._scheduler_or_raise().submit(self, after, nowait=False)

    def submit_nowait(self, after: Iterable[Completion] = ()) -> Completion:
        """Like `submit`, but raise `Busy` instead of queueing beyond `max_submissions`."""
        return self.runtime._scheduler_or_raise().submit(self, after, nowait=True)

    def __repr__(self) -> str:
        return f"<PreparedGraph {self.label!r} {len(self.nodes)} nodes {len(self.regions)} regions>"
