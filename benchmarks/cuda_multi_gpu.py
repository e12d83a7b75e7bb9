"""Two GPUs in one runtime: batch throughput on one GPU vs two, and copy bandwidth between GPUs.

1. Throughput: the same batch of independent graphs (upload `--mib` MiB, a kernel of about
   `--kernel-us` µs, download) all submitted at once, then awaited; once with every graph
   on GPU 0, once spread over GPUs 0 and 1 (one runtime, `devices=[0, 1]`), alternating
   which goes first. Ratio = one-GPU time / two-GPU time (goal >= 1.8).
2. Bandwidth: a `--peer-mib` MiB copy from GPU 0's memory to GPU 1's, as a prepared graph
   awaited, against `cudaMemcpyPeerAsync` on a stream of GPU 1 followed by
   `cudaStreamSynchronize` on the calling thread (the hardware's figure: it blocks the loop),
   and by the same synchronize in a worker thread (what async code does), alternating.
   Ratio = coordinated GB/s / direct GB/s.

Needs two CUDA devices: `python3 benchmarks/cuda_multi_gpu.py --json`.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import anyio
from cuda_common import check, configure, parser, run, summary

import hrx_async as hrx

WORK_CXX = r"""
extern "C" __global__ void work(const unsigned char* x, unsigned int* out,
                                unsigned long long cycles) {
    long long start = clock64();
    while ((unsigned long long)(clock64() - start) < cycles) { }
    if (threadIdx.x == 0) out[blockIdx.x] = x[blockIdx.x];
}
"""
BLOCKS = 132


def batch_graph(rt: Any, gpu: int, nbytes: int, cycles: int, kernels: dict[int, Any]) -> Any:
    place = hrx.gpu_local(gpu)
    host_in, host_out = rt.allocate(nbytes, hrx.HOST_VISIBLE), rt.allocate(nbytes, hrx.HOST_VISIBLE)
    dev_in, dev_out = rt.allocate(nbytes, place), rt.allocate(nbytes, place)
    done = rt.allocate(BLOCKS * 4, place)
    if cycles not in kernels:
        contract = hrx.KernelContract(
            [hrx.Binding(BLOCKS, hrx.Access.READ), hrx.Binding(BLOCKS * 4, hrx.Access.WRITE)],
            hrx.Constants().u64(cycles),
        )
        source = hrx.KernelSource(cxx=WORK_CXX)
        kernels[cycles] = rt.load_gpu_kernel(source, "work", (BLOCKS,), (128,), contract)
    graph = rt.graph(f"batch-gpu{gpu}")
    graph.copy(dev_in.view(), host_in.view())
    graph.gpu(kernels[cycles], [dev_in.view(0, BLOCKS), done.view()])
    graph.copy(dev_out.view(), dev_in.view())
    graph.copy(host_out.view(), dev_out.view())
    return graph.prepare()


async def timed_batch(graphs: list[Any]) -> float:
    start = time.perf_counter()
    completions = [graph.submit_nowait() for graph in graphs]
    for completion in completions:
        await completion
    return time.perf_counter() - start


def clock_rate_khz() -> int:
    from cuda.bindings import runtime

    attribute = runtime.cudaDeviceAttr.cudaDevAttrClockRate
    return int(check(runtime.cudaDeviceGetAttribute(attribute, 0)))


async def main(args: argparse.Namespace) -> dict[str, Any]:
    from cuda.bindings import runtime as cudart

    count = check(cudart.cudaGetDeviceCount())
    if count < 2:
        raise SystemExit(f"this benchmark needs two CUDA devices; found {count}")
    nbytes = args.mib << 20
    cycles = int(args.kernel_us * clock_rate_khz() / 1000)
    async with hrx.Runtime(backend="cuda", devices=[0, 1], npu=None) as rt:
        settings = configure(rt, args)
        kernels: dict[int, Any] = {}
        one = [batch_graph(rt, 0, nbytes, cycles, kernels) for _ in range(args.batch)]
        two = [batch_graph(rt, i % 2, nbytes, cycles, kernels) for i in range(args.batch)]
        for graphs in (one, two):  # warm-up: first launches, lane tasks, caches
            await timed_batch(graphs)
        one_s: list[float] = []
        two_s: list[float] = []
        for round_ in range(args.rounds):
            order = [(one, one_s), (two, two_s)]
            for graphs, samples in order if round_ % 2 == 0 else reversed(order):
                samples.append(await timed_batch(graphs))
        throughput = {
            "graphs_per_batch": args.batch,
            "one_gpu_us": summary(one_s),
            "two_gpu_us": summary(two_s),
            "ratio": round(sorted(one_s)[len(one_s) // 2] / sorted(two_s)[len(two_s) // 2], 3),
        }

        peer = args.peer_mib << 20
        src, dst = rt.allocate(peer, hrx.GPU_LOCAL), rt.allocate(peer, hrx.gpu_local(1))
        graph = rt.graph("peer")
        graph.copy(dst.view(), src.view())
        copy = graph.prepare()
        await copy.submit()
        check(cudart.cudaSetDevice(0))
        direct_src = check(cudart.cudaMalloc(peer))
        check(cudart.cudaSetDevice(1))
        direct_dst = check(cudart.cudaMalloc(peer))
        stream = check(cudart.cudaStreamCreateWithFlags(cudart.cudaStreamNonBlocking))

        async def direct() -> float:
            start = time.perf_counter()
            check(cudart.cudaMemcpyPeerAsync(direct_dst, 1, direct_src, 0, peer, stream))
            check(cudart.cudaStreamSynchronize(stream))
            return time.perf_counter() - start

        async def direct_in_thread() -> float:
            start = time.perf_counter()
            check(cudart.cudaMemcpyPeerAsync(direct_dst, 1, direct_src, 0, peer, stream))
            await anyio.to_thread.run_sync(cudart.cudaStreamSynchronize, stream)
            return time.perf_counter() - start

        async def coordinated() -> float:
            start = time.perf_counter()
            await copy.submit()
            return time.perf_counter() - start

        ours: list[float] = []
        theirs: list[float] = []
        threaded: list[float] = []
        for round_ in range(args.rounds):
            pairs = [(coordinated, ours), (direct, theirs), (direct_in_thread, threaded)]
            for measure, samples in pairs if round_ % 2 == 0 else reversed(pairs):
                samples.append(await measure())

        def median_gbs(samples: list[float]) -> float:
            return round(sorted(peer / s / 1e9 for s in samples)[len(samples) // 2], 2)

        bandwidth: dict[str, Any] = {
            "mib": args.peer_mib,
            "peer_access": rt._backend_or_raise().describe().get("peer_access"),
            "coordinated_gbs_median": median_gbs(ours),
            "direct_gbs_median": median_gbs(theirs),
            "direct_in_thread_gbs_median": median_gbs(threaded),
        }
        bandwidth["ratio"] = round(
            bandwidth["coordinated_gbs_median"] / bandwidth["direct_gbs_median"], 3
        )
        check(cudart.cudaFree(direct_dst))
        check(cudart.cudaSetDevice(0))
        check(cudart.cudaFree(direct_src))
    return {
        "benchmark": "cuda_multi_gpu",
        "settings": settings,
        "throughput": throughput,
        "bandwidth": bandwidth,
    }


if __name__ == "__main__":
    options = parser(__doc__.splitlines()[0])
    options.add_argument("--batch", type=int, default=32, help="graphs per batch")
    options.add_argument("--mib", type=int, default=4, help="MiB uploaded and downloaded per graph")
    options.add_argument("--kernel-us", type=float, default=500.0, help="kernel length, µs")
    options.add_argument("--rounds", type=int, default=10, help="timed rounds of each")
    options.add_argument("--peer-mib", type=int, default=256, help="MiB per copy between GPUs")
    run(main, options.parse_args())
