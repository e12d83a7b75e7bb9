"""What the event queries of awaited replays answered, and when.

Per replay: the last query that answered "not ready" and the first that answered "ready",
from an origin the caller chooses (the call, or the moment the work ended); the gap
between those two (about one sweep where a spin caught the end, `QueueWatch.spin_near_end`,
about one loop pass where none did) against the gap between queries while the work ran;
how many queries it took, and the watch's smoothed loop pass at the end.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from typing import Any


def us(values: list[float]) -> float:
    return round(statistics.median(values) * 1e6, 2)


class QueryAnswers:
    """The answers of many replays' queries, gathered with `add`, summed up by `summary`."""

    def __init__(self) -> None:
        self.last_not_ready: list[float] = []
        self.first_ready: list[float] = []
        self.end_gaps: list[float] = []
        self.query_gaps: list[float] = []
        self.counts: list[int] = []
        self.pass_costs: list[float] = []

    def add(self, answers: Sequence[tuple[float, bool]], origin: float, pass_cost: float) -> None:
        """One replay's `(time, ready)` answers, in order, and its watch's pass cost."""
        waiting = [at for at, ready in answers if not ready]
        ready = [at for at, ready in answers if ready]
        if waiting:
            self.last_not_ready.append(waiting[-1] - origin)
        if ready:
            self.first_ready.append(ready[0] - origin)
            if waiting:
                self.end_gaps.append(ready[0] - waiting[-1])
        self.query_gaps.extend(y - x for x, y in itertools.pairwise(waiting))
        self.counts.append(len(answers))
        self.pass_costs.append(pass_cost)

    def summary(self) -> dict[str, Any]:
        return {
            "queries_per_replay": statistics.median(self.counts) if self.counts else None,
            "end_gap_us": us(self.end_gaps) if self.end_gaps else None,
            "query_gap_us": us(self.query_gaps) if self.query_gaps else None,
            "pass_cost_at_end_us": us(self.pass_costs) if self.pass_costs else None,
        }
