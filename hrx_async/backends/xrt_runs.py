"""XRT runs on an NPU lane: prepared programs, their fences, and the queue that polls them.

A prepared NPU region is an `XrtProgram`: one `xrt.run` with every argument
set, the byte ranges to flush towards the NPU before it starts and to
invalidate after it ends. A replay is the flushes and `run.start()`; nothing is
allocated.

Cache maintenance follows who wrote the bytes last. A flush is left out when the
access tracker names, as the last writers of the range when the run is admitted,
only earlier runs on the same NPU, and those runs then ran (`XrtProgram.skipping`):
the bytes are in NPU memory already. Anything else (the host, a mapping, a GPU
copy or kernel, no writer the tracker still knows) keeps the flush; the tracker
forgets work once it finishes, so a run admitted after its producer finished
flushes too, which is safe because invalidation stays eager: right after each run.
It is not made lazy (at the next reader off the NPU) because one reader cannot be
hooked: a DLPack export of NPU memory is a host array that reads it whenever its
holder does, with no call to the runtime.

Completion is found by reading `run.state()` (a cheap read of the command's
state word; never `run.wait()`, which holds the interpreter lock for the whole
wait). States are compared as integers: RUNNING (3) is not in pyxrt's enum.
While the event loop watches a queue, its sweep polls; otherwise the queue's
own poller thread does, sleeping between polls. Either way one run per queue
is in flight, the next starts as soon as the previous one ended.

A watchdog fails a run that is still going after `watchdog_s`. XRT cannot stop
such a command (pyxrt binds no abort, and a timed-out wait leaves it running),
so its program and every buffer it binds are quarantined: nothing that binds
them starts, and nothing frees them, until the run reaches a final state.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import BackendError, Cancelled
from .watched import WatchedQueue
from .worker import ThreadFence

NEW, QUEUED, RUNNING, COMPLETED, ERROR, ABORT, SUBMITTED = 1, 2, 3, 4, 5, 6, 7
TIMEOUT, NORESPONSE, SKERROR, SKCRASHED = 8, 9, 10, 11
STATE_NAMES = {
    NEW: "NEW",
    QUEUED: "QUEUED",
    RUNNING: "RUNNING",
    COMPLETED: "COMPLETED",
    ERROR: "ERROR",
    ABORT: "ABORT",
    SUBMITTED: "SUBMITTED",
    TIMEOUT: "TIMEOUT",
    NORESPONSE: "NORESPONSE",
    SKERROR: "SKERROR",
    SKCRASHED: "SKCRASHED",
}
IN_FLIGHT = frozenset((NEW, QUEUED, RUNNING, SUBMITTED))
STICKY = frozenset((NORESPONSE, SKCRASHED))
"""States after which the device runs nothing more: the runtime is lost."""

TO_DEVICE = 0
FROM_DEVICE = 1
"""xclBOSyncDirection values (XCL_BO_SYNC_BO_TO_DEVICE / _FROM_DEVICE)."""


class XrtRunError(BackendError):
    """A run ended in a state other than COMPLETED (or the watchdog gave up on it)."""

    def __init__(self, kernel: str, state: int, message: str = "") -> None:
        name = STATE_NAMES.get(state, "UNKNOWN")
        self.state = state
        self.sticky = state in STICKY
        text = message or f"kernel {kernel!r} ended in state {name} ({state})"
        super().__init__("xrt", f"run {kernel}", f"ERT_CMD_STATE_{name}", text)


def state_of(run: Any) -> int:
    return int(run.state())


Range = tuple[Any, int, int]
"""(bo, nbytes, offset): a byte range of a root buffer object to sync."""
Staging = tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], Any]
"""(host bytes, staging bo bytes, staging bo): an argument copied through its own bo."""


class SyncCounter:
    """Bytes flushed or invalidated by `bo.sync`, for the runtime's statistics."""

    __slots__ = ("nbytes",)

    def __init__(self) -> None:
        self.nbytes = 0


class XrtProgram:
    """One NPU launch prepared for replay."""

    __slots__ = (
        "coherent_reads",
        "counter",
        "flushes",
        "invalidates",
        "kernel",
        "native_graph",
        "quarantine",
        "roots",
        "run",
        "stage_in",
        "stage_out",
        "subsets",
    )

    def __init__(
        self,
        kernel: str,
        run: Any,
        flushes: Sequence[Range],
        invalidates: Sequence[Range],
        stage_in: Sequence[Staging],
        stage_out: Sequence[Staging],
        roots: Sequence[Any],
        quarantine: Quarantine,
        counter: SyncCounter,
        coherent_reads: Sequence[tuple[int, int, int]] = (),
    ) -> None:
        self.counter = counter
        self.kernel = kernel
        self.run = run
        self.flushes = tuple(flushes)
        self.invalidates = tuple(invalidates)
        self.stage_in = tuple(stage_in)
        self.stage_out = tuple(stage_out)
        self.roots = tuple(roots)
        self.quarantine = quarantine
        self.native_graph = False
        self.coherent_reads = tuple(coherent_reads)
        """(buffer ident, start, end) of each flush, in order: the tracker's keys for the
        bytes, which the runtime looks up at admission to pick what `skipping` leaves out."""
        self.subsets: dict[int, tuple[Range, ...]] = {}
        """The flushes left after `skipping(mask)`, per mask."""

    def launch(self, flushes: Sequence[Range] | None = None) -> None:
        """Flush what the NPU reads (only `flushes` of it when given), then start the
        prepared run. Raises on refusal."""
        if self.quarantine.programs:
            self.quarantine.check(self)
        if flushes is None:
            flushes = self.flushes
        synced = 0
        for host, staged, bo in self.stage_in:
            np.copyto(staged, host)
            bo.sync(TO_DEVICE)
            synced += staged.nbytes
        for bo, nbytes, offset in flushes:
            bo.sync(TO_DEVICE, nbytes, offset)
            synced += nbytes
        self.counter.nbytes += synced
        self.run.start()

    def skipping(self, mask: int, writers: Sequence[Any]) -> XrtProgram | SkippingLaunch:
        """This program, or one launch of it without the flushes whose bit is set in `mask`
        (bit i: `coherent_reads[i]`), whose bytes `writers`, earlier runs on this NPU, wrote
        last. Each writer must have run for that to hold; if one did not, the launch
        flushes everything after all (see `SkippingLaunch`)."""
        if not mask:
            return self
        flushes = self.subsets.get(mask)
        if flushes is None:
            flushes = self.subsets[mask] = tuple(
                item for i, item in enumerate(self.flushes) if not mask >> i & 1
            )
        return SkippingLaunch(self, flushes, tuple(writers))

    def complete(self, state: int) -> BaseException | None:
        """The run ended in `state`: invalidate what it wrote (on success) and judge it."""
        if state != COMPLETED:
            return XrtRunError(self.kernel, state)
        try:
            for bo, nbytes, offset in self.invalidates:
                bo.sync(FROM_DEVICE, nbytes, offset)
                self.counter.nbytes += nbytes
            for host, staged, bo in self.stage_out:
                bo.sync(FROM_DEVICE)
                np.copyto(host, staged)
                self.counter.nbytes += staged.nbytes
        except Exception as exc:
            return BackendError("xrt", "bo.sync", "sync failed", str(exc))
        return None


class SkippingLaunch:
    """One launch of an `XrtProgram` that leaves out some of its flushes (see `skipping`).

    The bytes it does not flush were last written by `writers`, earlier runs on this NPU
    that the runtime orders before it. When it starts they have finished; if one of them
    did not run (skipped or refused) or failed, its bytes hold what was there before it,
    perhaps written on the host, so this launch flushes everything after all.
    """

    __slots__ = ("flushes", "kernel", "native_graph", "program", "roots", "run", "writers")

    def __init__(self, program: XrtProgram, flushes: tuple[Range, ...], writers: tuple[Any, ...]):
        self.program = program
        self.flushes = flushes
        self.writers = writers
        self.run = program.run
        self.kernel = program.kernel
        self.roots = program.roots
        self.native_graph = False

    def launch(self) -> None:
        writers, self.writers = self.writers, ()  # no longer needed: let them go
        flushes = self.flushes
        for writer in writers:
            if not writer.wrote():
                flushes = self.program.flushes
                break
        self.program.launch(flushes)

    def complete(self, state: int) -> BaseException | None:
        return self.program.complete(state)


Launch = XrtProgram | SkippingLaunch
"""What an NPU queue launches: a prepared program, or one launch of it."""


class Quarantine:
    """Programs whose run outlived the watchdog, and the buffers they bind, until they end."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.programs: list[Launch] = []
        self.roots: dict[int, tuple[Any, int]] = {}
        """id(root record) -> (record, how many quarantined programs bind it)."""

    def add(self, program: Launch) -> None:
        with self.lock:
            self.programs.append(program)
            for root in program.roots:
                _, count = self.roots.get(id(root), (root, 0))
                self.roots[id(root)] = (root, count + 1)

    def __len__(self) -> int:
        return len(self.programs)

    def holds(self, record: Any) -> bool:
        return id(record) in self.roots

    def check(self, program: XrtProgram) -> None:
        """Raise when `program` is, or binds a buffer of, a run still going after its watchdog."""
        if not self.programs:
            return
        self.release_finished()
        run = program.run  # held by the program and by every launch of it
        if any(held.run is run for held in self.programs):
            raise BackendError(
                "xrt",
                f"run {program.kernel}",
                "quarantined",
                "its previous run is still going after the watchdog; it cannot start again",
            )
        for root in program.roots:
            if id(root) in self.roots:
                raise BackendError(
                    "xrt",
                    f"run {program.kernel}",
                    "quarantined",
                    f"{root} is bound by a run still going after the watchdog",
                )

    def release_finished(self) -> int:
        """Let go of programs whose run has ended; returns how many remain."""
        with self.lock:
            keep: list[Launch] = []
            for program in self.programs:
                try:
                    done = state_of(program.run) not in IN_FLIGHT
                except Exception:
                    done = False
                if not done:
                    keep.append(program)
                    continue
                for root in program.roots:
                    record, count = self.roots[id(root)]
                    if count <= 1:
                        del self.roots[id(root)]
                    else:
                        self.roots[id(root)] = (record, count - 1)
            self.programs = keep
            return len(keep)


class _Item:
    __slots__ = ("fence", "preflight", "program", "started", "waits")

    def __init__(
        self,
        program: Launch,
        waits: tuple[Any, ...],
        preflight: Callable[[], BaseException | None] | None,
        fence: ThreadFence,
    ) -> None:
        self.program = program
        self.waits = waits
        self.preflight = preflight
        self.fence = fence
        self.started = 0.0


Finished = list[tuple[ThreadFence, BaseException | None, bool]]


class XrtQueue(WatchedQueue):
    """The NPU lane of one device: FIFO, one run in flight, polled by the loop or a thread."""

    def __init__(self, name: str, watchdog_s: float, quarantine: Quarantine) -> None:
        super().__init__()
        self.name = name
        self.watchdog_s = watchdog_s
        self.quarantine = quarantine
        self.lock = threading.Lock()
        self.backlog: collections.deque[_Item] = collections.deque()
        self.active: _Item | None = None
        self.watched = False
        self._closing = False
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the loop's side -----------------------------------------------------------------

    def submit(
        self,
        program: Launch,
        waits: Sequence[Any],
        preflight: Callable[[], BaseException | None] | None,
    ) -> ThreadFence:
        fence = ThreadFence()
        item = _Item(program, tuple(waits), preflight, fence)
        with self.lock:
            self.backlog.append(item)
            finished = self._start_next() if self.active is None else []
        _finish_all(finished)
        if not self.watched:
            self._ensure_poller()
        return fence

    def watch(self) -> None:
        self.watched = True

    def unwatch(self) -> None:
        self.watched = False
        if self.active is not None or self.backlog:
            self._ensure_poller()

    def sweep(self, limit: int) -> tuple[int, bool]:
        with self.lock:
            finished = self._advance(limit)
            remaining = self.active is not None or bool(self.backlog)
        _finish_all(finished)
        return len(finished), remaining

    def pending(self) -> int:
        return len(self.backlog) + (self.active is not None)

    def close(self) -> None:
        self._closing = True
        self._wake.set()
        thread = self._thread
        if thread is not None and threading.current_thread() is not thread:
            thread.join(timeout=10)

    # -- shared, under the lock ----------------------------------------------------------

    def _advance(self, limit: int) -> Finished:
        """Finish the active run if it ended, start the next; at most `limit` fences."""
        finished: Finished = []
        while len(finished) < limit:
            item = self.active
            if item is None:
                if not self.backlog:
                    break
                more = self._start_next()
                finished.extend(more)
                if self.active is None or not more:
                    break
                continue
            try:
                state = state_of(item.program.run)
            except Exception as exc:
                error: BaseException | None = BackendError("xrt", "run.state", "failed", str(exc))
            else:
                if state in IN_FLIGHT:
                    if time.perf_counter() - item.started < self.watchdog_s:
                        break
                    self.quarantine.add(item.program)
                    error = XrtRunError(
                        item.program.kernel,
                        TIMEOUT,
                        f"kernel {item.program.kernel!r} still in state "
                        f"{STATE_NAMES.get(state, state)} after the {self.watchdog_s:g} s "
                        "watchdog; its buffers stay quarantined until it ends",
                    )
                else:
                    error = item.program.complete(state)
            item.fence.started_at = item.started
            self.active = None
            finished.append((item.fence, error, False))
            if self.backlog:
                finished.extend(self._start_next())
        return finished

    def _start_next(self) -> Finished:
        """Start backlog items until one runs or one must wait (refusals finish at once)."""
        finished: Finished = []
        backlog = self.backlog
        while backlog and self.active is None:
            item = backlog[0]
            for dependency in item.waits:
                if not dependency.query():
                    return finished
            backlog.popleft()
            refusal = item.preflight() if item.preflight is not None else None
            if refusal is not None:
                finished.append((item.fence, refusal, isinstance(refusal, Cancelled)))
                continue
            item.started = time.perf_counter()
            try:
                item.program.launch()
            except BaseException as exc:
                finished.append((item.fence, exc, False))
                continue
            self.active = item
        return finished

    # -- the poller thread ---------------------------------------------------------------

    def _ensure_poller(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._poll, name=self.name, daemon=True)
            self._thread.start()
        self._wake.set()

    def _poll(self) -> None:
        pause = 20e-6
        while not self._closing:
            if self.watched or (self.active is None and not self.backlog):
                self._wake.wait()
                self._wake.clear()
                pause = 20e-6
                continue
            with self.lock:
                finished = self._advance(64)
            _finish_all(finished)
            if not finished:
                time.sleep(pause)  # polls get sparser while a long run goes on
                pause = min(pause * 2, 1e-3)
            else:
                pause = 20e-6


def _finish_all(finished: Finished) -> None:
    for fence, error, skipped in finished:
        if skipped:
            fence.finish(skipped=True)
        else:
            fence.finish(error)


__all__ = [
    "COMPLETED",
    "IN_FLIGHT",
    "RUNNING",
    "STATE_NAMES",
    "STICKY",
    "Quarantine",
    "SkippingLaunch",
    "SyncCounter",
    "XrtProgram",
    "XrtQueue",
    "XrtRunError",
    "state_of",
]
