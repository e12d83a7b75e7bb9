"""Where the time of one awaited replay goes, on the CUDA backend.

Timestamps are taken at four points of each `await prepared.submit()`: entry,
the driver table's graph launch, the moment a fence is marked finished, and
the moment the completion resolves. Two graphs: a 4 KiB fill (latency-bound)
and a 256 MiB fill + copy (about 200 µs of device work). Medians, in µs,
next to the same work done as `cudaGraphLaunch + cudaStreamSynchronize`.
The timestamps wrap internal methods, which adds a few tenths of a µs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from cuda_common import Direct, configure, parser, run

import hrx_async as hrx
from hrx_async._runtime import completion as completion_module
from hrx_async.backends import _stream_fences

STAMPS: dict[str, float] = {}


def _stamp_methods() -> None:
    mark = _stream_fences.StreamFence._mark
    resolve = completion_module.Completion._resolve

    def stamped_mark(self: Any, *args: Any) -> Any:
        STAMPS["finished"] = time.perf_counter()
        return mark(self, *args)

    def stamped_resolve(self: Any, error: Any) -> None:
        STAMPS["resolved"] = time.perf_counter()
        resolve(self, error)

    _stream_fences.StreamFence._mark = stamped_mark  # type: ignore[method-assign]
    completion_module.Completion._resolve = stamped_resolve  # type: ignore[method-assign]


PHASES = (
    "submit entry -> launch",
    "launch -> submit returns",
    "launch -> fence finished",
    "fence finished -> resolved",
    "resolved -> task resumed",
    "total",
)


async def measure(
    rt: hrx.Runtime, direct: Direct, nbytes: int, copy: bool, samples: int
) -> dict[str, Any]:
    calls = rt._backend_or_raise().table.replay_calls  # type: ignore[attr-defined]
    launch = calls.graph_launch_call

    def stamped_launch(graph_exec: Any, stream: Any) -> Any:
        STAMPS["launch"] = time.perf_counter()
        return launch(graph_exec, stream)

    calls.graph_launch_call = stamped_launch
    a = rt.allocate(nbytes, hrx.GPU_LOCAL)
    b = rt.allocate(nbytes, hrx.GPU_LOCAL)
    graph = rt.graph("breakdown")
    graph.fill(a.view(), 3)
    if copy:
        graph.copy(b.view(), a.view())
    prepared = graph.prepare()

    da, db = direct.malloc(nbytes), direct.malloc(nbytes)
    stream = direct.stream()

    def issue(s: Any) -> None:
        direct.memset(da, 3, nbytes, s)
        if copy:
            direct.memcpy(db, da, nbytes, s)

    graph_exec = direct.capture(stream, issue)
    rt_api = direct.rt
    for _ in range(50):
        await prepared.submit()
    rows: list[tuple[float, ...]] = []
    direct_total: list[float] = []
    direct_launch: list[float] = []
    for _ in range(samples):
        entered = time.perf_counter()
        completion = prepared.submit()
        returned = time.perf_counter()
        await completion
        resumed = time.perf_counter()
        launched, finished, resolved = STAMPS["launch"], STAMPS["finished"], STAMPS["resolved"]
        rows.append(
            (
                launched - entered,
                returned - launched,
                finished - launched,
                resolved - finished,
                resumed - resolved,
                resumed - entered,
            )
        )
        started = time.perf_counter()
        rt_api.cudaGraphLaunch(graph_exec, stream)
        issued = time.perf_counter()
        rt_api.cudaStreamSynchronize(stream)
        direct_total.append(time.perf_counter() - started)
        direct_launch.append(issued - started)
    calls.graph_launch_call = launch
    result = {
        name: round(statistics.median(row[i] for row in rows) * 1e6, 2)
        for i, name in enumerate(PHASES)
    }
    result["direct total"] = round(statistics.median(direct_total) * 1e6, 2)
    result["direct launch call"] = round(statistics.median(direct_launch) * 1e6, 2)
    return result


async def main(args: argparse.Namespace) -> dict[str, Any]:
    _stamp_methods()
    direct = Direct()
    async with hrx.Runtime(backend="cuda", npu=None) as rt:
        settings = configure(rt, args)
        small = await measure(rt, direct, 4096, False, args.samples)
        large = await measure(rt, direct, args.mib << 20, True, max(1, args.samples // 8))
    return {
        **settings,
        "benchmark": "cuda_breakdown",
        "us_median_4KiB_fill": small,
        f"us_median_{args.mib}MiB_fill_copy": large,
    }


if __name__ == "__main__":
    options = parser(__doc__ or "")
    options.add_argument("--samples", type=int, default=3000)
    options.add_argument("--mib", type=int, default=256)
    run(main, options.parse_args())
