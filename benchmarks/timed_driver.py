"""How soon the runtime notices the end of a long region, on any machine, no GPU needed.

The `cuda` backend's code runs over the host driver table of `instant_driver.py`, except
that an event finishes `--region-us` after it is recorded (a query answers by the clock).
Each replay of a 1-node graph is awaited, then the loop is polled by hand for as long
and the thread waits three times as long, as `cuda_long_region.py`'s other ways take
their turns on a GPU. Medians, in µs from the moment the region's event finished: the
last query that answered "not ready" (negative: before the end), the first that answered
"ready", the completion resolving and the awaiting task resuming; how many queries a
replay made, the gap between the last "not ready" and the first "ready" query against the
gap between queries while the region runs (a loop pass; much less where a spin caught the
end, `QueueWatch.spin_near_end`) and the watch's smoothed loop pass at the end.

    python benchmarks/timed_driver.py [--loop asyncio|trio] [--region-us 200] [--replays 1000]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from instant_driver import instant_table, one_node
from query_answers import QueryAnswers, us

import hrx_async as hrx
import hrx_async._runtime.session as runtime_module
from hrx_async._build import build
from hrx_async.backends._stream import StreamBackend
from hrx_async.backends.kernel_cache import KernelCache


class TimedEvent:
    """An event that finishes at `done_at` (perf_counter seconds), once recorded."""

    __slots__ = ("done_at",)

    def __init__(self) -> None:
        self.done_at = float("inf")


class Queries:
    """The answers of the queries of the replay under way, with their times."""

    def __init__(self) -> None:
        self.answers: list[tuple[float, bool]] = []
        self.last: TimedEvent | None = None


def timed_backend(region_s: float, queries: Queries) -> None:
    """Make `Runtime(backend="cuda")` open a stream backend over the timed driver."""
    table = instant_table()

    def record(event: TimedEvent, stream: Any) -> None:
        event.done_at = time.perf_counter() + region_s
        queries.last = event

    def query(event: TimedEvent) -> bool:
        now = time.perf_counter()
        done = now >= event.done_at
        queries.answers.append((now, done))
        return done

    def synchronize(event: TimedEvent) -> None:
        while time.perf_counter() < event.done_at:
            pass

    table.event_create = lambda blocking: TimedEvent()  # type: ignore[method-assign]
    table.event_record = record  # type: ignore[method-assign]
    table.event_query = query  # type: ignore[method-assign]
    table.event_synchronize = synchronize  # type: ignore[method-assign]
    cache = KernelCache(Path(tempfile.mkdtemp()))

    def open_timed(name: str, devices: Any = (0,)) -> tuple[StreamBackend, list[str]]:
        return StreamBackend(table, devices[0], "timed", cache=cache), []

    runtime_module.open_gpu_backend = open_timed  # type: ignore[assignment]


async def measure(args: argparse.Namespace, queries: Queries) -> dict[str, Any]:
    region_s = args.region_us * 1e-6
    if args.loop == "trio":
        import trio

        yield_once = trio.lowlevel.checkpoint
    else:
        import asyncio

        async def yield_once() -> None:
            await asyncio.sleep(0)

    answers = QueryAnswers()
    moments: dict[str, list[float]] = {
        "last_not_ready": answers.last_not_ready,
        "first_ready": answers.first_ready,
        "resolved": [],
        "resumed": [],
    }
    async with hrx.Runtime(backend="cuda", npu=None) as rt:
        watch = rt._scheduler_or_raise().watch
        prepared = one_node(rt)
        for index in range(args.warmup + args.replays):
            queries.answers.clear()
            completion = prepared.submit()
            await completion
            resumed = time.perf_counter()
            if index >= args.warmup:
                assert queries.last is not None and completion.finished_at is not None
                end = queries.last.done_at
                answers.add(queries.answers, end, watch.pass_cost)
                moments["resolved"].append(completion.finished_at - end)
                moments["resumed"].append(resumed - end)
            until = time.perf_counter() + region_s
            while time.perf_counter() < until:
                await yield_once()
            until = time.perf_counter() + 3 * region_s
            while time.perf_counter() < until:
                pass
    return {
        "benchmark": "timed_driver",
        "loop": args.loop,
        "region_us": args.region_us,
        "replays": args.replays,
        "from_the_end_us": {name: us(values) for name, values in moments.items() if values},
        **answers.summary(),
        "build": build()["kind"],
    }


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--loop", default="asyncio", choices=["asyncio", "trio"])
    options.add_argument("--region-us", type=float, default=200.0)
    options.add_argument("--replays", type=int, default=1000)
    options.add_argument("--warmup", type=int, default=200)
    args = options.parse_args()
    queries = Queries()
    timed_backend(args.region_us * 1e-6, queries)
    report = anyio.run(measure, args, queries, backend=args.loop)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
