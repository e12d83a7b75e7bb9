"""Single launch: the three-region replay of cuda_replay.py prepared both ways, awaited.

The graph uploads 64 KiB, runs a kernel and downloads the result; each replay
is awaited before the next. Four ways, in one process, in chunks whose order
rotates from chunk to chunk:

* default: `graph.prepare()`: three regions on three lanes (three stream
  submissions, three fences per replay);
* single: `graph.prepare(single_launch=True)`: one region on the compute lane,
  one native graph launch and one fence per replay;
* direct: cuda_replay.py's baseline, three captured graphs on three streams
  chained by events, then `cudaStreamSynchronize`;
* direct_one_graph: the three operations captured into one graph, launched on
  one stream and synchronized: single launch with no coordination at all.

Reports µs per replay of each (mean over all chunks, and the p50/p95 of the
per-replay times), ratios to `direct`, that both prepared graphs and both direct
forms computed the right bytes, and that replay allocated nothing.
`--backend sim` times the two prepared graphs only (no GPU needed), as a check
of the script.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from cuda_common import Direct, DirectMix, configure, mix_replay, parser, run, summary

import hrx_async as hrx


async def main(args: argparse.Namespace) -> dict[str, Any]:
    n = 64 << 10
    pattern = (np.arange(n) % 251).astype(np.uint8)
    expected = (pattern.astype(np.uint32) * 3 + 1).astype(np.uint8)
    async with hrx.Runtime(backend=args.backend, npu=None) as rt:
        settings = configure(rt, args)
        default, default_in, default_out = mix_replay(rt, n, "default")
        single, single_in, single_out = mix_replay(rt, n, "single", single_launch=True)
        for host_in in (default_in, single_in):
            async with host_in.map_write() as memory:
                np.frombuffer(memory, np.uint8)[:] = pattern

        coordinated = {"default": default, "single": single}
        direct = (
            DirectMix(Direct(), rt.gpu().target, n, pattern) if args.backend == "cuda" else None
        )
        uncoordinated: dict[str, Callable[[], None]] = (
            {"direct": direct.three_graphs, "direct_one_graph": direct.one}
            if direct is not None
            else {}
        )
        names = [*coordinated, *uncoordinated]

        async def replays(name: str, count: int, times: list[float] | None) -> None:
            """`count` replays of one way, each timed into `times` unless it is None."""
            clock = time.perf_counter
            prepared = coordinated.get(name)
            if prepared is not None:
                for _ in range(count):
                    begin = clock()
                    await prepared.submit()
                    if times is not None:
                        times.append(clock() - begin)
            else:
                way = uncoordinated[name]
                for _ in range(count):
                    begin = clock()
                    way()
                    if times is not None:
                        times.append(clock() - begin)

        for name in names:
            await replays(name, args.warmup, None)
        before = rt.statistics()
        chunk = args.replays // args.chunks
        samples: dict[str, list[float]] = {name: [] for name in names}
        totals = dict.fromkeys(names, 0.0)
        for index in range(args.chunks):
            shift = index % len(names)
            order = names[shift:] + names[:shift]
            if index % 2:
                order.reverse()
            for name in order:
                started = time.perf_counter()
                await replays(name, chunk, samples[name])
                totals[name] += time.perf_counter() - started
        after = rt.statistics()
        correct: dict[str, bool] = {}
        for name, host_out in (("default", default_out), ("single", single_out)):
            async with host_out.map_read() as memory:
                correct[name] = bool((np.frombuffer(memory, np.uint8) == expected).all())
        if direct is not None:
            correct.update(direct.check(expected))
        regions = {name: len(prepared.regions) for name, prepared in coordinated.items()}
    replays = chunk * args.chunks
    per_replay = {name: round(total / replays * 1e6, 2) for name, total in totals.items()}
    report: dict[str, Any] = {
        **settings,
        "benchmark": "cuda_single_launch",
        "backend": args.backend,
        "work": "upload 64 KiB -> kernel -> download 64 KiB, awaited one replay at a time",
        "replays": replays,
        "regions": regions,
        "us_per_replay": per_replay,
        "per_replay_us": {name: summary(times) for name, times in samples.items()},
        "result_correct": correct,
        "unchanged": (before.allocations, before.imports) == (after.allocations, after.imports),
        "native_graphs_prepared": after.native_graphs_prepared,
        "copy_streams_created": after.copy_streams_created,
    }
    if "direct" in totals:
        base = totals["direct"]
        report["ratio_to_direct"] = {
            name: round(total / base, 3) for name, total in totals.items() if name != "direct"
        }
    report["single_vs_default"] = round(totals["single"] / totals["default"], 3)
    return report


if __name__ == "__main__":
    options = parser(__doc__ or "")
    options.add_argument("--backend", choices=("cuda", "sim"), default="cuda")
    options.add_argument("--replays", type=int, default=10_000, help="per way, in all chunks")
    options.add_argument("--chunks", type=int, default=10)
    options.add_argument("--warmup", type=int, default=200, help="replays of each way first")
    run(main, options.parse_args())
