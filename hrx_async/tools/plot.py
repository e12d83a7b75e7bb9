"""Draw an `ExecutionTrace`, or any Chrome trace-event file, as a per-lane timeline image.

`load_timeline` reads the standard Chrome trace-event format: a JSON object with a
`traceEvents` list (what `ExecutionTrace.write` and the demo write, and what most tools
save), or a bare JSON list of events, with or without its closing bracket. Complete
events ("X") and begin/end pairs ("B"/"E") become bars; `args` are optional. Rows are
threads, named by their `thread_name` metadata when there is one.

matplotlib is optional (the `plot` extra), so it is imported only when a plot is asked for.
The figure is drawn on the non-interactive "Agg" canvas directly rather than through pyplot,
so it works without a display, leaves the caller's pyplot backend alone and leaks no figures.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hrx_async._core.install import install_hint
from hrx_async._core.lane import Lane
from hrx_async._core.trace import ExecutionTrace, lane_name
from hrx_async.errors import ContractError, Unsupported
from hrx_async.files import NotRegularFile, open_regular

_OK_COLOR = "tab:blue"
_FAILED_COLOR = "tab:red"
_KIND_COLORS = {"GPU": "tab:blue", "NPU": "tab:orange", "host": "tab:gray"}
"""Bar colours by the kind of work a row runs (a runtime trace's lanes); other rows blue."""
_INSTALL = install_hint("plot")
_LABEL_POINTS = 7.0
"""Font size of bar labels; a character is taken as about 0.6 of it wide."""


@dataclass(frozen=True, slots=True)
class Span:
    """One bar: a region or trace event on one row, in microseconds."""

    row: int
    start_us: float
    duration_us: float
    label: str
    failed: bool = False


@dataclass(frozen=True, slots=True)
class Timeline:
    """What a timeline picture shows: named rows, top to bottom, and the bars on them."""

    rows: tuple[str, ...]
    spans: tuple[Span, ...]
    kinds: tuple[str, ...] = ()
    """Per row, the kind of work it runs ("GPU", "NPU" or "host"), for a runtime trace;
    empty for other traces (their rows are threads of unknown kind)."""

    @classmethod
    def from_trace(cls, trace: ExecutionTrace) -> Timeline:
        """One row per lane that appears; each bar labelled graph#region (and its replay)."""
        keys = trace.lane_devices
        row = {key: index for index, key in enumerate(keys)}
        spans = [
            Span(
                row[e.lane, e.device], e.start_us, e.duration_us, f"{e.graph}#{e.region}", e.failed
            )
            for e in trace.events
        ]
        return cls(
            tuple(lane_name(lane, device) for lane, device in keys),
            _numbered(spans),
            tuple(_work_kind(lane) for lane, _ in keys),
        )


def _work_kind(lane: Lane) -> str:
    if lane is Lane.NPU:
        return "NPU"
    if lane is Lane.HOST:
        return "host"
    return "GPU"


def _numbered(spans: list[Span]) -> tuple[Span, ...]:
    """`spans` by start time; a label seen more than once gets its replay: "name r2"."""
    ordered = sorted(spans, key=lambda span: span.start_us)
    totals: dict[str, int] = {}
    for span in ordered:
        totals[span.label] = totals.get(span.label, 0) + 1
    seen: dict[str, int] = {}
    numbered = []
    for span in ordered:
        if totals[span.label] > 1:
            seen[span.label] = replay = seen.get(span.label, 0) + 1
            span = replace(span, label=f"{span.label} r{replay}")
        numbered.append(span)
    return tuple(numbered)


def picture_formats() -> tuple[str, ...]:
    """The file suffixes (without the dot) matplotlib can save to; Unsupported without it."""
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError as exc:
        raise Unsupported(f"plotting needs matplotlib, which is not installed: {_INSTALL}") from exc
    return tuple(sorted(FigureCanvasBase.get_supported_filetypes()))


def check_picture_path(path: str | os.PathLike[str]) -> str:
    """The picture format `path`'s suffix names; ContractError naming the formats if none."""
    suffix = Path(path).suffix.lower().lstrip(".")
    formats = picture_formats()
    if suffix not in formats:
        shown = f"'.{suffix}'" if suffix else "no suffix"
        raise ContractError(
            f"cannot draw a picture to {os.fspath(path)!r} ({shown}); "
            f"the file name must end in one of: {', '.join('.' + f for f in formats)}"
        )
    return suffix


def _parse_json(text: str, shown: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        # The JSON array format may end without its closing bracket (a trace cut short).
        stripped = text.rstrip().rstrip(",")
        if stripped.lstrip().startswith("[") and not stripped.endswith("]"):
            try:
                return json.loads(stripped + "]")
            except json.JSONDecodeError:
                pass
        raise ContractError(f"{shown} is not JSON: {exc}") from exc


def _number(raw: Mapping[str, Any], key: str, where: str) -> float:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ContractError(f"{where} needs a number {key!r}, got {value!r}")
    if not math.isfinite(value):
        raise ContractError(f"{where} needs a finite {key!r}, got {value!r}")
    return float(value)


def _thread(raw: Mapping[str, Any]) -> tuple[str, str]:
    return (str(raw.get("pid", "")), str(raw.get("tid", "")))


def timeline_from_chrome(data: Any) -> Timeline:
    """The bars of a Chrome trace: an object with `traceEvents`, or a bare list of events."""
    if isinstance(data, Mapping):
        events = data.get("traceEvents")
        if not isinstance(events, list):
            raise ContractError("a trace object needs a 'traceEvents' list")
    elif isinstance(data, list):
        events = data
    else:
        raise ContractError(f"a trace is a JSON object or list, got {type(data).__name__}")
    names: dict[tuple[str, str], str] = {}
    processes: dict[str, str] = {}
    found: list[tuple[tuple[str, str], float, float, str, bool]] = []
    open_events: dict[tuple[str, str], list[tuple[float, str]]] = {}
    for index, raw in enumerate(events):
        where = f"trace event {index}"
        if not isinstance(raw, Mapping):
            raise ContractError(f"{where} is not an object: {raw!r}")
        phase = raw.get("ph")
        given = raw.get("args")
        args: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
        thread = _thread(raw)
        if phase == "M" and raw.get("name") in ("thread_name", "process_name"):
            if raw["name"] == "thread_name":
                names[thread] = str(args.get("name", thread[1]))
            else:
                processes[thread[0]] = str(args.get("name", thread[0]))
        elif phase == "X":
            start = _number(raw, "ts", where)
            duration = _number(raw, "dur", where) if "dur" in raw else 0.0
            if duration < 0:
                raise ContractError(f"{where} has a negative 'dur' ({duration:g} us)")
            failed = args.get("failed") is True
            found.append((thread, start, duration, str(raw.get("name", "")), failed))
        elif phase == "B":
            open_events.setdefault(thread, []).append(
                (_number(raw, "ts", where), raw.get("name", ""))
            )
        elif phase == "E" and open_events.get(thread):
            start, name = open_events[thread].pop()
            end = _number(raw, "ts", where)
            found.append((thread, start, max(end - start, 0.0), str(name), False))
    if not found:
        raise ContractError("the trace has no complete ('X') or begin/end ('B'/'E') events")
    threads = sorted({item[0] for item in found}, key=_sort_key)
    several = len({pid for pid, _ in threads}) > 1

    def row_name(thread: tuple[str, str]) -> str:
        name = names.get(thread, f"thread {thread[1]}")
        return f"{processes.get(thread[0], 'pid ' + thread[0])}: {name}" if several else name

    row = {thread: index for index, thread in enumerate(threads)}
    spans = [
        Span(row[thread], start, length, name, bad) for thread, start, length, name, bad in found
    ]
    return Timeline(tuple(row_name(thread) for thread in threads), _numbered(spans))


def _sort_key(thread: tuple[str, str]) -> tuple[tuple[int, int | str], ...]:
    return tuple((0, int(part)) if part.lstrip("-").isdigit() else (1, part) for part in thread)


def read_trace_text(path: str | os.PathLike[str]) -> str:
    """The text of a trace file. ContractError when `path` is not a regular file (checked
    before reading, so a FIFO or device never blocks or streams forever) or not UTF-8
    text; OSError when it cannot be opened or read (a missing file, say)."""
    shown = repr(os.fspath(path))
    try:
        fd, _ = open_regular(path)
    except NotRegularFile as exc:
        raise ContractError(f"{shown} is {exc.kind}, not a regular file") from None
    with os.fdopen(fd, "rb") as file:
        data = file.read()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ContractError(
            f"{shown} is not a trace: byte {exc.start} (0x{data[exc.start]:02x}) is not UTF-8 "
            "text, and a trace is a JSON file (a picture or other binary file, perhaps)"
        ) from None


def timeline_from_text(text: str, shown: str = "the trace") -> Timeline:
    """The timeline of a trace file's text (`shown` names it in errors)."""
    return timeline_from_chrome(_parse_json(text, shown))


def load_timeline(path: str | os.PathLike[str]) -> Timeline:
    """Read a Chrome trace-event file (see the module's docstring) as a timeline."""
    return timeline_from_text(read_trace_text(path), os.fspath(path))


def plot_timeline(
    trace: ExecutionTrace | Timeline, path: str | os.PathLike[str], title: str | None = None
) -> None:
    """Save a timeline of `trace` to `path` (format from the suffix, e.g. .png or .svg).

    One row per lane (or thread), one bar per region from its start to its end, in
    milliseconds after the first event, labelled with its name (graph#region and replay
    for an `ExecutionTrace`) where the bar is wide enough. For an `ExecutionTrace` bars are
    coloured by the kind of work (GPU blue, NPU orange, host gray) and the legend names
    each kind shown. Failed regions are hatched red. The legend sits below the axes, clear
    of every bar.
    """
    timeline = Timeline.from_trace(trace) if isinstance(trace, ExecutionTrace) else trace
    if not timeline.spans:
        raise ContractError("cannot plot an empty trace: it has no events (0 recorded)")
    check_picture_path(path)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    rows = timeline.rows
    origin_us = min(span.start_us for span in timeline.spans)
    end_ms = max((s.start_us + s.duration_us - origin_us) / 1000.0 for s in timeline.spans)

    kinds = timeline.kinds if len(timeline.kinds) == len(rows) else ("",) * len(rows)
    # One broken_barh call per row and state keeps the artist count (and the file) small.
    bars: dict[tuple[int, bool], list[tuple[float, float]]] = {}
    for span in timeline.spans:
        start_ms = (span.start_us - origin_us) / 1000.0
        bars.setdefault((span.row, span.failed), []).append((start_ms, span.duration_us / 1000.0))

    figure = Figure(figsize=(10, 1.6 + 0.6 * len(rows)))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for (index, failed), spans in bars.items():
        if failed:
            axes.broken_barh(
                spans,
                (index - 0.4, 0.8),
                facecolors="none",
                edgecolors=_FAILED_COLOR,
                hatch="///",
                linewidth=0.8,
            )
        else:
            color = _KIND_COLORS.get(kinds[index], _OK_COLOR)
            axes.broken_barh(
                spans, (index - 0.4, 0.8), facecolors=color, edgecolors="black", linewidth=0.3
            )
    axes.set_yticks(range(len(rows)), list(rows))
    axes.set_ylim(-0.6, len(rows) - 0.4)
    axes.set_xlim(0, end_ms * 1.01 if end_ms > 0 else 1.0)
    # Lane 0 (upload) on top reads like the pipeline: upload, compute, download.
    axes.invert_yaxis()
    axes.set_xlabel("time since first region (ms, host-observed)")
    axes.grid(axis="x", linestyle=":", linewidth=0.5)
    if title is not None:
        axes.set_title(title)
    _label_bars(axes, figure, timeline, origin_us, end_ms)
    handles = [
        Patch(facecolor=color, edgecolor="black", label=label)
        for label, color in legend_entries(timeline)
    ]
    if any(failed for _, failed in bars):
        handles.append(
            Patch(facecolor="none", edgecolor=_FAILED_COLOR, hatch="///", label="failed")
        )
    # Below the axes, so it never covers a bar.
    axes.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.35 if len(rows) < 3 else -0.22),
        ncol=len(handles),
        fontsize="small",
        frameon=False,
    )
    figure.tight_layout()
    figure.savefig(os.fspath(path), dpi=100)


def legend_entries(timeline: Timeline) -> list[tuple[str, str]]:
    """The legend's (label, colour) entries for the bars that did not fail: one per kind of
    work shown ("GPU work", "NPU work", "host work") for a runtime trace, else one for all."""
    kinds = timeline.kinds
    if len(kinds) != len(timeline.rows):
        return [("region (label: name, replay)", _OK_COLOR)]
    shown = {kinds[span.row] for span in timeline.spans if not span.failed}
    return [(f"{kind} work", color) for kind, color in _KIND_COLORS.items() if kind in shown]


def _text_color(span: Span, kinds: tuple[str, ...]) -> str:
    # Dark text on hatched (failed), gray and orange bars; light text on blue ones.
    light = not kinds or kinds[span.row] == "GPU"
    return "white" if light and not span.failed else "black"


def _label_bars(
    axes: Any, figure: Any, timeline: Timeline, origin_us: float, end_ms: float
) -> None:
    """Write each bar's label in it: the whole label if it fits, else its replay, else none."""
    width_points = figure.get_figwidth() * 72 * 0.8
    points_per_ms = width_points / (end_ms * 1.01) if end_ms > 0 else 0.0
    kinds = timeline.kinds
    for span in timeline.spans:
        room = span.duration_us / 1000.0 * points_per_ms
        text = span.label
        if len(text) * _LABEL_POINTS * 0.6 > room:
            text = text.rsplit(" ", 1)[-1]
            if len(text) * _LABEL_POINTS * 0.6 > room:
                continue
        axes.text(
            (span.start_us - origin_us + span.duration_us / 2) / 1000.0,
            span.row,
            text,
            ha="center",
            va="center",
            fontsize=_LABEL_POINTS,
            color=_text_color(span, kinds),
            clip_on=True,
        )


__all__ = [
    "Span",
    "Timeline",
    "check_picture_path",
    "legend_entries",
    "load_timeline",
    "picture_formats",
    "plot_timeline",
    "read_trace_text",
    "timeline_from_chrome",
    "timeline_from_text",
]
