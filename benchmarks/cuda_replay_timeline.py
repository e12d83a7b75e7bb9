"""When each part of an awaited replay happens, timed from outside, for a small and a large
region of the same shape (fill + device copy over 4 KiB and over `--mib` MiB).

Per replay: how long `submit()` takes to return, when the first region started (the
completion's `started_at`) and when the completion resolved, each from the call, then how
long the awaiting task took to resume; next to it, the same CUDA work done directly:
`cudaGraphLaunch`, `cudaEventRecord`, one `cudaEventQuery` while the work runs, then
`cudaStreamSynchronize`. Medians in µs, and who finished the fences (the loop's sweeps or a
waiter thread). Works on the compiled build (nothing is patched).

    python benchmarks/cuda_replay_timeline.py [--mib 256] [--replays 400]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from cuda_common import Direct, configure, fill_copy, parser, run

import hrx_async as hrx


def us(values: list[float]) -> float:
    return round(statistics.median(values) * 1e6, 2)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    direct = Direct()
    api = direct.rt
    rows = []
    async with hrx.Runtime(backend="cuda", npu=None) as rt:
        settings = configure(rt, args)
        for nbytes in (4096, args.mib << 20):
            prepared, graph_exec, stream = fill_copy(rt, direct, nbytes)
            event = direct.event()
            times: dict[str, list[float]] = {
                name: []
                for name in (
                    "submit_returns",
                    "started",
                    "resolved",
                    "resumed_after_resolve",
                    "total",
                    "direct_launch",
                    "direct_record",
                    "direct_query",
                    "direct_total",
                )
            }
            for index in range(args.replays + 30):
                t0 = time.perf_counter()
                completion = prepared.submit()
                t1 = time.perf_counter()
                await completion
                t2 = time.perf_counter()
                d0 = time.perf_counter()
                api.cudaGraphLaunch(graph_exec, stream)
                d1 = time.perf_counter()
                api.cudaEventRecord(event, stream)
                d2 = time.perf_counter()
                api.cudaEventQuery(event)
                d3 = time.perf_counter()
                api.cudaStreamSynchronize(stream)
                d4 = time.perf_counter()
                if index < 30:
                    continue  # warm-up
                finished = completion.finished_at
                assert finished is not None
                times["submit_returns"].append(t1 - t0)
                times["started"].append((completion.started_at or t0) - t0)
                times["resolved"].append(finished - t0)
                times["resumed_after_resolve"].append(t2 - finished)
                times["total"].append(t2 - t0)
                times["direct_launch"].append(d1 - d0)
                times["direct_record"].append(d2 - d1)
                times["direct_query"].append(d3 - d2)
                times["direct_total"].append(d4 - d0)
            row: dict[str, Any] = {"bytes": nbytes}
            row.update({f"{name}_us": us(values) for name, values in times.items()})
            rows.append(row)
        info = rt._backend_or_raise().describe()
    return {
        **settings,
        "benchmark": "cuda_replay_timeline",
        "work": "fill + device copy, one region, awaited one replay at a time",
        "replays": args.replays,
        "rows": rows,
        "fences_finished_by_loop": info.get("fences_finished_by_loop"),
        "fences_finished_by_waiter": info.get("fences_finished_by_waiter"),
    }


if __name__ == "__main__":
    options = parser(__doc__ or "")
    options.add_argument("--mib", type=int, default=256)
    options.add_argument("--replays", type=int, default=400)
    run(main, options.parse_args())
