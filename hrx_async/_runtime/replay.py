"""What every replay of one prepared graph needs, worked out once when it is prepared.

`PreparedGraph` is what users hold; admission reads this record instead. It is a compiled
class (see `_build.COMPILED`), so each of its fields is a direct read for the compiled
scheduler, where an attribute of the interpreted `PreparedGraph` is a dictionary-style
lookup, and a replay reads a dozen of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._core.chains import ReplayChain, replay_chain
from .._core.counters import AdmissionMarks
from .._core.graph import GraphPlan, RegionPlan
from .._core.intervals import Interval, read_before_written, written_whole
from .._core.tracker import AccessTracker
from .host import AsyncHostProgram

if TYPE_CHECKING:
    from .._core.lane import Lane
    from .._core.memory import Buffer
    from .lane_task import LaneRunner

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
    bool,
    int,
    "tuple[tuple[Lane, int], ...]",
]
"""Per region, what admission needs (see `ReplayPlan.steps`)."""


class ReplayPlan:
    """The admission side of one prepared graph: its regions' steps, the buffers to check,
    and what replays learn (durations, queues)."""

    def __init__(
        self,
        plan: GraphPlan,
        programs: tuple[Any, ...],
        providers: tuple[object, ...],
        session: Any,
    ) -> None:
        self.plan = plan
        self.label = plan.label
        self.buffers: tuple[Buffer, ...] = plan.buffers
        self.marks: AdmissionMarks = session.marks
        """The count of buffers freed and of host mappings live of the session it submits
        through (`ports.Submitter`)."""
        self.mappings = session.mappings
        """The session's host mappings (`ports.MappingBook`): a replay checks them while any
        is live (`marks.mappings`)."""
        self.frees_seen = -1
        """`marks.frees` when every buffer was last seen alive: until another is freed, a
        replay need not look at each again."""
        self.estimates = [0.0] * len(programs)
        """Smoothed observed duration of each region, seconds: how long to watch its queue."""
        self.queues: list[Any] = [None] * len(programs)
        """Per region, its provider's queue, looked up on first use (queues are made lazily)."""
        self.lanes: list[LaneRunner | None] = [None] * len(programs)
        """Per region, its lane's task, looked up by key on first use: a session's
        scheduler, and so its lanes, stay the same for the session's life (a lookup by a
        (lane, device) key costs a tuple's hash and comparison per region)."""
        coherent = tuple(getattr(program, "coherent_reads", ()) for program in programs)
        regions = plan.regions
        self.steps: tuple[ReplayStep, ...] = tuple(
            (
                region,
                program,
                provider,
                region.queue_key,
                tuple((i.buffer.ident, i.start, i.end, False) for i in region.reads)
                + tuple((i.buffer.ident, i.start, i.end, True) for i in region.writes),
                written_whole(plan, region),
                read_before_written([plan.nodes[i] for i in region.nodes]),
                coherent[region.index],
                float(getattr(provider, "poll_budget_us", 0.0)),
                isinstance(program, AsyncHostProgram),
                region.index,
                region.copies,
            )
            for region, program, provider in zip(regions, programs, providers, strict=True)
        )
        """Per region, what admission needs: its plan, program, provider, queue key,
        byte-range accesses (reads first) as (buffer ident, start, end, writes), the
        buffers it writes whole (running it clears their poison), the bytes it reads
        before writing them itself (poisoned, they refuse it), its program's coherent reads
        (the byte ranges it syncs unless earlier regions of its lane wrote them last, see
        `RegionRun.program_for_writers`), its provider's poll budget (µs; above 0 for a
        watched device stream) and whether it runs on the host (an `async def` host
        function: `RegionRun.host_side`), and its plan's index and copies (read here once:
        an attribute of the interpreted plan is a lookup by name)."""
        self.chain: ReplayChain[object] | None = None
        """Its replays in the tracker as a chain (`ReplayChain`): each replay's regions are
        registered in a few steps while nothing else is pending on its bytes. None when a
        region's program depends on who wrote its inputs last (its coherent reads), which
        asks the tracker's segments region by region."""
        if not any(step[7] for step in self.steps):
            pattern = tuple(step[4] for step in self.steps)
            self.chain = replay_chain(pattern, AccessTracker())
        self.first_on_stream = self.steps[0][8] > 0
        """Its first region goes to a watched queue (a device stream): it may launch before
        the bookkeeping of its submission (`Scheduler.submit`)."""
        self.input_reads: tuple[Interval, ...] = read_before_written(plan.nodes)
        """The bytes the graph reads before writing them itself: poisoned, they refuse it."""
        self.inputs: tuple[Buffer, ...] = tuple(
            {i.buffer.ident: i.buffer for i in self.input_reads}.values()
        )
