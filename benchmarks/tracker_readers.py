"""Access-tracker cost per submission against the number of pending users.

Each scenario first records N pending users, then times a steady state in which
every step records one new user and forgets the oldest one (so N stay pending),
the way the scheduler admits a submission and retires a completed one:

* ``readers``: every user reads the same 16 bytes (nothing ever writes them);
* ``writers``: every user writes the same 16 bytes;
* ``mixed``: users read bytes [0, 64) and [0, 32) in turn, so the reader state is
  split in two segments whose reader sets overlap;
* ``slices``: user k reads bytes [16k, 16k + 16), one segment per pending user;
* ``replay``: the replay pattern of the tests (a producer, two kernel halves and a
  consumer per iteration, forgotten one iteration late), in µs per iteration.

The tracker of this checkout runs against a baseline version read from git
(``--baseline REV``, the last commit before reader groups by default), in
alternating rounds; the table gives the median µs per step and baseline/current.
The baseline is quadratic in N, so its rows at N=32000 take a while.

    python benchmarks/tracker_readers.py [--sizes 2000 8000 32000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hrx_async._core import tracker as current

BASELINE = "01b88050bd55b59ccda7ece6f04a7a1028008e9d"


class User:
    """Hashed by identity, like the scheduler's region runs."""

    __slots__ = ()


def load_baseline(rev: str) -> types.ModuleType | None:
    root = Path(__file__).resolve().parent.parent
    try:
        source = subprocess.run(
            ["git", "show", f"{rev}:hrx_async/tracker.py"],
            cwd=root,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"baseline {rev} not available ({exc}); timing the current tracker only")
        return None
    module = types.ModuleType("tracker_baseline")
    exec(compile(source, f"{rev[:12]}:hrx_async/tracker.py", "exec"), module.__dict__)
    return module


Access = Callable[[int], tuple[int, int, bool]]


def steady(module: Any, pending: int, steps: int, access: Access) -> float:
    """µs per record+forget with `pending` users pending; user k does access(k)."""
    t = module.AccessTracker()
    record = t.record
    forget = t.forget
    users = [User() for _ in range(pending + steps)]
    accesses = [access(k) for k in range(pending + steps)]
    for k in range(pending):
        s, e, w = accesses[k]
        record("buf", s, e, w, users[k])
    start = time.perf_counter()
    for k in range(pending, pending + steps):
        s, e, w = accesses[k]
        record("buf", s, e, w, users[k])
        forget(users[k - pending])
    return (time.perf_counter() - start) / steps * 1e6


def replay(module: Any, iterations: int) -> float:
    """µs per iteration of the producer / kernel halves / consumer replay pattern."""
    t = module.AccessTracker()
    record = t.record
    forget = t.forget
    previous: list[User] = []
    start = time.perf_counter()
    for _ in range(iterations):
        prod, lo, hi, cons = User(), User(), User(), User()
        record("inp", 0, 64, True, prod)
        record("inp", 0, 64, False, lo)
        record("inp", 0, 64, False, hi)
        record("out", 0, 32, True, lo)
        record("out", 32, 64, True, hi)
        record("out", 0, 64, False, cons)
        for u in previous:
            forget(u)
        previous = [prod, lo, hi, cons]
    return (time.perf_counter() - start) / iterations * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 8000, 32000])
    parser.add_argument("--steps", type=int, default=2000, help="timed steps per run")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per row")
    parser.add_argument("--baseline", default=BASELINE, help="git revision, or 'none'")
    args = parser.parse_args()
    old = None if args.baseline == "none" else load_baseline(args.baseline)

    scenarios: list[tuple[str, Callable[[Any], float]]] = []
    for n in args.sizes:
        patterns: list[tuple[str, Access]] = [
            ("readers", lambda k: (0, 16, False)),
            ("writers", lambda k: (0, 16, True)),
            ("mixed", lambda k: (0, 64 >> (k & 1), False)),
            ("slices", lambda k: (16 * k, 16 * k + 16, False)),
        ]
        for name, access in patterns:
            scenarios.append(
                (f"{name} N={n}", lambda m, n=n, a=access: steady(m, n, args.steps, a))
            )
    scenarios.append(("replay (per iteration)", lambda m: replay(m, 20 * args.steps)))

    print(f"python {sys.version.split()[0]}, {args.steps} steps, {args.rounds} rounds")
    print(f"{'scenario':<24} {'baseline_us':>12} {'current_us':>11} {'ratio':>8}")
    for label, run in scenarios:
        before: list[float] = []
        after: list[float] = []
        for _ in range(args.rounds):
            if old is not None:
                before.append(run(old))
            after.append(run(current))
        now = statistics.median(after)
        if old is None:
            print(f"{label:<24} {'-':>12} {now:>11.2f} {'-':>8}")
        else:
            then = statistics.median(before)
            print(f"{label:<24} {then:>12.2f} {now:>11.2f} {then / now:>7.2f}x")


if __name__ == "__main__":
    main()
