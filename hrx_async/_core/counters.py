"""The runtime's live counters, which its hot path bumps on every replay.

Compiled (see `_build.COMPILED`), so a submission counting itself, or a region its copied
bytes, is a native field update, not an attribute lookup or a Python call. `Statistics`
(`stats.py`) is the frozen snapshot users get.
"""

from __future__ import annotations

from typing import Final

from hrx_async._core.lane import Lane
from hrx_async._core.stats import FIELD_NAMES, Statistics
from hrx_async.errors import ContractError

_UPLOAD: Final = Lane.UPLOAD
_DOWNLOAD: Final = Lane.DOWNLOAD
_HOST: Final = Lane.HOST


def _check_nbytes(nbytes: object) -> int:
    # bool is an int subclass; counting True as one byte would hide a caller's bug.
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
        raise ContractError(f"byte count must be an int >= 0, got {nbytes!r}")
    return nbytes


class AdmissionMarks:
    """What every replay's admission compares first, kept by the session and its host
    mappings: native fields, where an attribute of those interpreted objects is a lookup
    in their dictionaries, twice per replay."""

    __slots__ = ("frees", "mappings")

    def __init__(self) -> None:
        self.frees = 0
        """Buffers freed so far: until it changes, a replay that found its buffers alive
        need not look at each again."""
        self.mappings = 0
        """Host mappings live now (`HostMappings.count`): while any is, a replay is
        checked against them."""


class Counters:
    """The runtime's live counters, one field per `Statistics` counter.

    Not thread-safe: the runtime updates them only from its event loop, so no lock is paid for.
    """

    __slots__ = (
        "allocations",
        "cache_maintenance_bytes",
        "completions",
        "copied_bytes",
        "copy_streams_created",
        "device_copied_bytes",
        "downloaded_bytes",
        "host_copied_bytes",
        "imports",
        "live_bytes",
        "native_graphs_prepared",
        "peak_bytes",
        "submissions",
        "uploaded_bytes",
    )

    def __init__(self) -> None:
        self.native_graphs_prepared = 0
        self.copy_streams_created = 0
        self.allocations = 0
        self.imports = 0
        self.submissions = 0
        self.completions = 0
        self.copied_bytes = 0
        self.uploaded_bytes = 0
        self.downloaded_bytes = 0
        self.device_copied_bytes = 0
        self.cache_maintenance_bytes = 0
        self.live_bytes = 0
        self.peak_bytes = 0
        self.host_copied_bytes = 0

    def allocated(self, nbytes: object) -> None:
        """Count one allocation of `nbytes` and raise the peak if live bytes pass it."""
        size = _check_nbytes(nbytes)
        self.allocations += 1
        self.live_bytes += size
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes

    def released(self, nbytes: object) -> None:
        """Count the release of `nbytes` that were counted by `allocated`."""
        size = _check_nbytes(nbytes)
        if size > self.live_bytes:
            raise ContractError(
                f"releasing {size} bytes but only {self.live_bytes} are live; "
                "a release must match an earlier allocation"
            )
        self.live_bytes -= size

    def copied(self, lane: Lane, nbytes: object) -> None:
        """Count a copy of `nbytes` on `lane`.

        UPLOAD copies count as uploaded, DOWNLOAD copies as downloaded, HOST lane copies
        (host memory to host memory, by a host region) as host copies, every other lane's
        copies as device copies; all of them count in `copied_bytes`.
        """
        self.count_copies(((lane, _check_nbytes(nbytes)),))

    def count_copies(self, copies: tuple[tuple[Lane, int], ...]) -> None:
        """`copied` for each (lane, nbytes) of a region that ran, checked when it was planned."""
        for lane, nbytes in copies:
            self.copied_bytes += nbytes
            if lane == _UPLOAD:
                self.uploaded_bytes += nbytes
            elif lane == _DOWNLOAD:
                self.downloaded_bytes += nbytes
            elif lane == _HOST:
                self.host_copied_bytes += nbytes
            else:
                self.device_copied_bytes += nbytes

    def snapshot(self) -> Statistics:
        """A frozen copy of the counters as they are now."""
        return Statistics(
            native_graphs_prepared=self.native_graphs_prepared,
            copy_streams_created=self.copy_streams_created,
            allocations=self.allocations,
            imports=self.imports,
            submissions=self.submissions,
            completions=self.completions,
            copied_bytes=self.copied_bytes,
            uploaded_bytes=self.uploaded_bytes,
            downloaded_bytes=self.downloaded_bytes,
            device_copied_bytes=self.device_copied_bytes,
            cache_maintenance_bytes=self.cache_maintenance_bytes,
            live_bytes=self.live_bytes,
            peak_bytes=self.peak_bytes,
            host_copied_bytes=self.host_copied_bytes,
        )

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)}" for name in FIELD_NAMES)
        return f"Counters({inner})"


__all__ = ["Counters"]
