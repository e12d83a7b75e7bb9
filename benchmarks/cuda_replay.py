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
from cuda_common import Direct, DirectMix, configure, mix_replay, parser, run

import hrx_async as hrx


async def main(args: argparse.Namespace) -> dict[str, Any]:
    n = 64 << 10
    direct = Direct()
    async with hrx.Runtime(backend="cuda", npu=None) as rt:
        settings = configure(rt, args)
        prepared, host_in, host_out = mix_replay(rt, n, "replay")
        pattern = (np.arange(n) % 251).astype(np.uint8)
        async with host_in.map_write() as memory:
            np.frombuffer(memory, np.uint8)[:] = pattern
        direct_replay = DirectMix(direct, rt.gpu().target, n, pattern).three_graphs

        for _ in range(200):
            await prepared.submit()
            direct_replay()
        before = rt.statistics()
        fences_before = finished_by(rt)
        chunk = args.replays // args.chunks
        chunk_ratios: list[float] = []
        coordinated_s = direct_s = 0.0
        for index in range(args.chunks):
            pair = {}
            for which in ("c", "d") if index % 2 == 0 else ("d", "c"):
                started = time.perf_counter()
                if which == "c":
                    for _ in range(chunk):
                        await prepared.submit()
                else:
                    for _ in range(chunk):
                        direct_replay()
                pair[which] = time.perf_counter() - started
            coordinated_s += pair["c"]
            direct_s += pair["d"]
            chunk_ratios.append(round(pair["c"] / pair["d"], 2))
        after = rt.statistics()
        fences = {key: value - fences_before[key] for key, value in finished_by(rt).items()}
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
        # Each chunk's pair on its own (a mode change within the run shows here), and who
        # finished the runtime's fences in the timed part: the loop's sweeps, waiter
        # threads (a stream handed back), or a later fence that waited for them.
        "chunk_ratios": chunk_ratios,
        "fences_finished": fences,
        "native_graphs_prepared": after.native_graphs_prepared,
        "copy_streams_created": after.copy_streams_created,
    }


def finished_by(rt: hrx.Runtime) -> dict[str, int]:
    info = rt._backend_or_raise().describe()
    return {who: int(info[f"fences_finished_by_{who}"]) for who in ("loop", "waiter", "proof")}


if __name__ == "__main__":
    options = parser(__doc__ or "")
    options.add_argument("--replays", type=int, default=10_000)
    options.add_argument("--chunks", type=int, default=10)
    run(main, options.parse_args())
