"""How far to trust a measured speedup: the spread of the samples and the machine's load.

A parallel speedup needs free cores: on a machine whose other work leaves fewer
cores than the example's lanes need, or whose baseline samples scatter widely,
the median speedup swings from run to run. `judge` decides that from given
numbers (a pure function, so it can be tested with chosen samples); `machine_load`
reads the numbers of this machine.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

NOISY_SPREAD = 0.25
"""A baseline whose p10..p90 range is wider than this fraction of its median is noisy."""
BUSY_MARGIN = 0.5
"""Cores short of what the example needs before the machine counts as busy."""


@dataclass(frozen=True)
class Spread:
    """The 10th, 50th and 90th percentiles of a set of samples."""

    p10: float
    median: float
    p90: float

    @property
    def relative(self) -> float:
        """(p90 - p10) / median: 0 for identical samples."""
        return (self.p90 - self.p10) / self.median if self.median > 0 else float("inf")


def spread(samples: Sequence[float]) -> Spread:
    """p10, median and p90 (inclusive interpolation; one sample is its own spread)."""
    values = sorted(samples)
    if not values:
        raise ValueError("no samples")
    if len(values) == 1:
        return Spread(values[0], values[0], values[0])
    deciles = statistics.quantiles(values, n=10, method="inclusive")
    return Spread(deciles[0], statistics.median(values), deciles[8])


@dataclass(frozen=True)
class MachineLoad:
    """The 1-minute load average (None where the system has none) and the usable cores."""

    load: float | None
    cores: int


def usable_cores() -> int:
    """The cores this process may run on (its affinity), else the machine's count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def machine_load() -> MachineLoad:
    try:
        load: float | None = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = None
    return MachineLoad(load, usable_cores())


@dataclass(frozen=True)
class Verdict:
    """Whether the measurement can be trusted, and the lines that say so."""

    busy: bool
    noisy: bool
    lines: tuple[str, ...]

    @property
    def trustworthy(self) -> bool:
        return not (self.busy or self.noisy)


def judge(
    baseline: Sequence[float],
    machine: MachineLoad,
    cores_needed: int = 2,
    noisy_spread: float = NOISY_SPREAD,
) -> Verdict:
    """Busy when the cores left free (usable cores less the load average before the run)
    fall short of `cores_needed` by more than half a core; noisy when the baseline's
    p10..p90 range is wider than `noisy_spread` of its median."""
    base = spread(baseline)
    free = None if machine.load is None else machine.cores - machine.load
    busy = machine.cores < cores_needed or (free is not None and free < cores_needed - BUSY_MARGIN)
    noisy = base.relative > noisy_spread
    load_text = (
        "no load average"
        if machine.load is None
        else f"load average {machine.load:.2f} on {machine.cores} usable cores"
    )
    lines: list[str] = []
    if busy:
        free_text = f"{max(free, 0.0):.1f}" if free is not None else f"{machine.cores}"
        lines.append(
            f"Warning: busy machine: {load_text} leaves {free_text} free; this example needs "
            f"{cores_needed}, so the speedup above is not reliable (run it on a quiet machine)"
        )
    if noisy:
        lines.append(
            f"Warning: noisy baseline: the sequential samples' p10..p90 range is "
            f"{base.relative:.0%} of their median (more than {noisy_spread:.0%}), "
            "so the speedup above is not reliable (more samples or a quiet machine help)"
        )
    if not lines:
        lines.append(
            f"Machine: quiet ({load_text}; baseline p10..p90 range {base.relative:.0%} "
            "of its median)"
        )
    return Verdict(busy, noisy, tuple(lines))


__all__ = [
    "BUSY_MARGIN",
    "NOISY_SPREAD",
    "MachineLoad",
    "Spread",
    "Verdict",
    "judge",
    "machine_load",
    "spread",
    "usable_cores",
]
