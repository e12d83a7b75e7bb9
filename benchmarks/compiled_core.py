"""Does the mypyc-compiled core pay? The pure build against the compiled one.

Two interpreters, each with hrx-async installed (a virtual environment each: one installed
with ``HRX_ASYNC_PURE=1``, one compiled), run the same measurements in alternating order,
``--rounds`` times:

* the access tracker alone: µs per `record` + `forget` in a steady state of N pending users
  (as benchmarks/tracker_readers.py; every user reads, or writes, the same 16 bytes, or
  user k reads its own 16 bytes), and µs per iteration of the replay pattern (a producer,
  two kernel halves and a consumer, forgotten one iteration late);
* benchmarks/graph_prepare.py (record and prepare, with dependency inference, per node);
* benchmarks/sim_overhead.py (a chain of 1, 4, 16 tiny regions submitted and awaited: median
  µs per chain; 64 concurrent submitters: regions per second).

Each run checks which build it imports (hrx_async._build) and refuses a mix-up. The table
gives the median of each measurement per build and the gain of the compiled one (pure time
/ compiled time, or compiled rate / pure rate: above 1, the compiled build does better), of
the medians and of the best rounds (which a busy machine disturbs less).

    python benchmarks/compiled_core.py --pure PURE_VENV/bin/python \\
        --compiled COMPILED_VENV/bin/python [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def tracker_rows(pending: int, steps: int) -> dict[str, float]:
    """The tracker measurements, in this interpreter (the best of three runs each), with the
    workloads of `tracker_readers.py`."""
    from tracker_readers import replay, steady

    from hrx_async._core import tracker

    patterns: dict[str, Callable[[int], tuple[int, int, bool]]] = {
        "readers": lambda k: (0, 16, False),
        "writers": lambda k: (0, 16, True),
        "slices": lambda k: (16 * k, 16 * k + 16, False),
    }
    rows = {
        f"tracker {name} N={pending} us/step": min(
            steady(tracker, pending, steps, access) for _ in range(3)
        )
        for name, access in patterns.items()
    }
    rows["tracker replay us/iteration"] = min(replay(tracker, 10 * steps) for _ in range(3))
    return rows


def key_values(line: str) -> dict[str, str]:
    return dict(token.split("=", 1) for token in line.split() if "=" in token)


def script_rows(python: str, script: str, args: list[str]) -> dict[str, float]:
    """The numbers one of the other benchmark scripts prints, by name."""
    done = subprocess.run(
        [python, str(HERE / script), *args], check=True, capture_output=True, text=True
    )
    rows: dict[str, float] = {}
    for line in done.stdout.splitlines():
        found = key_values(line)
        if "chain" in found:
            name = f"sim chain={found['chain']} p50 us/chain"
            rows[name] = float(found["coordinated_p50_us"])
        elif "gc" in found:
            rows[f"sim 64 submitters gc={found['gc']} regions/s"] = float(found["regions_per_s"])
        elif "nodes" in found and found["nodes"] in ("128", "2048"):
            name = f"prepare {found['case']} nodes={found['nodes']} us/node"
            rows[name] = float(found["per_node_us"])
    return rows


def measure(python: str, expected: str, args: argparse.Namespace) -> dict[str, float]:
    done = subprocess.run(
        [python, __file__, "--tracker-only", str(args.pending), str(args.steps)],
        check=True,
        capture_output=True,
        text=True,
    )
    report = json.loads(done.stdout)
    if report["build"]["kind"] != expected:
        raise SystemExit(f"{python} runs the {report['build']['kind']} build, not {expected}")
    rows: dict[str, float] = report["rows"]
    rows.update(script_rows(python, "graph_prepare.py", []))
    rows.update(script_rows(python, "sim_overhead.py", ["--pairs", str(args.pairs)]))
    return rows


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--tracker-only":
        from hrx_async._build import build

        rows = tracker_rows(int(sys.argv[2]), int(sys.argv[3]))
        print(json.dumps({"build": build(), "rows": rows}))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pure", required=True, help="python of the pure install")
    parser.add_argument("--compiled", required=True, help="python of the compiled install")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pending", type=int, default=2000, help="tracker: pending users")
    parser.add_argument("--steps", type=int, default=4000, help="tracker: timed steps")
    parser.add_argument("--pairs", type=int, default=200, help="sim_overhead.py --pairs")
    args = parser.parse_args()

    results: dict[str, dict[str, list[float]]] = {"pure": {}, "compiled": {}}
    for round_ in range(args.rounds):
        order = ["pure", "compiled"] if round_ % 2 == 0 else ["compiled", "pure"]
        for kind in order:
            python = args.pure if kind == "pure" else args.compiled
            for name, value in measure(python, kind, args).items():
                results[kind].setdefault(name, []).append(value)
            print(f"round {round_ + 1}: {kind} done", file=sys.stderr, flush=True)

    print(f"{args.rounds} alternating rounds: medians, and the gain of the medians and bests")
    header = f"{'measurement':<42} {'pure':>10} {'compiled':>10} {'gain':>7} {'best':>7}"
    print(header)
    for name, values in results["pure"].items():
        other = results["compiled"][name]
        pure, compiled = statistics.median(values), statistics.median(other)
        # For a rate, higher is better: its gain is compiled / pure, and its best the highest.
        if name.endswith("/s"):
            gain, best = compiled / pure, max(other) / max(values)
        else:
            gain, best = pure / compiled, min(values) / min(other)
        print(f"{name:<42} {pure:>10.2f} {compiled:>10.2f} {gain:>6.2f}x {best:>6.2f}x")
    raw: dict[str, Any] = {"rounds": args.rounds, "values": results}
    print(json.dumps(raw))


if __name__ == "__main__":
    main()
