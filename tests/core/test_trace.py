"""Trace recording, the Chrome trace format, round trips and lane overlap."""

import json
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

import hrx_async as hrx
from hrx_async._core.lane import Lane
from hrx_async._core.trace import ExecutionTrace, TraceEvent, TraceRecorder
from hrx_async.errors import ContractError


def event(
    lane: Lane,
    start: float,
    duration: float,
    *,
    graph: str = "g",
    region: int = 0,
    copied: int = 0,
    failed: bool = False,
) -> TraceEvent:
    return TraceEvent(
        graph=graph,
        region=region,
        lane=lane,
        start_us=start,
        duration_us=duration,
        copied_bytes=copied,
        failed=failed,
    )


def sample_trace() -> ExecutionTrace:
    return ExecutionTrace(
        events=(
            event(Lane.UPLOAD, 0.0, 10.0, region=0, copied=4096),
            event(Lane.COMPUTE, 10.0, 25.5, region=1),
            event(Lane.DOWNLOAD, 35.5, 4.25, region=2, copied=4096, failed=True),
            event(Lane.UPLOAD, 12.0, 8.0, graph="other", region=0, copied=64),
        ),
        dropped=3,
    )


@pytest.mark.parametrize("capacity", [0, -1, 1.5, True])
def test_recorder_rejects_bad_capacity(capacity: Any) -> None:
    with pytest.raises(ContractError, match="capacity"):
        TraceRecorder(capacity)


def test_recorder_keeps_newest_and_counts_dropped() -> None:
    recorder = TraceRecorder(3)
    for region in range(7):
        recorder.record(event(Lane.COMPUTE, float(region), 1.0, region=region))
    trace = recorder.finish()
    assert [e.region for e in trace.events] == [4, 5, 6]
    assert trace.dropped == 4
    assert recorder.dropped == 4
    assert len(recorder) == 3


def test_recorder_below_capacity_drops_nothing() -> None:
    recorder = TraceRecorder(5)
    for region in range(5):
        recorder.record(event(Lane.UPLOAD, float(region), 1.0, region=region))
    trace = recorder.finish()
    assert [e.region for e in trace.events] == [0, 1, 2, 3, 4]
    assert trace.dropped == 0


def test_event_rejects_bad_values() -> None:
    with pytest.raises(ContractError, match="duration_us"):
        event(Lane.UPLOAD, 0.0, -1.0)
    with pytest.raises(ContractError, match="start_us"):
        event(Lane.UPLOAD, float("nan"), 1.0)
    with pytest.raises(ContractError, match="lane"):
        event(9, 0.0, 1.0)  # type: ignore[arg-type]


def test_chrome_schema() -> None:
    trace = sample_trace()
    chrome = trace.to_chrome()
    assert chrome["displayTimeUnit"] == "ms"
    assert chrome["dropped_events"] == 3
    assert isinstance(chrome["otherData"]["note"], str)
    assert "host-observed" in chrome["otherData"]["note"]
    events = chrome["traceEvents"]
    assert isinstance(events, list)

    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == len(trace.events)
    for raw, source in zip(complete, trace.events, strict=True):
        assert set(raw) >= {"name", "cat", "ph", "pid", "tid", "ts", "dur", "args"}
        assert raw["name"] == f"{source.graph}#{source.region}"
        assert raw["cat"] == source.lane.label
        assert raw["pid"] == 0
        assert isinstance(raw["tid"], int)
        assert raw["tid"] == int(source.lane)
        assert isinstance(raw["ts"], float)
        assert isinstance(raw["dur"], float)
        assert raw["ts"] == source.start_us
        assert raw["dur"] == source.duration_us
        assert raw["args"] == {
            "graph": source.graph,
            "region": source.region,
            "copied_bytes": source.copied_bytes,
            "failed": source.failed,
        }

    metadata = [e for e in events if e["ph"] == "M"]
    process = [e for e in metadata if e["name"] == "process_name"]
    assert [e["args"]["name"] for e in process] == ["hrx_async"]
    threads = {e["tid"]: e["args"]["name"] for e in metadata if e["name"] == "thread_name"}
    # Only lanes that appear get a thread name: no NPU or HOST here.
    assert threads == {0: "upload", 1: "compute", 2: "download"}

    # The object must survive JSON encoding unchanged.
    assert json.loads(trace.to_json()) == chrome


def test_round_trip_through_a_file(tmp_path: Path) -> None:
    trace = sample_trace()
    path = tmp_path / "trace.json"
    trace.write(path)
    loaded = ExecutionTrace.load(path)
    assert loaded == trace
    assert ExecutionTrace.from_chrome(json.loads(trace.to_json())) == trace


def test_load_rejects_non_json(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(ContractError, match="not JSON"):
        ExecutionTrace.load(path)


def _without(chrome: dict[str, Any], key: str, in_args: bool = False) -> dict[str, Any]:
    for raw in chrome["traceEvents"]:
        if raw["ph"] == "X":
            del (raw["args"] if in_args else raw)[key]
            break
    return chrome


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda c: {k: v for k, v in c.items() if k != "traceEvents"}, "traceEvents"),
        (lambda c: _without(c, "ts"), "'ts'"),
        (lambda c: _without(c, "dur"), "'dur'"),
        (lambda c: _without(c, "tid"), "'tid'"),
        (lambda c: _without(c, "args"), "'args'"),
        (lambda c: _without(c, "graph", in_args=True), "'graph'"),
        (lambda c: _without(c, "copied_bytes", in_args=True), "'copied_bytes'"),
        (lambda c: {**c, "dropped_events": -2}, "dropped_events"),
    ],
)
def test_from_chrome_names_what_is_missing(mutate: Any, message: str) -> None:
    chrome = json.loads(sample_trace().to_json())
    with pytest.raises(ContractError, match=message):
        ExecutionTrace.from_chrome(mutate(chrome))


def test_from_chrome_rejects_unknown_lane() -> None:
    chrome = json.loads(sample_trace().to_json())
    for raw in chrome["traceEvents"]:
        if raw["ph"] == "X":
            raw["tid"] = 42
    with pytest.raises(ContractError, match="42"):
        ExecutionTrace.from_chrome(chrome)


def test_overlap_of_constructed_intervals() -> None:
    trace = ExecutionTrace(
        events=(
            # Upload busy over [0, 10] and [20, 30]; the two overlapping regions merge.
            event(Lane.UPLOAD, 0.0, 6.0),
            event(Lane.UPLOAD, 4.0, 6.0),
            event(Lane.UPLOAD, 20.0, 10.0),
            # Compute busy over [5, 25].
            event(Lane.COMPUTE, 5.0, 20.0),
            # Download busy over [40, 50]: touches nothing.
            event(Lane.DOWNLOAD, 40.0, 10.0),
        )
    )
    # [5, 10] and [20, 25]
    assert trace.overlap_us(Lane.UPLOAD, Lane.COMPUTE) == pytest.approx(10.0)
    assert trace.overlap_us(Lane.COMPUTE, Lane.UPLOAD) == pytest.approx(10.0)
    assert trace.overlap_us(Lane.UPLOAD, Lane.DOWNLOAD) == 0.0
    assert trace.overlap_us(Lane.UPLOAD, Lane.NPU) == 0.0
    # Same lane: merged busy time, not double-counted.
    assert trace.overlap_us(Lane.UPLOAD, Lane.UPLOAD) == pytest.approx(20.0)


def test_overlap_with_one_long_interval_spanning_many() -> None:
    trace = ExecutionTrace(
        events=(
            event(Lane.COMPUTE, 0.0, 100.0),
            *(event(Lane.UPLOAD, float(start), 5.0) for start in range(0, 100, 10)),
        )
    )
    assert trace.overlap_us(Lane.UPLOAD, Lane.COMPUTE) == pytest.approx(50.0)


def test_lanes_lists_appearing_lanes_in_order() -> None:
    assert sample_trace().lanes == (Lane.UPLOAD, Lane.COMPUTE, Lane.DOWNLOAD)
    assert ExecutionTrace(events=()).lanes == ()


@pytest.mark.anyio
async def test_a_skipped_region_leaves_no_event_in_the_trace() -> None:
    """Two submissions of a host region; the second is cancelled while the first runs: the
    function ran once, so the trace holds one event for it."""
    ran: list[int] = []

    def slow(memory: Any) -> None:
        ran.append(1)
        time.sleep(0.2)

    async with hrx.Runtime(backend="sim", npu=None) as rt:
        h = rt.allocate(64, hrx.HOST_VISIBLE)
        g = rt.graph("slow")
        g.host(slow, [(h.view(), hrx.Access.WRITE)])
        prepared = g.prepare()
        rt.start_trace()
        first = prepared.submit()
        second = prepared.submit()
        await anyio.sleep(0.05)
        second.cancel()
        await first
        with pytest.raises(hrx.Cancelled):
            await second
        trace = rt.finish_trace()
    assert ran == [1]
    assert len([e for e in trace.events if e.graph == "slow"]) == 1
