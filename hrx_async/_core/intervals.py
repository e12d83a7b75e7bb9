"""Byte-interval arithmetic, in one place: ranges of one buffer, merging, subtracting, and
the summaries a prepared graph keeps of what each region reads first and writes whole.

Pure: intervals are plain ``(start, end)`` pairs (half-open) or `Interval`s of a buffer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..errors import ContractError
from .contract import Access
from .memory import Buffer, View


@dataclass(frozen=True, slots=True)
class Interval:
    """Bytes [start, end) of one buffer."""

    buffer: Buffer
    start: int
    end: int


class Accessing(Protocol):
    """What the summaries read of a recorded node: the bytes it touches, in order."""

    @property
    def accesses(self) -> tuple[tuple[View, Access], ...]: ...


class Planned(Protocol):
    """What `written_whole` reads of a graph plan: its nodes."""

    @property
    def nodes(self) -> tuple[Accessing, ...]: ...


class Region(Protocol):
    """What `written_whole` reads of a region: the indices of its nodes."""

    @property
    def nodes(self) -> tuple[int, ...]: ...


def check_range(start: int, end: int) -> None:
    if start < 0 or end <= start:
        raise ContractError(f"byte range [{start}, {end}) is invalid: need 0 <= start < end")


def tracked_range(view: View) -> tuple[int, int]:
    """The byte range ordering uses: shared memory is ordered as a whole allocation."""
    if view.buffer.placement.tracked_whole:
        return (0, view.buffer.nbytes)
    return (view.offset, view.end)


def merge_intervals(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sort half-open intervals and merge those that overlap or touch.

    ``[(4, 8), (0, 4), (10, 12)]`` gives ``[(0, 8), (10, 12)]``. Empty intervals
    (``start == end``) cover nothing and are dropped; an interval with ``end < start``
    raises `ContractError`.
    """
    ordered: list[tuple[int, int]] = []
    for s, e in intervals:
        if e < s:
            raise ContractError(f"interval [{s}, {e}) is invalid: need start <= end")
        if e > s:
            ordered.append((s, e))
    ordered.sort()
    merged: list[tuple[int, int]] = []
    for s, e in ordered:
        if merged and s <= merged[-1][1]:
            if e > merged[-1][1]:
                merged[-1] = (merged[-1][0], e)
        else:
            merged.append((s, e))
    return merged


def subtract(span: tuple[int, int], holes: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of `span` outside the sorted, disjoint `holes`."""
    start, end = span
    parts: list[tuple[int, int]] = []
    for s, e in holes:
        if e <= start or s >= end:
            continue
        if s > start:
            parts.append((start, s))
        start = max(start, e)
    if start < end:
        parts.append((start, end))
    return parts


def read_before_written(nodes: Iterable[Accessing]) -> tuple[Interval, ...]:
    """Per buffer, the merged bytes some node reads before an earlier node wrote them."""
    written: dict[int, list[tuple[int, int]]] = {}
    read: dict[int, list[tuple[int, int]]] = {}
    buffers: dict[int, Buffer] = {}
    for node in nodes:
        for view, access in node.accesses:
            if access.reads:
                key = view.buffer.ident
                buffers[key] = view.buffer
                read.setdefault(key, []).extend(
                    subtract((view.offset, view.end), written.get(key, ()))
                )
        for view, access in node.accesses:
            if access.writes:
                key = view.buffer.ident
                written[key] = merge_intervals([*written.get(key, ()), (view.offset, view.end)])
    return tuple(
        Interval(buffers[key], s, e)
        for key, spans in read.items()
        for s, e in merge_intervals(spans)
    )


def written_whole(plan: Planned, region: Region) -> tuple[Buffer, ...]:
    """The buffers the region's nodes write whole (running it clears their poison)."""
    nodes: Sequence[Accessing] = plan.nodes
    found: dict[int, Buffer] = {}
    for index in region.nodes:
        for view, access in nodes[index].accesses:
            buffer = view.buffer
            if access is Access.WRITE and view.offset == 0 and view.nbytes == buffer.nbytes:
                found.setdefault(buffer.ident, buffer)
    return tuple(found.values())


__all__ = [
    "Accessing",
    "Interval",
    "check_range",
    "merge_intervals",
    "read_before_written",
    "subtract",
    "tracked_range",
    "written_whole",
]
