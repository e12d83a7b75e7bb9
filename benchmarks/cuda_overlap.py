"""Upload, compute and download overlap: coordinated graphs vs three hand-written streams.

Three independent pieces of work on disjoint buffers: an H2D copy of N MiB
(pinned -> device), a ~1.1 ms kernel, a D2H copy of N MiB. Each is timed run
one after another and all at once, both through hrx_async (three prepared
graphs, awaited one by one vs submitted together) and directly (three streams,
synchronized after each vs launched together). Speedup = sequential / overlapped;
goal: coordinated speedup >= 0.95 x the direct one.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np
from cuda_common import Direct, configure, parser, run

import hrx_async as hrx
from hrx_async.backends import cuda

SPIN_CXX = r"""
extern "C" __global__ void spin(unsigned int* done, unsigned long long cycles) {
    long long start = clock64();
    while ((unsigned long long)(clock64() - start) < cycles) { }
    if (threadIdx.x == 0) done[blockIdx.x] = 1u;
}
"""
BLOCKS = 132


async def main(args: argparse.Namespace) -> dict[str, Any]:
    nbytes = args.mib << 20
    direct = Direct()
    async with hrx.Runtime(backend="cuda", npu=None) as rt:
        settings = configure(rt, args)
        target = rt.gpu().target
        cubin = cuda.compile_cxx(SPIN_CXX, "spin", cuda.compile_options(target, {}))
        function = direct.load(cubin, "spin")
        s_up, s_compute, s_down = direct.stream(), direct.stream(), direct.stream()
        d_host_in, d_host_out = direct.host_alloc(nbytes), direct.host_alloc(nbytes)
        d_in, d_out, d_done = (
            direct.malloc(nbytes),
            direct.malloc(nbytes),
            direct.malloc(BLOCKS * 4),
        )
        done_arg = np.array([d_done], dtype=np.uint64)
        cycles_arg = np.array([args.cycles], dtype=np.uint64)
        kernel_args = np.array([done_arg.ctypes.data, cycles_arg.ctypes.data], dtype=np.uint64)
        dr, rt_api = direct.dr, direct.rt

        def launch_spin(stream: Any) -> None:
            dr.cuLaunchKernel(
                function, BLOCKS, 1, 1, 128, 1, 1, 0, stream, kernel_args.ctypes.data, 0
            )

        # Calibrate the kernel to the asked-for duration (clock64 counts cycles, not time).
        for _ in range(3):
            samples = []
            for _ in range(5):
                started = time.perf_counter()
                launch_spin(s_compute)
                rt_api.cudaStreamSynchronize(s_compute)
                samples.append(time.perf_counter() - started)
            measured = statistics.median(samples)
            cycles_arg[0] = max(1000, int(cycles_arg[0] * args.kernel_ms / 1e3 / measured))

        def direct_sequential() -> None:
            direct.memcpy(d_in, d_host_in, nbytes, s_up)
            rt_api.cudaStreamSynchronize(s_up)
            launch_spin(s_compute)
            rt_api.cudaStreamSynchronize(s_compute)
            direct.memcpy(d_host_out, d_out, nbytes, s_down)
            rt_api.cudaStreamSynchronize(s_down)

        def direct_overlapped() -> None:
            direct.memcpy(d_in, d_host_in, nbytes, s_up)
            launch_spin(s_compute)
            direct.memcpy(d_host_out, d_out, nbytes, s_down)
            for stream in (s_up, s_compute, s_down):
                rt_api.cudaStreamSynchronize(stream)

        host_in = rt.allocate(nbytes, hrx.HOST_VISIBLE)
        host_out = rt.allocate(nbytes, hrx.HOST_VISIBLE)
        dev_in = rt.allocate(nbytes, hrx.GPU_LOCAL)
        dev_out = rt.allocate(nbytes, hrx.GPU_LOCAL)
        done = rt.allocate(BLOCKS * 4, hrx.GPU_LOCAL)
        spin = rt.load_gpu_kernel(
            hrx.KernelSource(cxx=SPIN_CXX),
            "spin",
            (BLOCKS,),
            (128,),
            hrx.KernelContract(
                [hrx.Binding(BLOCKS * 4, hrx.Access.WRITE)], hrx.Constants().u64(int(cycles_arg[0]))
            ),
        )
        up, compute, down = rt.graph("upload"), rt.graph("compute"), rt.graph("download")
        up.copy(dev_in.view(), host_in.view())
        compute.gpu(spin, [done.view()])
        down.copy(host_out.view(), dev_out.view())
        prepared = [g.prepare() for g in (up, compute, down)]

        async def coordinated_sequential() -> None:
            for p in prepared:
                await p.submit()

        async def coordinated_overlapped() -> None:
            completions = [p.submit() for p in prepared]
            for completion in completions:
                await completion

        times: dict[str, list[float]] = {k: [] for k in ("dseq", "dovl", "cseq", "covl")}

        async def timed(name: str) -> None:
            started = time.perf_counter()
            if name == "dseq":
                direct_sequential()
            elif name == "dovl":
                direct_overlapped()
            elif name == "cseq":
                await coordinated_sequential()
            else:
                await coordinated_overlapped()
            times[name].append(time.perf_counter() - started)

        for _ in range(2):
            for name in times:
                await timed(name)
        for values in times.values():
            values.clear()
        for round_ in range(args.rounds):
            order = ["dseq", "dovl", "cseq", "covl"]
            for name in order if round_ % 2 == 0 else order[::-1]:
                await timed(name)
        kernel_samples = []
        for _ in range(5):
            started = time.perf_counter()
            launch_spin(s_compute)
            rt_api.cudaStreamSynchronize(s_compute)
            kernel_samples.append(time.perf_counter() - started)

    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    direct_speedup = med["dseq"] / med["dovl"]
    coordinated_speedup = med["cseq"] / med["covl"]
    return {
        **settings,
        "benchmark": "cuda_overlap",
        "work": f"H2D {args.mib} MiB, kernel ~{args.kernel_ms} ms, D2H {args.mib} MiB",
        "rounds": args.rounds,
        "kernel_ms": round(statistics.median(kernel_samples) * 1e3, 3),
        "direct_ms": {"sequential": round(med["dseq"], 3), "overlapped": round(med["dovl"], 3)},
        "coordinated_ms": {
            "sequential": round(med["cseq"], 3),
            "overlapped": round(med["covl"], 3),
        },
        "direct_speedup": round(direct_speedup, 3),
        "coordinated_speedup": round(coordinated_speedup, 3),
        "coordinated_over_direct_speedup": round(coordinated_speedup / direct_speedup, 3),
        "goal": "coordinated speedup >= 0.95 x direct speedup",
    }


if __name__ == "__main__":
    options = parser(__doc__ or "")
    options.add_argument("--mib", type=int, default=256)
    options.add_argument("--kernel-ms", type=float, default=1.1)
    options.add_argument("--cycles", type=int, default=2_000_000)
    options.add_argument("--rounds", type=int, default=20)
    run(main, options.parse_args())
