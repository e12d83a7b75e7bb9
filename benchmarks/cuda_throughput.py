"""Tiny graphs from 64 concurrent tasks: completions per second and event-loop lag.

Each task replays its own one-node graph (a 256-byte fill of its own buffer)
and awaits it, again and again, for a fixed time; a `LoopLag` ticker measures
how late the loop wakes meanwhile. The direct baseline replays the same kind
of captured fill with `cudaGraphLaunch + cudaStreamSynchronize` from one
thread for the same time. Phases alternate. Goal: >= 40,000 completions/s with
loop-lag p99 <= 2 ms.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import anyio
from cuda_common import Direct, configure, parser, run

import hrx_async as hrx
from hrx_async.tools.benchmark import LoopLag


async def main(args: argparse.Namespace) -> dict[str, Any]:
    direct = Direct()
    async with hrx.Runtime(backend="cuda", npu=None, max_submissions=max(64, args.tasks)) as rt:
        settings = configure(rt, args)
        buffers = [rt.allocate(256, hrx.GPU_LOCAL) for _ in range(args.tasks)]
        prepared = []
        for buffer in buffers:
            graph = rt.graph("tiny")
            graph.fill(buffer.view(), 1)
            prepared.append(graph.prepare())

        target = direct.malloc(256)
        stream = direct.stream()
        graph_exec = direct.capture(stream, lambda s: direct.memset(target, 1, 256, s))
        rt_api = direct.rt

        async def coordinated_phase(seconds: float) -> tuple[float, float]:
            count = 0
            deadline = time.perf_counter() + seconds

            async def worker(graph: hrx.PreparedGraph) -> None:
                nonlocal count
                while time.perf_counter() < deadline:
                    await graph.submit()
                    count += 1

            started = time.perf_counter()
            async with LoopLag(0.001) as lag, anyio.create_task_group() as tasks:
                for graph in prepared:
                    tasks.start_soon(worker, graph)
            elapsed = time.perf_counter() - started
            return count / elapsed, lag.p99_ms

        def direct_phase(seconds: float) -> float:
            count = 0
            started = time.perf_counter()
            deadline = started + seconds
            while time.perf_counter() < deadline:
                rt_api.cudaGraphLaunch(graph_exec, stream)
                rt_api.cudaStreamSynchronize(stream)
                count += 1
            return count / (time.perf_counter() - started)

        await coordinated_phase(0.5)
        direct_phase(0.2)
        rates, lags, direct_rates = [], [], []
        for round_ in range(args.rounds):
            if round_ % 2:
                direct_rates.append(direct_phase(args.seconds))
            rate, lag = await coordinated_phase(args.seconds)
            rates.append(rate)
            lags.append(lag)
            if not round_ % 2:
                direct_rates.append(direct_phase(args.seconds))
        stats = rt.statistics()
    rates.sort()
    return {
        **settings,
        "benchmark": "cuda_throughput",
        "work": f"{args.tasks} tasks, each awaiting replays of its own 256-byte fill graph",
        "rounds": args.rounds,
        "seconds_per_round": args.seconds,
        "completions_per_s": [round(r) for r in rates],
        "completions_per_s_median": round(rates[len(rates) // 2]),
        "loop_lag_p99_ms": [round(lag, 3) for lag in lags],
        "loop_lag_p99_ms_worst": round(max(lags), 3),
        "direct_sync_replays_per_s": [round(r) for r in direct_rates],
        "completions": stats.completions,
        "goal": ">= 40000 completions/s, loop lag p99 <= 2 ms",
    }


if __name__ == "__main__":
    options = parser(__doc__ or "")
    options.add_argument("--tasks", type=int, default=64)
    options.add_argument("--seconds", type=float, default=2.0)
    options.add_argument("--rounds", type=int, default=4)
    run(main, options.parse_args())
