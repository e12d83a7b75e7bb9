"""What `hrx-async info` and `hrx-async doctor` report about this machine.

Everything here looks, nothing installs or downloads: package versions come
from the installed distributions' metadata, backends are probed by opening
them (`hrx_async.backends.probe`), device nodes are listed from /dev, and the
doctor's self-test runs a tiny graph on each usable backend.
"""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import os
import platform
import sys
from collections.abc import Iterable
from typing import Any

import anyio
import numpy as np

from .. import __version__
from .._build import build
from ..backends import GPU_BACKENDS, probe, resolve
from ..errors import BackendUnavailable, ContractError

PACKAGES = (
    ("numpy", "required"),
    ("anyio", "required"),
    ("trio", "optional extra 'trio': the trio event loop"),
    ("uvloop", "optional extra 'uvloop': asyncio on uvloop"),
    ("platformdirs", "optional extra 'cache': the kernel cache in each system's cache folder"),
    ("matplotlib", "optional extra 'plot': timeline pictures"),
    ("cuda-bindings", "optional extra 'cuda': NVIDIA GPUs"),
    ("hip-python", "optional extra 'hip': AMD GPUs"),
)

DEVICE_NODES = (
    ("NVIDIA GPU", ("/dev/nvidiactl", "/dev/nvidia[0-9]*")),
    ("AMD GPU (ROCm)", ("/dev/kfd",)),
    ("GPU render node", ("/dev/dri/renderD*",)),
    ("NPU (accel)", ("/dev/accel/accel*",)),
)


def package_versions() -> dict[str, str | None]:
    """Installed version of each package the runtime can use (None when missing)."""
    found: dict[str, str | None] = {}
    for name, _ in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    # pyxrt ships with XRT, not as a distribution: look for the module without importing it.
    found["pyxrt"] = "present" if importlib.util.find_spec("pyxrt") is not None else None
    return found


def backend_reports() -> list[dict[str, Any]]:
    """`probe` of every GPU backend; a backend that breaks while probing is reported as such."""
    reports: list[dict[str, Any]] = []
    for name in GPU_BACKENDS:
        try:
            report = probe(name)
        except Exception as exc:  # a broken driver is a finding, not a crash
            report = {"backend": name, "available": False, "reason": f"probe failed: {exc}"}
        report.setdefault("backend", name)
        reports.append(report)
    return reports


def auto_choice(reports: Iterable[dict[str, Any]]) -> str:
    """What `Runtime()` (backend "auto", HRX_BACKEND read) opens here.

    Raises what opening it would raise: ContractError for a bad HRX_BACKEND,
    BackendUnavailable when the backend it names cannot open.
    """
    return resolve("auto", {report["backend"]: report for report in reports})


def runtime_outcome(reports: Iterable[dict[str, Any]]) -> tuple[str | None, str | None]:
    """(backend `Runtime()` opens, None), or (None, why `Runtime()` would fail here)."""
    try:
        return auto_choice(reports), None
    except (ContractError, BackendUnavailable) as exc:
        return None, str(exc)


def device_nodes() -> dict[str, list[str]]:
    """Device files present, by kind of device."""
    return {
        kind: sorted(path for pattern in patterns for path in glob.glob(pattern))
        for kind, patterns in DEVICE_NODES
    }


def info() -> dict[str, Any]:
    """Versions, platform, build (compiled or pure) and backends as one JSON-ready object."""
    backends = backend_reports()
    chosen, problem = runtime_outcome(backends)
    return {
        "hrx_async": __version__,
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "build": build(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "packages": package_versions(),
        "backends": backends,
        "auto": chosen,
        "auto_error": problem,
        "HRX_BACKEND": os.environ.get("HRX_BACKEND"),
        "npu": npu_report(),
    }


def npu_report() -> dict[str, Any]:
    """Which NPU `Runtime()` uses here (HRX_NPU, else xrt when it opens, else sim) and the
    xrt checks behind that choice. `error` is set when the choice cannot be honoured."""
    from ..backends import xrt

    forced = os.environ.get("HRX_NPU")
    mode = (forced or "auto").strip().lower() or "auto"
    report: dict[str, Any] = {"HRX_NPU": forced, "opens": None, "error": None}
    if mode not in ("auto", "sim", "xrt", "none"):
        report["error"] = f"HRX_NPU must be one of auto, sim, xrt, none; got {forced!r}"
        return report
    checks = xrt.doctor_lines()
    report["xrt"] = [{"check": line, "ok": ok} for line, ok in checks]
    if mode in ("sim", "none"):
        report["opens"] = mode
        return report
    try:
        xrt.import_pyxrt().device(0)  # what Runtime(npu="auto") tries
    except Exception as exc:  # any failure to reach XRT means: not usable here
        usable, why = False, str(exc)
    else:
        usable, why = True, ""
    if usable:
        report["opens"] = "xrt"
    elif mode == "xrt":
        report["error"] = f"HRX_NPU=xrt, but xrt is unavailable: {why}"
    else:
        report["opens"] = "sim"
    return report


async def self_test(backend: str) -> str | None:
    """Run upload → kernel → download and an NPU copy on `backend`; None if all is right."""
    from .. import (
        GPU_LOCAL,
        HOST_VISIBLE,
        Access,
        Binding,
        KernelContract,
        KernelSource,
        Runtime,
        npu_local,
    )
    from ..examples.kernels import AFFINE_CXX, affine_host, npu_copy

    count = 1024
    size = count * 4
    async with Runtime(backend=backend, label="doctor") as rt:
        affine = rt.load_gpu_kernel(
            KernelSource(cxx=AFFINE_CXX, host=affine_host),
            "affine",
            (count // 256, 1, 1),
            (256, 1, 1),
            KernelContract([Binding(size, Access.READ), Binding(size, Access.WRITE)]),
        )
        host = rt.allocate(size, HOST_VISIBLE, "host")
        x = rt.allocate(size, GPU_LOCAL, "x")
        y = rt.allocate(size, GPU_LOCAL, "y")
        graph = rt.graph("doctor")
        graph.copy(x.view(), host.view())
        graph.gpu(affine, [x.view(), y.view()])
        graph.copy(host.view(), y.view())
        step = graph.prepare()
        async with host.map_write() as memory:
            np.frombuffer(memory, np.int32)[:] = np.arange(count, dtype=np.int32)
        await step.submit()
        async with host.map_read() as memory:
            got = np.frombuffer(memory, np.int32).copy()
        if not np.array_equal(got, np.arange(count, dtype=np.int32) * 3 + 7):
            return f"{backend}: the GPU kernel computed wrong values"

        npu = rt.npu(0)
        copy = npu.load_artifact(
            KernelSource(host=npu_copy),
            "copy",
            1,
            KernelContract([Binding(size, Access.READ), Binding(size, Access.WRITE)]),
        )
        source = rt.allocate(size, npu_local(npu.index), "npu_in")
        target = rt.allocate(size, npu_local(npu.index), "npu_out")
        npu_graph = rt.graph("doctor_npu")
        npu_graph.npu(copy, [source.view(), target.view()])
        async with source.map_write() as memory:
            np.frombuffer(memory, np.uint8)[:] = 0xA5
        await npu_graph.prepare().submit()
        async with target.map_read() as memory:
            if not bool((np.frombuffer(memory, np.uint8) == 0xA5).all()):
                return f"{backend}: the NPU copy produced wrong bytes"
    return None


def run_self_tests(backends: Iterable[str]) -> dict[str, str | None]:
    """The self-test of each backend: None when it passed, else what went wrong."""
    results: dict[str, str | None] = {}
    for name in backends:
        try:
            results[name] = anyio.run(self_test, name)
        except Exception as exc:  # the doctor reports every failure instead of stopping
            results[name] = f"{name}: {type(exc).__name__}: {exc}"
    return results


__all__ = [
    "auto_choice",
    "backend_reports",
    "device_nodes",
    "info",
    "npu_report",
    "package_versions",
    "run_self_tests",
    "runtime_outcome",
    "self_test",
]
