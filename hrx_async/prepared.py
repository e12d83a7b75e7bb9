"""PreparedGraph: a validated graph with its backend programs, ready to replay."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .completion import Completion
from .graph import GraphPlan, Interval, Node, RegionPlan

if TYPE_CHECKING:
    from .lanes.lane import Lane
    from .runtime import Runtime

Access = tuple[int, int, int, bool]
"""(buffer ident, start, end, writes)"""
ReplayStep = tuple[RegionPlan, Any, object, "tuple[Lane, int]", tuple[Access, ...]]


class PreparedGraph:
    """Replay with `await p.submit()`; `submit()` itself never blocks.

    Replay does O(regions) Python work and allocates no native memory.
    """

    __slots__ = (
        "buffers",
        "estimates",
        "inputs",
        "plan",
        "programs",
        "providers",
        "runtime",
        "steps",
    )

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
        """Smoothed observed duration of each region, seconds: how long to watch its queue."""
        self.steps: tuple[ReplayStep, ...] = tuple(
            (
                region,
                program,
                provider,
                region.queue_key,
                tuple((i.buffer.ident, i.start, i.end, False) for i in region.reads)
                + tuple((i.buffer.ident, i.start, i.end, True) for i in region.writes),
            )
            for region, program, provider in zip(plan.regions, programs, providers, strict=True)
        )
        """Per region, what admission needs, worked out once: its plan, program, provider,
        queue key and byte-range accesses (reads first) as (buffer ident, start, end, writes)."""
        overwritten = {buffer.ident for buffer in plan.overwrites}
        self.inputs = tuple(
            {
                i.buffer.ident: i.buffer for i in plan.reads if i.buffer.ident not in overwritten
            }.values()
        )
        """Buffers the graph reads without overwriting them first: a poisoned one refuses it."""

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
