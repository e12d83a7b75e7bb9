"""Latency of `await prepared.submit()` (a one-node 4 KiB fill) against what users write today.

Paired, alternating order, in the same process (as cuda_latency.py):

* PyTorch: a 4 KiB uint8 tensor's `fill_(1)` on a side stream (`with
  torch.cuda.stream(stream)`), `event = torch.cuda.Event(); event.record(stream)`,
  then `while not event.query()` yield to the loop: `await asyncio.sleep(0)` on
  asyncio and uvloop, `await trio.lowlevel.checkpoint()` on trio (the cheapest
  yield of each loop; anyio's checkpoint costs more on asyncio).
* CuPy: a 4 KiB uint8 array's `fill(1)` on `cupy.cuda.Stream(non_blocking=True)`,
  then the stream's `synchronize` in a worker thread: `await
  asyncio.to_thread(stream.synchronize)` on asyncio and uvloop, `await
  trio.to_thread.run_sync(stream.synchronize)` on trio.

Reports p50/p95 µs of each and the ratios hrx/torch and hrx/cupy. Goal:
hrx/torch p50 <= 0.8. torch and cupy are imported here only; a missing or
unusable one is reported as skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any

from cuda_common import configure, parser, run, summary

import hrx_async as hrx
from hrx_async.tools.benchmark import PairedResult, paired

Variant = tuple[Callable[[], Awaitable[None]], Callable[[], bool], str, str]
"""(one fill awaited, a check of the result, how it waits, the library's version)"""


def loop_calls(loop: str) -> tuple[Callable[[], Awaitable[None]], Any, str, str]:
    """This loop's cheapest yield and its to-thread call, and their names."""
    if loop == "trio":
        import trio

        return (
            trio.lowlevel.checkpoint,
            trio.to_thread.run_sync,
            "trio.lowlevel.checkpoint()",
            "trio.to_thread.run_sync",
        )
    sleep0 = functools.partial(asyncio.sleep, 0)
    return sleep0, asyncio.to_thread, "asyncio.sleep(0)", "asyncio.to_thread"


def torch_variant(checkpoint: Callable[[], Awaitable[None]], yield_name: str) -> Variant | str:
    """The PyTorch fill and its check, or why it is skipped."""
    try:
        import torch
    except Exception as error:  # ImportError, or a broken install
        return f"torch not importable: {type(error).__name__}: {error}"
    try:
        if not torch.cuda.is_available():
            return "torch sees no CUDA device"
        stream = torch.cuda.Stream()
        tensor = torch.zeros(4096, dtype=torch.uint8, device="cuda")
        with torch.cuda.stream(stream):
            tensor.fill_(1)  # the first launch loads the kernel
            tensor.zero_()  # so the check at the end sees what the measured fills wrote
        torch.cuda.synchronize()
    except Exception as error:
        return f"torch set-up failed: {type(error).__name__}: {error}"

    async def fill() -> None:
        with torch.cuda.stream(stream):
            tensor.fill_(1)
        event = torch.cuda.Event()
        event.record(stream)
        while not event.query():
            await checkpoint()

    def correct() -> bool:
        torch.cuda.synchronize()
        return bool((tensor == 1).all().item())

    how = f"fill_ on a side stream; Event.record; poll Event.query() with {yield_name}"
    return fill, correct, how, str(torch.__version__)


def cupy_variant(to_thread: Any, thread_name: str) -> Variant | str:
    """The CuPy fill and its check, or why it is skipped."""
    try:
        import cupy
    except Exception as error:
        return f"cupy not importable: {type(error).__name__}: {error}"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "cupy sees no CUDA device"
        stream = cupy.cuda.Stream(non_blocking=True)
        array = cupy.zeros(4096, dtype=cupy.uint8)
        with stream:
            array.fill(1)  # the first launch compiles the kernel
            array.fill(0)  # so the check at the end sees what the measured fills wrote
        cupy.cuda.Device().synchronize()
    except Exception as error:
        return f"cupy set-up failed: {type(error).__name__}: {error}"

    async def fill() -> None:
        with stream:
            array.fill(1)
        await to_thread(stream.synchronize)

    def correct() -> bool:
        cupy.cuda.Device().synchronize()
        return bool((array == 1).all())

    how = f"fill on a non-blocking stream; await {thread_name}(stream.synchronize)"
    return fill, correct, how, str(cupy.__version__)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    checkpoint, to_thread, yield_name, thread_name = loop_calls(args.loop)
    variants: dict[str, Variant | str] = {
        "torch": torch_variant(checkpoint, yield_name),
        "cupy": cupy_variant(to_thread, thread_name),
    }
    async with hrx.Runtime(backend="cuda", npu=None) as rt:
        buffer = rt.allocate(4096, hrx.GPU_LOCAL)
        graph = rt.graph("fill-4k")
        graph.fill(buffer.view(), 1)
        prepared = graph.prepare()
        settings = configure(rt, args)

        async def coordinated() -> None:
            await prepared.submit()

        for _ in range(args.warmup):
            await coordinated()
        results: dict[str, PairedResult] = {}
        for name, variant in variants.items():
            if isinstance(variant, str):
                continue
            fill = variant[0]
            for _ in range(args.warmup):
                await fill()
            results[name] = await paired(coordinated, fill, args.pairs)
        alone = []
        if not results:
            for _ in range(args.pairs):
                started = time.perf_counter()
                await coordinated()
                alone.append(time.perf_counter() - started)
        stats = rt.statistics()

    report: dict[str, Any] = {
        **settings,
        "benchmark": "cuda_user_baselines",
        "work": "4 KiB fill, awaited",
        "pairs": args.pairs,
        "hrx": "await prepared.submit() of a 1-node graph",
    }
    first = next(iter(results.values()), None)
    report["hrx_us"] = summary(first.a_samples if first is not None else alone)
    for name, variant in variants.items():
        if isinstance(variant, str):
            report[name] = {"skipped": variant}
            report[f"ratio_hrx_over_{name}_p50"] = None
            continue
        _, correct, how, version = variant
        result = results[name]
        report[name] = {
            "how": how,
            "version": version,
            "us": summary(result.b_samples),
            "hrx_us": summary(result.a_samples),
            "ratio_p95": round(result.a.p95 / result.b.p95, 3),
            "ratio_median_per_pair": round(result.ratio.median, 3),
            "result_correct": correct(),
        }
        report[f"ratio_hrx_over_{name}_p50"] = round(result.a.median / result.b.median, 3)
    report["goal"] = "hrx/torch p50 <= 0.8"
    report["completions"] = stats.completions
    return report


if __name__ == "__main__":
    options = parser(__doc__ or "")
    options.add_argument("--pairs", type=int, default=3000)
    options.add_argument("--warmup", type=int, default=300)
    run(main, options.parse_args())
