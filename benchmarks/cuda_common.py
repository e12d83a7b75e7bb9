"""Shared pieces of the CUDA benchmarks: the direct cuda-bindings baseline and reporting.

Every benchmark compares hrx_async against the same work issued directly
through cuda-bindings in the same process, alternating which goes first, and
reports ratios. Run one with `python benchmarks/cuda_latency.py --help`.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import platform
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import numpy as np
from core_speed import workload

import hrx_async as hrx
import hrx_async._runtime.watch as watch_module
from hrx_async.tools.benchmark import Distribution

MIX_CXX = r"""
extern "C" __global__ void mix(const unsigned char* src, unsigned char* dst, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = (unsigned char)(src[i] * 3u + 1u);
}
"""
"""The kernel of the three-region replay benchmarks: dst = src * 3 + 1 (bytes)."""


def mix_host(arrays: list[Any], constants: bytes) -> None:
    """`mix` for the sim backend (a smoke run of a benchmark without a GPU)."""
    arrays[1][:] = arrays[0] * np.uint8(3) + np.uint8(1)


def mix_replay(rt: Any, n: int, label: str, single_launch: bool = False) -> tuple[Any, Any, Any]:
    """Upload `n` bytes, run `mix`, download: the prepared graph, its host input and output.
    `single_launch` prepares it as one region (`Graph.prepare`)."""
    host_in = rt.allocate(n, hrx.HOST_VISIBLE)
    host_out = rt.allocate(n, hrx.HOST_VISIBLE)
    dev_in = rt.allocate(n, hrx.GPU_LOCAL)
    dev_out = rt.allocate(n, hrx.GPU_LOCAL)
    contract = hrx.KernelContract(
        [hrx.Binding(n, hrx.Access.READ, 1), hrx.Binding(n, hrx.Access.WRITE, 1)],
        hrx.Constants().u32(n),
    )
    source = hrx.KernelSource(cxx=MIX_CXX, host=mix_host)
    kernel = rt.load_gpu_kernel(source, "mix", (n // 256,), (256,), contract)
    graph = rt.graph(label)
    graph.copy(dev_in.view(), host_in.view())
    graph.gpu(kernel, [dev_in.view(), dev_out.view()])
    graph.copy(host_out.view(), dev_out.view())
    return graph.prepare(single_launch=single_launch), host_in, host_out


def check(result: tuple[Any, ...]) -> Any:
    """The value of a cuda-bindings call, or an exception naming the error."""
    status = result[0]
    if int(status):
        raise RuntimeError(f"CUDA call failed: {status!r}")
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


class Direct:
    """The baseline: streams, graphs and launches straight through cuda-bindings."""

    def __init__(self, device: int = 0) -> None:
        from cuda.bindings import driver, runtime

        self.rt = runtime
        self.dr = driver
        check(runtime.cudaSetDevice(device))
        check(runtime.cudaFree(0))
        self._keep: list[Any] = []

    def stream(self) -> Any:
        return check(self.rt.cudaStreamCreateWithFlags(self.rt.cudaStreamNonBlocking))

    def event(self) -> Any:
        return check(self.rt.cudaEventCreateWithFlags(self.rt.cudaEventDisableTiming))

    def malloc(self, nbytes: int) -> int:
        return int(check(self.rt.cudaMalloc(nbytes)))

    def host_alloc(self, nbytes: int) -> int:
        rt = self.rt
        return int(check(rt.cudaHostAlloc(nbytes, rt.cudaHostAllocMapped)))

    def capture(self, stream: Any, issue: Callable[[Any], None]) -> Any:
        """An executable graph of what `issue(stream)` queues."""
        rt = self.rt
        check(
            rt.cudaStreamBeginCapture(
                stream, rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
            )
        )
        issue(stream)
        graph = check(rt.cudaStreamEndCapture(stream))
        return check(rt.cudaGraphInstantiate(graph, 0))

    def memset(self, pointer: int, value: int, nbytes: int, stream: Any) -> None:
        check(self.rt.cudaMemsetAsync(pointer, value, nbytes, stream))

    def memcpy(self, dst: int, src: int, nbytes: int, stream: Any) -> None:
        kind = self.rt.cudaMemcpyKind.cudaMemcpyDefault
        check(self.rt.cudaMemcpyAsync(dst, src, nbytes, kind, stream))

    def load(self, cubin: bytes, name: str) -> Any:
        module = check(self.dr.cuModuleLoadData(cubin))
        self._keep.append(module)
        return check(self.dr.cuModuleGetFunction(module, name.encode()))

    def launch(
        self,
        function: Any,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        stream: Any,
        args: list[np.ndarray[Any, Any]],
    ) -> None:
        pointers = np.array([a.ctypes.data for a in args], dtype=np.uint64)
        self._keep.append((pointers, args))
        check(self.dr.cuLaunchKernel(function, *grid, *block, 0, stream, pointers.ctypes.data, 0))

    def graph_launch(self, graph_exec: Any, stream: Any) -> None:
        check(self.rt.cudaGraphLaunch(graph_exec, stream))

    def sync(self, stream: Any) -> None:
        check(self.rt.cudaStreamSynchronize(stream))


def fill_copy(rt: Any, direct: Direct, nbytes: int) -> tuple[Any, Any, Any]:
    """Fill `nbytes` of GPU memory with 3 and copy it to a second buffer, twice over: as the
    runtime's prepared graph (one region) and captured by hand into a CUDA graph on a
    stream of its own. Returns (prepared graph, by-hand graph exec, its stream)."""
    a = rt.allocate(nbytes, hrx.GPU_LOCAL)
    b = rt.allocate(nbytes, hrx.GPU_LOCAL)
    graph = rt.graph("fill-copy")
    graph.fill(a.view(), 3)
    graph.copy(b.view(), a.view())
    prepared = graph.prepare()
    da, db = direct.malloc(nbytes), direct.malloc(nbytes)
    stream = direct.stream()

    def issue(s: Any) -> None:
        direct.memset(da, 3, nbytes, s)
        direct.memcpy(db, da, nbytes, s)

    return prepared, direct.capture(stream, issue), stream


def pinned(pointer: int, nbytes: int) -> np.ndarray[Any, Any]:
    """A numpy view of `nbytes` of pinned host memory at `pointer`."""
    return np.frombuffer((ctypes.c_uint8 * nbytes).from_address(pointer), np.uint8)


class DirectMix:
    """The direct baseline of `mix_replay`, over buffers of its own: the upload, the `mix`
    kernel and the download each captured as a graph on its own stream (`execs`, run
    chained by events: `three_graphs`), and the three captured as one graph (`one`)."""

    def __init__(self, direct: Direct, target: str, n: int, pattern: np.ndarray[Any, Any]) -> None:
        from hrx_async.backends import cuda

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


def parser(description: str) -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(description=description)
    options.add_argument(
        "--loop", choices=("asyncio", "uvloop", "trio"), default="asyncio", help="event loop"
    )
    options.add_argument(
        "--fence-wait",
        choices=("blocking", "spin"),
        default=None,
        help="how waiter threads wait on CUDA events (HRX_CUDA_FENCE_WAIT)",
    )
    options.add_argument(
        "--poll-us",
        type=float,
        default=None,
        help="the backend's poll budget, µs (0: never watch queues from the loop)",
    )
    options.add_argument(
        "--gc-freeze",
        action="store_true",
        help="gc.collect(); gc.freeze() once the runtime is set up, as latency-sensitive "
        "services do (full collections then scan only objects made since)",
    )
    options.add_argument(
        "--sweep-limit",
        type=int,
        default=None,
        help="fences one loop pass may finish (the watch's SWEEP_LIMIT)",
    )
    options.add_argument("--json", action="store_true", help="print one JSON line only")
    return options


def configure(rt: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Apply --poll-us and --sweep-limit; returns the settings in force."""
    backend = rt._backend_or_raise()
    if args.poll_us is not None:
        backend.poll_budget_us = args.poll_us
    if args.sweep_limit is not None:
        watch_module.SWEEP_LIMIT = args.sweep_limit
    if args.gc_freeze:
        gc.collect()
        gc.freeze()
    return {
        "poll_budget_us": backend.poll_budget_us,
        "gc_frozen": bool(args.gc_freeze),
        "sweep_limit": watch_module.SWEEP_LIMIT,
    }


def run(
    main: Callable[[argparse.Namespace], Awaitable[dict[str, Any]]], args: argparse.Namespace
) -> None:
    """Run `main(args)` on the chosen loop and print its report."""
    if args.fence_wait:
        os.environ["HRX_CUDA_FENCE_WAIT"] = args.fence_wait
    backend, options = ("trio", {}) if args.loop == "trio" else ("asyncio", {})
    if args.loop == "uvloop":
        options = {"use_uvloop": True}
    before = host_speed_us()
    report: dict[str, Any] = anyio.run(main, args, backend=backend, backend_options=options)
    # Interpreted code runs up to 2-3x slower on some virtual CPUs, and a CPU's speed can
    # change while a benchmark runs (`core_speed.py`): each report says how fast the
    # process's CPU ran the same small workload before and after it.
    report["host_speed_us"] = {"before": before, "after": host_speed_us()}
    report["loop"] = args.loop
    report["fence_wait"] = os.environ.get("HRX_CUDA_FENCE_WAIT", "spin")
    report["python"] = platform.python_version()
    report["command"] = " ".join([os.path.basename(sys.executable), *sys.argv])
    print(json.dumps(report, sort_keys=True) if args.json else json.dumps(report, indent=2))


def host_speed_us() -> float:
    """Best of three runs of `core_speed.workload` on the CPU this process runs on, µs."""
    return round(min(workload(20000) for _ in range(3)) * 1e6, 1)


def summary(samples: list[float], scale: float = 1e6) -> dict[str, float]:
    """Median, p95, min and mean of `samples` (seconds), in µs by default."""
    d = Distribution.from_samples([s * scale for s in samples])
    return {
        "p50": round(d.median, 2),
        "p95": round(d.p95, 2),
        "min": round(d.min, 2),
        "mean": round(d.mean, 2),
    }
