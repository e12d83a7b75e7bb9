"""The XRT NPU backend: AMD Ryzen AI NPUs through XRT's Python binding, pyxrt.

Only this module imports pyxrt, lazily. NPU programs are the pair that
mlir-aie/IRON build: an xclbin and an instruction sequence (`insts.bin`
little-endian 32-bit words, or `insts.txt` with one hex word per line):

    source = xrt_source("final.xclbin", "insts.bin")     # KernelSource(binary={...})
    kernel = rt.npu().load_artifact(source, "MLIR_AIE", columns, contract)

A kernel is called as mlir-aie's host code calls it:
`kernel(3, insts, count, buffer0, buffer1, ...)` (opcode 3: a transaction), so
the xclbin's kernel must take at least `3 + len(contract.bindings)` arguments
(more buffers than that crash XRT, so this is checked first). One
`hw_context` per xclbin is made once and kept (making one costs ~95 ms).

Memory: `npu_local(i)` and `shared(i)` allocations are buffer objects
(`host_only`; instructions `cacheable`) whose host mapping (`bo.map()`) is the
storage the rest of the runtime reads and writes. Before a run, the byte
ranges it reads are flushed towards the NPU (`bo.sync(TO_DEVICE, n, offset)`),
except those whose last writer, as the runtime's access tracker saw it when the
run was admitted, is an earlier run on this NPU (see `XrtProgram.skipping`);
after it completes, the ranges it wrote are invalidated (`FROM_DEVICE`), before
any other engine can be ordered after it. Arguments whose memory is not a
buffer object of this device (another GPU backend's host memory) go through a
staging buffer made at prepare time: copied in, synced, and copied back.

Fences: see `xrt_runs` (polled `run.state()`, a watchdog, quarantine).
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._core.contract import Access, KernelContract
from .._core.kernels import KernelSource
from .._core.lane import Lane
from .._core.memory import Placement, PlacementKind, View
from .._core.ops import NpuLaunch, Op
from ..errors import BackendError, BackendUnavailable, ContractError, Unsupported
from .base import HostArray, QueueKey
from .xrt_runs import FROM_DEVICE, TO_DEVICE, Quarantine, SyncCounter, XrtProgram, XrtQueue

INSTALL = (
    "pyxrt comes with XRT, not from PyPI (PyPI's 'xrt' is an unrelated package): install XRT "
    "and the amdxdna driver, then `source /opt/xilinx/xrt/setup.sh` so that "
    "/opt/xilinx/xrt/python is on PYTHONPATH"
)
OPCODE_TRANSACTION = 3
FIXED_ARGS = 3
"""opcode, instruction buffer, instruction count; buffers follow."""
INSTS_GROUP_ARG = 1
DEFAULT_WATCHDOG_S = 60.0
COLUMNS = {"npu1": 4, "npu4": 8, "npu5": 8, "npu6": 8}
DEFAULT_COLUMNS = 8


def xrt_source(xclbin: str | Path, insts: str | Path) -> KernelSource:
    """The `KernelSource` of an mlir-aie/IRON NPU program: its xclbin and instructions."""
    return KernelSource(binary={"xclbin": xclbin, "insts": insts})


def import_pyxrt() -> Any:
    try:
        return importlib.import_module("pyxrt")
    except ImportError as exc:
        raise BackendUnavailable("xrt", f"pyxrt cannot be imported ({exc})", INSTALL) from exc


def open_npu_backend(
    device: int = 0,
    host_array: HostArray | None = None,
    watchdog_s: float = DEFAULT_WATCHDOG_S,
) -> XrtBackend:
    """The XRT backend for NPU `device`; `BackendUnavailable` saying why when it cannot open."""
    module = import_pyxrt()
    try:
        handle = module.device(device)
    except Exception as exc:
        raise BackendUnavailable(
            "xrt", f"pyxrt imports but xrt.device({device}) does not open: {exc}", INSTALL
        ) from exc
    return XrtBackend(module, handle, device, host_array, watchdog_s)


def target_of(name: str) -> str:
    """The NPU generation in a device name ("RyzenAI-npu4" -> "npu4"), else "xrt-npu"."""
    lowered = name.lower()
    at = lowered.find("npu")
    if at < 0:
        return "xrt-npu"
    digits = "".join(c for c in lowered[at + 3 : at + 5] if c.isdigit())
    return f"npu{digits}" if digits else "npu"


class BoRecord:
    """A root buffer object of this backend and the sub-buffers made over it."""

    __slots__ = ("__weakref__", "bo", "group", "nbytes", "placement", "subs")

    def __init__(self, bo: Any, nbytes: int, group: int, placement: Placement) -> None:
        self.bo = bo
        self.nbytes = nbytes
        self.group = group
        self.placement = placement
        self.subs: dict[tuple[int, int], Any] = {}

    def __repr__(self) -> str:
        return f"<xrt bo {self.nbytes} bytes {self.placement}>"


class BoArray(np.ndarray):
    """Host bytes of a buffer object; every slice keeps the buffer object alive."""

    record: BoRecord | None

    def __array_finalize__(self, obj: Any) -> None:
        self.record = getattr(obj, "record", None)


def read_insts(path: Path) -> np.ndarray[Any, np.dtype[np.uint32]]:
    """Instruction words from `insts.bin` (little-endian uint32) or `insts.txt` (hex lines)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ContractError(f"cannot read NPU instruction file {str(path)!r}: {exc}") from exc
    if path.suffix == ".txt":
        words: list[int] = []
        for number, line in enumerate(data.decode("ascii", "replace").splitlines(), 1):
            text = line.strip()
            if not text:
                continue
            try:
                value = int(text, 16)
            except ValueError:
                value = -1
            if not 0 <= value < 2**32:
                raise ContractError(
                    f"NPU instruction file {str(path)!r} line {number} is not a 32-bit hex "
                    f"word: {text[:40]!r}"
                )
            words.append(value)
        insts = np.array(words, dtype=np.uint32)
    else:
        if len(data) % 4:
            raise ContractError(
                f"NPU instruction file {str(path)!r} has {len(data)} bytes, not whole 32-bit words"
            )
        insts = np.frombuffer(data, dtype="<u4").astype(np.uint32)
    if insts.size == 0 or not insts.any():
        raise ContractError(f"NPU instruction file {str(path)!r} holds no instructions")
    return insts


class XrtKernel:
    """A loaded NPU program: kernel, instruction buffer, and its argument layout."""

    def __init__(
        self, name: str, kernel: Any, insts: Any, count: int, num_args: int, groups: list[int]
    ) -> None:
        self.name = name
        self.kernel = kernel
        self.insts = insts
        self.count = count
        self.num_args = num_args
        self.groups = groups


class XrtBackend:
    """One NPU through pyxrt. Serves the NPU lane; memory of NPU placements lives here."""

    name = "xrt"
    poll_budget_us = 200.0
    """NPU round trips take 45-160 µs: the loop keeps polling that long before a thread does."""

    def __init__(
        self,
        module: Any,
        device: Any,
        index: int = 0,
        host_array: HostArray | None = None,
        watchdog_s: float = DEFAULT_WATCHDOG_S,
        insts_unit: str = "words",
    ) -> None:
        if insts_unit not in ("words", "bytes"):
            raise ContractError(f"insts_unit must be 'words' or 'bytes', got {insts_unit!r}")
        if not isinstance(watchdog_s, int | float) or not watchdog_s > 0:
            raise ContractError(f"watchdog_s must be a positive number, got {watchdog_s!r}")
        self.xrt = module
        self.device = device
        self.index = index
        self.watchdog_s = float(watchdog_s)
        self.insts_unit = insts_unit
        self._external_host_array = host_array
        try:
            self.device_name = str(device.get_info(module.xrt_info_device.name))
        except Exception:
            self.device_name = "unknown"
        self.target = target_of(self.device_name)
        self.max_columns = COLUMNS.get(self.target, DEFAULT_COLUMNS)
        self.native_graphs_prepared = 0
        self.copy_streams_created = 0
        self.quarantine = Quarantine()
        self.synced = SyncCounter()
        self._contexts: dict[str, Any] = {}
        self._kernels: dict[tuple[str, str, str], XrtKernel] = {}
        self._queues: dict[QueueKey, XrtQueue] = {}
        self._default_group = 0

    # -- devices -------------------------------------------------------------------------

    def npu_count(self) -> int:
        return 1

    def npu_target(self, npu: int) -> str:
        return self.target

    # -- memory --------------------------------------------------------------------------

    def allocate(self, nbytes: int, placement: Placement) -> BoArray:
        if placement.kind not in (PlacementKind.NPU_LOCAL, PlacementKind.SHARED):
            raise Unsupported(f"the xrt backend holds NPU memory only, not {placement}")
        xrt = self.xrt
        try:
            bo = xrt.bo(self.device, nbytes, xrt.bo.host_only, self._default_group)
            memory = bo.map()
        except Exception as exc:
            raise BackendError("xrt", "bo", "allocation failed", str(exc)) from exc
        array = np.frombuffer(memory, dtype=np.uint8).view(BoArray)
        array.record = BoRecord(bo, nbytes, self._default_group, placement)
        array[:] = 0
        return array

    def free(self, storage: Any) -> None:
        """A buffer object goes when the last array over it does (quarantine holds one)."""

    def host_array(self, storage: Any, offset: int, nbytes: int) -> np.ndarray[Any, Any]:
        array: np.ndarray[Any, Any] = storage[offset : offset + nbytes]
        return array

    def quarantined(self, storage: Any) -> bool:
        """Whether a run still going after its watchdog binds this storage."""
        record = getattr(storage, "record", None)
        return record is not None and self.quarantine.holds(record)

    # -- kernels -------------------------------------------------------------------------

    def load_npu_kernel(
        self, npu: int, source: KernelSource, name: str, columns: int, contract: KernelContract
    ) -> XrtKernel:
        """Check everything first; then register, make (or reuse) the hw_context and kernel."""
        xrt = self.xrt
        if not isinstance(columns, int) or not 1 <= columns <= self.max_columns:
            raise ContractError(
                f"NPU program {name!r} needs 1..{self.max_columns} columns on {self.target}, "
                f"got {columns!r}"
            )
        if contract.constants:
            raise ContractError(
                f"NPU program {name!r} takes no scalar constants, "
                f"got {len(contract.constants)} bytes"
            )
        binary = dict(source.binary)
        if "xclbin" not in binary or "insts" not in binary:
            raise ContractError(
                f"an xrt NPU program needs KernelSource(binary={{'xclbin': path, 'insts': path}}) "
                f"(see xrt_source); {name!r} has {sorted(binary) or 'no binary'}"
            )
        xclbin_path = Path(binary["xclbin"])
        if not xclbin_path.is_file():
            raise ContractError(f"xclbin {str(xclbin_path)!r} of {name!r} does not exist")
        insts = read_insts(Path(binary["insts"]))
        try:
            xclbin = xrt.xclbin(str(xclbin_path))
            listed = {k.get_name(): int(k.get_num_args()) for k in xclbin.get_kernels()}
            ident = xclbin.get_uuid().to_string()
        except Exception as exc:
            raise ContractError(f"{str(xclbin_path)!r} is not a readable xclbin: {exc}") from exc
        if name not in listed:
            raise ContractError(
                f"xclbin {str(xclbin_path)!r} has no kernel {name!r}; it has {sorted(listed)}"
            )
        num_args = listed[name]
        wanted = FIXED_ARGS + len(contract.bindings)
        if wanted > num_args:
            raise ContractError(
                f"kernel {name!r} takes {num_args} arguments ({num_args - FIXED_ARGS} buffers "
                f"after opcode, instructions and count); the contract binds "
                f"{len(contract.bindings)} buffers"
            )
        key = (ident, name, str(Path(binary["insts"]).resolve()))
        loaded = self._kernels.get(key)
        if loaded is not None:
            return loaded
        try:
            context = self._contexts.get(ident)
            if context is None:
                uuid = self.device.register_xclbin(xclbin)
                context = xrt.hw_context(self.device, uuid)
                self._contexts[ident] = context
            kernel = xrt.kernel(context, name)
            groups = [int(kernel.group_id(i)) for i in range(num_args)]
            insts_bo = xrt.bo(self.device, insts.nbytes, xrt.bo.cacheable, groups[INSTS_GROUP_ARG])
            insts_bo.write(insts, 0)
            insts_bo.sync(xrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE)
        except Exception as exc:
            raise BackendError("xrt", f"load {name}", "load failed", str(exc)) from exc
        count = int(insts.size) if self.insts_unit == "words" else int(insts.nbytes)
        loaded = XrtKernel(name, kernel, insts_bo, count, num_args, groups)
        if len(groups) > FIXED_ARGS and not self._kernels:
            self._default_group = groups[FIXED_ARGS]
        self._kernels[key] = loaded
        return loaded

    def load_gpu_kernel(self, *args: Any) -> Any:
        raise Unsupported("the xrt backend runs NPU programs only")

    # -- execution -----------------------------------------------------------------------

    def queue(self, key: QueueKey) -> XrtQueue:
        found = self._queues.get(key)
        if found is None:
            lane, device = key
            found = XrtQueue(f"hrx-xrt-{lane.label}-{device}", self.watchdog_s, self.quarantine)
            self._queues[key] = found
        return found

    def prepare_region(self, lane: Lane, ops: Sequence[Op]) -> XrtProgram:
        if lane is not Lane.NPU or len(ops) != 1 or not isinstance(ops[0], NpuLaunch):
            raise Unsupported("the xrt backend prepares one NPU launch per region")
        op = ops[0]
        loaded = op.kernel.native
        if not isinstance(loaded, XrtKernel):
            raise ContractError(f"NPU kernel {op.kernel.name!r} was not loaded by the xrt backend")
        xrt = self.xrt
        run = xrt.run(loaded.kernel)
        run.set_arg(0, OPCODE_TRANSACTION)
        run.set_arg(1, loaded.insts)
        run.set_arg(2, loaded.count)
        # Per buffer (its ident is the tracker's allocation key): root bo and byte ranges.
        flushes: dict[int, tuple[Any, list[tuple[int, int]]]] = {}
        writes: dict[int, tuple[Any, list[tuple[int, int]]]] = {}
        stage_in: list[Any] = []
        stage_out: list[Any] = []
        roots: list[BoRecord] = []
        for position, (view, binding) in enumerate(
            zip(op.views, op.kernel.contract.bindings, strict=True)
        ):
            arg = FIXED_ARGS + position
            group = loaded.groups[arg]
            record = getattr(view.buffer.storage, "record", None)
            if isinstance(record, BoRecord) and record.group == group:
                run.set_arg(arg, self._sub_bo(record, view))
                span = (view.offset, view.offset + view.nbytes)
                ident = view.buffer.ident
                if binding.access is not Access.WRITE:
                    flushes.setdefault(ident, (record.bo, []))[1].append(span)
                if binding.access.writes:
                    writes.setdefault(ident, (record.bo, []))[1].append(span)
                if record not in roots:
                    roots.append(record)
            else:
                staged = self._staging(view, group)
                run.set_arg(arg, staged[2])
                if binding.access is not Access.WRITE:
                    stage_in.append(staged)
                if binding.access.writes:
                    stage_out.append(staged)
        merged_flushes = _merged(flushes)
        return XrtProgram(
            op.kernel.name,
            run,
            [(bo, nbytes, offset) for _, bo, nbytes, offset in merged_flushes],
            [(bo, nbytes, offset) for _, bo, nbytes, offset in _merged(writes)],
            stage_in,
            stage_out,
            roots,
            self.quarantine,
            self.synced,
            [(ident, offset, offset + nbytes) for ident, _, nbytes, offset in merged_flushes],
        )

    def _sub_bo(self, record: BoRecord, view: View) -> Any:
        if view.offset == 0 and view.nbytes == record.nbytes:
            return record.bo
        key = (view.offset, view.nbytes)
        sub = record.subs.get(key)
        if sub is None:
            sub = record.subs[key] = self.xrt.bo(record.bo, view.nbytes, view.offset)
        return sub

    def _staging(self, view: View, group: int) -> tuple[Any, Any, Any]:
        host_array = self._external_host_array
        if host_array is None:
            raise Unsupported(f"{view} is not memory of this NPU and has no host mapping")
        host = host_array(view.buffer.storage, view.offset, view.nbytes)
        bo = self.xrt.bo(self.device, view.nbytes, self.xrt.bo.host_only, group)
        staged = np.frombuffer(bo.map(), dtype=np.uint8)
        return host, staged, bo

    @property
    def cache_maintenance_bytes(self) -> int:
        return self.synced.nbytes

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "npus": [self.target],
            "device": self.device_name,
            "pyxrt": getattr(self.xrt, "__file__", "pyxrt"),
            "watchdog_s": self.watchdog_s,
            "hw_contexts": len(self._contexts),
            "quarantined_runs": len(self.quarantine),
        }

    def close(self) -> None:
        for queue in self._queues.values():
            queue.close()
        self._queues.clear()


def _merged(
    spans: dict[int, tuple[Any, list[tuple[int, int]]]],
) -> list[tuple[int, Any, int, int]]:
    """(buffer ident, bo, nbytes, offset) per maximal run of overlapping or touching ranges."""
    out: list[tuple[int, Any, int, int]] = []
    for ident, (bo, ranges) in spans.items():
        ranges.sort()
        start, end = ranges[0]
        for lo, hi in ranges[1:]:
            if lo > end:
                out.append((ident, bo, end - start, start))
                start, end = lo, hi
            else:
                end = max(end, hi)
        out.append((ident, bo, end - start, start))
    return out


# -- hrx-async doctor -------------------------------------------------------------------


def xrt_version() -> str | None:
    """XRT's version from its install's version.json, when one is found."""
    roots = [os.environ.get("XILINX_XRT", ""), "/opt/xilinx/xrt"]
    for root in filter(None, roots):
        path = Path(root) / "version.json"
        with contextlib.suppress(OSError, ValueError):
            import json

            data = json.loads(path.read_text())
            version = data.get("BUILD_VERSION") or data.get("version")
            if version:
                return str(version)
    return None


def doctor_lines() -> list[tuple[str, bool]]:
    """(line, ok) pairs for `hrx-async doctor`: pyxrt, XRT version, /dev/accel, a self-test."""
    lines: list[tuple[str, bool]] = []
    accel = (
        sorted(str(p) for p in Path("/dev/accel").glob("accel*"))
        if Path("/dev/accel").is_dir()
        else []
    )
    try:
        module = import_pyxrt()
    except BackendUnavailable as exc:
        lines.append((f"pyxrt: not importable ({exc.reason}); {INSTALL}", False))
        module = None
    else:
        lines.append((f"pyxrt: {getattr(module, '__file__', 'imported')}", True))
    version = xrt_version()
    lines.append((f"XRT version: {version or 'not found (no version.json)'}", version is not None))
    lines.append((f"NPU device nodes: {', '.join(accel) or 'none in /dev/accel'}", bool(accel)))
    if module is not None and (accel or int(_quiet_count(module)) > 0):
        lines.append(self_test(module))
    else:
        lines.append(("NPU self-test: skipped (no NPU here)", True))
    return lines


def _quiet_count(module: Any) -> int:
    try:
        return int(module.enumerate_devices())
    except Exception:
        return 0


def self_test(module: Any) -> tuple[str, bool]:
    """Open device 0, round-trip 4 KiB through a host_only buffer object with both syncs."""
    try:
        device = module.device(0)
        name = device.get_info(module.xrt_info_device.name)
        bo = module.bo(device, 4096, module.bo.host_only, 0)
        pattern = (np.arange(4096) % 251).astype(np.uint8)
        bo.write(pattern, 0)
        bo.sync(module.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE, 4096, 0)
        bo.sync(module.xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE, 4096, 0)
        back = np.asarray(bo.read(4096, 0)).view(np.uint8)
        ok = bool(np.array_equal(back, pattern))
    except Exception as exc:
        return (f"NPU self-test: failed ({exc})", False)
    return (f"NPU self-test: {name}: buffer round trip {'ok' if ok else 'WRONG BYTES'}", ok)


__all__ = [
    "FROM_DEVICE",
    "INSTALL",
    "TO_DEVICE",
    "BoArray",
    "BoRecord",
    "XrtBackend",
    "XrtKernel",
    "doctor_lines",
    "import_pyxrt",
    "open_npu_backend",
    "read_insts",
    "self_test",
    "target_of",
    "xrt_source",
]
