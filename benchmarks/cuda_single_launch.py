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
import ctypes
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from cuda_common import MIX_CXX, Direct, configure, mix_replay, parser, run, summary

import hrx_async as hrx


def pinned(pointer: int, nbytes: int) -> np.ndarray[Any, Any]:
    """A numpy view of `nbytes` of pinned host memory at `pointer`."""
    return np.frombuffer((ctypes.c_uint8 * nbytes).from_address(pointer), np.uint8)


class DirectReplays:
    """The two direct forms over buffers of their own: three graphs, and one graph."""

    def __init__(self, target: str, n: int, pattern: np.ndarray[Any, Any]) -> None:
        from hrx_async.backends import cuda

        direct = Direct()
        cubin = cuda.compile_cxx(MIX_CXX, "mix", cuda.compile_options(target, {}))
        function = direct.load(cubin, "mix")
        host_in, self.host_out = direct.host_alloc(n), direct.host_alloc(n)
        dev_in, dev_out = direct.malloc(n), direct.malloc(n)
        pinned(host_in, n)[:] = pattern
        self.n = n
        self.streams = [direct.stream() for _ in range(3)]
        self.events = [direct.event() for _ in range(2)]
        arguments = [
            np.array([dev_in], dtype=np.uint64),
            np.array([dev_out], dtype=np.uint64),
            np.array([n], dtype=np.uint32),
        ]

        def upload(stream: Any) -> None:
            direct.memcpy(dev_in, host_in, n, stream)

        def kernel(stream: Any) -> None:
            direct.launch(function, (n // 256, 1, 1), (256, 1, 1), stream, arguments)

        def download(stream: Any) -> None:
            direct.memcpy(self.host_out, dev_out, n, stream)

        def all_three(stream: Any) -> None:
            upload(stream)
            kernel(stream)
            download(stream)

        self.execs = [
            direct.capture(stream, issue)
            for stream, issue in zip(self.streams, (upload, kernel, download), strict=True)
        ]
        self.one_graph = direct.capture(self.streams[1], all_three)
        self.api = direct.rt

    def three_graphs(self) -> None:
        api, streams, events, execs = self.api, self.streams, self.events, self.execs
        api.cudaGraphLaunch(execs[0], streams[0])
        api.cudaEventRecord(events[0], streams[0])
        api.cudaStreamWaitEvent(streams[1], events[0], 0)
        api.cudaGraphLaunch(execs[1], streams[1])
        api.cudaEventRecord(events[1], streams[1])
        api.cudaStreamWaitEvent(streams[2], events[1], 0)
        api.cudaGraphLaunch(execs[2], streams[2])
        api.cudaStreamSynchronize(streams[2])

    def one(self) -> None:
        api, stream = self.api, self.streams[1]
        api.cudaGraphLaunch(self.one_graph, stream)
        api.cudaStreamSynchronize(stream)

    def check(self, expected: np.ndarray[Any, Any]) -> dict[str, bool]:
        """Whether each direct form, run once more on a cleared output, computes `expected`."""
        out = pinned(self.host_out, self.n)
        correct = {}
        for name, way in (("direct", self.three_graphs), ("direct_one_graph", self.one)):
            out[:] = 0
            way()
            correct[name] = bool((out == expected).all())
        return correct


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
        direct = DirectReplays(rt.gpu().target, n, pattern) if args.backend == "cuda" else None
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
