"""Shared pieces of the CUDA benchmarks: the direct cuda-bindings baseline and reporting.

Every benchmark compares hrx_async against the same work issued directly
through cuda-bindings in the same process, alternating which goes first, and
reports ratios. Run one with `python benchmarks/cuda_latency.py --help`.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import numpy as np

import hrx_async as hrx
from hrx_async.benchmark import Distribution

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
    options.add_argument("--json", action="store_true", help="print one JSON line only")
    return options


def configure(rt: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Apply --poll-us to the runtime's backend; returns the settings in force."""
    backend = rt._backend_or_raise()
    if args.poll_us is not None:
        backend.poll_budget_us = args.poll_us
    if args.gc_freeze:
        gc.collect()
        gc.freeze()
    return {
        "poll_budget_us": backend.poll_budget_us,
        "gc_frozen": bool(args.gc_freeze),
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
    report: dict[str, Any] = anyio.run(main, args, backend=backend, backend_options=options)
    report["loop"] = args.loop
    report["fence_wait"] = os.environ.get("HRX_CUDA_FENCE_WAIT", "spin")
    report["python"] = platform.python_version()
    report["command"] = " ".join([os.path.basename(sys.executable), *sys.argv])
    print(json.dumps(report, sort_keys=True) if args.json else json.dumps(report, indent=2))


def summary(samples: list[float], scale: float = 1e6) -> dict[str, float]:
    """Median, p95, min and mean of `samples` (seconds), in µs by default."""
    d = Distribution.from_samples([s * scale for s in samples])
    return {
        "p50": round(d.median, 2),
        "p95": round(d.p95, 2),
        "min": round(d.min, 2),
        "mean": round(d.mean, 2),
    }
