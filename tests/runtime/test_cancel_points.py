"""Cancellation injected at every schedule point of a scenario, as trio's own tests do it.

A scenario (sim backend) records graphs whose GPU kernels and host functions log when they
start and end, submits them and awaits their completions. It runs once per injection point
n = 0, 1, 2, ... until a run ends without reaching point n. Three clocks count the points:

- ``task``: the schedule points of the task that awaits the completions (each time it
  suspends), counted by wrapping its coroutine. The cancellation is requested just as the
  task suspends there, so it lands at exactly that point on trio, and at that point or the
  next one on asyncio.
- ``event``: the start and the end of every logged region, in the order they happen. The
  region waits right there until the injection has been delivered (and the loop has run a
  while after it, or the runtime's exit has begun), so the cancellation meets a region that
  is known to be running and successors that are known not to have started, and whatever the
  runtime wrongly starts in reaction overlaps it.
- ``loop``: loop passes, counted by a sibling task that does ``checkpoint()`` n times. They
  fall between the scheduler's own steps (lane tasks, fence notifications, admission).
  Their position against the worker threads varies from run to run; the ``slow`` test
  (``-m slow``, minutes) sweeps again and again.

The injection is one of: a cancel scope around the awaiting task is cancelled (``scope``);
``completion.cancel()`` on one submission (``cancel``); a cancellation (``exit-cancel``) or an
exception (``exit-raise``) leaves ``async with Runtime()``.

After every run: no region ran twice; conflicting regions ran in admission order without
overlapping, and ``after=`` / ``max_submissions`` ordering held; every completion settled, after
its started regions ended, with success exactly when all its regions ran (``Cancelled``
otherwise); the bytes equal a sequential replay, in admission order, of the regions that ran.
Per injection: ``scope`` skips nothing; ``cancel`` and the exits skip every region that had not
started when the injection came and could not start yet (something it waits for had not
finished); the runtime then still runs fresh work (``scope``, ``cancel``) or refuses it as closed
(the exits).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Coroutine, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest

import hrx_async as hrx
from tests.helpers import load_mix, read_bytes

pytestmark = pytest.mark.anyio

HOLD_S = 10.0
"""The longest a region waits at its point for the injection (a hang guard: never reached when
the runtime works, and reaching it fails the test)."""
RUN_LIMIT_S = 30.0
"""Generous bound on one run, exit of `async with Runtime()` included."""
SETTLE_PASSES = 50
"""Loop passes a region held at its point keeps running after the injection (``event`` clock)."""
HANDOVER_S = 10e-6
"""How long the ``event`` clock waits on the event between its checkpoints (see `ticker`)."""
MAX_POINTS = 5000
REPEATS = 10
"""Sweeps of each scenario and injection in the slow test."""
"""No scenario has this many points: a sweep that gets here does not end."""

# -- scenarios ------------------------------------------------------------------------------

Range = tuple[str, int, int]
"""A buffer's name and a byte range [start, end) of it."""


@dataclass(frozen=True)
class Region:
    """One region: a GPU kernel, a plain or an `async def` host function, or a copy."""

    kind: str
    """"kernel", "host", "ahost", "upload" or "download"."""
    target: Range
    source: Range | None = None
    rmw: bool = True
    """The target is read as well as written (copies and write-only kernels: False)."""

    @property
    def logged(self) -> bool:
        return self.kind in ("kernel", "host", "ahost")

    @property
    def writes(self) -> tuple[Range, ...]:
        return (self.target,)

    @property
    def reads(self) -> tuple[Range, ...]:
        reads = (self.source,) if self.source is not None else ()
        return reads + ((self.target,) if self.rmw else ())


@dataclass(frozen=True)
class Sub:
    """One submission: a graph of its own (so its functions know whose they are)."""

    regions: tuple[Region, ...]
    after: tuple[int, ...] = ()


@dataclass(frozen=True)
class Scenario:
    name: str
    buffers: tuple[tuple[str, bool, int], ...]
    """(name, GPU-local?, bytes) of each buffer; the others are HOST_VISIBLE."""
    subs: tuple[Sub, ...]
    cancel_target: int
    """The submission that `completion.cancel()` cancels."""
    max_submissions: int = 64


def _k(sub: int, index: int) -> int:
    return (11 * sub + 3 * index + 1) & 0xFF


def transform(region: Region, k: int, dst: np.ndarray, src: np.ndarray | None) -> np.ndarray:
    """What `region` writes, from what it reads (the same function on device and in the model)."""
    if region.kind in ("upload", "download"):
        assert src is not None
        return src.copy()
    out = np.full(dst.shape, k, np.int64)
    if region.rmw:
        out += 5 * dst.astype(np.int64)
    if src is not None:
        out += 3 * src.astype(np.int64)
    return (out & 0xFF).astype(np.uint8)


def _overlap(a: Range, b: Range) -> bool:
    return a[0] == b[0] and a[1] < b[2] and b[1] < a[2]


def conflict(p: Region, q: Region) -> bool:
    return any(_overlap(w, x) for w in p.writes for x in q.reads + q.writes) or any(
        _overlap(w, x) for w in q.writes for x in p.reads
    )


def K(target: Range, source: Range | None = None, rmw: bool = True) -> Region:
    return Region("kernel", target, source, rmw)


def H(target: Range, source: Range | None = None) -> Region:
    return Region("host", target, source)


def A(target: Range, source: Range | None = None) -> Region:
    return Region("ahost", target, source)


SCENARIOS = [
    # Upload copy -> GPU kernel -> download copy.
    Scenario(
        "pipeline",
        (("host_in", False, 64), ("x", True, 64), ("y", True, 64), ("host_out", False, 64)),
        (
            Sub(
                (
                    Region("upload", ("x", 0, 64), ("host_in", 0, 64), rmw=False),
                    K(("y", 0, 64), ("x", 0, 64), rmw=False),
                    Region("download", ("host_out", 0, 64), ("y", 0, 64), rmw=False),
                )
            ),
        ),
        cancel_target=0,
    ),
    # Plain and async host functions in a chain, two conflicting submissions.
    Scenario(
        "host-functions",
        (("h", False, 64),),
        tuple(
            Sub(
                (
                    H(("h", 0, 16)),
                    A(("h", 16, 32), ("h", 0, 16)),
                    H(("h", 0, 16), ("h", 16, 32)),
                    A(("h", 32, 48), ("h", 0, 16)),
                )
            )
            for _ in range(2)
        ),
        cancel_target=0,
    ),
    # Three conflicting graphs submitted back to back, then awaited.
    Scenario(
        "pipelined",
        (("b", False, 96),),
        (
            Sub((K(("b", 0, 48)), H(("b", 48, 96), ("b", 0, 48)))),
            Sub((H(("b", 24, 72)), K(("b", 72, 96), ("b", 0, 24)))),
            Sub((K(("b", 0, 32), ("b", 64, 96)), A(("b", 32, 64)))),
        ),
        cancel_target=1,
    ),
    # max_submissions=1: the second and third wait for admission (the second touches bytes of
    # its own, so only the limit orders it).
    Scenario(
        "queued",
        (("q", False, 64), ("r", False, 64)),
        (
            Sub((H(("q", 0, 32)), K(("r", 0, 32), ("q", 0, 32)))),
            Sub((K(("q", 32, 64)),)),
            Sub((H(("r", 32, 64), ("q", 32, 64)),)),
        ),
        cancel_target=1,
        max_submissions=1,
    ),
    # max_submissions=2: the third waits for admission and is cancelled there; unrelated work
    # then frees a slot for the fourth, which must still wait for the first.
    Scenario(
        "queued-2",
        (("x", False, 32), ("y", False, 32), ("w", False, 32)),
        (
            Sub((H(("x", 0, 32)),)),
            Sub((K(("y", 0, 32)),)),
            Sub((K(("x", 0, 32)),)),
            Sub((K(("w", 0, 32), ("x", 0, 32)),)),
        ),
        cancel_target=2,
        max_submissions=2,
    ),
    # after= links on disjoint bytes, and an unlinked submission that conflicts with the first.
    Scenario(
        "after",
        (("a", False, 32), ("b", False, 32), ("c", False, 32)),
        (
            Sub((K(("a", 0, 32)), A(("b", 0, 16), ("a", 0, 16)))),
            Sub((H(("c", 0, 32)),), after=(0,)),
            Sub((K(("b", 16, 32), ("c", 0, 16)),), after=(1,)),
            Sub((H(("a", 0, 32)),)),
        ),
        cancel_target=0,
    ),
]


def initial_bytes(index: int, nbytes: int) -> np.ndarray:
    return ((np.arange(nbytes) * 7 + 29 * index + 5) & 0xFF).astype(np.uint8)


# -- injection ------------------------------------------------------------------------------


class Injection:
    """Where and how one run is interrupted."""

    def __init__(self, clock: str, n: int, release_on_fire: bool) -> None:
        self.clock = clock
        self.n = n
        self.release_on_fire = release_on_fire
        self.action: Callable[[], None] = lambda: None
        self.observe: Callable[[], Snapshot] | None = None
        self.fired = False
        self.at_fire: Snapshot | None = None
        self.count = 0
        self.hit = threading.Event()
        """The event clock's point was reached (by a region, which now waits for `release`)."""
        self.release = threading.Event()
        self.hold_expired = False

    def fire(self) -> None:
        if self.fired:
            return
        self.fired = True
        self.action()
        # Observed after the injection took effect: what had not finished by now was still
        # running when the runtime learnt of it (worker threads go on meanwhile).
        if self.observe is not None:
            self.at_fire = self.observe()

    def on_yield(self) -> None:
        """The task clock: the awaiting task is suspending."""
        if self.clock == "task":
            if self.count == self.n:
                self.fire()
            self.count += 1

    async def ticker(self) -> None:
        """The sibling task of the loop and event clocks."""
        if self.clock == "loop":
            for _ in range(self.n):
                await anyio.lowlevel.checkpoint()
        elif self.clock == "event":
            while not self.hit.is_set():
                await anyio.lowlevel.checkpoint()
                # Waiting on the event releases the interpreter lock to the worker thread
                # that is to reach the point: with bare checkpoints only, a compiled build
                # spent minutes here once earlier tests had run in the same process.
                self.hit.wait(HANDOVER_S)
        else:
            return
        self.fire()
        if self.release_on_fire:
            # The held region goes on running while the runtime reacts to the injection:
            # whatever it wrongly starts now overlaps it.
            for _ in range(SETTLE_PASSES):
                await anyio.lowlevel.checkpoint()
            self.release.set()


class _Counted:
    """Awaits a coroutine, telling `on_yield` each time it suspends."""

    def __init__(self, coro: Coroutine[Any, Any, Any], on_yield: Callable[[], None]) -> None:
        self._coro = coro
        self._on_yield = on_yield

    def __await__(self) -> Generator[Any, Any, Any]:
        coro = self._coro
        sent: Any = None
        error: BaseException | None = None
        try:
            while True:
                try:
                    yielded = coro.send(sent) if error is None else coro.throw(error)
                except StopIteration as stop:
                    return stop.value
                self._on_yield()
                sent, error = None, None
                try:
                    sent = yield yielded
                except BaseException as exc:  # delivered into the inner coroutine
                    error = exc
        finally:
            coro.close()


@dataclass
class Snapshot:
    events: int
    """How many log events had happened."""
    done: list[bool]
    """Which completions had settled."""


class Log:
    """What the kernels and host functions did, in order, from every thread."""

    def __init__(self, injection: Injection) -> None:
        self._lock = threading.Lock()
        self.events: list[tuple[str, str, float]] = []
        self._points = 0
        self._injection = injection
        self._gate: threading.Event | None = None

    def note(self, phase: str, tag: str, on_loop: bool = False) -> None:
        """Log `phase` of region `tag`. While the gate is closed, regions on worker threads
        do not end (see `close_gate`); on the loop nothing happens while it is closed."""
        while True:
            with self._lock:
                gate = self._gate
                if on_loop or phase != "end" or gate is None or gate.is_set():
                    self.events.append((phase, tag, time.perf_counter()))
                    return
            if not gate.wait(HOLD_S):
                self._injection.hold_expired = True
                gate.set()

    def close_gate(self) -> int:
        """How many events have happened; the regions still running on worker threads do not
        end until the loop has taken its next step (`gate.set`, scheduled by the caller)."""
        with self._lock:
            self._gate = threading.Event()
            return len(self.events)

    @property
    def gate(self) -> threading.Event:
        assert self._gate is not None
        return self._gate

    def length(self) -> int:
        with self._lock:
            return len(self.events)

    def _is_the_point(self) -> bool:
        with self._lock:
            index = self._points
            self._points += 1
        injection = self._injection
        if injection.clock == "event" and index == injection.n:
            injection.hit.set()
            return True
        return False

    def point(self) -> None:
        """A point of the event clock, on a worker thread."""
        if self._is_the_point() and not self._injection.release.wait(HOLD_S):
            self._injection.hold_expired = True

    async def apoint(self) -> None:
        """A point of the event clock, on the loop (an async host function)."""
        if self._is_the_point():
            with anyio.move_on_after(HOLD_S) as scope:
                while not self._injection.release.is_set():
                    await anyio.sleep(0.001)
            if scope.cancelled_caught:
                self._injection.hold_expired = True


# -- building and running -------------------------------------------------------------------


@dataclass
class Built:
    prepared: list[hrx.PreparedGraph]
    arrays: dict[str, np.ndarray]
    """Each buffer's storage, as the init kernel saw it (sim storage is numpy and outlives
    the runtime, so the final bytes can be read even after the runtime closed)."""


def _sync_fn(log: Log, tag: str, region: Region, k: int) -> Callable[..., None]:
    def run(dst: np.ndarray, src: np.ndarray | None) -> None:
        log.note("start", tag)
        log.point()
        value = transform(region, k, dst, src)
        dst[:] = value
        log.point()
        log.note("end", tag)

    return run


async def build(rt: hrx.Runtime, scenario: Scenario, log: Log) -> Built:
    buffers = {
        name: rt.allocate(nbytes, hrx.GPU_LOCAL if gpu else hrx.HOST_VISIBLE)
        for name, gpu, nbytes in scenario.buffers
    }
    arrays: dict[str, np.ndarray] = {}
    names = [name for name, _, _ in scenario.buffers]

    def init(kernel_arrays: list[np.ndarray], constants: bytes) -> None:
        for index, (name, array) in enumerate(zip(names, kernel_arrays, strict=True)):
            array[:] = initial_bytes(index, array.size)
            arrays[name] = array

    init_kernel = rt.load_gpu_kernel(
        hrx.KernelSource(host=init),
        "init",
        grid=(1,),
        block=(1,),
        contract=hrx.KernelContract(
            [hrx.Binding(buffers[name].nbytes, hrx.Access.WRITE, 1) for name in names]
        ),
    )
    graph = rt.graph("init")
    graph.gpu(init_kernel, [buffers[name].view() for name in names])
    await graph.prepare().submit()

    def view(r: Range) -> hrx.View:
        return buffers[r[0]].view(r[1], r[2] - r[1])

    prepared = []
    for s, sub in enumerate(scenario.subs):
        graph = rt.graph(f"sub{s}")
        for i, region in enumerate(sub.regions):
            tag, k = f"{s}.{i}", _k(s, i)
            target_access = hrx.Access.READ_WRITE if region.rmw else hrx.Access.WRITE
            fn = _sync_fn(log, tag, region, k)
            if region.kind == "kernel":
                bindings = [hrx.Binding(region.target[2] - region.target[1], target_access, 1)]
                views = [view(region.target)]
                if region.source is not None:
                    bindings.append(
                        hrx.Binding(region.source[2] - region.source[1], hrx.Access.READ, 1)
                    )
                    views.append(view(region.source))

                def kernel(kernel_arrays: list[np.ndarray], constants: bytes, fn: Any = fn) -> None:
                    fn(kernel_arrays[0], kernel_arrays[1] if len(kernel_arrays) > 1 else None)

                loaded = rt.load_gpu_kernel(
                    hrx.KernelSource(host=kernel),
                    f"k{s}_{i}",
                    grid=(1,),
                    block=(1,),
                    contract=hrx.KernelContract(bindings),
                )
                graph.gpu(loaded, views)
            elif region.kind in ("host", "ahost"):
                accesses = [(view(region.target), target_access)]
                if region.source is not None:
                    accesses.append((view(region.source), hrx.Access.READ))
                if region.kind == "host":

                    def host(*host_arrays: np.ndarray, fn: Any = fn) -> None:
                        fn(host_arrays[0], host_arrays[1] if len(host_arrays) > 1 else None)

                    graph.host(host, accesses)
                else:

                    async def ahost(
                        *host_arrays: np.ndarray,
                        tag: str = tag,
                        region: Region = region,
                        k: int = k,
                    ) -> None:
                        log.note("start", tag, on_loop=True)
                        await log.apoint()
                        await anyio.lowlevel.checkpoint()
                        src = host_arrays[1] if len(host_arrays) > 1 else None
                        host_arrays[0][:] = transform(region, k, host_arrays[0], src)
                        await anyio.lowlevel.checkpoint()
                        await log.apoint()
                        log.note("end", tag, on_loop=True)

                    graph.host(ahost, accesses)
            else:
                assert region.source is not None
                graph.copy(view(region.target), view(region.source))
        prepared.append(graph.prepare())
    return Built(prepared, arrays)


def submit_all(scenario: Scenario, built: Built, into: list[hrx.Completion]) -> None:
    for s, sub in enumerate(scenario.subs):
        into.append(built.prepared[s].submit(after=[into[j] for j in sub.after]))


async def drive(completions: Sequence[hrx.Completion]) -> None:
    """The awaiting task: awaits every completion in turn (their errors are checked later)."""
    for completion in completions:
        with contextlib.suppress(hrx.HrxError):
            await completion


async def fresh_work_completes(rt: hrx.Runtime) -> None:
    a = rt.allocate(32, hrx.HOST_VISIBLE)
    b = rt.allocate(32, hrx.HOST_VISIBLE)
    graph = rt.graph("fresh")
    graph.fill(a.view(), 9)
    graph.gpu(load_mix(rt, 32), [a.view(), b.view()])
    await graph.prepare().submit()
    assert await read_bytes(rt, b) == bytes([9 * 3 + 1]) * 32


@dataclass
class Outcome:
    """Everything one run left behind, for `check`."""

    scenario: Scenario
    delivery: str
    injection: Injection
    events: list[tuple[str, str, float]] = field(default_factory=list)
    completions: list[hrx.Completion] = field(default_factory=list)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    uploaded: int = 0
    downloaded: int = 0
    landed: bool = False
    cancel_returned: bool | None = None
    at_exit: Snapshot | None = None


async def run_once(scenario: Scenario, delivery: str, clock: str, n: int) -> Outcome:
    injection = Injection(clock, n, release_on_fire=not delivery.startswith("exit"))
    log = Log(injection)
    outcome = Outcome(scenario, delivery, injection)
    completions = outcome.completions

    def observe() -> Snapshot:
        return Snapshot(log.length(), [c.done() for c in completions])

    injection.observe = observe
    if delivery.startswith("exit"):
        await _run_exit(scenario, delivery, injection, log, outcome)
    else:
        await _run_open(scenario, delivery, injection, log, outcome)
    outcome.events = list(log.events)
    return outcome


async def _run_open(
    scenario: Scenario, delivery: str, injection: Injection, log: Log, outcome: Outcome
) -> None:
    completions = outcome.completions
    with anyio.fail_after(RUN_LIMIT_S):
        async with hrx.Runtime(backend="sim", max_submissions=scenario.max_submissions) as rt:
            built = await build(rt, scenario, log)
            async with anyio.create_task_group() as tg:
                tg.start_soon(injection.ticker)
                if delivery == "scope":
                    with anyio.CancelScope() as scope:
                        injection.action = scope.cancel
                        submit_all(scenario, built, completions)
                        await _Counted(drive(completions), injection.on_yield)
                    outcome.landed = scope.cancelled_caught
                else:
                    submit_all(scenario, built, completions)
                    target = completions[scenario.cancel_target]

                    def cancel() -> None:
                        outcome.cancel_returned = target.cancel()

                    injection.action = cancel
                    await _Counted(drive(completions), injection.on_yield)
                    outcome.landed = bool(outcome.cancel_returned)
                if not injection.fired:
                    tg.cancel_scope.cancel()
            injection.release.set()
            # The device work of a cancelled awaiting task still runs: await it again.
            await drive(completions)
            await rt.drain()
            outcome.uploaded = rt.statistics().uploaded_bytes
            outcome.downloaded = rt.statistics().downloaded_bytes
            outcome.arrays = {name: array.copy() for name, array in built.arrays.items()}
            assert all(c.done() for c in completions), completions
            await fresh_work_completes(rt)


class Boom(Exception):
    pass


def _call_soon(fn: Callable[[], None]) -> None:
    """Call `fn` on the loop once the current task has yielded."""
    native = anyio.lowlevel.current_token().native_token
    if isinstance(native, asyncio.AbstractEventLoop):
        native.call_soon(fn)
    else:
        native.run_sync_soon(fn)  # type: ignore[attr-defined]  # trio's TrioToken


async def _run_exit(
    scenario: Scenario, delivery: str, injection: Injection, log: Log, outcome: Outcome
) -> None:
    completions = outcome.completions
    built: Built | None = None
    boom = False

    def at_exit() -> None:
        # Nothing awaits between here and the runtime's __aexit__, which cancels what has
        # not started before it awaits anything. Until then, what was running at this
        # snapshot keeps running (the gate opens at the loop's next step), so what waits for
        # it cannot have started before the runtime knew it was leaving.
        outcome.at_exit = Snapshot(log.close_gate(), [c.done() for c in completions])
        _call_soon(log.gate.set)
        injection.release.set()

    with anyio.fail_after(RUN_LIMIT_S):
        with anyio.CancelScope() as outer:
            try:
                async with hrx.Runtime(
                    backend="sim", max_submissions=scenario.max_submissions
                ) as rt:
                    try:
                        built = await build(rt, scenario, log)
                        async with anyio.create_task_group() as tg:
                            tg.start_soon(injection.ticker)
                            with anyio.CancelScope() as inner:
                                injection.action = (
                                    outer.cancel if delivery == "exit-cancel" else inner.cancel
                                )
                                submit_all(scenario, built, completions)
                                await _Counted(drive(completions), injection.on_yield)
                            tg.cancel_scope.cancel()
                        if inner.cancelled_caught:
                            raise Boom("leaving the runtime by an exception")
                    finally:
                        at_exit()
            except Boom:
                boom = True
        outcome.landed = outer.cancelled_caught or boom
    assert built is not None
    outcome.uploaded = rt.statistics().uploaded_bytes
    outcome.downloaded = rt.statistics().downloaded_bytes
    outcome.arrays = {name: array.copy() for name, array in built.arrays.items()}
    with pytest.raises(hrx.RuntimeClosed):
        built.prepared[0].submit()


# -- checks ---------------------------------------------------------------------------------


def check(outcome: Outcome) -> None:
    scenario, delivery, injection = outcome.scenario, outcome.delivery, outcome.injection
    subs = scenario.subs
    events, completions = outcome.events, outcome.completions
    where = f"{scenario.name}/{delivery}/{injection.clock} n={injection.n}"
    shown = "\n".join(f"  {phase:5} {tag}" for phase, tag, _ in events)
    context = f"{where}\nlog:\n{shown}\noutcomes: {[_outcome(c) for c in completions]}"

    assert not injection.hold_expired, f"a region waited {HOLD_S} s for the injection: {context}"
    assert len(completions) == len(subs), context
    assert all(c.done() for c in completions), f"a completion never settled: {context}"

    starts: dict[str, int] = {}
    ends: dict[str, int] = {}
    times: dict[tuple[str, str], float] = {}
    for index, (phase, tag, when) in enumerate(events):
        seen = starts if phase == "start" else ends
        assert tag not in seen, f"region {tag} ran twice: {context}"
        seen[tag] = index
        times[phase, tag] = when
    for tag, index in starts.items():
        assert tag in ends and ends[tag] > index, f"region {tag} never finished: {context}"

    regions = [(s, i, region) for s, sub in enumerate(subs) for i, region in enumerate(sub.regions)]
    copies = {"upload": outcome.uploaded, "download": outcome.downloaded}
    ran: dict[tuple[int, int], bool] = {}
    for s, i, region in regions:
        if region.logged:
            ran[s, i] = f"{s}.{i}" in starts
        else:
            copied = copies[region.kind]
            nbytes = region.target[2] - region.target[1]
            assert copied in (0, nbytes), f"{region.kind} copied {copied} bytes: {context}"
            ran[s, i] = copied == nbytes

    # Conflicting regions in admission order, never overlapping.
    for a, (s, i, p) in enumerate(regions):
        for t, j, q in regions[a + 1 :]:
            if p.logged and q.logged and conflict(p, q) and ran[s, i] and ran[t, j]:
                assert ends[f"{s}.{i}"] < starts[f"{t}.{j}"], (
                    f"{t}.{j} started before {s}.{i} (admitted earlier, conflicting) ended: "
                    f"{context}"
                )

    # after= links and admission under max_submissions: started only once those settled.
    for s, sub in enumerate(subs):
        waited = list(sub.after)
        if scenario.max_submissions == 1:
            waited += list(range(s))
        for i, region in enumerate(sub.regions):
            if region.logged and ran[s, i]:
                for w in waited:
                    finished = completions[w].finished_at
                    assert finished is not None and times["start", f"{s}.{i}"] >= finished, (
                        f"{s}.{i} started before submission {w} it waits for settled: {context}"
                    )

    # A submission that follows (after=) one that did not succeed runs nothing.
    for s, sub in enumerate(subs):
        if any(completions[w].exception() is not None for w in sub.after):
            assert isinstance(completions[s].exception(), hrx.Cancelled), (
                f"submission {s} follows one that was cancelled: {context}"
            )
            assert not any(ran[s, i] for i in range(len(sub.regions))), (
                f"submission {s} ran after one it follows was cancelled: {context}"
            )

    # Each completion: success exactly when every region ran, settled after they ended.
    for s, sub in enumerate(subs):
        completion = completions[s]
        error = completion.exception()
        assert error is None or isinstance(error, hrx.Cancelled), (
            f"submission {s} failed with {error!r}: {context}"
        )
        all_ran = all(ran[s, i] for i in range(len(sub.regions)))
        assert (error is None) == all_ran, (
            f"submission {s}: {_outcome(completion)} but regions ran: "
            f"{[ran[s, i] for i in range(len(sub.regions))]}: {context}"
        )
        finished = completion.finished_at
        assert finished is not None
        for i, region in enumerate(sub.regions):
            if region.logged and ran[s, i]:
                assert times["end", f"{s}.{i}"] <= finished, (
                    f"submission {s} settled before its region {i} ended: {context}"
                )

    # What the injection skipped.
    if delivery == "scope":
        assert all(ran.values()), f"cancelling the awaiting task skipped work: {context}"
    elif delivery == "cancel":
        linked = _followers(scenario, scenario.cancel_target)
        for s in range(len(subs)):
            if s not in linked:
                assert completions[s].exception() is None, (
                    f"cancelling submission {scenario.cancel_target} changed submission {s}: "
                    f"{context}"
                )
        if injection.fired and outcome.cancel_returned:
            assert injection.at_fire is not None
            _check_skipped(
                scenario, {scenario.cancel_target}, injection.at_fire, starts, ends, ran, context
            )
    elif outcome.at_exit is not None and outcome.landed:
        _check_skipped(scenario, set(range(len(subs))), outcome.at_exit, starts, ends, ran, context)

    # The bytes: a sequential replay, in admission order, of what ran.
    model = {
        name: initial_bytes(index, nbytes)
        for index, (name, _, nbytes) in enumerate(scenario.buffers)
    }
    for s, i, region in regions:
        if ran[s, i]:
            name, lo, hi = region.target
            src = None
            if region.source is not None:
                src = model[region.source[0]][region.source[1] : region.source[2]].copy()
            model[name][lo:hi] = transform(region, _k(s, i), model[name][lo:hi], src)
    for name, expected in model.items():
        actual = outcome.arrays[name]
        assert np.array_equal(actual, expected), (
            f"buffer {name}: {actual.tolist()} != sequential {expected.tolist()}: {context}"
        )


def _check_skipped(
    scenario: Scenario,
    cancelled: set[int],
    snapshot: Snapshot,
    starts: dict[str, int],
    ends: dict[str, int],
    ran: dict[tuple[int, int], bool],
    context: str,
) -> None:
    """A region of a cancelled submission that had not started at the snapshot, and could not
    have been about to (a region or a submission it waits for had not finished), never runs."""
    subs = scenario.subs
    for s in cancelled:
        waited = list(subs[s].after)
        if scenario.max_submissions == 1:
            waited += list(range(s))
        blocked_by = [w for w in waited if not snapshot.done[w]]
        for i, region in enumerate(subs[s].regions):
            if not ran[s, i]:
                continue
            reasons = [f"submission {w} had not settled" for w in blocked_by]
            for t, sub in enumerate(subs[: s + 1]):
                for j, earlier in enumerate(sub.regions):
                    if (t, j) >= (s, i) or not earlier.logged or not conflict(earlier, region):
                        continue
                    end = ends.get(f"{t}.{j}")
                    if end is None or end >= snapshot.events:
                        reasons.append(f"region {t}.{j} it waits for had not finished")
            if region.logged:
                start = starts[f"{s}.{i}"]
                if start < snapshot.events:
                    continue  # it had started: it drains
            assert not reasons, (
                f"region {s}.{i} ran although it had not started when its submission was "
                f"cancelled ({'; '.join(reasons)}): {context}"
            )


def _followers(scenario: Scenario, sub: int) -> set[int]:
    """`sub` and the submissions that follow it through after= links."""
    found = {sub}
    changed = True
    while changed:
        changed = False
        for s, other in enumerate(scenario.subs):
            if s not in found and found.intersection(other.after):
                found.add(s)
                changed = True
    return found


def _outcome(completion: hrx.Completion) -> str:
    if not completion.done():
        return "pending"
    error = completion.exception()
    return "ok" if error is None else type(error).__name__


# -- the sweeps -----------------------------------------------------------------------------


async def sweep(scenario: Scenario, delivery: str, clock: str, points: Any) -> None:
    """Runs the scenario once per point until a run does not reach its point."""
    reached = landed = 0
    for n in points:
        outcome = await run_once(scenario, delivery, clock, n)
        check(outcome)
        if not outcome.injection.fired:
            break
        reached += 1
        landed += outcome.landed
    else:
        pytest.fail(f"{scenario.name}/{delivery}/{clock}: still reaching points after {reached}")
    # The sweep injected something: the first point exists, and (where a region is held at
    # its point, so the work is pending for sure) some injection interrupted that work. The
    # other clocks' points may all come after the work finished, on a fast run.
    assert reached >= 1, (scenario.name, delivery, clock)
    if clock == "event":
        assert landed >= 1, (scenario.name, delivery, clock, reached)


DELIVERIES = ["scope", "cancel", "exit-cancel", "exit-raise"]
CLOCKS = ["task", "event", "loop"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("clock", CLOCKS)
@pytest.mark.parametrize("delivery", DELIVERIES)
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
async def test_cancellation_at_every_point(scenario: Scenario, delivery: str, clock: str) -> None:
    await sweep(scenario, delivery, clock, range(MAX_POINTS))


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("delivery", DELIVERIES)
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
async def test_cancellation_at_every_point_again_and_again(
    scenario: Scenario, delivery: str, request: pytest.FixtureRequest
) -> None:
    """The worker threads' timing differs from sweep to sweep, and with it what the task and
    loop clocks' points fall between: sweep many times (minutes; only with ``-m slow``)."""
    expression = request.config.getoption("markexpr", "") or ""
    if "slow" not in expression or "not slow" in expression:
        pytest.skip("sweeps again and again for minutes: select it with -m slow")
    for _ in range(REPEATS):
        for clock in CLOCKS:
            await sweep(scenario, delivery, clock, range(MAX_POINTS))
