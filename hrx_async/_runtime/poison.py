"""Which bytes failed work left undefined.

A region that fails, or that refuses to run because bytes it reads are poisoned,
poisons the byte ranges it writes. Reads are checked against those ranges, so a
failure in one part of a buffer does not refuse work on another part. Poison on
a buffer is cleared only by a region that writes the whole buffer and is about to
run (its checks passed); if it then fails, its own failure poisons the buffer
again. A region that is skipped changes nothing.

Outcomes are applied in dependency order: a region's checks first apply the
failures of the device-side dependencies it waited for, so work that follows a
failure on the same backend sees it even before the event loop has heard of it.
That is also why the book is locked: the sim backend's checks run on its worker
threads. `buffer.poison` (the first failure, or None) stays the public summary;
setting it to None clears the buffer's ranges too.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from .._core.intervals import Interval
from .._core.memory import Buffer
from ..errors import HrxError


class PoisonBook:
    """Poisoned byte ranges per buffer."""

    __slots__ = ("_expected", "_lock", "_ranges")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ranges: dict[int, list[tuple[int, int]]] = {}
        self._expected: dict[int, int] = {}
        """Per buffer, admitted regions that will overwrite it whole if they run."""

    def expect(self, buffers: Iterable[Buffer]) -> None:
        """Regions writing `buffers` whole were admitted: until they run or end, a graph
        reading those buffers is not refused at submit (they may clear it first)."""
        with self._lock:
            expected = self._expected
            for buffer in buffers:
                expected[buffer.ident] = expected.get(buffer.ident, 0) + 1

    def settle(self, buffers: Iterable[Buffer], ran: bool) -> None:
        """Regions announced by `expect` run (`ran`: their poison is cleared) or end."""
        with self._lock:
            expected = self._expected
            for buffer in buffers:
                left = expected[buffer.ident] - 1
                if left:
                    expected[buffer.ident] = left
                else:
                    del expected[buffer.ident]
                if ran and buffer.poison is not None:
                    self._clear_locked(buffer)

    def expected(self, buffer: Buffer) -> bool:
        """Some admitted region not yet run will overwrite `buffer` whole."""
        return buffer.ident in self._expected

    def add(self, intervals: Iterable[Interval], cause: HrxError) -> None:
        """Poison `intervals`; a buffer already poisoned keeps its first failure as cause."""
        with self._lock:
            ranges = self._ranges
            for interval in intervals:
                buffer = interval.buffer
                span = (interval.start, interval.end)
                if buffer.poison is None:
                    ranges[buffer.ident] = [span]  # first: `empty` reads only this
                    buffer.poison = cause
                else:
                    ranges.setdefault(buffer.ident, []).append(span)

    def clear(self, buffer: Buffer) -> None:
        """`buffer` is being overwritten whole: none of its bytes are poisoned any more."""
        if buffer.poison is None:
            return
        with self._lock:
            self._clear_locked(buffer)

    def _clear_locked(self, buffer: Buffer) -> None:
        buffer.poison = None
        self._ranges.pop(buffer.ident, None)

    def empty(self) -> bool:
        """No byte of any buffer is poisoned (the usual state): a check can stop here. Safe
        from any thread: a buffer's ranges are recorded before its poison is set."""
        return not self._ranges

    def find(self, intervals: Iterable[Interval]) -> tuple[str, HrxError] | None:
        """The first poisoned buffer `intervals` read from, with its cause; None if clean."""
        for interval in intervals:
            buffer = interval.buffer
            if buffer.poison is not None:
                with self._lock:
                    found = self._poisoned_locked(buffer, interval.start, interval.end)
                if found is not None:
                    return buffer.label, found
        return None

    def _poisoned_locked(self, buffer: Buffer, start: int, end: int) -> HrxError | None:
        cause = buffer.poison
        if cause is None:
            return None
        spans = self._ranges.get(buffer.ident)
        if spans is None:
            return cause  # poisoned as a whole (no ranges recorded)
        for s, e in spans:
            if s < end and start < e:
                return cause
        return None

    def overlaps(self, buffer: Buffer, start: int, end: int) -> HrxError | None:
        """The cause when bytes [start, end) of `buffer` are poisoned, else None."""
        found = self.find((Interval(buffer, start, end),))
        return None if found is None else found[1]
