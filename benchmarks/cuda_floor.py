"""The awaited 1-node replay against a hand-written event poll and the blocking floor.

Latency, in one process, in rounds of all three variants (order reversed every
other round, so drift hits them alike):

* hrx: `await prepared.submit()` of `rt.graph(); g.fill(buffer.view(), 1);
  g.prepare()` over a 4 KiB GPU_LOCAL buffer.
* poll: the same fill captured as a CUDA graph (a 4 KiB cudaMemsetAsync),
  `cudaGraphLaunch`, `cudaEventRecord` on a DisableTiming event, then
  `cudaEventQuery` until it succeeds, yielding to the loop between queries with
  its cheapest yield: `await asyncio.sleep(0)` on asyncio and uvloop, `await
  trio.lowlevel.checkpoint()` on trio. This is what a careful user writes by hand.
* blocking: `cudaGraphLaunch` + `cudaStreamSynchronize` of that graph, which holds
  the loop for the whole replay: the floor, for reference.

Reports p50/p90 (µs) of each, hrx/poll and poll/blocking (of the p50s and the
median of per-round ratios).

Throughput: `--tasks` tasks (64) running for `--seconds` each phase, in
`--rounds` rounds of the phases (order reversed every other round):

* poll: every task has its own captured fill (over its own buffer), stream and
  event, and replays it with the hand-written poll above.
* hrx: every task awaits replays of its own prepared fill over its own buffer, so
  no task's replays wait on another's bytes.
* hrx_shared: every task awaits replays of one prepared fill over one buffer (the
  runtime orders them all on those bytes).

Reports completions/s of each, hrx/poll per round, and the event-loop lag p99 (a
`LoopLag` ticker's oversleep) during each phase. Tasks run in the loop's own task
group (asyncio.TaskGroup, a trio nursery). uvloop's clock counts whole
milliseconds, so on uvloop the lag comes in steps of 1 ms.

    python benchmarks/cuda_floor.py --loop asyncio|uvloop|trio [--pairs 2000] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import numpy as np
from cuda_common import Direct, check, configure, parser, run

import hrx_async as hrx
from hrx_async.tools.benchmark import LoopLag, percentile

Body = Callable[[], Awaitable[Any]]
Task = Callable[[], Coroutine[Any, Any, None]]


def yield_name(loop: str) -> str:
    return "trio.lowlevel.checkpoint()" if loop == "trio" else "asyncio.sleep(0)"


async def run_tasks(loop: str, bodies: list[Task]) -> None:
    """Run `bodies` as concurrent tasks of the loop's own task group until all return."""
    if loop == "trio":
        import trio

        async with trio.open_nursery() as nursery:
            for body in bodies:
                nursery.start_soon(body)
    else:
        async with asyncio.TaskGroup() as group:
            for body in bodies:
                group.create_task(body())


def stats_us(samples: list[float]) -> dict[str, float]:
    ordered = sorted(s * 1e6 for s in samples)
    return {
        "p50": round(percentile(ordered, 50), 2),
        "p90": round(percentile(ordered, 90), 2),
        "p99": round(percentile(ordered, 99), 2),
        "min": round(ordered[0], 2),
        "mean": round(sum(ordered) / len(ordered), 2),
    }


def median(values: list[float]) -> float:
    return percentile(sorted(values), 50)


class Poller:
    """The hand-written poll of one captured fill graph on its own stream and event."""

    def __init__(self, direct: Direct, nbytes: int, loop: str) -> None:
        self.rt = rt = direct.rt
        self.target = direct.malloc(nbytes)
        self.nbytes = nbytes
        self.stream = direct.stream()
        self.event = direct.event()
        self.graph_exec = direct.capture(
            self.stream, lambda s: direct.memset(self.target, 1, nbytes, s)
        )
        self.not_ready = rt.cudaError_t.cudaErrorNotReady
        self.ready_at_first_query = 0
        """Replays whose first query already succeeded (they never yielded)."""
        # One method per loop, so the poll awaits the loop's yield itself, as code
        # written by hand for that loop would, with no wrapper or branch per query.
        self.replay: Body = self._replay_asyncio
        if loop == "trio":
            import trio

            self._checkpoint = trio.lowlevel.checkpoint
            self.replay = self._replay_trio

    def _launch(self) -> bool:
        """Launch and record; whether the event is already complete."""
        rt, event, stream = self.rt, self.event, self.stream
        if rt.cudaGraphLaunch(self.graph_exec, stream)[0]:
            raise RuntimeError("cudaGraphLaunch failed")
        if rt.cudaEventRecord(event, stream)[0]:
            raise RuntimeError("cudaEventRecord failed")
        status = rt.cudaEventQuery(event)[0]
        if not status:
            self.ready_at_first_query += 1
            return True
        if status != self.not_ready:
            raise RuntimeError(f"cudaEventQuery failed: {status!r}")
        return False

    async def _replay_asyncio(self) -> None:
        if self._launch():
            return
        query, event, not_ready, sleep = (
            self.rt.cudaEventQuery,
            self.event,
            self.not_ready,
            asyncio.sleep,
        )
        while True:
            await sleep(0)
            status = query(event)[0]
            if not status:
                return
            if status != not_ready:
                raise RuntimeError(f"cudaEventQuery failed: {status!r}")

    async def _replay_trio(self) -> None:
        if self._launch():
            return
        query, event, not_ready = self.rt.cudaEventQuery, self.event, self.not_ready
        checkpoint = self._checkpoint
        while True:
            await checkpoint()
            status = query(event)[0]
            if not status:
                return
            if status != not_ready:
                raise RuntimeError(f"cudaEventQuery failed: {status!r}")

    def blocking(self) -> None:
        rt, stream = self.rt, self.stream
        if rt.cudaGraphLaunch(self.graph_exec, stream)[0]:
            raise RuntimeError("cudaGraphLaunch failed")
        if rt.cudaStreamSynchronize(stream)[0]:
            raise RuntimeError("cudaStreamSynchronize failed")

    def read(self) -> np.ndarray[Any, Any]:
        host = np.zeros(self.nbytes, np.uint8)
        kind = self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        check(self.rt.cudaMemcpy(host.ctypes.data, self.target, self.nbytes, kind))
        return host


async def latency(rt: hrx.Runtime, direct: Direct, args: argparse.Namespace) -> dict[str, Any]:
    nbytes = args.bytes
    buffer = rt.allocate(nbytes, hrx.GPU_LOCAL)
    graph = rt.graph("fill")
    graph.fill(buffer.view(), 1)
    prepared = graph.prepare()
    poller = Poller(direct, nbytes, args.loop)

    # Each round awaits `variants[name]()`: for hrx that is `await prepared.submit()`.
    # The blocking floor is called as it is, with no coroutine around it.
    variants: dict[str, Body | None] = {
        "hrx": prepared.submit,
        "poll": poller.replay,
        "blocking": None,
    }
    names = list(variants)
    blocking = poller.blocking
    clock = time.perf_counter
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(args.warmup + args.pairs):
        if round_ == args.warmup:
            poller.ready_at_first_query = 0
            samples = {name: [] for name in names}
        for name in names if round_ % 2 == 0 else names[::-1]:
            body = variants[name]
            started = clock()
            if body is None:
                blocking()
            else:
                await body()
            samples[name].append(clock() - started)
    first_ready = poller.ready_at_first_query

    # The poll must really wait for the fill: clear the target, poll once, read it back.
    check(direct.rt.cudaMemset(poller.target, 0, nbytes))
    check(direct.rt.cudaDeviceSynchronize())
    await poller.replay()
    poll_correct = bool((poller.read() == 1).all())

    hrx_over_poll = [a / b for a, b in zip(samples["hrx"], samples["poll"], strict=True)]
    poll_over_blocking = [a / b for a, b in zip(samples["poll"], samples["blocking"], strict=True)]
    p50 = {name: median(values) for name, values in samples.items()}
    return {
        "rounds": args.pairs,
        "us": {name: stats_us(values) for name, values in samples.items()},
        "hrx_over_poll_p50": round(p50["hrx"] / p50["poll"], 3),
        "hrx_over_poll_per_round_median": round(median(hrx_over_poll), 3),
        "poll_over_blocking_p50": round(p50["poll"] / p50["blocking"], 3),
        "poll_over_blocking_per_round_median": round(median(poll_over_blocking), 3),
        "hrx_over_blocking_p50": round(p50["hrx"] / p50["blocking"], 3),
        "poll_ready_at_first_query": first_ready,
        "poll_result_correct": poll_correct,
    }


async def throughput(rt: hrx.Runtime, direct: Direct, args: argparse.Namespace) -> dict[str, Any]:
    tasks, nbytes = args.tasks, args.bytes
    pollers = [Poller(direct, nbytes, args.loop) for _ in range(tasks)]
    own = []
    for _ in range(tasks):
        graph = rt.graph("fill")
        graph.fill(rt.allocate(nbytes, hrx.GPU_LOCAL).view(), 1)
        own.append(graph.prepare())
    shared_graph = rt.graph("fill-shared")
    shared_graph.fill(rt.allocate(nbytes, hrx.GPU_LOCAL).view(), 1)
    shared = shared_graph.prepare()
    replays: dict[str, list[Body]] = {
        "poll": [poller.replay for poller in pollers],
        "hrx": [prepared.submit for prepared in own],
        "hrx_shared": [shared.submit] * tasks,
    }
    clock = time.perf_counter

    async def phase(name: str, seconds: float) -> tuple[float, float]:
        counts = [0] * tasks
        deadline = clock() + seconds

        def worker(index: int, replay: Body) -> Task:
            async def body() -> None:
                count = 0
                while clock() < deadline:
                    await replay()
                    count += 1
                counts[index] = count

            return body

        bodies = [worker(index, replay) for index, replay in enumerate(replays[name])]
        async with LoopLag(0.001) as lag:
            started = clock()
            await run_tasks(args.loop, bodies)
            elapsed = clock() - started
        return sum(counts) / elapsed, lag.p99_ms

    names = list(replays)
    for name in names:
        await phase(name, min(0.3, args.seconds))
    for poller in pollers:
        poller.ready_at_first_query = 0
    rates: dict[str, list[float]] = {name: [] for name in names}
    lags: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(args.rounds):
        for name in names if round_ % 2 == 0 else names[::-1]:
            rate, lag = await phase(name, args.seconds)
            rates[name].append(rate)
            lags[name].append(lag)
    per_round = [h / p for h, p in zip(rates["hrx"], rates["poll"], strict=True)]
    shared_per_round = [h / p for h, p in zip(rates["hrx_shared"], rates["poll"], strict=True)]
    return {
        "tasks": tasks,
        "seconds_per_phase": args.seconds,
        "rounds": args.rounds,
        "completions_per_s": {name: [round(r) for r in values] for name, values in rates.items()},
        "completions_per_s_median": {name: round(median(v)) for name, v in rates.items()},
        "hrx_over_poll_per_round": [round(r, 3) for r in per_round],
        "hrx_over_poll_median": round(median(per_round), 3),
        "hrx_shared_over_poll_median": round(median(shared_per_round), 3),
        "loop_lag_p99_ms": {name: [round(v, 3) for v in values] for name, values in lags.items()},
        "loop_lag_p99_ms_worst": {name: round(max(v), 3) for name, v in lags.items()},
        "poll_ready_at_first_query": sum(p.ready_at_first_query for p in pollers),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    direct = Direct()
    async with hrx.Runtime(backend="cuda", npu=None, max_submissions=max(64, args.tasks)) as rt:
        settings = configure(rt, args)
        one = await latency(rt, direct, args)
        many = await throughput(rt, direct, args) if args.tasks else None
        stats = rt.statistics()
        info = rt._backend_or_raise().describe()
    return {
        **settings,
        "benchmark": "cuda_floor",
        "work": f"1-node graph: {args.bytes} B fill of GPU_LOCAL memory",
        "poll": "cudaGraphLaunch; cudaEventRecord; poll cudaEventQuery, between queries "
        + yield_name(args.loop),
        "blocking": "cudaGraphLaunch; cudaStreamSynchronize",
        "latency": one,
        "throughput": many,
        "completions": stats.completions,
        # Who finished the runtime's fences: its loop-side polls, or waiter threads.
        "fences_finished_by_loop": info.get("fences_finished_by_loop"),
        "fences_finished_by_waiter": info.get("fences_finished_by_waiter"),
    }


if __name__ == "__main__":
    options = parser(__doc__ or "")
    options.add_argument("--pairs", type=int, default=2000, help="rounds of the three variants")
    options.add_argument("--warmup", type=int, default=200, help="rounds before measuring")
    options.add_argument("--bytes", type=int, default=4096, help="bytes each fill writes")
    options.add_argument("--tasks", type=int, default=64, help="0 skips the throughput part")
    options.add_argument("--seconds", type=float, default=1.0, help="seconds per phase")
    options.add_argument("--rounds", type=int, default=3, help="rounds of the phases")
    parsed = options.parse_args()
    if parsed.pairs < 1 or parsed.rounds < 1 or parsed.tasks < 0 or parsed.bytes < 1:
        options.error("--pairs and --rounds must be >= 1, --tasks >= 0, --bytes >= 1")
    run(main, parsed)
