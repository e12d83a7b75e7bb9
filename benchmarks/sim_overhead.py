"""Per-region scheduling overhead on the sim backend.

Chains of 1, 4 and 16 dependent tiny regions (each a separate submission of a
one-kernel graph on the same bytes) against calling the same numpy function
directly in a worker thread, in alternating order; then 64 concurrent
submitters of tiny graphs with the event-loop lag measured by a ticker task,
once as is and once after `gc.freeze()`.

Under heavy load the lag tail is set by CPython's full garbage collections
(their cost grows with every object the process holds). Freezing the heap
after start-up (`gc.collect(); gc.freeze()`), as latency-sensitive services
do, leaves the collector only the objects made since.

    python benchmarks/sim_overhead.py [--pairs 200] [--seconds 3] [--loop asyncio|trio]
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from typing import Any

import anyio
import numpy as np

import hrx_async as hrx
from hrx_async.tools.benchmark import LoopLag, paired


def _bump(arrays: list[np.ndarray[Any, Any]], constants: bytes) -> None:
    arrays[0][:8] += 1


async def chains(rt: hrx.Runtime, pairs: int) -> list[dict[str, Any]]:
    buffer = rt.allocate(64, hrx.HOST_VISIBLE)
    direct_array = np.zeros(64, np.uint8)
    kernel = rt.load_gpu_kernel(
        hrx.KernelSource(host=_bump),
        "bump",
        (1,),
        (64,),
        hrx.KernelContract([hrx.Binding(64, hrx.Access.READ_WRITE)]),
    )
    graph = rt.graph("bump")
    graph.gpu(kernel, [buffer.view()])
    step = graph.prepare()
    rows = []
    for length in (1, 4, 16):

        async def coordinated(length: int = length) -> None:
            pending = [step.submit() for _ in range(length)]
            await pending[-1]
            for completion in pending:
                completion.result()

        async def direct(length: int = length) -> None:
            def work() -> None:
                for _ in range(length):
                    _bump([direct_array], b"")

            await anyio.to_thread.run_sync(work)

        for _ in range(20):
            await coordinated()
            await direct()
        result = await paired(coordinated, direct, pairs)
        added_us = (result.a.median - result.b.median) / length * 1e6
        rows.append(
            {
                "chain": length,
                "coordinated_p50_us": round(result.a.median * 1e6, 1),
                "direct_thread_p50_us": round(result.b.median * 1e6, 1),
                "ratio_p50": round(result.ratio.median, 3),
                "added_us_per_region": round(added_us, 1),
            }
        )
    return rows


async def concurrent(rt: hrx.Runtime, tasks: int, seconds: float) -> dict[str, Any]:
    prepared = []
    for index in range(tasks):
        buffer = rt.allocate(64, hrx.HOST_VISIBLE)
        graph = rt.graph(f"tiny{index}")
        graph.fill(buffer.view(), index % 256)
        prepared.append(graph.prepare())
    counts = [0] * tasks
    stop = time.perf_counter() + seconds

    async def submitter(index: int) -> None:
        step = prepared[index]
        while time.perf_counter() < stop:
            await step.submit()
            counts[index] += 1

    async with LoopLag() as lag:
        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for index in range(tasks):
                tg.start_soon(submitter, index)
        elapsed = time.perf_counter() - start
    lags = lag.distribution()
    return {
        "submitters": tasks,
        "regions_per_s": round(sum(counts) / elapsed),
        "loop_lag_p50_ms": round(lags.median, 3),
        "loop_lag_p99_ms": round(lag.p99_ms, 3),
        "loop_lag_max_ms": round(lags.max, 3),
    }


async def main(args: argparse.Namespace) -> None:
    async with hrx.Runtime(backend="sim") as rt:
        for row in await chains(rt, args.pairs):
            print(" ".join(f"{k}={v}" for k, v in row.items()))
        row = await concurrent(rt, 64, args.seconds)
        print("gc=default", " ".join(f"{k}={v}" for k, v in row.items()))
        gc.collect()
        gc.freeze()
        row = await concurrent(rt, 64, args.seconds)
        gc.unfreeze()
        print("gc=frozen", " ".join(f"{k}={v}" for k, v in row.items()))
        if args.json:
            print(json.dumps(rt.statistics().to_dict()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--loop", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("--json", action="store_true")
    arguments = parser.parse_args()
    anyio.run(main, arguments, backend=arguments.loop)
