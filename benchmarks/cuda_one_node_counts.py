"""Where an awaited 1-node replay's time goes on CUDA, on one loop, next to the hand poll.

Two phases in one process. Timing: `await prepared.submit()` of a 4 KiB fill and the
hand-written poll of `cuda_floor.py`, alternating, p50 of each and their ratio. Counting:
the same two again, one after the other, counting per replay the loop passes (asyncio: the
selector's `select` calls; trio: `before_io_wait`; uvloop offers no hook) and, on trio,
the task steps of each task (the queue watcher's among them). The counts show whether a
replay finishes within its own task step (no pass) or waits for the loop.

    python3 benchmarks/cuda_one_node_counts.py asyncio|uvloop|trio

One JSON line; PAIRS (environment) sets the timing pairs (3000).
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import statistics
import sys
import time
from typing import Any

import anyio
from cuda_common import Direct
from cuda_floor import Poller

import hrx_async as hrx
import hrx_async._build as build_info

LOOP = sys.argv[1]
PAIRS = int(os.environ.get("PAIRS", "3000"))


async def main() -> None:
    direct = Direct()
    out: dict[str, Any] = {
        "loop": LOOP,
        "site": os.environ.get("SITE_LABEL", "?"),
        "build": build_info.build()["kind"],
    }
    async with hrx.Runtime(backend="cuda", npu=None) as rt:
        buf = rt.allocate(4096, hrx.GPU_LOCAL)
        g = rt.graph("fill")
        g.fill(buf.view(), 1)
        prepared = g.prepare()
        poller = Poller(direct, 4096, "trio" if LOOP == "trio" else "asyncio")
        clock = time.perf_counter
        s: dict[str, list[float]] = {"hrx": [], "poll": []}
        for i in range(PAIRS + 300):
            for name in ("hrx", "poll") if i % 2 == 0 else ("poll", "hrx"):
                t = clock()
                if name == "hrx":
                    await prepared.submit()
                else:
                    await poller.replay()
                if i >= 300:
                    s[name].append(clock() - t)
        p50 = {k: statistics.median(v) * 1e6 for k, v in s.items()}
        out["p50_us"] = {k: round(v, 2) for k, v in p50.items()}
        out["ratio"] = round(p50["hrx"] / p50["poll"], 3)
        # counting phase
        counts: collections.Counter[str] = collections.Counter()
        if LOOP == "trio":
            import trio

            class Count(trio.abc.Instrument):
                def before_io_wait(self, timeout: float) -> None:
                    counts["pass"] += 1

                def before_task_step(self, task: Any) -> None:
                    counts["step:" + task.name.rsplit(".", 1)[-1][:40]] += 1

            inst = Count()
            trio.lowlevel.add_instrument(inst)
        else:
            loop = asyncio.get_running_loop()
            sel = getattr(loop, "_selector", None)
            if sel is not None:
                orig = sel.select

                def counting(timeout: float | None = None) -> Any:
                    counts["pass"] += 1
                    return orig(timeout)

                sel.select = counting

        def snap(label: str, n: int) -> None:
            out[label] = {k: round(v / n, 2) for k, v in sorted(counts.items())}
            counts.clear()

        counts.clear()
        n = 2000
        for _ in range(n):
            await prepared.submit()
        snap("per_hrx_replay", n)
        for _ in range(n):
            await poller.replay()
        snap("per_poll_replay", n)
        if LOOP == "trio":
            trio.lowlevel.remove_instrument(inst)
        info = rt._backend_or_raise().describe()
        out["fences_by_waiter"] = info.get("fences_finished_by_waiter")
    print(json.dumps(out))


if LOOP == "uvloop":
    anyio.run(main, backend="asyncio", backend_options={"use_uvloop": True})
else:
    anyio.run(main, backend=LOOP)
