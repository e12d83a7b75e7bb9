"""Latency of `await prepared.submit()` of a one-node graph (4 KiB fill) on CUDA.

Against, in the same process and alternating order: a synchronous
`cudaGraphLaunch + cudaStreamSynchronize` of the same captured fill (the
floor), and `await anyio.to_thread.run_sync(cudaEventSynchronize)` (what a
naive async wrapper costs). Goal: coordinated p50 <= 2.0x the synchronous one.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import anyio
from cuda_common import Direct, check, configure, parser, run, summary

import hrx_async as hrx
from hrx_async.tools.benchmark import paired


async def main(args: argparse.Namespace) -> dict[str, Any]:
    direct = Direct()
    async with hrx.Runtime(backend="cuda", npu=None) as rt:
        settings = configure(rt, args)
        buffer = rt.allocate(4096, hrx.GPU_LOCAL)
        graph = rt.graph("fill-4k")
        graph.fill(buffer.view(), 1)
        prepared = graph.prepare()

        target = direct.malloc(4096)
        stream = direct.stream()
        graph_exec = direct.capture(stream, lambda s: direct.memset(target, 1, 4096, s))
        event = direct.event()
        rt_api = direct.rt

        async def coordinated() -> None:
            await prepared.submit()

        async def synchronous() -> float:
            started = time.perf_counter()
            rt_api.cudaGraphLaunch(graph_exec, stream)
            rt_api.cudaStreamSynchronize(stream)
            return time.perf_counter() - started

        def wait_event() -> None:
            check(rt_api.cudaEventSynchronize(event))

        async def to_thread() -> None:
            rt_api.cudaGraphLaunch(graph_exec, stream)
            rt_api.cudaEventRecord(event, stream)
            await anyio.to_thread.run_sync(wait_event)

        for _ in range(args.warmup):
            await coordinated()
            await synchronous()
            await to_thread()
        versus_sync = await paired(coordinated, synchronous, args.pairs)
        versus_thread = await paired(to_thread, synchronous, max(1, args.pairs // 4))
        stats = rt.statistics()
    return {
        **settings,
        "benchmark": "cuda_latency",
        "work": "1-node graph: 4 KiB fill",
        "pairs": args.pairs,
        "coordinated_us": summary(versus_sync.a_samples),
        "sync_graph_launch_us": summary(versus_sync.b_samples),
        "to_thread_event_sync_us": summary(versus_thread.a_samples),
        "ratio_p50_of_medians": round(versus_sync.a.median / versus_sync.b.median, 3),
        "ratio_median_per_pair": round(versus_sync.ratio.median, 3),
        "to_thread_over_coordinated_p50": round(versus_thread.a.median / versus_sync.a.median, 2),
        "goal": "coordinated p50 <= 2.0x sync graph launch",
        "completions": stats.completions,
    }


if __name__ == "__main__":
    options = parser(__doc__ or "")
    options.add_argument("--pairs", type=int, default=3000)
    options.add_argument("--warmup", type=int, default=300)
    run(main, options.parse_args())
