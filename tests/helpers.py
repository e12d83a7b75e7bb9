"""Small kernels and graph builders shared by the runtime tests."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

import hrx_async as hrx

U8 = np.ndarray[Any, np.dtype[np.uint8]]


def mix_numpy(src: U8, dst: U8) -> None:
    dst[:] = (src.astype(np.uint16) * 3 + 1).astype(np.uint8)


def mix_kernel(arrays: list[U8], constants: bytes) -> None:
    mix_numpy(arrays[0], arrays[1])


MIX_CXX = r"""
extern "C" __global__ void mix(const unsigned char* src, unsigned char* dst, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = (unsigned char)(src[i] * 3u + 1u);
}
"""


def load_mix(rt: hrx.Runtime, nbytes: int) -> hrx.GpuKernel:
    """A GPU kernel dst = src*3+1 (mod 256) over `nbytes` bytes, in C++ and numpy."""
    contract = hrx.KernelContract(
        [hrx.Binding(nbytes, hrx.Access.READ, 1), hrx.Binding(nbytes, hrx.Access.WRITE, 1)],
        hrx.Constants().u32(nbytes),
    )
    return rt.load_gpu_kernel(
        hrx.KernelSource(cxx=MIX_CXX, host=mix_kernel),
        "mix",
        grid=((nbytes + 255) // 256,),
        block=(256,),
        contract=contract,
    )


def load_npu_mix(rt: hrx.Runtime, nbytes: int) -> hrx.NpuKernel:
    contract = hrx.KernelContract(
        [hrx.Binding(nbytes, hrx.Access.READ, 1), hrx.Binding(nbytes, hrx.Access.WRITE, 1)]
    )
    return rt.npu(0).load_artifact(hrx.KernelSource(host=mix_kernel), "npu_mix", 1, contract)


async def read_bytes(rt: hrx.Runtime, buffer: hrx.Buffer) -> bytes:
    """The buffer's bytes, through a host staging copy when it cannot be mapped."""
    if buffer.placement.host_mappable:
        async with buffer.map_read() as memory:
            return bytes(memory)
    staging = rt.allocate(buffer.nbytes, hrx.HOST_VISIBLE)
    graph = rt.graph("read-back")
    graph.copy(staging.view(), buffer.view())
    await graph.prepare().submit()
    async with staging.map_read() as memory:
        data = bytes(memory)
    staging.free()
    return data


async def write_bytes(buffer: hrx.Buffer, data: bytes) -> None:
    async with buffer.map_write() as memory:
        memory[:] = data


def load_module(path: Path, name: str) -> ModuleType:
    """Import the program at `path` (an example outside the package) once, as `name`."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        # As the import system does: a module that failed to run is not left half made
        # for the next test to find.
        del sys.modules[name]
        raise
    return module


def require_ray(config: Any) -> ModuleType:
    """`ray` for a test marked `ray`: skipped unless `-m ray` selects it or Ray is missing
    (failed instead when HRX_RAY_REQUIRED=1, as in `.ci/run`, so a broken install shows)."""
    import pytest

    expression = config.getoption("markexpr") or ""
    if "ray" not in expression or "not ray" in expression:
        pytest.skip("starts a Ray cluster: select it with -m ray")
    if importlib.util.find_spec("ray") is None:
        message = 'Ray is not installed: pip install ".[ray]"'
        if os.environ.get("HRX_RAY_REQUIRED") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return importlib.import_module("ray")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def fifo_with_a_late_writer(path: Path, after_s: float = 1.0) -> Iterator[Path]:
    """A FIFO at `path` that a writer opens after `after_s`, so a reader wrongly blocked in
    open() goes on (and the test fails) instead of hanging; with no reader it does nothing."""
    os.mkfifo(path)

    def writer_comes() -> None:
        with contextlib.suppress(OSError):
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))

    late_writer = threading.Timer(after_s, writer_comes)
    late_writer.daemon = True
    late_writer.start()
    try:
        yield path
    finally:
        late_writer.cancel()
