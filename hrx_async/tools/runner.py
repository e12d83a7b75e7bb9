"""`hrx-async run`: launch one kernel on files and dump its buffers.

The grammar is the original runner's: `--kernel`, `--grid x,y,z` and
`--block x,y,z` (missing parts are 1), `--repeat N` (one warm-up launch first
when N > 1), scalars `--i32 V` / `--f32 V`, and buffers `--in PATH`,
`--inout PATH`, `--out PATH:BYTES`, bound in the order they are given.
`--rotate-input INDEX:COUNT` gives buffer INDEX (an `--in`) COUNT device
copies (2..64) that successive launches cycle through, so no launch reads
what the previous one left in the caches.

On the sim backend the kernel is `module:function` (or `file.py:function`), a
host kernel as `hrx_async._core.kernels` describes; on GPU backends it is
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
import os
import stat
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import (
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
from ..errors import ContractError, HrxError
from ..files import file_kind

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
        raise ContractError(f"--rotate-input COUNT must be 2 <= COUNT <= 64, got {text!r}")
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


def regular_file(option: str, text: str) -> os.stat_result:
    """`os.stat` of the file an option names; ContractError unless it is a regular file."""
    try:
        info = os.stat(text)
    except FileNotFoundError:
        raise ContractError(f"{option} {text!r}: no such file") from None
    except OSError as exc:
        raise ContractError(f"{option} {text!r}: cannot read it: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ContractError(f"{option} {text!r} is {file_kind(info.st_mode)}, not a regular file")
    return info


def input_file_size(kind: str, text: str) -> int:
    """The size of the regular, readable, non-empty file an `--in` / `--inout` names."""
    path = Path(text)
    info = regular_file(f"--{kind}", text)
    wanted = os.R_OK | (os.W_OK if kind == "inout" else 0)
    if not os.access(path, wanted):
        what = "readable" if kind == "in" else "readable and writable"
        raise ContractError(f"--{kind} {text!r} is not {what} by this user")
    if info.st_size < 1:
        raise ContractError(f"--{kind} {text!r} is empty; a buffer needs >= 1 byte")
    return info.st_size


def check_output_path(path: Path) -> None:
    """An `--out` file must be writable where it is: not a directory, in an existing one."""
    if path.is_dir():
        raise ContractError(f"--out {str(path)!r} is a directory, not a file")
    parent = path.parent
    if not parent.is_dir():
        raise ContractError(f"--out {str(path)!r}: no such directory {str(parent)!r}")


def buffer_args(items: list[tuple[str, str]]) -> tuple[BufferArg, ...]:
    """Buffers in declaration order; input files must be non-empty regular files."""
    buffers: list[BufferArg] = []
    for kind, text in items:
        if kind == "out":
            path, nbytes = parse_out(text)
            check_output_path(path)
        else:
            path = Path(text)
            nbytes = input_file_size(kind, text)
        buffers.append(BufferArg(kind, path, nbytes))
    if not buffers:
        raise ContractError("give at least one buffer (--in, --inout or --out PATH:BYTES)")
    return tuple(buffers)


# -- host memory -------------------------------------------------------------------------


def _proc_kib(path: str, keys: tuple[str, ...]) -> dict[str, int]:
    """`Key:   123 kB` lines of a /proc file, in bytes; empty where there is no such file."""
    values: dict[str, int] = {}
    try:
        with open(path, encoding="ascii", errors="replace") as lines:
            for line in lines:
                key, _, rest = line.partition(":")
                if key in keys:
                    values[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return {}
    return values


def _cgroup_headroom() -> int | None:
    """Bytes left under this process's cgroup v2 memory limit, if it has one."""
    try:
        with open("/proc/self/cgroup", encoding="ascii", errors="replace") as lines:
            entries = [line.strip().split(":", 2) for line in lines]
        relative = next(e[2] for e in entries if len(e) == 3 and e[0] == "0")
        base = Path("/sys/fs/cgroup") / relative.lstrip("/")
        limit = (base / "memory.max").read_text().strip()
        current = (base / "memory.current").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int(current))
    except (OSError, ValueError, StopIteration):
        return None


def host_memory_headroom() -> tuple[int, str] | None:
    """About how many bytes this process can still allocate, and what sets that, or None
    where the system does not say. The smallest of: memory available (with free swap), the
    address-space and data-size limits (`ulimit -v`, `ulimit -d`) less what is in use, and
    the cgroup's memory limit less its usage."""
    candidates: list[tuple[int, str]] = []
    meminfo = _proc_kib("/proc/meminfo", ("MemAvailable", "SwapFree"))
    if "MemAvailable" in meminfo:
        candidates.append(
            (meminfo["MemAvailable"] + meminfo.get("SwapFree", 0), "available memory and swap")
        )
    else:
        try:
            pages = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            pages = -1
        if pages > 0:
            candidates.append((pages, "available memory"))
    try:
        import resource
    except ImportError:  # not on Windows
        pass
    else:
        status = _proc_kib("/proc/self/status", ("VmSize", "VmData"))
        for limit_id, name, key in (
            (resource.RLIMIT_AS, "the address-space limit (ulimit -v)", "VmSize"),
            (resource.RLIMIT_DATA, "the data-size limit (ulimit -d)", "VmData"),
        ):
            soft = resource.getrlimit(limit_id)[0]
            if soft != resource.RLIM_INFINITY:
                candidates.append((max(0, soft - status.get(key, 0)), name))
    cgroup = _cgroup_headroom()
    if cgroup is not None:
        candidates.append((cgroup, "the cgroup memory limit"))
    return min(candidates) if candidates else None


def _gib(nbytes: int) -> str:
    return f"{nbytes / (1 << 30):.1f} GiB"


def check_host_memory(spec: RunSpec, backend: str) -> None:
    """Refuse buffers that cannot fit in host memory, before allocating any of them.

    Every buffer has host staging; on the sim backend the device copies are host memory too.
    """
    copies = [
        spec.rotate[1] if spec.rotate is not None and spec.rotate[0] == index else 1
        for index in range(len(spec.buffers))
    ]
    staging = sum(arg.nbytes for arg in spec.buffers)
    device = sum(arg.nbytes * count for arg, count in zip(spec.buffers, copies, strict=True))
    needed = staging + (device if backend == "sim" else 0)
    if needed > sys.maxsize:
        raise ContractError(
            f"the buffers need {needed} bytes of host memory, more than this machine can "
            f"address ({sys.maxsize} bytes)"
        )
    headroom = host_memory_headroom()
    if headroom is not None and needed > headroom[0]:
        limit, what = headroom
        raise ContractError(
            f"the buffers need {needed} bytes ({_gib(needed)}) of host memory, but only "
            f"{limit} bytes ({_gib(limit)}) can be allocated here (limited by {what})"
        )


def scalar_constants(scalars: tuple[tuple[str, float], ...]) -> Constants:
    constants = Constants()
    for kind, value in scalars:
        if kind == "i32":
            constants.i32(int(value))
        else:
            constants.f32(float(value))
    return constants


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _kernel_code_error(name: str, module: str, exc: BaseException) -> HrxError:
    """One line naming where kernel `name` (module `module`) failed while being imported:
    ContractError when it cannot be loaded here (not Python, or an import in it fails),
    HrxError when its own code raised."""
    if isinstance(exc, SyntaxError):
        line = f", line {exc.lineno}" if exc.lineno else ""
        return ContractError(
            f"kernel {name!r} is not valid Python: {exc.filename or name}{line}: "
            f"{type(exc).__name__}: {exc.msg}"
        )
    # The kernel module's own line that raised, else the deepest one outside the import
    # machinery.
    frames = [
        (frame.f_globals.get("__name__"), frame.f_code.co_filename, lineno)
        for frame, lineno in traceback.walk_tb(exc.__traceback__)
    ]
    own = [f for f in frames if f[0] == module]
    frames = own or [f for f in frames if not f[1].startswith("<frozen ")]
    where = f" at {frames[-1][1]}, line {frames[-1][2]}" if frames else ""
    if isinstance(exc, ImportError):
        return ContractError(f"cannot import kernel {name!r}{where}: {_first_line(exc)}")
    return HrxError(f"kernel {name!r} raised on import{where}: {_first_line(exc)}")


def import_kernel_module(name: str) -> Any:
    """A module by dotted name, or a `.py` file by path.

    ContractError if it cannot be found, is not valid Python or an import in it fails;
    HrxError if its code raises while it is imported. Both name the file and line.
    """
    if name.endswith(".py"):
        path = Path(name)
        regular_file("--kernel", name)  # names the problem: no such file, a directory, ...
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise ContractError(f"cannot load kernel file {name!r}")
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            raise _kernel_code_error(name, spec.name, exc) from None
        return module
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and f"{name}.".startswith(f"{exc.name}."):
            raise ContractError(f"cannot import kernel module {name!r}: {exc}") from None
        raise _kernel_code_error(name, name, exc) from None
    except Exception as exc:
        raise _kernel_code_error(name, name, exc) from None


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
    regular_file("--kernel", str(path))
    if path.suffix in SOURCE_SUFFIXES:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ContractError(
                f"--kernel {str(path)!r} is not UTF-8 source text (byte {exc.start} is not)"
            ) from None
        return KernelSource(cxx=text), name
    return KernelSource(binary={target: path}), name


async def run_kernel(spec: RunSpec) -> dict[str, Any]:
    """Upload the inputs, launch `repeat` times (after a warm-up), download, report."""
    async with Runtime(backend=spec.backend, label="run") as rt:
        check_host_memory(spec, rt.backend_name)
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
                    read_exactly(arg.path, memory)
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
                    arg.path.write_bytes(memory)
    return {
        "launches": spec.repeat,
        "total_ms": round(total * 1e3, 6),
        "per_launch_us": round(total * 1e6 / spec.repeat, 3),
        "input_copies": copies,
    }


def read_exactly(path: Path, memory: memoryview) -> None:
    """Fill `memory` from the file, straight into it; the file must still have that size."""
    filled = 0
    with memory.cast("B") as target, open(path, "rb") as file:
        size = len(target)
        while filled < size:
            count = file.readinto(target[filled:])
            if not count:
                break
            filled += count
        longer = filled == size and file.read(1)
    if filled != size or longer:
        raise HrxError(f"{str(path)!r} changed size after the run started; it was {size} bytes")


def report_line(result: dict[str, Any]) -> str:
    return json.dumps(result)


__all__ = [
    "BufferArg",
    "RunSpec",
    "buffer_args",
    "check_host_memory",
    "host_memory_headroom",
    "input_file_size",
    "kernel_source",
    "parse_dims",
    "parse_out",
    "parse_rotate",
    "regular_file",
    "run_kernel",
]
