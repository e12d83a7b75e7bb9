"""Cache maintenance of an NPU chain on the xrt backend: bytes `bo.sync`ed per replay.

A chain of `--runs` NPU regions, each copying one buffer of `--mib` MiB into the next
(buffer i -> buffer i + 1), replayed three ways: recorded as one graph; as one
single-region graph per run, all submitted before the first is awaited; and the same
graphs awaited one by one. Over the fake pyxrt of the test suite; the bytes are the
runtime's `cache_maintenance_bytes` (flushes towards the NPU plus invalidations).

    python benchmarks/xrt_syncs.py [--runs 4] [--mib 1] [--loop asyncio|trio]
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
from pathlib import Path
from typing import Any

import anyio
from xrt_overhead import install_fake

import hrx_async as hrx
from hrx_async.backends.xrt import xrt_source


async def measure(args: argparse.Namespace, xclbin: Path, insts: Path, name: str) -> dict:
    nbytes = args.mib << 20
    contract = hrx.KernelContract(
        [hrx.Binding(nbytes, hrx.Access.READ), hrx.Binding(nbytes, hrx.Access.WRITE)]
    )
    async with hrx.Runtime(backend="sim", npu="xrt") as rt:
        kernel = rt.npu(0).load_artifact(xrt_source(xclbin, insts), name, 1, contract)
        buffers = [rt.allocate(nbytes, hrx.npu_local(0)) for _ in range(args.runs + 1)]
        pairs = list(itertools.pairwise(buffers))
        graph = rt.graph("chain")
        for src, dst in pairs:
            graph.npu(kernel, [src.view(), dst.view()])
        chain = graph.prepare()
        singles = []
        for src, dst in pairs:
            single = rt.graph("link")
            single.npu(kernel, [src.view(), dst.view()])
            singles.append(single.prepare())

        def synced() -> int:
            return rt.statistics().cache_maintenance_bytes

        before = synced()
        await chain.submit()
        one_graph = synced() - before
        before = synced()
        completions = [single.submit() for single in singles]
        for completion in completions:
            await completion
        pending = synced() - before
        before = synced()
        for single in singles:
            await single.submit()
        awaited = synced() - before
        return {
            "loop": args.loop,
            "runs": args.runs,
            "buffer_mib": args.mib,
            "synced_mib_one_graph": one_graph / (1 << 20),
            "synced_mib_pending_submissions": pending / (1 << 20),
            "synced_mib_awaited_submissions": awaited / (1 << 20),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--mib", type=int, default=1)
    parser.add_argument("--loop", choices=("asyncio", "trio"), default="asyncio")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        xclbin, insts, name = install_fake(Path(tmp))
        result: Any = anyio.run(measure, args, xclbin, insts, name, backend=args.loop)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
