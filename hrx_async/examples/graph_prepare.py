"""What dependency inference costs when a graph is recorded and prepared.

For 128, 512, 1024 and 2048 nodes: time recording a chain of fills on one 4 KiB buffer
and inferring every edge between them (`Graph.plan`: regions, edges, access summaries),
and, separately, recording the same chain and preparing it (`Graph.prepare`: the plan
plus the backend's programs). The prepared graph then runs once. The heap is collected
and frozen before each timing (`benchmark.quiet_gc`), so a garbage collection owed to an
earlier size does not land in a later one.

usage: graph_prepare
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

from .. import GPU_LOCAL, Runtime
from ..tools.benchmark import quiet_gc
from .common import ExampleFailed, ExampleResult, ExampleSpec, Report, UsageError, main_for

NAME = "graph_prepare"
USAGE = "usage: graph_prepare"
COUNTS = (128, 512, 1024, 2048)
BUFFER_BYTES = 4096


def parse(args: Sequence[str]) -> tuple[int, ...]:
    if args:
        raise UsageError(f"graph_prepare takes no arguments, got {list(args)}")
    return COUNTS


async def run(counts: tuple[int, ...], backend: str, report: Report) -> ExampleResult:
    rows: list[dict[str, int]] = []
    async with Runtime(backend=backend, label=NAME) as rt:
        buffer = rt.allocate(BUFFER_BYTES, GPU_LOCAL, "buffer")
        for count in counts:
            report.progress(f"{count} nodes", force=True)
            with quiet_gc():
                begin = time.perf_counter()
                graph = rt.graph(f"plan{count}")
                for _ in range(count):
                    graph.fill(buffer.view(), 0)
                plan = graph.plan()
                plan_us = int((time.perf_counter() - begin) * 1e6)

            with quiet_gc():
                begin = time.perf_counter()
                graph = rt.graph(f"chain{count}")
                for _ in range(count):
                    graph.fill(buffer.view(), 0)
                prepared = graph.prepare()
                prepare_us = int((time.perf_counter() - begin) * 1e6)

            if len(plan.nodes) != count or len(prepared.nodes) != count:
                raise ExampleFailed(f"planned {len(plan.nodes)} nodes, recorded {count}")
            report.line(f"nodes={count} plan_us={plan_us} prepare_us={prepare_us}")
            rows.append({"nodes": count, "plan_us": plan_us, "prepare_us": prepare_us})
            await prepared.submit()
        backend_name = rt.backend_name
    return ExampleResult({"backend": backend_name, "rows": rows})


SPEC = ExampleSpec(NAME, USAGE, parse, run)


def main(argv: Sequence[str] | None = None) -> int:
    return main_for(SPEC, argv)


if __name__ == "__main__":
    sys.exit(main())
