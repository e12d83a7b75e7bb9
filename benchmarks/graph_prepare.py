"""Graph preparation cost: build + prepare graphs of 128 to 2048 fills on the sim backend.

Three graph shapes, each at 128, 512, 1024 and 2048 nodes:

* ``one_buffer``: every fill writes the same 4 KiB buffer (a chain: each fill depends on
  the one before; all fills land in one compute region).
* ``disjoint``: fill ``i`` writes view ``i % 2048`` of 2048 disjoint 4-byte views, in order
  (no dependencies; the tracker holds up to 2048 segments).
* ``scattered``: the same disjoint views visited in a scattered order, so new segments go
  into the middle of the tracker's sorted list rather than at its end.

For each, ``inferred_us`` is the median time to record the graph and prepare it (regions,
edges inferred by the tracker, access summaries, the backend's per-region programs), and
``explicit_us`` the median time to record the same nodes with preparation skipped: the
difference is what inferring the schedule adds. The two are timed in alternating order
(AB, BA, ...) so drift hits both alike. ``per_node_us`` is ``inferred_us / nodes``; the goal
is that it stays flat from 128 to 2048 nodes and below 10 µs.

Usage: ``python benchmarks/graph_prepare.py [repeats=21] [--json]``
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
import time
from collections.abc import Callable

import anyio

import hrx_async as hrx
from hrx_async._core.memory import Buffer, View

NODE_COUNTS = (128, 512, 1024, 2048)
VIEWS = 2048
BUFFER_BYTES = 4096


def views_for(case: str, buffer: Buffer, wide: Buffer, nodes: int) -> list[View]:
    """The view each fill writes, in recording order."""
    if case == "one_buffer":
        whole = buffer.view()
        return [whole] * nodes
    slots = [wide.view(4 * i, 4) for i in range(VIEWS)]
    if case == "disjoint":
        return [slots[i % VIEWS] for i in range(nodes)]
    # 1031 is prime and coprime with 2048: a fixed permutation that jumps around.
    return [slots[(i * 1031) % VIEWS] for i in range(nodes)]


def timed(action: Callable[[], object]) -> float:
    gc.collect()
    start = time.perf_counter_ns()
    action()
    return (time.perf_counter_ns() - start) / 1000.0


async def main(repeats: int, as_json: bool) -> None:
    async with hrx.Runtime(backend="sim", npu=None, label="graph_prepare") as rt:
        buffer = rt.allocate(BUFFER_BYTES, hrx.GPU_LOCAL, "buffer")
        wide = rt.allocate(4 * VIEWS, hrx.GPU_LOCAL, "wide")
        rows = []
        for case in ("one_buffer", "disjoint", "scattered"):
            for nodes in NODE_COUNTS:
                views = views_for(case, buffer, wide, nodes)

                def record(views: list[View] = views) -> hrx.Graph:
                    graph = rt.graph(f"{len(views)} fills")
                    fill = graph.fill
                    for view in views:
                        fill(view, 0)
                    return graph

                def record_and_prepare(
                    record: Callable[[], hrx.Graph] = record,
                ) -> hrx.PreparedGraph:
                    return record().prepare()

                for _ in range(3):  # warm-up, untimed
                    prepared = record_and_prepare()
                assert len(prepared.nodes) == nodes
                inferred: list[float] = []
                explicit: list[float] = []
                for trial in range(repeats):
                    if trial % 2 == 0:
                        inferred.append(timed(record_and_prepare))
                        explicit.append(timed(record))
                    else:
                        explicit.append(timed(record))
                        inferred.append(timed(record_and_prepare))
                inferred_us = statistics.median(inferred)
                explicit_us = statistics.median(explicit)
                row = {
                    "case": case,
                    "nodes": nodes,
                    "inferred_us": round(inferred_us, 1),
                    "explicit_us": round(explicit_us, 1),
                    "per_node_us": round(inferred_us / nodes, 2),
                    "prepare_per_node_us": round((inferred_us - explicit_us) / nodes, 2),
                }
                rows.append(row)
                if not as_json:
                    print(" ".join(f"{key}={value}" for key, value in row.items()), flush=True)
        # The prepared graph also runs: the last one fills every byte of the wide buffer.
        await prepared.submit()
        if as_json:
            print(json.dumps(rows))


if __name__ == "__main__":
    arguments = [a for a in sys.argv[1:] if a != "--json"]
    anyio.run(main, int(arguments[0]) if arguments else 21, "--json" in sys.argv)
