"""Pipelined replays: the three-region graph of cuda_replay.py with 8 replays in flight.

The graph uploads 64 KiB, runs a kernel and downloads the result (three
regions on three lanes). Coordinated: `prepared.submit()` until 8 replays are
pending, then await the oldest before submitting the next, so the window stays
full. Direct: the same three operations as three captured graphs on three
streams chained by events, 8 replays in flight: each replay records an event
per stage from a ring of 8, and before issuing a replay the host waits
(`cudaEventSynchronize`) only for the replay 8 back.

Every replay writes the same buffers, and hrx_async orders the replays by the
bytes they use: stage i of replay k waits for stage i-1 of replay k (read
after write), and the next replay's upload waits for this replay's kernel,
its kernel for this replay's download (write after read: the upload rewrites
the kernel's input, the kernel the download's source). The direct baseline
waits for the same, so both are equally correct; `--no-war-waits` drops the
write-after-read waits from the direct baseline (racy, for comparison).

N replays in alternating chunks; each chunk ends with its window drained.
Reports replays/s of both and coordinated/direct throughput (goal >= 0.9),
and checks the final output of both.
"""

from __future__ import annotations

import argparse
import time
from collections import deque
from typing import Any

import numpy as np
from cuda_common import Direct, DirectMix, configure, mix_replay, parser, pinned, run

import hrx_async as hrx


async def main(args: argparse.Namespace) -> dict[str, Any]:
    n = 64 << 10
    window = args.window
    pattern = (np.arange(n) % 251).astype(np.uint8)
    expected = (pattern.astype(np.uint32) * 3 + 1).astype(np.uint8)
    direct = Direct()
    async with hrx.Runtime(backend="cuda", npu=None, max_submissions=max(64, window)) as rt:
        prepared, host_in, host_out = mix_replay(rt, n, "pipeline")
        async with host_in.map_write() as memory:
            np.frombuffer(memory, np.uint8)[:] = pattern

        mix = DirectMix(direct, rt.gpu().target, n, pattern)
        streams, execs = mix.streams, mix.execs
        # One ring of `window` events per stage: stage i of replay k records ring[i][k % window].
        rings = [[direct.event() for _ in range(window)] for _ in range(3)]
        settings = configure(rt, args)
        rt_api = direct.rt
        launch, record = rt_api.cudaGraphLaunch, rt_api.cudaEventRecord
        wait, event_sync = rt_api.cudaStreamWaitEvent, rt_api.cudaEventSynchronize
        s_up, s_mix, s_down = streams
        e_up, e_mix, e_down = rings
        x_up, x_mix, x_down = execs
        war_waits = not args.no_war_waits
        issued = 0

        def direct_chunk(count: int) -> None:
            """`count` replays, `window` in flight, then drain."""
            nonlocal issued
            for index in range(count):
                slot = issued % window
                previous = (issued - 1) % window
                if index >= window:
                    event_sync(e_down[slot])  # the replay `window` back
                if war_waits:
                    wait(s_up, e_mix[previous], 0)  # upload k rewrites what kernel k-1 reads
                launch(x_up, s_up)
                record(e_up[slot], s_up)
                wait(s_mix, e_up[slot], 0)
                if war_waits:
                    wait(s_mix, e_down[previous], 0)  # kernel k rewrites what download k-1 reads
                launch(x_mix, s_mix)
                record(e_mix[slot], s_mix)
                wait(s_down, e_mix[slot], 0)
                launch(x_down, s_down)
                record(e_down[slot], s_down)
                issued += 1
            # Every stage of every replay comes before the last download.
            rt_api.cudaStreamSynchronize(s_down)

        async def coordinated_chunk(count: int) -> None:
            """`count` replays, `window` in flight, then drain."""
            pending: deque[hrx.Completion] = deque()
            for _ in range(count):
                if len(pending) >= window:
                    await pending.popleft()
                pending.append(prepared.submit())
            while pending:
                await pending.popleft()

        for _ in range(args.warmup // 50 or 1):
            await coordinated_chunk(50)
            direct_chunk(50)
        # Clear both outputs so the checks below see what the measured replays wrote.
        async with host_out.map_write() as memory:
            np.frombuffer(memory, np.uint8)[:] = 0
        pinned(mix.host_out, n)[:] = 0

        before = rt.statistics()
        chunk = max(window, args.replays // args.chunks)
        coordinated_s = direct_s = 0.0
        chunk_ratios = []
        for index in range(args.chunks):
            seconds = {}
            for which in ("c", "d") if index % 2 == 0 else ("d", "c"):
                started = time.perf_counter()
                if which == "c":
                    await coordinated_chunk(chunk)
                else:
                    direct_chunk(chunk)
                seconds[which] = time.perf_counter() - started
            coordinated_s += seconds["c"]
            direct_s += seconds["d"]
            chunk_ratios.append(round(seconds["d"] / seconds["c"], 3))
        after = rt.statistics()
        async with host_out.map_read() as memory:
            correct = bool((np.frombuffer(memory, np.uint8) == expected).all())
        direct_correct = bool((pinned(mix.host_out, n) == expected).all())
    replays = chunk * args.chunks
    coordinated_rate = replays / coordinated_s
    direct_rate = replays / direct_s
    return {
        **settings,
        "benchmark": "cuda_pipeline",
        "work": f"upload 64 KiB -> kernel -> download 64 KiB, {window} replays in flight",
        "replays": replays,
        "chunks": args.chunks,
        "window": window,
        "direct_war_waits": war_waits,
        "coordinated_replays_per_s": round(coordinated_rate),
        "direct_replays_per_s": round(direct_rate),
        "coordinated_us_per_replay": round(coordinated_s / replays * 1e6, 2),
        "direct_us_per_replay": round(direct_s / replays * 1e6, 2),
        "throughput_ratio": round(coordinated_rate / direct_rate, 3),
        "chunk_ratios": chunk_ratios,
        "goal": "coordinated/direct throughput >= 0.9",
        "result_correct": correct,
        "direct_result_correct": direct_correct,
        "allocations": [before.allocations, after.allocations],
        "imports": [before.imports, after.imports],
        "completions": after.completions - before.completions,
    }


if __name__ == "__main__":
    options = parser(__doc__ or "")
    options.add_argument("--replays", type=int, default=8000)
    options.add_argument("--chunks", type=int, default=10)
    options.add_argument("--window", type=int, default=8, help="replays in flight")
    options.add_argument("--warmup", type=int, default=200)
    options.add_argument(
        "--no-war-waits",
        action="store_true",
        help="direct baseline without the write-after-read waits between replays (racy)",
    )
    run(main, options.parse_args())
