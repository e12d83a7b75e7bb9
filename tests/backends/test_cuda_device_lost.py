"""A kernel that faults the device turns the runtime to DeviceLost, with a clear message.

The fault corrupts the CUDA context for the rest of the process, so it runs in a
subprocess that reports what it saw as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hrx_async.backends import probe


def _cuda_usable() -> bool:
    try:
        return bool(probe("cuda").get("available"))
    except Exception:
        return False


SCRIPT = r'''
import json, sys
import anyio
import hrx_async as hrx

# The contract claims 4 bytes; the kernel writes far past any allocation.
FAULT = r"""
extern "C" __global__ void scribble(unsigned int* p) {
    p[(1ull << 38) + threadIdx.x] = 0xdeadbeef;
}
"""

async def main():
    report = {}
    async with hrx.Runtime(backend="cuda") as rt:
        target = rt.allocate(4, hrx.GPU_LOCAL)
        other = rt.allocate(1 << 20, hrx.GPU_LOCAL)
        kernel = rt.load_gpu_kernel(
            hrx.KernelSource(cxx=FAULT), "scribble", (1,), (32,),
            hrx.KernelContract([hrx.Binding(4, hrx.Access.WRITE)]),
        )
        bad = rt.graph("bad")
        bad.gpu(kernel, [target.view()])
        fine = rt.graph("fine")
        fine.fill(other.view(), 1)
        unrelated = fine.prepare()
        first = bad.prepare().submit()
        later = [unrelated.submit() for _ in range(8)]
        try:
            await first
            report["first"] = "ok"
        except hrx.HrxError as exc:
            report["first"] = type(exc).__name__
            report["first_message"] = str(exc)
            cause = exc.__cause__
            report["cause"] = type(cause).__name__ if cause else None
            report["sticky"] = bool(getattr(cause, "sticky", False))
            report["code"] = str(getattr(cause, "code", ""))
            report["operation"] = getattr(cause, "operation", "")
        outcomes = []
        for completion in later:
            try:
                await completion
                outcomes.append("ok")
            except hrx.HrxError as exc:
                outcomes.append(type(exc).__name__)
        report["later"] = outcomes
        report["healthy"] = rt.healthy
        try:
            unrelated.submit()
            report["new_submit"] = "accepted"
        except hrx.DeviceLost as exc:
            report["new_submit"] = "DeviceLost"
            report["new_submit_message"] = str(exc)
    report["closed"] = True
    print(json.dumps(report))

anyio.run(main)
'''


@pytest.mark.cuda
@pytest.mark.skipif(not _cuda_usable(), reason="no CUDA device answers here")
def test_out_of_bounds_kernel_loses_the_device(tmp_path: Path) -> None:
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["first"] in ("ExecutionError", "DeviceLost"), report
    assert report["sticky"] is True, report
    assert report["code"] in ("cudaErrorIllegalAddress", "cudaErrorLaunchFailure"), report
    assert report["code"] in report["first_message"], report
    # Work queued behind the fault fails too, by the sticky error or as DeviceLost.
    assert all(outcome in ("ExecutionError", "DeviceLost") for outcome in report["later"]), report
    assert report["healthy"] is False
    assert report["new_submit"] == "DeviceLost", report
    assert "device was lost" in report["new_submit_message"]
    assert report["code"] in report["new_submit_message"]
    assert report["closed"] is True
