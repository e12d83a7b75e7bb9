"""Draw an `ExecutionTrace` as a per-lane timeline image.

matplotlib is optional (the `plot` extra), so it is imported only when a plot is asked for.
The figure is drawn on the non-interactive "Agg" canvas directly rather than through pyplot,
so it works without a display, leaves the caller's pyplot backend alone and leaks no figures.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from hrx_async.errors import ContractError, Unsupported

if TYPE_CHECKING:
    from hrx_async.trace import ExecutionTrace

_OK_COLOR = "tab:blue"
_FAILED_COLOR = "tab:red"


def plot_timeline(
    trace: ExecutionTrace, path: str | os.PathLike[str], title: str | None = None
) -> None:
    """Save a timeline of `trace` to `path` (format from the suffix, e.g. .png or .svg).

    One row per lane that appears, one bar per region from its start to its end, in
    milliseconds after the first event. Failed regions are hatched red.
    """
    if not trace.events:
        raise ContractError("cannot plot an empty trace: it has no events (0 recorded)")
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError as exc:
        raise Unsupported(
            'plotting needs matplotlib, which is not installed: pip install "hrx-async[plot]"'
        ) from exc

    lanes = trace.lanes
    row = {lane: index for index, lane in enumerate(lanes)}
    origin_us = min(event.start_us for event in trace.events)

    # One broken_barh call per lane and state keeps the artist count (and the file) small.
    bars: dict[tuple[int, bool], list[tuple[float, float]]] = {}
    for event in trace.events:
        start_ms = (event.start_us - origin_us) / 1000.0
        bars.setdefault((row[event.lane], event.failed), []).append(
            (start_ms, event.duration_us / 1000.0)
        )

    figure = Figure(figsize=(10, 1.0 + 0.6 * len(lanes)))
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
            axes.broken_barh(
                spans, (index - 0.4, 0.8), facecolors=_OK_COLOR, edgecolors="black", linewidth=0.3
            )
    axes.set_yticks(range(len(lanes)), [lane.label for lane in lanes])
    axes.set_ylim(-0.6, len(lanes) - 0.4)
    # Lane 0 (upload) on top reads like the pipeline: upload, compute, download.
    axes.invert_yaxis()
    axes.set_xlabel("time since first region (ms, host-observed)")
    axes.grid(axis="x", linestyle=":", linewidth=0.5)
    if title is not None:
        axes.set_title(title)
    handles = [Patch(facecolor=_OK_COLOR, edgecolor="black", label="region")]
    if any(failed for _, failed in bars):
        handles.append(
            Patch(facecolor="none", edgecolor=_FAILED_COLOR, hatch="///", label="failed")
        )
    axes.legend(handles=handles, loc="upper right", fontsize="small")
    figure.tight_layout()
    figure.savefig(os.fspath(path), dpi=100)


__all__ = ["plot_timeline"]
