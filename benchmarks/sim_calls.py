"""Python function calls on the event-loop thread per awaited replay, on the sim backend.

The count is what cProfile reports: `pstats.Stats.total_calls` (Python functions
and builtins alike, the "N function calls" line of a cProfile report) over the
profiled replays, divided by the number of replays. cProfile hooks only the
thread that enables it, here the loop thread, so the sim backend's worker
threads are not counted; everything the loop does for a replay is (the
runtime, the awaiting task, the loop's own scheduling and selector calls).

cProfile also counts each resumption of every coroutine frame on the awaiting
stack as a call, so the replay loop is the top coroutine of a task of its own,
as an application's task would be; every extra wrapper coroutine around the loop
would add a call per wake-up (2 per replay of the 1-node graph for two wrappers).

Scenarios, each warmed up first (every lane, pool and cache in use), then profiled
`--repeat` times over `--replays` replays; the figure is the median of those runs:

* one_node: `await prepared.submit()` of a 4 KiB fill of a GPU_LOCAL buffer.
* three_region: upload -> fill -> download of 64 KiB (a HOST_VISIBLE -> GPU_LOCAL
  copy, a fill of the GPU buffer, a GPU_LOCAL -> HOST_VISIBLE copy): three regions on
  the upload, compute and download lanes, awaited one replay at a time.
* three_region_8_in_flight: 8 `submit()`s of that same prepared graph, then all 8
  awaited, again and again. Every replay uses the same bytes, so each is ordered
  after the one before it.
* three_region_8_window (reported besides the three): the same graph kept 8 replays
  deep, as cuda_pipeline.py does: submit until 8 are pending, then await the oldest
  before submitting the next.

Which form the quoted "308 per 3-region replay with 8 in flight" meant is not
written down. Eight graphs over separate buffers, in either form, give about 200
on asyncio (nothing waits on another replay's bytes), far from 308, so it was one
graph. Of the two forms of one graph, the batch (about 270-310 here) is the one
"submit 8, await them all" describes and the steadier of the two; the window
(about 310-440) depends much more on thread scheduling. So the batch is the
headline and the window is reported next to it.

Figures on the sim backend with Python 3.11, asyncio: 116 / 243-252 / 270-310 (the
quoted ones are 115 / 243 / 308); trio: 187 / 313-347 / 355-390. The 1-node count is
exactly repeatable. The 3-region ones are not: whether a replay's work is already
done when the loop looks decides how many polls and wake-ups it takes, and that
depends on when the worker threads get the GIL, so they move between runs (most
with 8 in flight). Compare medians, and treat a change inside the reported range as
noise.

The stream backend over a host driver table (the one test_cuda_stream_logic.py
drives) is not offered: that table lives in a test module and is wired in by
monkeypatching the runtime, which a benchmark should not do.

    python benchmarks/sim_calls.py [--loop asyncio|uvloop|trio] [--replays 2000] [--top 15]
    python benchmarks/sim_calls.py --json
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import sys
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

import hrx_async as hrx

IN_FLIGHT = 8
SCENARIOS = ("one_node", "three_region", "three_region_8_in_flight", "three_region_8_window")
WHAT = {
    "one_node": "await submit() of a 4 KiB GPU_LOCAL fill",
    "three_region": "await submit() of upload -> fill -> download, 64 KiB",
    "three_region_8_in_flight": f"{IN_FLIGHT} submit() of that graph, then await all",
    "three_region_8_window": f"that graph kept {IN_FLIGHT} deep (await the oldest)",
}


def _three_region(rt: hrx.Runtime, n: int) -> hrx.PreparedGraph:
    host_in = rt.allocate(n, hrx.HOST_VISIBLE)
    host_out = rt.allocate(n, hrx.HOST_VISIBLE)
    device = rt.allocate(n, hrx.GPU_LOCAL)
    graph = rt.graph("upload-fill-download")
    graph.copy(device.view(), host_in.view())
    graph.fill(device.view(), 1)
    graph.copy(host_out.view(), device.view())
    return graph.prepare()


def _where(key: tuple[str, int, str]) -> str:
    filename, line, name = key
    if filename == "~":  # builtins: cProfile names them "<built-in method ...>"
        return name
    parts = filename.replace(os.sep, "/").split("/")
    if "hrx_async" in parts:
        short = "/".join(parts[len(parts) - parts[::-1].index("hrx_async") - 1 :])
    else:  # the package as well as the file: several packages have an __init__.py
        short = "/".join(parts[-2:])
    return f"{short}:{line}({name})"


def _top(stats: pstats.Stats, replays: int, k: int) -> list[dict[str, Any]]:
    table: dict[tuple[str, int, str], tuple[int, int, float, float, Any]]
    table = stats.stats  # type: ignore[attr-defined]
    ranked = sorted(table.items(), key=lambda item: item[1][1], reverse=True)[:k]
    return [
        {"function": _where(key), "calls_per_replay": round(row[1] / replays, 2)}
        for key, row in ranked
    ]


def _nothing() -> None:
    pass


Replay = Callable[[int, Callable[[], None], Callable[[], None]], Awaitable[None]]
"""Runs `count` replays between calling `start` and `stop`."""


async def _profile(
    replay: Replay, replays: int, warmup: int, repeat: int, top: int
) -> dict[str, Any]:
    # cProfile counts every resumption of each coroutine frame on the awaiting stack, so
    # the replay loop is the top coroutine of a task of its own, as in an application's
    # task: wrappers around it would add calls per replay that the runtime does not make.
    if warmup:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(replay, warmup, _nothing, _nothing)
    figures: list[float] = []
    combined: pstats.Stats | None = None
    for _ in range(repeat):
        profiler = cProfile.Profile()
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(replay, replays, profiler.enable, profiler.disable)
        stats = pstats.Stats(profiler)
        figures.append(stats.total_calls / replays)  # type: ignore[attr-defined]
        if combined is None:
            combined = stats
        else:
            combined.add(stats)
    assert combined is not None
    ordered = sorted(figures)
    result: dict[str, Any] = {
        "replays": replays,
        "repeat": repeat,
        "calls_per_replay": round(ordered[(len(ordered) - 1) // 2], 1),
        "calls_per_replay_runs": [round(figure, 1) for figure in figures],
        "calls_per_replay_min": round(ordered[0], 1),
        "calls_per_replay_max": round(ordered[-1], 1),
    }
    if top:
        result["top"] = _top(combined, replays * repeat, top)
    return result


async def main(args: argparse.Namespace) -> dict[str, Any]:
    async with hrx.Runtime(backend="sim", npu=None) as rt:
        buffer = rt.allocate(4096, hrx.GPU_LOCAL)
        graph = rt.graph("fill-4k")
        graph.fill(buffer.view(), 1)
        one_node = graph.prepare()
        three = _three_region(rt, 64 << 10)

        async def awaited_one(
            count: int, start: Callable[[], None], stop: Callable[[], None]
        ) -> None:
            start()
            for _ in range(count):
                await one_node.submit()
            stop()

        async def awaited_three(
            count: int, start: Callable[[], None], stop: Callable[[], None]
        ) -> None:
            start()
            for _ in range(count):
                await three.submit()
            stop()

        async def in_flight(
            count: int, start: Callable[[], None], stop: Callable[[], None]
        ) -> None:
            start()
            for _ in range(count // IN_FLIGHT):
                pending = [three.submit() for _ in range(IN_FLIGHT)]
                for completion in pending:
                    await completion
            stop()

        async def window(count: int, start: Callable[[], None], stop: Callable[[], None]) -> None:
            start()
            pending: deque[hrx.Completion] = deque()
            for _ in range(count):
                if len(pending) == IN_FLIGHT:
                    await pending.popleft()
                pending.append(three.submit())
            while pending:
                await pending.popleft()
            stop()

        # Whole batches of IN_FLIGHT, so every scenario divides by the replays it ran.
        replays = max(IN_FLIGHT, args.replays // IN_FLIGHT * IN_FLIGHT)
        warmup = args.warmup // IN_FLIGHT * IN_FLIGHT
        runs = {}
        for name, replay in (
            ("one_node", awaited_one),
            ("three_region", awaited_three),
            ("three_region_8_in_flight", in_flight),
            ("three_region_8_window", window),
        ):
            runs[name] = await _profile(replay, replays, warmup, args.repeat, args.top)
    return {
        "benchmark": "sim_calls",
        "backend": "sim",
        "method": "cProfile total_calls on the loop thread / replays, median of runs",
        "repeat": args.repeat,
        **{name: runs[name]["calls_per_replay"] for name in SCENARIOS},
        "detail": runs,
    }


def _print_table(report: dict[str, Any]) -> None:
    print(
        f"Python calls on the loop thread per replay ({report['backend']}, "
        f"{report['loop']}, cProfile total_calls; median of {report['repeat']} runs, range)"
    )
    for name in SCENARIOS:
        run = report["detail"][name]
        spread = f"{run['calls_per_replay_min']:.1f}-{run['calls_per_replay_max']:.1f}"
        print(f"  {name:<26} {run['calls_per_replay']:>8.1f}  {spread:>13}  {WHAT[name]}")
    for name in SCENARIOS:
        top = report["detail"][name].get("top")
        if not top:
            continue
        print(f"\ntop functions, {name} (calls per replay):")
        for row in top:
            print(f"  {row['calls_per_replay']:>7.2f}  {row['function']}")


def run(args: argparse.Namespace) -> None:
    backend, options = ("trio", {}) if args.loop == "trio" else ("asyncio", {})
    if args.loop == "uvloop":
        options = {"use_uvloop": True}
    report: dict[str, Any] = anyio.run(main, args, backend=backend, backend_options=options)
    report["loop"] = args.loop
    report["python"] = platform.python_version()
    report["command"] = " ".join([os.path.basename(sys.executable), *sys.argv])
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        _print_table(report)


if __name__ == "__main__":
    options = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    options.add_argument(
        "--loop", choices=("asyncio", "uvloop", "trio"), default="asyncio", help="event loop"
    )
    options.add_argument("--replays", type=int, default=2000, help="profiled replays")
    options.add_argument("--warmup", type=int, default=400, help="replays before profiling")
    options.add_argument(
        "--repeat",
        type=int,
        default=5,
        help="profiled runs of --replays each; the figure is their median",
    )
    options.add_argument(
        "--top", type=int, default=0, help="also list the K most-called functions of each"
    )
    options.add_argument("--json", action="store_true", help="print one JSON line only")
    parsed = options.parse_args()
    if parsed.replays < 1 or parsed.repeat < 1 or parsed.warmup < 0 or parsed.top < 0:
        options.error("--replays and --repeat must be >= 1, --warmup and --top >= 0")
    run(parsed)
