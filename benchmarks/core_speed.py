"""How fast Python runs on each CPU this process may use, and which one is fastest.

On a virtual machine the host's cores need not run alike: a virtual CPU that shares its
physical core with another guest's busy thread runs interpreted code up to three times
slower, and a benchmark process lands on whichever CPU the scheduler picks. A ratio
between the runtime (host work per replay) and a direct form (mostly driver calls) then
follows the CPU more than the code. This times the same interpreted workload pinned to
each CPU in turn (best of `--tries`), so a run can say which CPUs were slow, and pin its
benchmarks to the fastest (both forms of a pair run in one process, on that CPU):

    taskset -c "$(python3 benchmarks/core_speed.py --fastest)" python3 benchmarks/...
    python3 benchmarks/core_speed.py            # one JSON line: µs per CPU
"""

from __future__ import annotations

import argparse
import json
import os
import time


def workload(rounds: int) -> float:
    """Seconds for `rounds` of attribute, dictionary and call work, like a runtime's."""

    class Node:
        __slots__ = ("next", "value")

        def __init__(self, value: int) -> None:
            self.value = value
            self.next: Node | None = None

    table: dict[int, Node] = {}
    started = time.perf_counter()
    for index in range(rounds):
        node = Node(index)
        table[index & 255] = node
        previous = table.get((index - 1) & 255)
        if previous is not None:
            previous.next = node
            node.value += previous.value & 7
    return time.perf_counter() - started


def speeds(tries: int, rounds: int) -> dict[int, float]:
    """Best µs of the workload on each CPU of this process's affinity."""
    allowed = sorted(os.sched_getaffinity(0))
    result: dict[int, float] = {}
    try:
        for cpu in allowed:
            os.sched_setaffinity(0, {cpu})
            workload(rounds // 10)  # settle on the CPU first
            result[cpu] = round(min(workload(rounds) for _ in range(tries)) * 1e6, 1)
    finally:
        os.sched_setaffinity(0, allowed)
    return result


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--tries", type=int, default=5)
    options.add_argument("--rounds", type=int, default=20000)
    options.add_argument("--fastest", action="store_true", help="print the fastest CPU only")
    args = options.parse_args()
    measured = speeds(args.tries, args.rounds)
    fastest = min(measured, key=measured.__getitem__)
    if args.fastest:
        print(fastest)
        return
    slowest = max(measured.values())
    print(
        json.dumps(
            {
                "benchmark": "core_speed",
                "us_per_cpu": measured,
                "fastest": fastest,
                "slowest_over_fastest": round(slowest / measured[fastest], 3),
            }
        )
    )


if __name__ == "__main__":
    main()
