"""Replay allocates nothing: statistics `allocations` and `imports` over 10,000 replays.

The graph uploads 64 KiB, runs a kernel and downloads the result (three
regions on three lanes). The counters are read before and after the replays;
the time per replay is compared with the same three operations done directly
(three captured graphs on three streams chained by events, then synchronized),
in alternating chunks.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
from cuda_common import MIX_CXX, Direct, configure, mix_replay, parser, run

import hrx_async as hrx
from hrx_async.backends import cuda


async def main(args: argparse.Namespace) -> dict[str, Any]:
    n = 64 << 10
    direct = Direct()
    async with hrx.Runtime(backend="cuda", npu=None) as rt:
        settings = configure(rt, args)
        prepared, host_in, host_out = mix_replay(rt, n, "replay")
        async with host_in.map_write() as memory:
            np.frombuffer(memory, np.uint8)[:] = np.arange(n) % 251

        cubin = cuda.compile_cxx(MIX_CXX, "mix", cuda.compile_options(rt.gpu().target, {}))
        function = direct.load(cubin, "mix")
        d_host_in, d_host_out = direct.host_alloc(n), direct.host_alloc(n)
        d_in, d_out = direct.malloc(n), direct.malloc(n)
        streams = [direct.stream() for _ in range(3)]
        events = [direct.event() for _ in range(2)]
        args_in = np.array([d_in], dtype=np.uint64)
        args_out = np.array([d_out], dtype=np.uint64)
        args_n = np.array([n], dtype=np.uint32)
        execs = [
            direct.capture(streams[0], lambda s: direct.memcpy(d_in, d_host_in, n, s)),
            direct.capture(
                streams[1],
                lambda s: direct.launch(
                    function, (n // 256, 1, 1), (256, 1, 1), s, [args_in, args_out, args_n]
                ),
            ),
            direct.capture(streams[2], lambda s: direct.memcpy(d_host_out, d_out, n, s)),
        ]
        rt_api = direct.rt

        def direct_replay() -> None:
            rt_api.cudaGraphLaunch(execs[0], streams[0])
            rt_api.cudaEventRecord(events[0], streams[0])
            rt_api.cudaStreamWaitEvent(streams[1], events[0], 0)
            rt_api.cudaGraphLaunch(execs[1], streams[1])
            rt_api.cudaEventRecord(events[1], streams[1])
            rt_api.cudaStreamWaitEvent(streams[2], events[1], 0)
            rt_api.cudaGraphLaunch(execs[2], streams[2])
            rt_api.cudaStreamSynchronize(streams[2])

        for _ in range(200):
            await prepared.submit()
            direct_replay()
        before = rt.statistics()
        chunk = args.replays // args.chunks
        coordinated_s = direct_s = 0.0
        for index in range(args.chunks):
            for which in ("c", "d") if index % 2 == 0 else ("d", "c"):
                started = time.perf_counter()
                if which == "c":
                    for _ in range(chunk):
                        await prepared.submit()
                    coordinated_s += time.perf_counter() - started
                else:
                    for _ in range(chunk):
                        direct_replay()
                    direct_s += time.perf_counter() - started
        after = rt.statistics()
        async with host_out.map_read() as memory:
            expected = ((np.arange(n) % 251) * 3 + 1).astype(np.uint8)
            correct = bool((np.frombuffer(memory, np.uint8) == expected).all())
    replays = chunk * args.chunks
    return {
        **settings,
        "benchmark": "cuda_replay",
        "work": "upload 64 KiB -> kernel -> download 64 KiB, awaited one replay at a time",
        "replays": replays,
        "allocations": [before.allocations, after.allocations],
        "imports": [before.imports, after.imports],
        "live_bytes": [before.live_bytes, after.live_bytes],
        "unchanged": (before.allocations, before.imports) == (after.allocations, after.imports),
        "result_correct": correct,
        "coordinated_us_per_replay": round(coordinated_s / replays * 1e6, 2),
        "direct_us_per_replay": round(direct_s / replays * 1e6, 2),
        "ratio": round(coordinated_s / direct_s, 3),
        "native_graphs_prepared": after.native_graphs_prepared,
        "copy_streams_created": after.copy_streams_created,
    }


if __name__ == "__main__":
    options = parser(__doc__ or "")
    options.add_argument("--replays", type=int, default=10_000)
    options.add_argument("--chunks", type=int, default=10)
    run(main, options.parse_args())
