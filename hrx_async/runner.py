"""`hrx-async run`: launch one kernel on files and dump its buffers.

The grammar is the original runner's: `--kernel`, `--grid x,y,z` and
`--block x,y,z` (missing parts are 1), `--repeat N` (one warm-up launch first
when N > 1), scalars `--i32 V` / `--f32 V`, and buffers `--in PATH`,
`--inout PATH`, `--out PATH:BYTES`, bound in the order they are given.
`--rotate-input INDEX:COUNT` gives buffer INDEX (an `--in`) COUNT device
copies (2..64) that successive launches cycle through, so no launch reads
what the previous one left in the caches.

On the sim backend the kernel is `module:function` (or `file.py:function`), a
host kernel as `hrx_async.kernels` describes; on GPU backends it is
`FILE[:SYMBOL]`, CUDA/HIP C++ source (.cu, .hip, .cpp) compiled at load or a
code object for the device's target. Outputs and in-out buffers are written
back to their files. One JSON line reports `launches`, `total_ms`,
`per_launch_us` and `input_copies` (device copies of the rotated input; 1
without rotation).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import (
    GPU_LOCAL,
    HOST_VISIBLE,
    Access,
    Binding,
    Buffer,
    Completion,
    Constants,
    KernelContract,
    KernelSource,
    Runtime,
)
from .errors import ContractError

SOURCE_SUFFIXES = (".cu", ".cuh", ".hip", ".cpp", ".cc", ".cxx")
ACCESS = {"in": Access.READ, "inout": Access.READ_WRITE, "out": Access.WRITE}


@dataclass(frozen=True)
class BufferArg:
    """One `--in`, `--inout` or `--out` argument."""

    kind: str
    path: Path
    nbytes: int


@dataclass(frozen=True)
class RunSpec:
    """A validated `run` command line."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    repeat: int = 1
    buffers: tuple[BufferArg, ...] = ()
    scalars: tuple[tuple[str, float], ...] = ()
    rotate: tuple[int, int] | None = None
    backend: str = "auto"
    loop: str = "asyncio"


def parse_dims(text: str, what: str) -> tuple[int, int, int]:
    """`x[,y[,z]]` with positive integers; missing parts are 1."""
    parts = text.split(",")
    try:
        values = [int(part, 10) for part in parts]
    except ValueError:
        raise ContractError(f"{what} must be x,y,z positive integers, got {text!r}") from None
    if not 1 <= len(values) <= 3 or min(values) < 1:
        raise ContractError(f"{what} must be 1 to 3 positive integers x,y,z, got {text!r}")
    values += [1] * (3 - len(values))
    return (values[0], values[1], values[2])


def parse_out(text: str) -> tuple[Path, int]:
    """`PATH:BYTES` for an output buffer."""
    path, sep, size = text.rpartition(":")
    if not sep or not path:
        raise ContractError(f"--out takes PATH:BYTES, got {text!r}")
    try:
        nbytes = int(size, 10)
    except ValueError:
        raise ContractError(f"--out BYTES must be an integer, got {size!r} in {text!r}") from None
    if nbytes < 1:
        raise ContractError(f"--out BYTES must be >= 1, got {nbytes}")
    return Path(path), nbytes


def parse_rotate(text: str, buffers: tuple[BufferArg, ...]) -> tuple[int, int]:
    """`INDEX:COUNT` naming an `--in` buffer and 2..64 copies."""
    index_text, sep, count_text = text.partition(":")
    try:
        index, count = int(index_text, 10), int(count_text, 10)
    except ValueError:
        raise ContractError(f"--rotate-input takes INDEX:COUNT, got {text!r}") from None
    if not sep or not 2 <= count <= 64:
        raise ContractError(f"--rotate-input COUNT must be in 2..64, got {text!r}")
    if not 0 <= index < len(buffers):
        raise ContractError(
            f"--rotate-input INDEX must name a buffer 0..{len(buffers) - 1}, got {index}"
        )
    if buffers[index].kind != "in":
        raise ContractError(
            f"--rotate-input INDEX {index} is an --{buffers[index].kind} buffer; only --in "
            "buffers can rotate"
        )
    return index, count


def buffer_args(items: list[tuple[str, str]]) -> tuple[BufferArg, ...]:
    """Buffers in declaration order; input files must exist and be non-empty."""
    buffers: list[BufferArg] = []
    for kind, text in items:
        if kind == "out":
            path, nbytes = parse_out(text)
        else:
            path = Path(text)
            if not path.is_file():
                raise ContractError(f"--{kind} {text!r}: no such file")
            nbytes = path.stat().st_size
            if nbytes < 1:
                raise ContractError(f"--{kind} {text!r} is empty; a buffer needs >= 1 byte")
        buffers.append(BufferArg(kind, path, nbytes))
    if not buffers:
        raise ContractError("give at least one buffer (--in, --inout or --out PATH:BYTES)")
    return tuple(buffers)


def scalar_constants(scalars: tuple[tuple[str, float], ...]) -> Constants:
    constants = Constants()
    for kind, value in scalars:
        if kind == "i32":
            constants.i32(int(value))
        else:
            constants.f32(float(value))
    return constants


def import_kernel_module(name: str) -> Any:
    """A module by dotted name, or a `.py` file by path; ContractError if it cannot load."""
    if name.endswith(".py"):
        path = Path(name)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None or not path.is_file():
            raise ContractError(f"cannot load kernel file {name!r}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ContractError(f"cannot import kernel module {name!r}: {exc}") from None


def kernel_source(kernel: str, backend: str, target: str) -> tuple[KernelSource, str]:
    """The kernel's source and name: a host function on sim, source or code on GPUs."""
    location, sep, symbol = kernel.rpartition(":")
    if backend == "sim":
        if not sep or not location or not symbol:
            raise ContractError(
                f"on the sim backend --kernel is module:function or file.py:function, "
                f"got {kernel!r}"
            )
        function = getattr(import_kernel_module(location), symbol, None)
        if not callable(function):
            raise ContractError(f"{location} has no callable {symbol!r}")
        return KernelSource(host=function), symbol
    path = Path(location if sep else kernel)
    name = symbol if sep and symbol else path.stem
    if not path.is_file():
        raise ContractError(f"--kernel {kernel!r}: no such file {str(path)!r}")
    if path.suffix in SOURCE_SUFFIXES:
        return KernelSource(cxx=path.read_text()), name
    return KernelSource(binary={target: path}), name


async def run_kernel(spec: RunSpec) -> dict[str, Any]:
    """Upload the inputs, launch `repeat` times (after a warm-up), download, report."""
    async with Runtime(backend=spec.backend, label="run") as rt:
        source, name = kernel_source(spec.kernel, rt.backend_name, rt.gpu().target)
        contract = KernelContract(
            [Binding(b.nbytes, ACCESS[b.kind], layout=b.path.name) for b in spec.buffers],
            scalar_constants(spec.scalars),
        )
        kernel = rt.load_gpu_kernel(source, name, spec.grid, spec.block, contract)
        copies = spec.rotate[1] if spec.rotate is not None else 1
        device: list[list[Buffer]] = []
        staging: list[Buffer] = []
        for index, arg in enumerate(spec.buffers):
            count = copies if spec.rotate is not None and spec.rotate[0] == index else 1
            device.append(
                [rt.allocate(arg.nbytes, GPU_LOCAL, f"{arg.kind}{index}") for _ in range(count)]
            )
            staging.append(rt.allocate(arg.nbytes, HOST_VISIBLE, f"{arg.kind}{index}_host"))

        upload = rt.graph("upload")
        download = rt.graph("download")
        for index, arg in enumerate(spec.buffers):
            if arg.kind != "out":
                for target in device[index]:
                    upload.copy(target.view(), staging[index].view())
            if arg.kind != "in":
                download.copy(staging[index].view(), device[index][0].view())
        launches = []
        for turn in range(copies):
            graph = rt.graph(f"launch{turn}")
            graph.gpu(kernel, [views[turn % len(views)].view() for views in device])
            launches.append(graph.prepare())

        for index, arg in enumerate(spec.buffers):
            if arg.kind != "out":
                async with staging[index].map_write() as memory:
                    np.frombuffer(memory, np.uint8)[:] = np.fromfile(arg.path, np.uint8)
        if len(upload):
            await upload.prepare().submit()
        if spec.repeat > 1:
            await launches[0].submit()
        start = time.perf_counter()
        pending: list[Completion] = [
            launches[turn % copies].submit() for turn in range(spec.repeat)
        ]
        for completion in pending:
            await completion
        total = time.perf_counter() - start
        if len(download):
            await download.prepare().submit()
        for index, arg in enumerate(spec.buffers):
            if arg.kind != "in":
                async with staging[index].map_read() as memory:
                    arg.path.write_bytes(bytes(memory))
    return {
        "launches": spec.repeat,
        "total_ms": round(total * 1e3, 6),
        "per_launch_us": round(total * 1e6 / spec.repeat, 3),
        "input_copies": copies,
    }


def report_line(result: dict[str, Any]) -> str:
    return json.dumps(result)


__all__ = [
    "BufferArg",
    "RunSpec",
    "buffer_args",
    "kernel_source",
    "parse_dims",
    "parse_out",
    "parse_rotate",
    "run_kernel",
]
