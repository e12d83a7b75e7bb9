"""GPU and NPU work on disjoint buffers, sequentially and in parallel.

The GPU computes `out = in * 3 + 7` over int32; the NPU multiplies batches of
8×8 bf16 matrices into f32. Both are checked exactly against CPU references,
with inputs changed between runs so a stale result cannot pass. Samples
alternate the order of the sequential and the parallel variant; the medians
and the speedup are printed with the spread of the samples (p10..p90), and a
warning when the machine was busy or the baseline noisy (either makes the
speedup swing from run to run). Timed replays must allocate and import nothing.
Four more parallel replays are traced to show the lanes' overlap.

The NPU part runs on the sim NPU, or with `--npu xrt --xclbin F --insts F` on an
XRT NPU (see `npu_choice`).

usage: gpu_npu_parallel [--npu auto|sim|xrt] [--xclbin PATH --insts PATH] [--npu-kernel NAME]
       [gpu-elements=16777216] [npu-matrices=1024] [samples=21] [trace.json]
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import (
    GPU_LOCAL,
    HOST_VISIBLE,
    Access,
    Binding,
    Buffer,
    KernelContract,
    KernelSource,
    PreparedGraph,
    Runtime,
    npu_local,
)
from .._core.lane import Lane
from .._core.trace import ExecutionTrace
from ..backends.sim import SIM_NPU_TARGET
from .common import (
    ExampleFailed,
    ExampleResult,
    ExampleSpec,
    Report,
    UsageError,
    check_output_file,
    main_for,
    parse_count,
)
from .kernels import AFFINE_CXX, BLOCK, BatchedGemmBf16, affine_host
from .npu_choice import USAGE as NPU_USAGE
from .npu_choice import NpuChoice, split_npu
from .sampling import judge, machine_load, spread

NAME = "gpu_npu_parallel"
USAGE = (
    f"usage: gpu_npu_parallel {NPU_USAGE} "
    "[gpu-elements=16777216] [npu-matrices=1024] [samples=21] [trace.json]"
)
MAX_ELEMENTS = 1 << 26
MAX_MATRICES = 16384
TRACED_REPLAYS = 4
CORES_NEEDED = 2
"""The GPU and the NPU lane each keep a core busy while both run."""


@dataclass(frozen=True)
class Params:
    elements: int = 1 << 24
    matrices: int = 1024
    samples: int = 21
    trace_path: Path | None = None
    npu: NpuChoice = field(default_factory=NpuChoice)


def parse(args: Sequence[str]) -> Params:
    npu, args = split_npu(args)
    if len(args) > 4:
        raise UsageError(f"too many arguments: got {len(args)}, at most 4")
    defaults = Params()
    names = ("gpu-elements", "npu-matrices", "samples")
    values = [defaults.elements, defaults.matrices, defaults.samples]
    for index, text in enumerate(args[:3]):
        values[index] = parse_count(text, names[index])
    elements, matrices, samples = values
    if not 256 <= elements <= MAX_ELEMENTS or elements % 256:
        raise UsageError(
            f"gpu-elements must be a multiple of 256 with 256 <= gpu-elements <= "
            f"{MAX_ELEMENTS}, got {elements}"
        )
    if not 1 <= matrices <= MAX_MATRICES:
        raise UsageError(
            f"npu-matrices must be 1 <= npu-matrices <= {MAX_MATRICES}, got {matrices}"
        )
    if not 3 <= samples <= 1000:
        raise UsageError(f"samples must be 3 <= samples <= 1000, got {samples}")
    trace_path = check_output_file(args[3], "trace.json") if len(args) > 3 else None
    return Params(elements, matrices, samples, trace_path, npu)


# -- inputs and CPU references ------------------------------------------------------------


def gpu_input(elements: int, seed: int) -> np.ndarray[Any, np.dtype[np.int32]]:
    """Bounded int32 inputs (|x| < 2**20, so x*3+7 cannot overflow) that change with `seed`."""
    values = np.arange(elements, dtype=np.int64)
    values *= 2654435761 % (1 << 20)
    values += seed * 7919
    values %= 1 << 21
    values -= 1 << 20
    return values.astype(np.int32)


def npu_inputs(matrices: int, seed: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Small-integer 8×8 matrices: every product and sum is exact in f32."""
    index = np.arange(matrices * 64, dtype=np.int64).reshape(matrices, 8, 8)
    a = ((index * 5 + seed * 3) % 9 - 4).astype(np.float32)
    b = ((index * 3 + seed * 7 + 1) % 7 - 3).astype(np.float32)
    return a, b


def bf16_bits_exact(values: np.ndarray[Any, Any]) -> np.ndarray[Any, np.dtype[np.uint16]]:
    """bf16 patterns of values that bf16 holds exactly (the low half of the f32 is zero)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    return (bits >> np.uint32(16)).astype(np.uint16)


class Workload:
    """The buffers and graphs, with `initialize` and `validate` for a given input seed."""

    def __init__(self, rt: Runtime, params: Params) -> None:
        self.rt = rt
        self.elements = elements = params.elements
        self.matrices = matrices = params.matrices
        gpu = rt.gpu()
        npu = rt.npu(0)
        self.targets = (gpu.target, npu.target)
        affine = rt.load_gpu_kernel(
            KernelSource(cxx=AFFINE_CXX, host=affine_host),
            "affine",
            grid=(elements // BLOCK, 1, 1),
            block=(BLOCK, 1, 1),
            contract=KernelContract(
                [
                    Binding(elements * 4, Access.READ, layout=f"i32[{elements}]"),
                    Binding(elements * 4, Access.WRITE, layout=f"i32[{elements}]"),
                ]
            ),
        )
        source, kernel_name = params.npu.source(npu.target, BatchedGemmBf16(matrices), "gemm")
        gemm = npu.load_artifact(
            source,
            kernel_name,
            1,
            KernelContract(
                [
                    Binding(matrices * 128, Access.READ, layout=f"bf16[{matrices}x8x8]"),
                    Binding(matrices * 128, Access.READ, layout=f"bf16[{matrices}x8x8]"),
                    Binding(matrices * 256, Access.WRITE, layout=f"f32[{matrices}x8x8]"),
                ]
            ),
        )
        self.input = rt.allocate(elements * 4, GPU_LOCAL, "input")
        self.output = rt.allocate(elements * 4, GPU_LOCAL, "output")
        self.host_input = rt.allocate(elements * 4, HOST_VISIBLE, "host_input")
        self.host_output = rt.allocate(elements * 4, HOST_VISIBLE, "host_output")
        self.a = rt.allocate(matrices * 128, npu_local(npu.index), "a")
        self.b = rt.allocate(matrices * 128, npu_local(npu.index), "b")
        self.c = rt.allocate(matrices * 256, npu_local(npu.index), "c")

        def single(label: str, record: Any) -> PreparedGraph:
            graph = rt.graph(label)
            record(graph)
            return graph.prepare()

        self.upload = single("upload", lambda g: g.copy(self.input.view(), self.host_input.view()))
        self.download = single(
            "download", lambda g: g.copy(self.host_output.view(), self.output.view())
        )
        gpu_views = [self.input.view(), self.output.view()]
        npu_views = [self.a.view(), self.b.view(), self.c.view()]
        self.gpu_only = single("gpu_only", lambda g: g.gpu(affine, gpu_views))
        self.npu_only = single("npu_only", lambda g: g.npu(gemm, npu_views))

        # Disjoint buffers imply no edge: one submission feeds both lanes at once.
        def both(graph: Any) -> None:
            graph.gpu(affine, gpu_views)
            graph.npu(gemm, npu_views)

        self.parallel = single("parallel", both)
        if self.parallel.edges:
            raise ExampleFailed(f"disjoint GPU/NPU work got edges {sorted(self.parallel.edges)}")

    async def initialize(self, seed: int) -> None:
        await _write(self.host_input, gpu_input(self.elements, seed))
        a, b = npu_inputs(self.matrices, seed)
        await _write(self.a, bf16_bits_exact(a))
        await _write(self.b, bf16_bits_exact(b))

    async def validate(self, seed: int) -> None:
        async with self.host_output.map_read() as memory:
            got = np.frombuffer(memory, np.int32)
            expected = gpu_input(self.elements, seed) * np.int32(3) + np.int32(7)
            if not np.array_equal(got, expected):
                first = int(np.flatnonzero(got != expected)[0])
                raise ExampleFailed(
                    f"GPU result differs from the CPU reference (input set {seed}) at element "
                    f"{first}: got {got[first]}, expected {expected[first]}"
                )
        a, b = npu_inputs(self.matrices, seed)
        expected_c = np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.float32)
        async with self.c.map_read() as memory:
            got_c = np.frombuffer(memory, np.float32).reshape(self.matrices, 8, 8)
            if not np.array_equal(got_c, expected_c):
                first = int(np.flatnonzero((got_c != expected_c).ravel())[0])
                raise ExampleFailed(
                    f"NPU result differs from the CPU reference (input set {seed}) at value "
                    f"{first}: got {got_c.ravel()[first]}, expected {expected_c.ravel()[first]}"
                )


async def _write(buffer: Buffer, values: np.ndarray[Any, Any]) -> None:
    async with buffer.map_write() as memory:
        np.frombuffer(memory, np.uint8)[:] = values.view(np.uint8).ravel()


async def _completed_ms(graph: PreparedGraph) -> float:
    start = time.perf_counter()
    await graph.submit()
    return (time.perf_counter() - start) * 1000.0


def pairwise_overlap_us(trace: ExecutionTrace, lane_a: Lane, lane_b: Lane) -> float:
    """The sum over every (lane_a event, lane_b event) pair of the time both ran."""
    total = 0.0
    for first in trace.events:
        if first.lane != lane_a:
            continue
        for second in trace.events:
            if second.lane == lane_b:
                total += max(
                    0.0, min(first.end_us, second.end_us) - max(first.start_us, second.start_us)
                )
    return total


async def run(params: Params, backend: str, report: Report) -> ExampleResult:
    machine = machine_load()  # before the run adds its own load
    async with Runtime(backend=backend, npu=params.npu.runtime_npu, label=NAME) as rt:
        work = Workload(rt, params)
        gpu_target, npu_target = work.targets
        backend_name = rt.backend_name
        report.line(f"GPU: {gpu_target}; NPU: {npu_target}")

        for check in range(3):
            report.progress(f"checking against CPU references: pass {check + 1}/3")
            seed = check * 2
            await work.initialize(seed)
            await work.upload.submit()
            await work.gpu_only.submit()
            await work.npu_only.submit()
            await work.download.submit()
            await work.validate(seed)
            # Change both inputs so a parallel branch that wrote nothing cannot pass.
            await work.initialize(seed + 1)
            await work.upload.submit()
            await work.parallel.submit()
            await work.download.submit()
            await work.validate(seed + 1)

        before = rt.statistics()
        sequential_ms: list[float] = []
        parallel_ms: list[float] = []
        gpu_ms: list[float] = []
        npu_ms: list[float] = []
        for sample in range(params.samples):
            report.progress(f"timing: sample {sample + 1}/{params.samples}")
            # Alternate the order so clock and thermal drift hit both variants alike.
            for concurrent in (False, True) if sample % 2 == 0 else (True, False):
                if concurrent:
                    parallel_ms.append(await _completed_ms(work.parallel))
                else:
                    start = time.perf_counter()
                    await work.gpu_only.submit()
                    middle = time.perf_counter()
                    await work.npu_only.submit()
                    end = time.perf_counter()
                    sequential_ms.append((end - start) * 1000.0)
                    gpu_ms.append((middle - start) * 1000.0)
                    npu_ms.append((end - middle) * 1000.0)
        after = rt.statistics()
        if before.allocations != after.allocations or before.imports != after.imports:
            raise ExampleFailed(
                "replay unexpectedly allocated or imported storage: allocations "
                f"{before.allocations} -> {after.allocations}, imports "
                f"{before.imports} -> {after.imports}"
            )
        await work.download.submit()
        await work.validate(5)

        sequential = statistics.median(sequential_ms)
        parallel = statistics.median(parallel_ms)
        speedup = sequential / parallel
        gpu_median = statistics.median(gpu_ms)
        npu_median = statistics.median(npu_ms)
        ideal = (gpu_median + npu_median) / max(gpu_median, npu_median)
        sequential_spread = spread(sequential_ms)
        parallel_spread = spread(parallel_ms)
        speedup_spread = spread([s / p for s, p in zip(sequential_ms, parallel_ms, strict=True)])
        verdict = judge(sequential_ms, machine, CORES_NEEDED)
        report.line(
            f"{params.elements} GPU elements + {params.matrices} NPU matrices; "
            f"{params.samples} paired samples"
        )
        report.line(
            f"sequential median: {sequential:.3f} ms; parallel median: {parallel:.3f} ms; "
            f"speedup: {speedup:.2f}x"
        )
        report.line(
            f"GPU-only median: {gpu_median:.3f} ms; NPU-only median: {npu_median:.3f} ms; "
            f"ideal speedup (sum/max): {ideal:.2f}x; achieved: {speedup / ideal:.2f} of ideal"
        )
        seq, par, pair = sequential_spread, parallel_spread, speedup_spread
        report.line(
            f"spread (p10..p90): sequential {seq.p10:.3f}..{seq.p90:.3f} ms; "
            f"parallel {par.p10:.3f}..{par.p90:.3f} ms; "
            f"paired speedup {pair.p10:.2f}..{pair.p90:.2f}x"
        )
        for line in verdict.lines:
            report.line(line)
        report.line(
            "Both CPU references match exactly, including changed-input replays. "
            "No native allocations/imports during timed replay."
        )

        # Traced separately so tracing cannot affect the timed samples.
        rt.start_trace(32)
        for _ in range(TRACED_REPLAYS):
            await work.parallel.submit()
        trace = rt.finish_trace()
        if trace is None:
            raise ExampleFailed("missing execution trace")
        overlap = pairwise_overlap_us(trace, Lane.COMPUTE, Lane.NPU)
        report.line(
            f"GPU/NPU host-observed overlap across four replays: {overlap:.1f} us "
            "(not device timestamps)"
        )
        if overlap == 0.0:
            report.line(
                "No overlap seen: the lanes ran one after the other in the traced replays "
                "(work too small to overlap, or too few free cores)"
            )
        if params.trace_path is not None:
            trace.write(params.trace_path)
            report.line(f"Trace: {params.trace_path}")

    values: dict[str, Any] = {
        "backend": backend_name,
        "gpu_target": gpu_target,
        "npu_target": npu_target,
        "gpu_elements": params.elements,
        "npu_matrices": params.matrices,
        "samples": params.samples,
        "sequential_median_ms": sequential,
        "parallel_median_ms": parallel,
        "speedup": speedup,
        "sequential_p10_ms": sequential_spread.p10,
        "sequential_p90_ms": sequential_spread.p90,
        "parallel_p10_ms": parallel_spread.p10,
        "parallel_p90_ms": parallel_spread.p90,
        "speedup_p10": speedup_spread.p10,
        "speedup_p90": speedup_spread.p90,
        "load_average": machine.load,
        "usable_cores": machine.cores,
        "busy_machine": verdict.busy,
        "noisy_baseline": verdict.noisy,
        "npu_backend": "sim" if npu_target == SIM_NPU_TARGET else "xrt",
        "gpu_only_median_ms": gpu_median,
        "npu_only_median_ms": npu_median,
        "ideal_speedup": ideal,
        "fraction_of_ideal": speedup / ideal,
        "overlap_us": overlap,
        "trace_path": str(params.trace_path) if params.trace_path else None,
    }
    return ExampleResult(values, trace)


SPEC = ExampleSpec(NAME, USAGE, parse, run)


def main(argv: Sequence[str] | None = None) -> int:
    return main_for(SPEC, argv)


if __name__ == "__main__":
    sys.exit(main())
