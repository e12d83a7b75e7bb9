"""A GPU → NPU → GPU inference step on shared memory, for latency and pipelining.

Each request fills A with zeros, a GPU Euler step makes it all ones (bf16),
the NPU multiplies it by all-ones weights (bf16 in, f32 out) and a GPU
epilogue adds 1.0, so every value of C must equal K + 1. Two graph instances
with their own A and C share the weights: 50 requests measure latency, then
50 pairs submitted together measure pipelined requests per second. Nothing is
copied and nothing is allocated while requests run.

usage: gemm_pipeline [--npu auto|sim|xrt] [--xclbin PATH --insts PATH] [--npu-kernel NAME]
       [KERNEL SYMBOL M K N]

KERNEL is empty or "builtin" for the built-in NPU GEMM (SYMBOL "gemm"), or a
module name or .py file whose SYMBOL(m, k, n) returns a sim NPU host program.
With `--npu xrt --xclbin F --insts F` the GEMM is that XRT NPU program instead
(M, K and N still give its buffers' sizes; see `npu_choice`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import Access, Binding, Buffer, Constants, KernelContract, KernelSource, Runtime, shared
from ..backends.sim import SIM_NPU_TARGET
from ..errors import ContractError
from ..tools.benchmark import percentile
from ..tools.runner import import_kernel_module
from .common import ExampleFailed, ExampleResult, ExampleSpec, Report, UsageError, main_for
from .kernels import ADD_F32_CXX, BLOCK, EULER_CXX, GemmBf16, add_f32_host, euler_host
from .npu_choice import USAGE as NPU_USAGE
from .npu_choice import NpuChoice, split_npu

NAME = "gemm_pipeline"
USAGE = f"usage: gemm_pipeline {NPU_USAGE} [<gemm-kernel> <symbol> M K N]"
WARMUPS = 5
LATENCY_SAMPLES = 50
PIPELINED_PAIRS = 50
MAX_EXTENT = 1 << 30
BF16_ONE = 0x3F80

HostProgram = Callable[[list[np.ndarray[Any, np.dtype[np.uint8]]], bytes], None]


@dataclass(frozen=True)
class Params:
    kernel: str = ""
    symbol: str = "gemm"
    m: int = 8
    k: int = 8
    n: int = 8
    npu: NpuChoice = field(default_factory=NpuChoice)


def parse(args: Sequence[str]) -> Params:
    npu, args = split_npu(args)
    if not args:
        return Params(npu=npu)
    if len(args) != 5:
        raise UsageError(f"expected no arguments or 5 (kernel, symbol, M, K, N), got {len(args)}")
    dims: list[int] = []
    for name, text in zip("MKN", args[2:], strict=True):
        try:
            dims.append(int(text, 10))
        except ValueError:
            raise UsageError(f"{name}: invalid integer: {text!r}") from None
    m, k, n = dims
    if min(dims) < 1 or max(m * k, k * n, m * n) > MAX_EXTENT:
        raise UsageError(
            f"invalid matrix extent: M, K and N must be >= 1 and every matrix at most "
            f"{MAX_EXTENT} elements (got M={m} K={k} N={n})"
        )
    kernel = "" if args[0] in ("", "builtin") else args[0]
    if not kernel and args[1] != "gemm":
        raise UsageError(f"the built-in NPU GEMM's symbol is 'gemm', got {args[1]!r}")
    return Params(kernel, args[1], m, k, n, npu)


def load_npu_program(params: Params) -> HostProgram:
    """The built-in GEMM, or `symbol(m, k, n)` from the named module or .py file."""
    if not params.kernel:
        return GemmBf16(params.m, params.k, params.n)
    module = _import(params.kernel)
    factory = getattr(module, params.symbol, None)
    if not callable(factory):
        raise UsageError(f"{params.kernel} has no callable {params.symbol!r}")
    program = factory(params.m, params.k, params.n)
    if not callable(program):
        raise UsageError(f"{params.kernel}:{params.symbol}(m, k, n) must return a callable")
    return program  # type: ignore[no-any-return]


def _import(name: str) -> Any:
    try:
        return import_kernel_module(name)
    except ContractError as exc:
        raise UsageError(str(exc)) from None


def _scalars(elements: int) -> Constants:
    return Constants().u32(elements).f32(1.0)


async def run(params: Params, backend: str, report: Report) -> ExampleResult:
    m, k, n = params.m, params.k, params.n
    a_bytes, b_bytes, c_bytes = m * k * 2, k * n * 2, m * n * 4
    async with Runtime(backend=backend, npu=params.npu.runtime_npu, label=NAME) as rt:
        npu = rt.npu(0)
        host = load_npu_program(params) if npu.target == SIM_NPU_TARGET else None
        source, kernel_name = params.npu.source(npu.target, host, params.symbol)
        gemm = npu.load_artifact(
            source,
            kernel_name,
            1,
            KernelContract(
                [
                    Binding(a_bytes, Access.READ, layout=f"bf16[{m}x{k}]"),
                    Binding(b_bytes, Access.READ, layout=f"bf16[{k}x{n}]"),
                    Binding(c_bytes, Access.WRITE, layout=f"f32[{m}x{n}]"),
                ]
            ),
        )
        prep = rt.load_gpu_kernel(
            KernelSource(cxx=EULER_CXX, host=euler_host),
            "krea2_euler",
            grid=(-(-m * k // BLOCK), 1, 1),
            block=(BLOCK, 1, 1),
            contract=KernelContract(
                [
                    Binding(a_bytes, Access.READ_WRITE, layout=f"bf16[{m}x{k}]"),
                    Binding(a_bytes, Access.READ, layout=f"bf16[{m}x{k}]"),
                ],
                _scalars(m * k),
            ),
        )
        epilogue = rt.load_gpu_kernel(
            KernelSource(cxx=ADD_F32_CXX, host=add_f32_host),
            "add_f32",
            grid=(-(-m * n // BLOCK), 1, 1),
            block=(BLOCK, 1, 1),
            contract=KernelContract(
                [Binding(c_bytes, Access.READ_WRITE, layout=f"f32[{m}x{n}]")], _scalars(m * n)
            ),
        )
        placement = shared(npu.index)
        weights = rt.allocate(b_bytes, placement, "weights")
        ones = rt.allocate(a_bytes, placement, "ones")
        for buffer in (weights, ones):
            async with buffer.map_write() as memory:
                np.frombuffer(memory, np.uint16)[:] = BF16_ONE

        def instance(index: int) -> tuple[Any, Buffer]:
            a = rt.allocate(a_bytes, placement, f"a{index}")
            c = rt.allocate(c_bytes, placement, f"c{index}")
            graph = rt.graph(f"{NAME}{index}")
            graph.fill(a.view(), 0)
            graph.gpu(prep, [a.view(), ones.view()])
            graph.npu(gemm, [a.view(), weights.view(), c.view()])
            graph.gpu(epilogue, [c.view()])
            return graph.prepare(), c

        first, c0 = instance(0)
        second, c1 = instance(1)
        for _ in range(WARMUPS):
            await first.submit()
            await second.submit()

        before = rt.statistics()
        latency: list[float] = []
        for sample in range(LATENCY_SAMPLES):
            report.progress(f"latency: request {sample + 1}/{LATENCY_SAMPLES}")
            start = time.perf_counter()
            await first.submit()
            latency.append(time.perf_counter() - start)
        report.progress("pipelined pairs", force=True)
        start = time.perf_counter()
        for _ in range(PIPELINED_PAIRS):
            one, two = first.submit(), second.submit()
            await one
            await two
        requests_per_second = 2 * PIPELINED_PAIRS / (time.perf_counter() - start)

        expected = np.float32(k + 1)
        for label, c in (("first", c0), ("second", c1)):
            async with c.map_read() as memory:
                values = np.frombuffer(memory, np.float32)
                wrong = np.flatnonzero(values != expected)
                if wrong.size:
                    raise ExampleFailed(
                        f"GEMM pipeline output mismatch in the {label} instance: "
                        f"{wrong.size} of {values.size} values differ from K+1={k + 1}, "
                        f"first C[{int(wrong[0])}]={values[int(wrong[0])]}"
                    )
        after = rt.statistics()
        if before.allocations != after.allocations or before.imports != after.imports:
            raise ExampleFailed(
                f"requests allocated or imported storage: allocations {before.allocations} -> "
                f"{after.allocations}, imports {before.imports} -> {after.imports}"
            )
        if after.copied_bytes != 0:
            raise ExampleFailed(f"the pipeline copied {after.copied_bytes} bytes; expected 0")

        latency.sort()
        p50_ms = percentile(latency, 50) * 1e3
        p95_ms = percentile(latency, 95) * 1e3
        report.line(
            f"M={m} K={k} N={n} p50_ms={p50_ms:.3f} p95_ms={p95_ms:.3f} "
            f"pipelined_requests_s={requests_per_second:.2f}"
        )
        report.line(after.to_json())
        values_out: dict[str, Any] = {
            "backend": rt.backend_name,
            "npu_target": npu.target,
            "m": m,
            "k": k,
            "n": n,
            "p50_ms": p50_ms,
            "p95_ms": p95_ms,
            "pipelined_requests_s": requests_per_second,
            "statistics": after.to_dict(),
        }
    return ExampleResult(values_out)


SPEC = ExampleSpec(NAME, USAGE, parse, run)


def main(argv: Sequence[str] | None = None) -> int:
    return main_for(SPEC, argv)


if __name__ == "__main__":
    sys.exit(main())
