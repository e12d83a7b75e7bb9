"""A small benchmark harness for async code, running on asyncio or trio (through anyio).

It covers the three measurements the project's benchmarks need:

* `paired` compares two variants in alternating order (AB, BA, AB, ...), so drift in clocks,
  caches or thermals hits both variants alike, and reports per-pair ratios.
* `LoopLag` measures how late the event loop wakes a sleeping task, which is how blocking
  calls hidden in "async" code show up.
* `StageTimer` times named stages, optionally synchronizing the device at each boundary so
  queued device work is charged to the stage that issued it.
* `quiet_gc` collects and freezes the heap before a timed section, so a full garbage
  collection owed to earlier work does not land in one measurement of a series.

Summaries use nearest-rank percentiles: every reported value is one that was measured.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import asdict, dataclass
from types import TracebackType
from typing import Literal, Self

import anyio
import anyio.abc

from hrx_async.errors import ContractError

TimedCall = Callable[[], Awaitable[float | None]]
"""An async callable that runs one trial and returns its elapsed seconds, or None to let the
harness time the call itself."""

SyncCall = Callable[[], Awaitable[None]]
"""An async callable that returns once all previously issued device work has finished."""


def percentile(sorted_samples: Sequence[float], p: float) -> float:
    """The nearest-rank `p`-th percentile of `sorted_samples` (ascending).

    That is the sample at index ceil(n * p / 100) - 1, so the result is always a measured
    value. `p` must be in [1, 100]; the samples must be non-empty and sorted.
    """
    if isinstance(p, bool) or not isinstance(p, int | float) or not 1 <= p <= 100:
        raise ContractError(f"percentile p must be a number in [1, 100], got {p!r}")
    n = len(sorted_samples)
    if n == 0:
        raise ContractError("percentile of no samples: got an empty sequence, need at least one")
    if any(sorted_samples[i] > sorted_samples[i + 1] for i in range(n - 1)):
        raise ContractError("percentile needs samples sorted ascending; sort them first")
    # Integer arithmetic for integral p keeps ceil() exact (no 19.000000001 -> 20).
    rank = -(-n * p // 100) if isinstance(p, int) else math.ceil(n * p / 100)
    return float(sorted_samples[rank - 1])


@contextmanager
def quiet_gc() -> Iterator[None]:
    """Collect, then freeze the survivors until the block ends (and unfreeze them).

    The collection pays now for garbage earlier work left; the freeze keeps the objects
    alive before the block out of any collection during it, as latency-sensitive services
    do after start-up. Collections inside the block then scan only what it makes. A heap
    the caller froze already stays frozen afterwards.
    """
    frozen_before = gc.get_freeze_count() > 0
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        if not frozen_before:
            gc.unfreeze()


@dataclass(frozen=True, slots=True)
class Distribution:
    """A summary of non-negative samples, in the samples' own unit.

    `median` and `p95` are nearest-rank percentiles (measured values, never interpolated).
    """

    count: int
    median: float
    p95: float
    min: float
    max: float
    mean: float

    @classmethod
    def from_samples(cls, samples: Iterable[float]) -> Distribution:
        """Summarize `samples`; they must be non-empty, finite and >= 0."""
        values = sorted(_checked_samples(samples))
        if not values:
            raise ContractError("a distribution needs at least one sample, got none")
        return cls(
            count=len(values),
            median=percentile(values, 50),
            p95=percentile(values, 95),
            min=values[0],
            max=values[-1],
            mean=math.fsum(values) / len(values),
        )

    def to_dict(self) -> dict[str, float]:
        """The fields by name, for JSON reports."""
        return asdict(self)


def _checked_samples(samples: Iterable[float]) -> list[float]:
    values: list[float] = []
    for index, sample in enumerate(samples):
        if isinstance(sample, bool) or not isinstance(sample, int | float):
            raise ContractError(f"sample {index} must be a number, got {sample!r}")
        if not math.isfinite(sample) or sample < 0:
            raise ContractError(f"sample {index} must be finite and >= 0, got {sample!r}")
        values.append(float(sample))
    return values


@dataclass(frozen=True, slots=True)
class PairedResult:
    """The outcome of `paired`: raw per-pair samples (seconds), their ratios, and summaries.

    `order[i]` says which variant ran first in pair i; `ratios[i]` is
    `a_samples[i] / b_samples[i]`, so a ratio below 1 means A was faster in that pair.
    """

    order: list[Literal["AB", "BA"]]
    a_samples: list[float]
    b_samples: list[float]
    ratios: list[float]
    a: Distribution
    b: Distribution
    ratio: Distribution


async def _timed(call: TimedCall, name: str) -> float:
    start = time.perf_counter()
    reported = await call()
    if reported is None:
        return time.perf_counter() - start
    if isinstance(reported, bool) or not isinstance(reported, int | float):
        raise ContractError(f"variant {name} must return seconds or None, got {reported!r}")
    if not math.isfinite(reported) or reported < 0:
        raise ContractError(
            f"variant {name} returned {reported!r} seconds; it must be finite and >= 0"
        )
    return float(reported)


async def paired(a: TimedCall, b: TimedCall, pairs: int) -> PairedResult:
    """Run `a` and `b` once per pair, `pairs` times, alternating which goes first.

    Pair 0 runs A then B, pair 1 runs B then A, and so on. Each call returns its elapsed
    seconds, or None to be timed here with `time.perf_counter` around the await.
    """
    if isinstance(pairs, bool) or not isinstance(pairs, int) or pairs < 1:
        raise ContractError(f"pairs must be an int >= 1, got {pairs!r}")
    order: list[Literal["AB", "BA"]] = []
    a_samples: list[float] = []
    b_samples: list[float] = []
    ratios: list[float] = []
    for index in range(pairs):
        if index % 2 == 0:
            order.append("AB")
            a_seconds = await _timed(a, "A")
            b_seconds = await _timed(b, "B")
        else:
            order.append("BA")
            b_seconds = await _timed(b, "B")
            a_seconds = await _timed(a, "A")
        if b_seconds == 0:
            raise ContractError(
                f"variant B took 0 seconds in pair {index}, so the ratio A/B is undefined; "
                "return a positive duration"
            )
        a_samples.append(a_seconds)
        b_samples.append(b_seconds)
        ratios.append(a_seconds / b_seconds)
    return PairedResult(
        order=order,
        a_samples=a_samples,
        b_samples=b_samples,
        ratios=ratios,
        a=Distribution.from_samples(a_samples),
        b=Distribution.from_samples(b_samples),
        ratio=Distribution.from_samples(ratios),
    )


class LoopLag:
    """Measures event-loop wake-up lateness while a workload runs.

    A ticker task sleeps `interval` seconds again and again and records how much later than
    asked it woke up. On a healthy loop that is a fraction of a millisecond; a blocking call
    in some task shows up as a lag about as long as the call.

    Use it as `async with LoopLag() as lag: ...workload...`, or start `lag.run` in your own
    task group and cancel that group's scope when done.
    """

    def __init__(self, interval: float = 0.001) -> None:
        if isinstance(interval, bool) or not isinstance(interval, int | float):
            raise ContractError(f"interval must be a number of seconds > 0, got {interval!r}")
        if not math.isfinite(interval) or interval <= 0:
            raise ContractError(f"interval must be finite seconds > 0, got {interval!r}")
        self.interval = float(interval)
        self._lags_s: list[float] = []
        self._group: anyio.abc.TaskGroup | None = None

    @property
    def samples_ms(self) -> list[float]:
        """Each recorded wake-up's lateness in milliseconds, oldest first (a copy)."""
        return [lag * 1000.0 for lag in self._lags_s]

    async def run(self) -> None:
        """The ticker: runs until cancelled."""
        # Timed with `perf_counter`, not the loop's clock: uvloop's clock counts whole
        # milliseconds, which would round every lag to 0 or 1 ms.
        while True:
            deadline = time.perf_counter() + self.interval
            await anyio.sleep(self.interval)
            # Timers may fire a hair early (clock granularity); early is not lag.
            self._lags_s.append(max(0.0, time.perf_counter() - deadline))

    async def __aenter__(self) -> Self:
        if self._group is not None:
            raise ContractError("this LoopLag is already running; use one instance per block")
        group = anyio.create_task_group()
        await group.__aenter__()
        self._group = group
        group.start_soon(self.run)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        group, self._group = self._group, None
        if group is None:
            return None
        group.cancel_scope.cancel()
        try:
            return await group.__aexit__(exc_type, exc, tb)
        except BaseExceptionGroup as grouped:
            # The ticker never fails, so a group holding only the body's own exception is
            # just the task group's wrapping; let the body's exception propagate unchanged.
            if exc is not None and len(grouped.exceptions) == 1 and grouped.exceptions[0] is exc:
                return False
            raise

    def distribution(self) -> Distribution:
        """The recorded lags in milliseconds. Raises ContractError if none were recorded."""
        if not self._lags_s:
            raise ContractError(
                "LoopLag recorded no wake-ups; let the loop run (await something) inside "
                "`async with LoopLag()` for longer than its interval"
            )
        return Distribution.from_samples(self.samples_ms)

    @property
    def p99_ms(self) -> float:
        """The nearest-rank 99th percentile lag in milliseconds."""
        self.distribution()  # raises the clear error when empty
        return percentile(sorted(self.samples_ms), 99)


class StageTimer:
    """Times named stages of a benchmark; each stage name collects one sample per run.

    With `sync`, the timer awaits it before a stage starts and before it ends, so work the
    device still had queued is not charged to the next stage.
    """

    def __init__(self, sync: SyncCall | None = None) -> None:
        self._sync = sync
        self._seconds: dict[str, list[float]] = {}

    @asynccontextmanager
    async def stage(self, name: str) -> AsyncIterator[None]:
        """Time the body of `async with timer.stage(name):`, in seconds.

        A body that raises records nothing: a partial stage would skew the summary.
        """
        if not isinstance(name, str) or not name:
            raise ContractError(f"stage name must be a non-empty str, got {name!r}")
        if self._sync is not None:
            await self._sync()
        start = time.perf_counter()
        yield
        if self._sync is not None:
            await self._sync()
        self._seconds.setdefault(name, []).append(time.perf_counter() - start)

    def samples(self, name: str) -> list[float]:
        """The recorded seconds of stage `name` (a copy). Raises ContractError if unknown."""
        if name not in self._seconds:
            raise ContractError(f"no stage named {name!r}; recorded stages: {list(self._seconds)}")
        return list(self._seconds[name])

    def report(self) -> dict[str, Distribution]:
        """A summary (seconds) per stage, in the order stages first completed."""
        return {name: Distribution.from_samples(seconds) for name, seconds in self._seconds.items()}


__all__ = [
    "Distribution",
    "LoopLag",
    "PairedResult",
    "StageTimer",
    "SyncCall",
    "TimedCall",
    "paired",
    "percentile",
    "quiet_gc",
]
