"""PreparedGraph: a validated graph with its backend programs, ready to replay."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .._core.graph import GraphPlan, Node, RegionPlan
from .._core.intervals import Interval, read_before_written, written_whole
from .completion import Completion

if TYPE_CHECKING:
    from .._core.lane import Lane
    from .._core.memory import Buffer
    from .ports import Submitter

ByteAccess = tuple[int, int, int, bool]
"""(buffer ident, start, end, writes)"""
ReplayStep = tuple[
    RegionPlan,
    Any,
    object,
    "tuple[Lane, int]",
    tuple[ByteAccess, ...],
    "tuple[Buffer, ...]",
    tuple[Interval, ...],
    tuple[tuple[int, int, int], ...],
    float,
]
"""Per region, what admission needs (see `PreparedGraph.steps`)."""


class PreparedGraph:
    """Replay with `await p.submit()`; `submit()` itself never blocks.

    Replay does O(regions) Python work and allocates no native memory.
    """

    __slots__ = (
        "buffers",
        "clears",
        "coherent_reads",
        "estimates",
        "first_on_stream",
        "input_reads",
        "inputs",
        "plan",
        "programs",
        "providers",
        "queues",
        "region_inputs",
        "runtime",
        "session",
        "steps",
    )

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
        self.estimates = [0.0] * len(programs)
        """Smoothed observed duration of each region, seconds: how long to watch its queue."""
        self.coherent_reads: tuple[tuple[tuple[int, int, int], ...], ...] = tuple(
            getattr(program, "coherent_reads", ()) for program in programs
        )
        """Per region, the byte ranges (buffer ident, start, end) its program syncs before it
        runs unless earlier regions of its lane wrote them last (see
        `RegionRun.program_for_writers`); empty for most programs."""
        self.clears = tuple(written_whole(plan, region) for region in plan.regions)
        """Per region, the buffers it writes whole: running it clears their poison."""
        self.region_inputs = tuple(
            read_before_written([plan.nodes[i] for i in region.nodes]) for region in plan.regions
        )
        """Per region, the bytes it reads before writing them itself: poisoned, they refuse it."""
        self.steps: tuple[ReplayStep, ...] = tuple(
            (
                region,
                program,
                provider,
                region.queue_key,
                tuple((i.buffer.ident, i.start, i.end, False) for i in region.reads)
                + tuple((i.buffer.ident, i.start, i.end, True) for i in region.writes),
                self.clears[region.index],
                self.region_inputs[region.index],
                self.coherent_reads[region.index],
                getattr(provider, "poll_budget_us", 0.0),
            )
            for region, program, provider in zip(plan.regions, programs, providers, strict=True)
        )
        """Per region, what admission needs, worked out once: its plan, program, provider,
        queue key, byte-range accesses (reads first) as (buffer ident, start, end, writes),
        the buffers it writes whole, the bytes it reads first, its program's coherent
        reads and its provider's poll budget (µs; above 0 for a watched device stream)."""
        self.first_on_stream = self.steps[0][8] > 0
        """Its first region goes to a watched queue (a device stream): it may launch before
        the bookkeeping of its submission (`Scheduler.submit`)."""
        self.queues: list[Any] = [None] * len(programs)
        """Per region, its provider's queue, looked up on first use (queues are made lazily)."""
        self.input_reads = read_before_written(plan.nodes)
        """The bytes the graph reads before writing them itself: poisoned, they refuse it."""
        self.inputs = tuple({i.buffer.ident: i.buffer for i in self.input_reads}.values())

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
        return scheduler.submit(self, after, False)

    def submit_nowait(self, after: Iterable[Completion] = ()) -> Completion:
        """Like `submit`, but raise `Busy` instead of queueing beyond `max_submissions`."""
        scheduler = self.session.scheduler
        if scheduler is None:
            scheduler = self.session.scheduler_or_raise()
        return scheduler.submit(self, after, True)

    def __repr__(self) -> str:
        return f"<PreparedGraph {self.label!r} {len(self.nodes)} nodes {len(self.regions)} regions>"
