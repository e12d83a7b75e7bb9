"""Where an eager torch region's replay goes, on CUDA: its `submit()` (which runs `fn` on the
lane's stream) and its `await`, against a region whose `fn` does nothing and a 1-node fill;
then the parts on their own: the lane-stream switch (`LaneStream`, what each replay
enters) against PyTorch's `torch.cuda.stream(...)` context, `torch.add` issued over the
region's memory (through DLPack) and over PyTorch's own tensors, and a `torch.cuda.Event`
record + query.

Medians of `--replays` samples (after a warm-up), µs. No ratio here: `cuda_torch_external.py`
gives the region against the direct form; this says what the difference is made of.

    python3 benchmarks/cuda_torch_eager_parts.py [--replays 4000] [--json]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from cuda_common import configure, parser, run

import hrx_async as hrx

N = 16384  # 64 KiB of float32


def add_one(x: Any, y: Any) -> None:
    import torch

    torch.add(x, 1, out=y)


def median_us(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1e6, 2)


def loop_us(body: Any, count: int) -> float:
    started = time.perf_counter()
    for _ in range(count):
        body()
    return round((time.perf_counter() - started) / count * 1e6, 2)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    import hrx_async.torch as hrx_torch
    from hrx_async.torch._region import LaneStream

    device = torch.device("cuda", 0)
    async with hrx.Runtime(backend="cuda", npu=None) as rt:
        settings = configure(rt, args)
        views = [rt.allocate(N * 4, hrx.GPU_LOCAL).view() for _ in range(2)]
        declared = [(view, torch.float32, (N,)) for view in views]
        graphs = {}
        for name, fn in (("eager_add", add_one), ("eager_nothing", lambda x, y: None)):
            graph = rt.graph(name)
            hrx_torch.region(graph, fn, reads=declared[:1], writes=declared[1:])
            graphs[name] = graph.prepare()
        fill = rt.graph("fill")
        fill.fill(rt.allocate(4096, hrx.GPU_LOCAL).view(), 1)
        graphs["fill_4KiB"] = fill.prepare()

        clock = time.perf_counter
        replays: dict[str, dict[str, float]] = {}
        for name, prepared in graphs.items():
            submits, awaits = [], []
            for index in range(args.warmup + args.replays):
                started = clock()
                completion = prepared.submit()
                submitted = clock()
                await completion
                if index >= args.warmup:
                    submits.append(submitted - started)
                    awaits.append(clock() - submitted)
            replays[name] = {
                "submit_us": median_us(submits),
                "await_us": median_us(awaits),
                "total_us": median_us([a + b for a, b in zip(submits, awaits, strict=True)]),
            }

        x = torch.rand(N, device=device)
        y = torch.empty_like(x)
        side = torch.cuda.Stream(device=device)
        torch_context = torch.cuda.stream(side)
        lane = LaneStream(torch.cuda.ExternalStream(side.cuda_stream, device=device), 0)
        # The region's own memory, seen through DLPack as the adapter sees it.
        region_tensors = [
            torch.from_dlpack(tensor).view(torch.float32)
            for tensor in graphs["eager_add"].programs[0].tensors
        ]
        event = torch.cuda.Event()
        count = args.replays * 5

        def enter_exit(context: Any) -> Any:
            def body() -> None:
                with context:
                    pass

            return body

        def record_query() -> None:
            event.record(side)
            event.query()

        parts = {
            "lane_stream_enter_exit_us": loop_us(enter_exit(lane), count),
            "torch_cuda_stream_enter_exit_us": loop_us(enter_exit(torch_context), count),
            "torch_event_record_query_us": loop_us(record_query, count),
        }
        with torch_context:
            for label, tensors in (("torch", (x, y)), ("region", region_tensors)):
                parts[f"torch_add_issue_{label}_tensors_us"] = loop_us(
                    lambda tensors=tensors: add_one(*tensors), count
                )
            torch.cuda.synchronize()
    return {
        **settings,
        "benchmark": "cuda_torch_eager_parts",
        "work": "torch.add over 64 KiB as an eager region; a region doing nothing; a 4 KiB fill",
        "replays": replays,
        "parts": parts,
        "torch": torch.__version__,
    }


if __name__ == "__main__":
    options = parser(__doc__ or "")
    options.add_argument("--replays", type=int, default=4000)
    options.add_argument("--warmup", type=int, default=500)
    run(main, options.parse_args())
