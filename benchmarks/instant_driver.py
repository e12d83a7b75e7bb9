"""The runtime's own cost per replay, on a stream backend whose driver does nothing.

The `cuda` backend's code (stream queues, fences, sweeps, the scheduler, the tracker) runs
over the tests' host driver table (`tests/backends/test_cuda_stream_logic.py`) with every
per-replay driver call made a no-op: launches, copies, event records and device-side waits
do nothing and every event is finished when asked. What is left is the runtime's own
Python (or compiled code) per replay, measurable on any machine, no GPU needed:

    python benchmarks/instant_driver.py [--loop asyncio|trio] [--replays 4000]
    valgrind --tool=callgrind python benchmarks/instant_driver.py --only window8 --replays N

(instructions per replay: the difference of two runs' totals, N = 1000 and 3000, divided by
the replays between them: 5 x 2000). Workloads: `one`, a 4 KiB fill awaited replay by
replay; `three`, upload -> fill -> download awaited; `window8`, the same kept 8 replays
deep (await the oldest before submitting the next); `tasks64`, 64 tasks each awaiting its
own 1-node graph. Best of five runs, microseconds per replay (per completion for tasks64).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

import hrx_async as hrx
import hrx_async._runtime.session as runtime_module
from hrx_async.backends._stream import StreamBackend
from hrx_async.backends.kernel_cache import KernelCache

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "backends"))
import test_cuda_stream_logic as host_driver  # (the tests' driver table, found just above)


class InlineStream(host_driver.FakeStream):
    """A stream that runs what is put on it at once, on the caller's thread."""

    def __init__(self, table: host_driver.HostTable) -> None:
        self.table = table
        self.capture: list[Any] | None = None

    def put(self, op: Callable[[], None]) -> None:
        if self.capture is not None:
            self.capture.append(op)
        else:
            op()


def instant_table() -> host_driver.HostTable:
    table = host_driver.HostTable()

    def stream_create() -> InlineStream:
        stream = InlineStream(table)
        table.streams[id(stream)] = stream
        return stream

    def nothing(*_: Any) -> None:
        return None

    table.stream_create = stream_create  # type: ignore[method-assign]
    table.stream_destroy = nothing  # type: ignore[method-assign]
    table.event_create = lambda blocking: object()  # type: ignore[method-assign]
    table.event_query = bool  # type: ignore[method-assign]  # (every event is done)
    for name in (
        "event_record",
        "stream_wait_event",
        "graph_launch",
        "memcpy_async",
        "memset_async",
        "event_synchronize",
        "stream_synchronize",
    ):
        setattr(table, name, nothing)
    return table


def three_region(rt: hrx.Runtime, n: int = 4096) -> hrx.PreparedGraph:
    host_in, host_out = rt.allocate(n, hrx.HOST_VISIBLE), rt.allocate(n, hrx.HOST_VISIBLE)
    dev_in, dev_out = rt.allocate(n, hrx.GPU_LOCAL), rt.allocate(n, hrx.GPU_LOCAL)
    graph = rt.graph("three")
    graph.copy(dev_in.view(), host_in.view())
    graph.fill(dev_out.view(), 3)
    graph.copy(host_out.view(), dev_out.view())
    return graph.prepare()


def one_node(rt: hrx.Runtime) -> hrx.PreparedGraph:
    graph = rt.graph("one")
    graph.fill(rt.allocate(4096, hrx.GPU_LOCAL).view(), 1)
    return graph.prepare()


def workload(rt: hrx.Runtime, which: str) -> Callable[[int], Awaitable[None]]:
    if which in ("one", "three"):
        prepared = one_node(rt) if which == "one" else three_region(rt)

        async def awaited(count: int) -> None:
            for _ in range(count):
                await prepared.submit()

        return awaited
    if which == "window8":
        prepared = three_region(rt)

        async def window(count: int) -> None:
            pending: deque[hrx.Completion] = deque()
            for _ in range(count):
                if len(pending) >= 8:
                    await pending.popleft()
                pending.append(prepared.submit())
            while pending:
                await pending.popleft()

        return window
    graphs = [one_node(rt) for _ in range(64)]

    async def tasks(count: int) -> None:
        async def worker(prepared: hrx.PreparedGraph) -> None:
            for _ in range(max(1, count // 64)):
                await prepared.submit()

        async with anyio.create_task_group() as group:
            for prepared in graphs:
                group.start_soon(worker, prepared)

    return tasks


async def measure(names: list[str], replays: int) -> dict[str, float]:
    results = {}
    async with hrx.Runtime(backend="cuda", npu=None, max_submissions=128) as rt:
        for which in names:
            body = workload(rt, which)
            await body(500)
            best = float("inf")
            for _ in range(5):
                started = time.perf_counter()
                await body(replays)
                best = min(best, time.perf_counter() - started)
            results[which] = round(best / replays * 1e6, 2)
    return results


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--loop", default="asyncio", choices=["asyncio", "trio"])
    options.add_argument("--replays", type=int, default=4000)
    options.add_argument("--only", choices=["one", "three", "window8", "tasks64"])
    args = options.parse_args()
    table = instant_table()
    cache = KernelCache(Path(tempfile.mkdtemp()))

    def open_instant(name: str, devices: Any = (0,)) -> tuple[StreamBackend, list[str]]:
        return StreamBackend(table, devices[0], "instant", cache=cache), []

    runtime_module.open_gpu_backend = open_instant  # type: ignore[assignment]
    names = [args.only] if args.only else ["one", "three", "window8", "tasks64"]
    us = anyio.run(measure, names, args.replays, backend=args.loop)
    print(json.dumps({"benchmark": "instant_driver", "loop": args.loop, "us_per_replay": us}))


if __name__ == "__main__":
    main()
