"""GPU → NPU → GPU on shared memory, with every byte checked.

A GPU fill writes 0x5a into `a`, the NPU copies `a` into `c`, and a GPU copy
moves `c` into `result`: three regions, no staging copies through the host.
Ten executions, each checked byte for byte.

usage: shared_roundtrip [--npu auto|sim|xrt] [--xclbin PATH --insts PATH] [--npu-kernel NAME]
       [bytes]

The NPU copy runs on the sim NPU, or with `--npu xrt --xclbin F --insts F` on an
XRT NPU (see `npu_choice`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np

from .. import Runtime, shared
from ._shared import SharedParams, load_copy, parse_shared
from .common import ExampleFailed, ExampleResult, ExampleSpec, Report, main_for
from .npu_choice import USAGE as NPU_USAGE

NAME = "shared_roundtrip"
USAGE = f"usage: shared_roundtrip {NPU_USAGE} [bytes]"
EXECUTIONS = 10
PATTERN = 0x5A


def parse(args: Sequence[str]) -> SharedParams:
    return parse_shared(args, USAGE)


async def run(params: SharedParams, backend: str, report: Report) -> ExampleResult:
    size = params.size
    async with Runtime(backend=backend, npu=params.npu.runtime_npu, label=NAME) as rt:
        npu = rt.npu(0)
        kernel = load_copy(npu, size, "u32 passthrough", params.npu)
        a = rt.allocate(size, shared(npu.index), "a")
        c = rt.allocate(size, shared(npu.index), "c")
        result = rt.allocate(size, shared(npu.index), "result")
        graph = rt.graph(NAME)
        graph.fill(a.view(), PATTERN)
        graph.npu(kernel, [a.view(), c.view()])
        graph.copy(result.view(), c.view())
        prepared = graph.prepare()
        for execution in range(EXECUTIONS):
            report.progress(f"execution {execution + 1}/{EXECUTIONS}")
            await prepared.submit()
            async with result.map_read() as memory:
                wrong = np.flatnonzero(np.frombuffer(memory, np.uint8) != PATTERN)
                if wrong.size:
                    raise ExampleFailed(
                        f"GPU/NPU roundtrip mismatch in execution {execution + 1}: "
                        f"{wrong.size} of {size} bytes wrong, first at offset {int(wrong[0])}"
                    )
        regions = len(prepared.regions)
        report.line(
            f"GPU -> NPU -> GPU: all {size} bytes correct, {EXECUTIONS} executions, "
            f"{regions} prepared regions"
        )
        values = {
            "backend": rt.backend_name,
            "npu_target": npu.target,
            "bytes": size,
            "executions": EXECUTIONS,
            "regions": regions,
        }
    return ExampleResult(values)


SPEC = ExampleSpec(NAME, USAGE, parse, run)


def main(argv: Sequence[str] | None = None) -> int:
    return main_for(SPEC, argv)


if __name__ == "__main__":
    sys.exit(main())
