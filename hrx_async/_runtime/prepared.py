"""PreparedGraph: a validated graph with its backend programs, ready to replay."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .._core.graph import GraphPlan, Node, RegionPlan
from .._core.intervals import Interval
from .completion import Completion
from .replay import ReplayPlan

if TYPE_CHECKING:
    from .ports import Submitter


class PreparedGraph:
    """Replay with `await p.submit()`; `submit()` itself never blocks.

    Replay does O(regions) Python work and allocates no native memory.
    """

    __slots__ = ("buffers", "plan", "programs", "providers", "replay", "runtime", "session")

    def __init__(
        self,
        runtime: object,
        session: Submitter,
        plan: GraphPlan,
        programs: tuple[Any, ...],
        providers: tuple[object, ...],
    ) -> None:
        self.runtime = runtime
        """The `Runtime` that prepared it (its public handle)."""
        self.session = session
        """What it submits through: the runtime's opened session."""
        self.plan = plan
        self.programs = programs
        self.providers = providers
        self.buffers = plan.buffers
        self.replay = ReplayPlan(plan, programs, providers, session)
        """What admission needs of each replay, worked out now."""

    @property
    def input_reads(self) -> tuple[Interval, ...]:
        """The bytes the graph reads before writing them itself: poisoned, they refuse it."""
        return self.replay.input_reads

    @property
    def label(self) -> str:
        """The label the graph was recorded under (`rt.graph(label)`), used in errors and traces."""
        return self.plan.label

    @property
    def nodes(self) -> tuple[Node, ...]:
        """The graph's nodes, in recording order."""
        return self.plan.nodes

    @property
    def regions(self) -> tuple[RegionPlan, ...]:
        """The regions the nodes were cut into: each a lane and the nodes it runs, in order."""
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
        """Per buffer, the merged byte intervals the graph writes."""
        return self.plan.writes

    def submit(self, after: Iterable[Completion] = ()) -> Completion:
        """Admit one replay now (in call order) and return its completion.

        Work on bytes that earlier submissions use waits for them, byte range by
        byte range; `after` adds explicit dependencies on other submissions.
        Beyond `max_submissions` in flight, the replay waits for admission in order.
        """
        scheduler = self.session.scheduler
        if scheduler is None:
            scheduler = self.session.scheduler_or_raise()
        return scheduler.submit(self.replay, after, False)

    def submit_nowait(self, after: Iterable[Completion] = ()) -> Completion:
        """Like `submit`, but raise `Busy` instead of queueing beyond `max_submissions`."""
        scheduler = self.session.scheduler
        if scheduler is None:
            scheduler = self.session.scheduler_or_raise()
        return scheduler.submit(self.replay, after, True)

    def __repr__(self) -> str:
        return f"<PreparedGraph {self.label!r} {len(self.nodes)} nodes {len(self.regions)} regions>"
