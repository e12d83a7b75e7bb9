"""The Python cost the runtime adds per NPU region on the xrt backend.

Each sample is a block of `--regions` dependent NPU regions (a one-launch
graph replayed with `await step.submit()`), against the same work done
directly on pyxrt in the same process: flush the input range, `run.start()`,
poll `run.state()` until it ends, invalidate the output range. Blocks
alternate which variant goes first. Reported: µs per region for each, and the
difference (what coordination adds).

Without `--xclbin` it runs over the fake pyxrt of the test suite (latency 0),
so the difference is the runtime's own Python work; with an NPU and an
mlir-aie build it runs on the real binding:

    python benchmarks/xrt_overhead.py [--blocks 200] [--regions 20] [--loop asyncio|trio]
    python benchmarks/xrt_overhead.py --xclbin final.xclbin --insts insts.bin --kernel MLIR_AIE
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np

import hrx_async as hrx
from hrx_async.backends.xrt import xrt_source

NBYTES = 4096


def install_fake(tmp: Path) -> tuple[Path, Path, str]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import fake_pyxrt

    fake_pyxrt.install()

    def passthrough(arrays: list[np.ndarray[Any, Any]]) -> None:
        np.copyto(arrays[1], arrays[0])

    fake_pyxrt.FAKE.references["MLIR_AIE"] = passthrough
    xclbin = fake_pyxrt.write_xclbin(tmp / "bench.xclbin", {"MLIR_AIE": 8})
    insts = tmp / "insts.bin"
    np.arange(1, 65, dtype=np.uint32).tofile(insts)
    return xclbin, insts, "MLIR_AIE"


async def measure(args: argparse.Namespace, xclbin: Path, insts: Path, kernel_name: str) -> dict:
    contract = hrx.KernelContract(
        [hrx.Binding(NBYTES, hrx.Access.READ), hrx.Binding(NBYTES, hrx.Access.WRITE)]
    )
    async with hrx.Runtime(backend="sim", npu="xrt") as rt:
        backend = rt._npu_backend
        xrt = backend.xrt
        kernel = rt.npu(0).load_artifact(xrt_source(xclbin, insts), kernel_name, 1, contract)
        a, c = rt.allocate(NBYTES, hrx.npu_local(0)), rt.allocate(NBYTES, hrx.npu_local(0))
        graph = rt.graph()
        graph.npu(kernel, [a.view(), c.view()])
        step = graph.prepare()

        # The same work straight on pyxrt: its own buffers and a ready run.
        loaded = kernel.native
        bo_a = xrt.bo(backend.device, NBYTES, xrt.bo.host_only, loaded.groups[3])
        bo_c = xrt.bo(backend.device, NBYTES, xrt.bo.host_only, loaded.groups[4])
        run = xrt.run(loaded.kernel)
        for index, value in enumerate((3, loaded.insts, loaded.count, bo_a, bo_c)):
            run.set_arg(index, value)
        to_dev = xrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE
        from_dev = xrt.xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE

        async def direct() -> float:
            start = time.perf_counter()
            for _ in range(args.regions):
                bo_a.sync(to_dev, NBYTES, 0)
                run.start()
                while True:
                    state = int(run.state())
                    if state not in (1, 2, 3, 7):
                        break
                    await anyio.lowlevel.checkpoint()
                if state != 4:
                    raise RuntimeError(f"run ended in state {state}")
                bo_c.sync(from_dev, NBYTES, 0)
            await anyio.lowlevel.checkpoint()  # the coordinated variant's last await
            return (time.perf_counter() - start) / args.regions

        async def coordinated() -> float:
            start = time.perf_counter()
            for _ in range(args.regions):
                await step.submit()
            return (time.perf_counter() - start) / args.regions

        for _ in range(5):
            await direct()
            await coordinated()
        direct_s: list[float] = []
        coordinated_s: list[float] = []
        for block in range(args.blocks):
            if block % 2 == 0:
                direct_s.append(await direct())
                coordinated_s.append(await coordinated())
            else:
                coordinated_s.append(await coordinated())
                direct_s.append(await direct())
        added = [c - d for c, d in zip(coordinated_s, direct_s, strict=True)]
        return {
            "loop": args.loop,
            "pyxrt": "fake" if args.xclbin is None else getattr(xrt, "__file__", "pyxrt"),
            "blocks": args.blocks,
            "regions_per_block": args.regions,
            "direct_us_per_region_p50": statistics.median(direct_s) * 1e6,
            "coordinated_us_per_region_p50": statistics.median(coordinated_s) * 1e6,
            "added_us_per_region_p50": statistics.median(added) * 1e6,
            "added_us_per_region_p90": sorted(added)[int(len(added) * 0.9)] * 1e6,
            "starts_checked": rt.statistics().completions,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=200)
    parser.add_argument("--regions", type=int, default=20)
    parser.add_argument("--loop", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument("--xclbin", type=Path)
    parser.add_argument("--insts", type=Path)
    parser.add_argument("--kernel", default="MLIR_AIE")
    args = parser.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        if args.xclbin is None:
            xclbin, insts, name = install_fake(Path(tmp))
        else:
            if args.insts is None:
                parser.error("--xclbin needs --insts")
            xclbin, insts, name = args.xclbin, args.insts, args.kernel
        result = anyio.run(measure, args, xclbin, insts, name, backend=args.loop)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
