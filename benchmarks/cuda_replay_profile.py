"""Where a replay's time goes on the loop thread: cProfile over awaited CUDA replays.

Four workloads on the runtime's own graphs: `window8`, the upload -> kernel -> download
graph of cuda_pipeline.py kept 8 replays deep (await the oldest before submitting the
next), `awaited3`, that graph awaited one replay at a time, `one_node`, a 4 KiB fill
awaited one replay at a time, and `tasks64`, 64 tasks each awaiting replays of its own
4 KiB fill graph (cuda_floor.py's throughput phase; "per replay" is per completion).
Each is run once unprofiled (µs per replay) and once under cProfile; the report gives
Python calls per replay and the functions by their own time. On a compiled build,
compiled functions do not appear on their own: their time is counted in the interpreted
function that called them (`Scheduler.submit` holds admission, the awaiting coroutine the
settling).

`--count` counts instead of profiling, per replay: each driver call the runtime makes
(cuda-bindings' functions, wrapped before the runtime opens; queries split by answer) and
the loop's passes (asyncio: the selector's `select` calls; trio: `before_io_wait`), to see
how many queries of unfinished work and loop iterations a replay costs:

    python benchmarks/cuda_replay_profile.py --count [--loop trio] [--only window8]

`--sample-seconds S --only NAME` runs one workload unprofiled for S seconds instead, for a
native sampling profiler outside the process, which does see compiled code and the driver
(`native_profile_summary.py` reads what py-spy records):

    python benchmarks/cuda_replay_profile.py [--loop asyncio|trio] [--replays 3000]
    py-spy record --native -r 1000 -f raw -o window8.txt -- \
        python benchmarks/cuda_replay_profile.py --only window8 --sample-seconds 8
    python benchmarks/native_profile_summary.py window8.txt
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import functools
import io
import pstats
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from cuda_common import mix_replay

import hrx_async as hrx

COUNTED = (
    "cudaGraphLaunch",
    "cudaEventRecord",
    "cudaEventQuery",
    "cudaStreamWaitEvent",
    "cudaMemcpyAsync",
    "cudaMemsetAsync",
    "cudaEventSynchronize",
)
"""The runtime API's calls a replay can make (`--count`)."""


def count_driver_calls(counts: collections.Counter[str]) -> None:
    """Wrap cuda-bindings' per-replay calls so each one counts itself (before the runtime
    opens: the backend takes the functions from the module as it starts)."""
    from cuda.bindings import runtime

    def counted(name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(call)
        def wrapper(*args: Any) -> Any:
            result = call(*args)
            if name == "cudaEventQuery":
                counts[f"{name}:{'pending' if result[0] else 'done'}"] += 1
            else:
                counts[name] += 1
            return result

        return wrapper

    for name in COUNTED:
        setattr(runtime, name, counted(name, getattr(runtime, name)))


def count_loop_passes(counts: collections.Counter[str], loop: str) -> None:
    if loop == "trio":
        import trio

        class Passes(trio.abc.Instrument):
            def before_io_wait(self, timeout: float) -> None:
                counts["loop_pass"] += 1

        trio.lowlevel.add_instrument(Passes())
        return
    selector = getattr(asyncio.get_running_loop(), "_selector", None)
    if selector is not None:
        select = selector.select

        def counting(timeout: float | None = None) -> Any:
            counts["loop_pass"] += 1
            return select(timeout)

        selector.select = counting


async def main(args: argparse.Namespace) -> None:
    n = args.replays
    counts: collections.Counter[str] = collections.Counter()
    if args.count:
        count_driver_calls(counts)
        count_loop_passes(counts, args.loop)
    async with hrx.Runtime(backend="cuda", npu=None, max_submissions=64) as rt:
        pipeline, _, _ = mix_replay(rt, 64 << 10, "pipeline")
        target = rt.allocate(4096, hrx.GPU_LOCAL)
        graph = rt.graph("one")
        graph.fill(target.view(), 1)
        one = graph.prepare()
        own = []
        for _ in range(64):
            fill = rt.graph("fill")
            fill.fill(rt.allocate(4096, hrx.GPU_LOCAL).view(), 1)
            own.append(fill.prepare())

        async def window8(count: int) -> None:
            pending: deque[hrx.Completion] = deque()
            for _ in range(count):
                if len(pending) >= 8:
                    await pending.popleft()
                pending.append(pipeline.submit())
            while pending:
                await pending.popleft()

        async def awaited3(count: int) -> None:
            for _ in range(count):
                await pipeline.submit()

        async def one_node(count: int) -> None:
            for _ in range(count):
                await one.submit()

        async def tasks64(count: int) -> None:
            # `count` completions in all: the first tasks take one more where it does not divide.
            share, extra = divmod(count, len(own))

            async def replays(prepared: hrx.PreparedGraph, times: int) -> None:
                for _ in range(times):
                    await prepared.submit()

            async with anyio.create_task_group() as group:
                for index, prepared in enumerate(own):
                    group.start_soon(replays, prepared, share + (index < extra))

        workloads: dict[str, Callable[[int], Awaitable[None]]] = {
            "window8": window8,
            "awaited3": awaited3,
            "one_node": one_node,
            "tasks64": tasks64,
        }
        if args.only is not None:
            workloads = {args.only: workloads[args.only]}
        for name, workload in workloads.items():
            if args.sample_seconds:
                await workload(500)
                # tasks64 in long runs, so that starting its tasks stays out of the samples.
                chunk = 64_000 if name == "tasks64" else 1000
                replays, started = 0, time.perf_counter()
                while time.perf_counter() - started < args.sample_seconds:
                    await workload(chunk)
                    replays += chunk
                elapsed_us = (time.perf_counter() - started) / replays * 1e6
                print(f"== {name}: {elapsed_us:.1f} us/replay over {replays} replays")
                continue
            if args.count:
                await workload(500)
                counts.clear()
                await workload(n)
                per = {key: round(value / n, 2) for key, value in sorted(counts.items())}
                print(f"== {name} ({args.loop}): per replay {per}")
                continue
            await workload(500)
            started = time.perf_counter()
            await workload(n)
            plain_us = (time.perf_counter() - started) / n * 1e6
            profile = cProfile.Profile()
            profile.enable()
            await workload(n)
            profile.disable()
            text = io.StringIO()
            stats = pstats.Stats(profile, stream=text)
            calls = stats.total_calls / n  # type: ignore[attr-defined]
            print(f"== {name}: {plain_us:.1f} us/replay unprofiled; calls/replay {calls:.1f}")
            stats.sort_stats("tottime").print_stats(args.top)
            print("\n".join(text.getvalue().splitlines()[: args.top + 25]))


if __name__ == "__main__":
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--loop", choices=("asyncio", "trio"), default="asyncio")
    options.add_argument("--replays", type=int, default=3000)
    options.add_argument("--top", type=int, default=45, help="functions listed")
    options.add_argument(
        "--only", choices=("window8", "awaited3", "one_node", "tasks64"), default=None
    )
    options.add_argument(
        "--sample-seconds",
        type=float,
        default=0.0,
        help="run the workloads unprofiled this long each, for an outside sampler",
    )
    options.add_argument(
        "--count", action="store_true", help="count driver calls and loop passes per replay"
    )
    parsed = options.parse_args()
    anyio.run(main, parsed, backend=parsed.loop)
