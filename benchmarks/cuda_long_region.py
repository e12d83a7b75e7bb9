"""Where a ~200 µs region's extra time goes: the device work, the noticing, the runtime.

One fill + device copy of `--mib` MiB, as in `cuda_overhead.py`, timed in seven ways in
turns (each pair of the cycle alternates which goes first), medians in µs:

- `direct_sync`: the by-hand graph, `cudaGraphLaunch` + `cudaStreamSynchronize` (the
  overhead row's baseline);
- `direct_tight_poll`: the same graph, an event recorded after it and queried in a tight
  loop that never yields (what noticing the end by query costs, without a loop);
- `direct_loop_poll`: the same, yielding to the event loop between queries (the
  hand-written poll at this size);
- `runtime_graph_sync`: the runtime's own captured graph of the region, on its own
  buffers, launched by hand on the by-hand stream and synchronized (is the device work
  the same?);
- `coordinated`: `await prepared.submit()`;
- `device_direct` / `device_runtime_graph`: the device time of the two graphs between
  timing events (`cudaEventElapsedTime`).

For `coordinated`, the completion's `finished_at` against the call; with `--log-calls`,
when its launch returned and when its event queries answered "not ready" last and "ready"
first (from the call), how many queries it made, the gap between the last "not ready" and
the first "ready" query against the gap between queries while the region runs (a loop
pass; less where a spin caught the end, `QueueWatch.spin_near_end`), where the watch
expected the end (`expected_end`) and its smoothed loop pass at the end
(`pass_cost_at_end_us`); and (on the pure
build, where the watch's methods can be wrapped) how many sweeps the loop made per replay
and the median gap between them.

    python benchmarks/cuda_long_region.py [--loop asyncio|uvloop|trio] [--mib 256]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from typing import Any

from cuda_common import Direct, check, configure, fill_copy, parser, run
from query_answers import QueryAnswers, us

import hrx_async as hrx
from hrx_async._runtime import watch as watch_module


class CallLog:
    """Times of the runtime's graph launches and event queries (with their answers): the
    bindings functions its `ReplayCalls` holds are wrapped, which works on both builds."""

    def __init__(self, calls: Any) -> None:
        self.launches: list[float] = []
        self.queries: list[tuple[float, bool]] = []
        self.active = False
        launch, query = calls.graph_launch_call, calls.event_query_call

        def logged_launch(*args: Any) -> Any:
            result = launch(*args)
            if self.active:
                self.launches.append(time.perf_counter())
            return result

        def logged_query(event: Any) -> Any:
            result = query(event)
            if self.active:
                self.queries.append((time.perf_counter(), not result[0]))
            return result

        calls.graph_launch_call = logged_launch
        calls.event_query_call = logged_query

    def clear(self) -> None:
        self.launches.clear()
        self.queries.clear()


class SweepLog:
    """Times of the watch's sweeps, when its class can be wrapped (the pure build)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.active = False
        try:
            original = watch_module.QueueWatch.sweep

            def sweep(watch: Any, new_pass: bool) -> None:
                if self.active:
                    self.times.append(time.perf_counter())
                original(watch, new_pass)

            watch_module.QueueWatch.sweep = sweep  # type: ignore[method-assign]
            self.wrapped = True
        except TypeError:  # a compiled class refuses new attributes
            self.wrapped = False


async def main(args: argparse.Namespace) -> dict[str, Any]:
    if args.loop == "trio":
        import trio

        yield_once = trio.lowlevel.checkpoint
    else:
        import asyncio

        async def yield_once() -> None:
            await asyncio.sleep(0)

    sweeps = SweepLog()
    nbytes = args.mib << 20
    direct = Direct()
    api = direct.rt
    async with hrx.Runtime(backend="cuda", npu=None) as rt:
        settings = configure(rt, args)
        prepared, direct_exec, stream = fill_copy(rt, direct, nbytes)
        program = prepared.programs[0]
        assert len(prepared.regions) == 1 and program.native_graph
        runtime_exec = program.graph_exec
        event = direct.event()
        timing = [check(api.cudaEventCreate()) for _ in range(2)]

        def direct_sync() -> None:
            api.cudaGraphLaunch(direct_exec, stream)
            api.cudaStreamSynchronize(stream)

        def direct_tight_poll() -> None:
            api.cudaGraphLaunch(direct_exec, stream)
            api.cudaEventRecord(event, stream)
            not_ready = api.cudaError_t.cudaErrorNotReady
            while api.cudaEventQuery(event)[0] == not_ready:
                pass

        async def direct_loop_poll() -> None:
            api.cudaGraphLaunch(direct_exec, stream)
            api.cudaEventRecord(event, stream)
            not_ready = api.cudaError_t.cudaErrorNotReady
            while api.cudaEventQuery(event)[0] == not_ready:
                await yield_once()

        def runtime_graph_sync() -> None:
            api.cudaGraphLaunch(runtime_exec, stream)
            api.cudaStreamSynchronize(stream)

        def device_time(graph_exec: Any) -> float:
            api.cudaEventRecord(timing[0], stream)
            api.cudaGraphLaunch(graph_exec, stream)
            api.cudaEventRecord(timing[1], stream)
            api.cudaStreamSynchronize(stream)
            return float(check(api.cudaEventElapsedTime(timing[0], timing[1]))) * 1e-3

        times: dict[str, list[float]] = {
            name: []
            for name in (
                "direct_sync",
                "direct_tight_poll",
                "direct_loop_poll",
                "runtime_graph_sync",
                "coordinated",
                "coordinated_resolved",
                "device_direct",
                "device_runtime_graph",
            )
        }
        calls = CallLog(rt._backend_or_raise().table.replay_calls) if args.log_calls else None
        answers = QueryAnswers()
        moments: dict[str, list[float]] = {
            "launch_returned": [],
            "last_query_not_ready": answers.last_not_ready,
            "first_query_ready": answers.first_ready,
            "expected_end": [],
        }
        watch = rt._scheduler_or_raise().watch
        sweep_counts: list[int] = []
        sweep_gaps: list[float] = []

        async def coordinated(record: bool) -> None:
            sweeps.times.clear()
            sweeps.active = True
            if calls is not None:
                calls.clear()
                calls.active = True
            t0 = time.perf_counter()
            completion = prepared.submit()
            expected_end = watch.ends[-1] - t0 if watch.ends else None
            await completion
            t1 = time.perf_counter()
            sweeps.active = False
            if calls is not None:
                calls.active = False
            if record and calls is not None and calls.launches:
                moments["launch_returned"].append(calls.launches[0] - t0)
                answers.add(calls.queries, t0, watch.pass_cost)
                if expected_end is not None:
                    moments["expected_end"].append(expected_end)
            if record:
                times["coordinated"].append(t1 - t0)
                assert completion.finished_at is not None
                times["coordinated_resolved"].append(completion.finished_at - t0)
                if sweeps.wrapped:
                    sweep_counts.append(len(sweeps.times))
                    stamps = sweeps.times
                    sweep_gaps.extend(y - x for x, y in itertools.pairwise(stamps))

        def timed(name: str, fn: Any, record: bool) -> None:
            t0 = time.perf_counter()
            fn()
            if record:
                times[name].append(time.perf_counter() - t0)

        for index in range(args.replays + args.warmup):
            record = index >= args.warmup
            forward = index % 2 == 0
            steps: list[Any] = ["sync", "tight", "loop", "runtime_sync", "coordinated", "dev"]
            for step in steps if forward else reversed(steps):
                if step == "sync":
                    timed("direct_sync", direct_sync, record)
                elif step == "tight":
                    timed("direct_tight_poll", direct_tight_poll, record)
                elif step == "loop":
                    t0 = time.perf_counter()
                    await direct_loop_poll()
                    if record:
                        times["direct_loop_poll"].append(time.perf_counter() - t0)
                elif step == "runtime_sync":
                    timed("runtime_graph_sync", runtime_graph_sync, record)
                elif step == "coordinated":
                    await coordinated(record)
                else:
                    dd, dr = device_time(direct_exec), device_time(runtime_exec)
                    if record:
                        times["device_direct"].append(dd)
                        times["device_runtime_graph"].append(dr)
        info = rt._backend_or_raise().describe()
    medians = {f"{name}_us": us(values) for name, values in times.items()}
    base = statistics.median(times["direct_sync"])
    return {
        **settings,
        "benchmark": "cuda_long_region",
        "work": f"one region: fill {args.mib} MiB + device copy {args.mib} MiB",
        "replays": args.replays,
        **medians,
        "ratios_to_direct_sync": {
            name: round(statistics.median(times[name]) / base, 4)
            for name in (
                "direct_tight_poll",
                "direct_loop_poll",
                "runtime_graph_sync",
                "coordinated",
            )
        },
        "from_the_call_us": {name: us(values) for name, values in moments.items() if values},
        **answers.summary(),
        "sweeps_per_replay": statistics.median(sweep_counts) if sweep_counts else None,
        "sweep_gap_us": us(sweep_gaps) if sweep_gaps else None,
        "fences_finished_by_loop": info.get("fences_finished_by_loop"),
        "fences_finished_by_waiter": info.get("fences_finished_by_waiter"),
    }


if __name__ == "__main__":
    options = parser(__doc__ or "")
    options.add_argument("--mib", type=int, default=256)
    options.add_argument("--replays", type=int, default=300)
    options.add_argument("--warmup", type=int, default=30)
    options.add_argument(
        "--log-calls",
        action="store_true",
        help="time the runtime's launches and event queries (adds a few µs per call)",
    )
    run(main, options.parse_args())
