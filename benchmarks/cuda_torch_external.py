"""An awaited replay of a graph whose one region is PyTorch work, against the same work run
directly on a PyTorch stream and awaited by polling a `torch.cuda.Event`.

Two sizes, each in two forms, paired and alternating which goes first (`paired`):

* add_64KiB: `torch.add(x, 1, out=y)` over 64 KiB of float32 (latency-bound);
* matmul: `torch.matmul(a, b, out=c)` of n x n float32 (`--matmul-n`, 1536 by default,
  which is ~100-200 µs on an H200; the report gives the direct p50 to check).

Forms:

* eager: the region `hrx_async.torch.region(g, fn, reads=..., writes=...)` runs `fn` on
  the lane's stream at each replay, `await prepared.submit()`. Direct: `with
  torch.cuda.stream(s): fn(...); event.record(s)`, then `event.query()` until it
  succeeds, yielding between queries with the loop's cheapest yield (`await
  asyncio.sleep(0)`, on trio `await trio.lowlevel.checkpoint()`).
* captured: `region(..., captured=True)`, one `CUDAGraph.replay()` on the lane's stream
  per replay. Direct: the same work captured once into a `torch.cuda.CUDAGraph`,
  `graph.replay()` on s, then the same poll.

Reports p50/p95 (µs) of each, the ratio of the p50s and the median of per-pair ratios,
and whether each result matches the direct one. Goal: region p50 <= 1.3x direct.

    python benchmarks/cuda_torch_external.py --loop asyncio|uvloop|trio [--pairs 2000] [--json]
    python benchmarks/cuda_torch_external.py --backend sim --pairs 20  # smoke run, CPU torch
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from cuda_common import configure, parser, run, summary

import hrx_async as hrx
from hrx_async.tools.benchmark import paired

GOAL = 1.3
Timed = Callable[[], Awaitable[None]]


def add_one(x: Any, y: Any) -> None:
    """The latency-bound work."""
    import torch

    torch.add(x, 1, out=y)


def matmul(a: Any, b: Any, c: Any) -> None:
    """The ~100-200 µs work."""
    import torch

    torch.matmul(a, b, out=c)


def poll_direct(torch: Any, issue: Callable[[], None], stream: Any, loop: str) -> Timed:
    """`issue()` on `stream`, an event recorded after it, then the event polled with the
    loop's cheapest yield between queries (the direct baseline); on the CPU (sim smoke run)
    just `issue()`."""
    if stream is None:

        async def on_cpu() -> None:
            issue()

        return on_cpu
    event = torch.cuda.Event()
    context = torch.cuda.stream(stream)
    if loop == "trio":
        import trio

        checkpoint = trio.lowlevel.checkpoint

        async def direct_trio() -> None:
            with context:
                issue()
                event.record(stream)
            while not event.query():
                await checkpoint()

        return direct_trio

    sleep = asyncio.sleep

    async def direct_asyncio() -> None:
        with context:
            issue()
            event.record(stream)
        while not event.query():
            await sleep(0)

    return direct_asyncio


async def measure(
    rt: hrx.Runtime,
    args: argparse.Namespace,
    name: str,
    work: Callable[..., None],
    shapes: list[tuple[int, ...]],
    captured: bool,
) -> dict[str, Any]:
    """One row: the region against the direct form of `work` over float32 tensors of
    `shapes` (the last one written)."""
    import torch

    import hrx_async.torch as hrx_torch

    on_gpu = args.backend != "sim"
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    generator = torch.Generator(device="cpu").manual_seed(5)
    tensors = [torch.rand(shape, generator=generator).to(device) for shape in shapes]
    if on_gpu:
        torch.cuda.synchronize()  # the inputs are read on other streams from here on
    views = [rt.allocate(t.numel() * 4, hrx.GPU_LOCAL).view() for t in tensors]
    declared = [(view, torch.float32, shape) for view, shape in zip(views, shapes, strict=True)]

    # The inputs, copied into the runtime's buffers by a region of their own.
    setup = rt.graph(f"{name}-setup")
    hrx_torch.region(
        setup,
        lambda *targets: [t.copy_(s) for t, s in zip(targets, tensors, strict=True)],
        writes=declared,
    )
    await setup.prepare().submit()

    graph = rt.graph(f"{name}-{'captured' if captured else 'eager'}")
    hrx_torch.region(graph, work, reads=declared[:-1], writes=declared[-1:], captured=captured)
    prepared = graph.prepare()

    stream = torch.cuda.Stream(device=device) if on_gpu else None
    issue: Callable[[], None] = lambda: work(*tensors)  # noqa: E731
    if captured and on_gpu:
        with torch.cuda.stream(stream):
            work(*tensors)  # warm-up, as PyTorch documents for a capture
        stream.synchronize()
        direct_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(direct_graph, stream=stream):
            work(*tensors)
        issue = direct_graph.replay
    direct = poll_direct(torch, issue, stream, args.loop)

    async def region() -> None:
        await prepared.submit()

    for _ in range(args.warmup):
        await region()
        await direct()
    result = await paired(region, direct, args.pairs)

    # The region's output, read back through a region, against the direct one.
    out = torch.empty_like(tensors[-1])
    check = rt.graph(f"{name}-check")
    hrx_torch.region(check, lambda got: out.copy_(got), reads=declared[-1:])
    await check.prepare().submit()
    if on_gpu:
        torch.cuda.synchronize()
    ratio_p50 = result.a.median / result.b.median
    return {
        "case": name,
        "form": "captured" if captured else "eager",
        "region_us": summary(result.a_samples),
        "direct_us": summary(result.b_samples),
        "ratio_p50": round(ratio_p50, 3),
        "ratio_median_per_pair": round(result.ratio.median, 3),
        "goal_met": ratio_p50 <= GOAL,
        "result_matches_direct": bool(torch.allclose(out, tensors[-1], rtol=1e-5, atol=1e-5)),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    n = args.matmul_n
    cases: list[tuple[str, Callable[..., None], list[tuple[int, ...]]]] = [
        ("add_64KiB", add_one, [(16384,), (16384,)]),
        (f"matmul_{n}", matmul, [(n, n), (n, n), (n, n)]),
    ]
    rows = []
    async with hrx.Runtime(backend=args.backend, npu=None) as rt:
        settings = configure(rt, args)
        for name, work, shapes in cases:
            for captured in (False, True):
                rows.append(await measure(rt, args, name, work, shapes, captured))
        stats = rt.statistics()
    yield_name = "trio.lowlevel.checkpoint()" if args.loop == "trio" else "asyncio.sleep(0)"
    return {
        **settings,
        "benchmark": "cuda_torch_external",
        "backend": args.backend,
        "smoke": args.backend == "sim",
        "work": "one torch region per graph, awaited one replay at a time",
        "direct": (
            f"torch stream + torch.cuda.Event polled with {yield_name}"
            if args.backend != "sim"
            else "the CPU torch call itself (smoke run: no stream, no event)"
        ),
        "pairs": args.pairs,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if args.backend != "sim" else "cpu",
        "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "rows": rows,
        "goal": f"region p50 <= {GOAL}x direct",
        "goal_met": all(row["goal_met"] for row in rows),
        "completions": stats.completions,
    }


if __name__ == "__main__":
    options = parser(__doc__ or "")
    options.add_argument("--backend", choices=("cuda", "sim"), default="cuda")
    options.add_argument("--pairs", type=int, default=2000)
    options.add_argument("--warmup", type=int, default=200)
    options.add_argument("--matmul-n", type=int, default=1536)
    run(main, options.parse_args())
