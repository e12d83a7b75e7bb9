"""Execution traces: what ran on which lane and when, as seen from the host.

`TraceRecorder` keeps the newest events in a bounded ring so tracing a long run costs a fixed
amount of memory; `ExecutionTrace` is the finished, immutable result. It converts to and from
the Chrome trace-event JSON format, which chrome://tracing and Perfetto open directly, and it
answers the question traces are mostly taken for: did two lanes actually overlap?
"""

from __future__ import annotations

import json
import math
import os
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hrx_async._core.lane import Lane
from hrx_async.errors import ContractError

PROCESS_NAME = "hrx_async"
"""The process name shown by trace viewers."""

TIMING_NOTE = "times are host-observed: region issue to observed completion"
"""Stored in every Chrome trace so a reader knows what the timestamps mean."""

TID_STRIDE = 16
"""A lane's thread id is its lane number plus `TID_STRIDE` times its device: the first
device keeps the original's lane numbers, and a viewer shows each device's lanes apart."""


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One region of one graph submission.

    `start_us` and `duration_us` are host-observed microseconds: from when the host issued
    the region to when it saw the region complete, so they include scheduling latency.
    """

    graph: str
    region: int
    lane: Lane
    start_us: float
    duration_us: float
    copied_bytes: int
    failed: bool
    device: int = 0
    """The lane's device: the runtime's GPU number for GPU lanes, the NPU for NPU lanes."""

    def __post_init__(self) -> None:
        if not isinstance(self.lane, Lane):
            # Accept a plain lane number (as read back from a file), but only a valid one.
            object.__setattr__(self, "lane", _lane(self.lane))
        if not isinstance(self.region, int) or self.region < 0:
            raise ContractError(f"region must be an int >= 0, got {self.region!r}")
        if not math.isfinite(self.start_us):
            raise ContractError(f"start_us must be finite, got {self.start_us!r}")
        if not math.isfinite(self.duration_us) or self.duration_us < 0:
            raise ContractError(f"duration_us must be finite and >= 0, got {self.duration_us!r}")
        if not isinstance(self.copied_bytes, int) or self.copied_bytes < 0:
            raise ContractError(f"copied_bytes must be an int >= 0, got {self.copied_bytes!r}")
        if type(self.device) is not int or self.device < 0:
            raise ContractError(f"device must be an int >= 0, got {self.device!r}")

    @property
    def thread_id(self) -> int:
        """The Chrome-trace `tid` of this event: its lane number, offset per device so each GPU
        gets its own rows."""
        return int(self.lane) + TID_STRIDE * self.device

    @property
    def lane_name(self) -> str:
        """The lane's label, with its device after a colon beyond the first device."""
        return lane_name(self.lane, self.device)

    @property
    def end_us(self) -> float:
        """When the region was observed complete."""
        return self.start_us + self.duration_us


def lane_name(lane: Lane, device: int = 0) -> str:
    """A lane's label, with its device after a colon beyond the first device ("compute:1")."""
    return f"{lane.label}:{device}" if device else lane.label


def _lane(value: object) -> Lane:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ContractError(f"lane must be one of {[int(lane) for lane in Lane]}, got {value!r}")
    try:
        return Lane(value)
    except ValueError:
        raise ContractError(
            f"lane must be one of {[int(lane) for lane in Lane]}, got {value!r}"
        ) from None


class TraceRecorder:
    """A bounded recorder: keeps the newest `capacity` events and counts the ones it dropped."""

    def __init__(self, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ContractError(f"trace capacity must be an int >= 1, got {capacity!r}")
        self._capacity = capacity
        self._events: deque[TraceEvent] = deque(maxlen=capacity)
        self._dropped = 0

    @property
    def capacity(self) -> int:
        """The most events kept at once."""
        return self._capacity

    @property
    def dropped(self) -> int:
        """How many of the oldest events were pushed out by newer ones."""
        return self._dropped

    def __len__(self) -> int:
        return len(self._events)

    def record(self, event: TraceEvent) -> None:
        """Add `event`; when the ring is full the oldest event is dropped and counted."""
        if len(self._events) == self._capacity:
            self._dropped += 1
        self._events.append(event)

    def finish(self) -> ExecutionTrace:
        """The events kept so far, oldest first. The recorder stays usable afterwards."""
        return ExecutionTrace(events=tuple(self._events), dropped=self._dropped)


@dataclass(frozen=True, slots=True)
class ExecutionTrace:
    """A finished trace: the recorded events, oldest first, and how many were dropped."""

    events: tuple[TraceEvent, ...]
    dropped: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.dropped, bool) or not isinstance(self.dropped, int) or self.dropped < 0:
            raise ContractError(f"dropped must be an int >= 0, got {self.dropped!r}")

    @property
    def lanes(self) -> tuple[Lane, ...]:
        """The lanes that appear in the trace, in lane order."""
        return tuple(sorted({event.lane for event in self.events}))

    @property
    def lane_devices(self) -> tuple[tuple[Lane, int], ...]:
        """The (lane, device) pairs that appear in the trace, by device then lane."""
        return tuple(sorted({(e.lane, e.device) for e in self.events}, key=_by_device))

    def to_chrome(self) -> dict[str, Any]:
        """The trace as a Chrome trace-event JSON object (one "X" event per region)."""
        trace_events: list[dict[str, Any]] = [
            {
                "name": "process_name",
                "ph": "M",
                "pid": 0,
                "tid": 0,
                "args": {"name": PROCESS_NAME},
            }
        ]
        trace_events.extend(
            {
                "name": "thread_name",
                "ph": "M",
                "pid": 0,
                "tid": int(lane) + TID_STRIDE * device,
                "args": {"name": lane_name(lane, device)},
            }
            for lane, device in self.lane_devices
        )
        trace_events.extend(
            {
                "name": f"{event.graph}#{event.region}",
                "cat": event.lane.label,
                "ph": "X",
                "pid": 0,
                "tid": event.thread_id,
                "ts": event.start_us,
                "dur": event.duration_us,
                "args": {
                    "graph": event.graph,
                    "region": event.region,
                    "copied_bytes": event.copied_bytes,
                    "failed": event.failed,
                },
            }
            for event in self.events
        )
        return {
            "traceEvents": trace_events,
            "displayTimeUnit": "ms",
            "dropped_events": self.dropped,
            "otherData": {"note": TIMING_NOTE},
        }

    def to_json(self) -> str:
        """`to_chrome()` as compact JSON text."""
        return json.dumps(self.to_chrome(), separators=(",", ":"))

    def write(self, path: str | os.PathLike[str]) -> None:
        """Write the Chrome trace JSON to `path` (open it in Perfetto or chrome://tracing)."""
        Path(path).write_text(self.to_json(), encoding="utf-8")

    @classmethod
    def from_chrome(cls, data: Mapping[str, Any]) -> ExecutionTrace:
        """Rebuild a trace from `to_chrome()` output. Events other than "X" are skipped.

        Raises ContractError naming the first missing or mistyped entry.
        """
        if not isinstance(data, Mapping):
            raise ContractError(f"a trace must be a JSON object, got {type(data).__name__}")
        raw_events = data.get("traceEvents")
        if not isinstance(raw_events, list):
            raise ContractError("trace is missing the 'traceEvents' list")
        # A plain Chrome trace has no dropped count; nothing was dropped from it by us.
        dropped = data.get("dropped_events", 0)
        if isinstance(dropped, bool) or not isinstance(dropped, int) or dropped < 0:
            raise ContractError(f"'dropped_events' must be an int >= 0, got {dropped!r}")
        events = tuple(_parse_events(raw_events))
        return cls(events=events, dropped=dropped)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ExecutionTrace:
        """Read a trace written by `write`. Raises ContractError if the file is not one."""
        text = Path(path).read_text(encoding="utf-8")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ContractError(f"{os.fspath(path)} is not JSON: {exc}") from exc
        return cls.from_chrome(data)

    def overlap_us(
        self,
        lane_a: Lane,
        lane_b: Lane,
        device_a: int | None = None,
        device_b: int | None = None,
    ) -> float:
        """Total time during which some region of `lane_a` and some region of `lane_b` both ran.

        Each lane's intervals are merged first, so overlapping regions on one lane are not
        counted twice. With `lane_a == lane_b` this is the lane's total busy time. A device
        (GPU number, NPU index) narrows a lane to that device's; None takes every device's.
        """
        a = _merged(e for e in self.events if _on(e, lane_a, device_a))
        b = _merged(e for e in self.events if _on(e, lane_b, device_b))
        total = 0.0
        i = j = 0
        while i < len(a) and j < len(b):
            start = max(a[i][0], b[j][0])
            end = min(a[i][1], b[j][1])
            if end > start:
                total += end - start
            # Advance whichever interval finishes first; the other may still meet the next one.
            if a[i][1] < b[j][1]:
                i += 1
            else:
                j += 1
        return total


def _on(event: TraceEvent, lane: Lane, device: int | None) -> bool:
    return event.lane == lane and (device is None or event.device == device)


def _by_device(key: tuple[Lane, int]) -> tuple[int, int]:
    return (key[1], int(key[0]))


def _merged(events: Iterable[TraceEvent]) -> list[tuple[float, float]]:
    """The union of the events' [start, end] intervals as sorted, disjoint intervals."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted((e.start_us, e.end_us) for e in events):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


_NUMBER = (int, float)
_LANE_NUMBERS = frozenset(int(lane) for lane in Lane)


def _field(raw: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in raw:
        raise ContractError(f"{where} is missing {key!r}")
    value = raw[key]
    # bool is an int subclass, but a flag is never a valid number or count here.
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ContractError(f"{where} {key!r} has the wrong type: {value!r}")
    return value


def _parse_events(raw_events: list[Any]) -> Iterable[TraceEvent]:
    for index, raw in enumerate(raw_events):
        where = f"trace event {index}"
        if not isinstance(raw, Mapping):
            raise ContractError(f"{where} is not an object: {raw!r}")
        if _field(raw, "ph", str, where) != "X":
            continue
        args = _field(raw, "args", Mapping, where)
        args_where = f"{where} args"
        thread = _field(raw, "tid", int, where)
        if thread < 0 or thread % TID_STRIDE not in _LANE_NUMBERS:
            raise ContractError(
                f"{where} 'tid' {thread} names no lane: lane numbers are "
                f"{sorted(_LANE_NUMBERS)}, plus {TID_STRIDE} per device"
            )
        yield TraceEvent(
            graph=_field(args, "graph", str, args_where),
            region=_field(args, "region", int, args_where),
            lane=_lane(thread % TID_STRIDE),
            device=thread // TID_STRIDE,
            start_us=float(_field(raw, "ts", _NUMBER, where)),
            duration_us=float(_field(raw, "dur", _NUMBER, where)),
            copied_bytes=_field(args, "copied_bytes", int, args_where),
            failed=_field(args, "failed", bool, args_where),
        )


__all__ = [
    "PROCESS_NAME",
    "TID_STRIDE",
    "TIMING_NOTE",
    "ExecutionTrace",
    "TraceEvent",
    "TraceRecorder",
    "lane_name",
]
