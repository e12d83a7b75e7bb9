"""Latency of a GPU fill followed by an NPU copy on shared memory.

Five warm-up executions, then 100 timed ones (submit to completion, awaited);
the output is checked, and the nearest-rank p50 and p95 are printed.

usage: shared_bench [--npu auto|sim|xrt] [--xclbin PATH --insts PATH] [--npu-kernel NAME]
       [bytes]

The NPU copy runs on the sim NPU, or with `--npu xrt --xclbin F --insts F` on an
XRT NPU (see `npu_choice`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

import numpy as np

from .. import Runtime, shared
from ..tools.benchmark import percentile
from ._shared import SharedParams, load_copy, parse_shared
from .common import ExampleFailed, ExampleResult, ExampleSpec, Report, main_for
from .npu_choice import USAGE as NPU_USAGE

NAME = "shared_bench"
USAGE = f"usage: shared_bench {NPU_USAGE} [bytes]"
WARMUPS = 5
TIMED = 100
PATTERN = 0x35


def parse(args: Sequence[str]) -> SharedParams:
    return parse_shared(args, USAGE)


async def run(params: SharedParams, backend: str, report: Report) -> ExampleResult:
    size = params.size
    async with Runtime(backend=backend, npu=params.npu.runtime_npu, label=NAME) as rt:
        npu = rt.npu(0)
        kernel = load_copy(npu, size, "passthrough", params.npu)
        a = rt.allocate(size, shared(npu.index), "a")
        c = rt.allocate(size, shared(npu.index), "c")
        graph = rt.graph(NAME)
        graph.fill(a.view(), PATTERN)
        graph.npu(kernel, [a.view(), c.view()])
        prepared = graph.prepare()
        for _ in range(WARMUPS):
            await prepared.submit()
        samples: list[float] = []
        for index in range(TIMED):
            report.progress(f"timed execution {index + 1}/{TIMED}")
            start = time.perf_counter()
            await prepared.submit()
            samples.append(time.perf_counter() - start)
        async with c.map_read() as memory:
            wrong = int(np.count_nonzero(np.frombuffer(memory, np.uint8) != PATTERN))
        if wrong:
            raise ExampleFailed(f"incorrect benchmark output: {wrong} of {size} bytes wrong")
        samples.sort()
        p50_us = percentile(samples, 50) * 1e6
        p95_us = percentile(samples, 95) * 1e6
        report.line(f"bytes={size} p50_us={p50_us:.2f} p95_us={p95_us:.2f}")
        values = {
            "backend": rt.backend_name,
            "npu_target": npu.target,
            "bytes": size,
            "p50_us": p50_us,
            "p95_us": p95_us,
        }
    return ExampleResult(values)


SPEC = ExampleSpec(NAME, USAGE, parse, run)


def main(argv: Sequence[str] | None = None) -> int:
    return main_for(SPEC, argv)


if __name__ == "__main__":
    sys.exit(main())
