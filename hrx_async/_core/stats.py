"""Runtime counters: a mutable `Counters` the runtime updates and a frozen `Statistics` snapshot.

The two are kept apart so a caller can hold a snapshot while the runtime keeps counting,
and so the runtime's hot path pays only for plain attribute updates (`__slots__`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from hrx_async._core.lane import Lane
from hrx_async.errors import ContractError


@dataclass(frozen=True, slots=True)
class Statistics:
    """A point-in-time copy of the runtime's counters.

    The field order is part of the format: `to_dict()` and `to_json()` list the counters
    in this order, so dumps from different runs line up.
    """

    native_graphs_prepared: int = 0
    copy_streams_created: int = 0
    allocations: int = 0
    imports: int = 0
    submissions: int = 0
    completions: int = 0
    copied_bytes: int = 0
    uploaded_bytes: int = 0
    downloaded_bytes: int = 0
    device_copied_bytes: int = 0
    cache_maintenance_bytes: int = 0
    live_bytes: int = 0
    peak_bytes: int = 0
    host_copied_bytes: int = 0

    def to_dict(self) -> dict[str, int]:
        """The 14 counters by name, in field order."""
        return {name: getattr(self, name) for name in FIELD_NAMES}

    def to_json(self) -> str:
        """The counters as a compact JSON object, keys in field order."""
        return json.dumps(self.to_dict(), separators=(",", ":"))


FIELD_NAMES: tuple[str, ...] = tuple(field.name for field in dataclasses.fields(Statistics))
"""The counter names in their canonical order."""


def _check_nbytes(nbytes: int) -> int:
    # bool is an int subclass; counting True as one byte would hide a caller's bug.
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
        raise ContractError(f"byte count must be an int >= 0, got {nbytes!r}")
    return nbytes


class Counters:
    """The runtime's live counters.

    Not thread-safe: the runtime updates them only from its event loop, so no lock is paid for.
    """

    __slots__ = FIELD_NAMES

    native_graphs_prepared: int
    copy_streams_created: int
    allocations: int
    imports: int
    submissions: int
    completions: int
    copied_bytes: int
    uploaded_bytes: int
    downloaded_bytes: int
    device_copied_bytes: int
    cache_maintenance_bytes: int
    live_bytes: int
    peak_bytes: int
    host_copied_bytes: int

    def __init__(self) -> None:
        for name in FIELD_NAMES:
            setattr(self, name, 0)

    def allocated(self, nbytes: int) -> None:
        """Count one allocation of `nbytes` and raise the peak if live bytes pass it."""
        _check_nbytes(nbytes)
        self.allocations += 1
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def released(self, nbytes: int) -> None:
        """Count the release of `nbytes` that were counted by `allocated`."""
        _check_nbytes(nbytes)
        if nbytes > self.live_bytes:
            raise ContractError(
                f"releasing {nbytes} bytes but only {self.live_bytes} are live; "
                "a release must match an earlier allocation"
            )
        self.live_bytes -= nbytes

    def copied(self, lane: Lane, nbytes: int) -> None:
        """Count a copy of `nbytes` on `lane`.

        UPLOAD copies count as uploaded, DOWNLOAD copies as downloaded, HOST lane copies
        (host memory to host memory, by a host region) as host copies, every other lane's
        copies as device copies; all of them count in `copied_bytes`.
        """
        _check_nbytes(nbytes)
        self.count_copies(((lane, nbytes),))

    def count_copies(self, copies: tuple[tuple[Lane, int], ...]) -> None:
        """`copied` for each (lane, nbytes) of a region that ran, checked when it was planned."""
        for lane, nbytes in copies:
            self.copied_bytes += nbytes
            if lane == Lane.UPLOAD:
                self.uploaded_bytes += nbytes
            elif lane == Lane.DOWNLOAD:
                self.downloaded_bytes += nbytes
            elif lane == Lane.HOST:
                self.host_copied_bytes += nbytes
            else:
                self.device_copied_bytes += nbytes

    def snapshot(self) -> Statistics:
        """A frozen copy of the counters as they are now."""
        return Statistics(**{name: getattr(self, name) for name in FIELD_NAMES})

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)}" for name in FIELD_NAMES)
        return f"Counters({inner})"


__all__ = ["FIELD_NAMES", "Counters", "Statistics"]
