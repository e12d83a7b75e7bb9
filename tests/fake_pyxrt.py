"""An in-memory stand-in for XRT's `pyxrt` binding, for tests only.

Same names, constructor forms, overloads and enum values as the binding
(XRT's `pyxrt.cpp` and `pyxrt.pyi`): no default offsets on `bo.read`/`bo.write`/the
3-argument `bo.sync`; `kernel.__call__` silently skips arguments that are
neither a bo nor an int; `run.state()` returns the plain int 3 while running
(the enum has no RUNNING). Buffers keep two copies of their bytes, the host's
(`map()`) and the device's, so a missing `sync` shows up as a wrong result.
NPU programs run as host references registered per kernel name:
`reference(arrays)` gets one uint8 array per buffer argument (the device's
bytes) and writes its outputs in place.

`install()` puts a fresh module at `sys.modules["pyxrt"]`; `FAKE` holds the
knobs: latency, injected failures, counters, and the record of any `wait()`
made from an event loop's thread.
"""

from __future__ import annotations

import contextlib
import enum
import json
import sys
import threading
import time
import types
import uuid as _uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import sniffio

XCLBIN_MAGIC = b"xclbin2\0"
RUNNING = 3
XCL_BO_FLAGS_NONE = 0


class xclBOSyncDirection(enum.IntEnum):
    XCL_BO_SYNC_BO_TO_DEVICE = 0
    XCL_BO_SYNC_BO_FROM_DEVICE = 1
    XCL_BO_SYNC_BO_GMIO_TO_AIE = 2
    XCL_BO_SYNC_BO_AIE_TO_GMIO = 3


class ert_cmd_state(enum.IntEnum):
    ERT_CMD_STATE_NEW = 1
    ERT_CMD_STATE_QUEUED = 2
    ERT_CMD_STATE_COMPLETED = 4
    ERT_CMD_STATE_ERROR = 5
    ERT_CMD_STATE_ABORT = 6
    ERT_CMD_STATE_SUBMITTED = 7
    ERT_CMD_STATE_TIMEOUT = 8
    ERT_CMD_STATE_NORESPONSE = 9
    ERT_CMD_STATE_SKERROR = 10
    ERT_CMD_STATE_SKCRASHED = 11


class xrt_info_device(enum.IntEnum):
    bdf = 0
    interface_uuid = 1
    kdma = 2
    max_clock_frequency_mhz = 3
    m2m = 4
    name = 5
    nodma = 6
    offline = 7
    electrical = 8
    thermal = 9
    mechanical = 10
    memory = 11
    platform = 12
    pcie_info = 13
    host = 14
    dynamic_regions = 15
    vmr = 16


class State:
    """Everything a test can set or inspect."""

    def __init__(self) -> None:
        self.devices = 1
        self.device_name = "RyzenAI-npu1"
        self.latency_s = 0.0
        self.references: dict[str, Callable[[list[np.ndarray[Any, Any]]], None]] = {}
        self.faults: list[int] = []
        """States the next runs end in, one per started run (ERROR, NORESPONSE, ...)."""
        self.hang_next = 0
        """The next N runs report RUNNING until `release_hung()` (a timeout that keeps running)."""
        self.hung: list[run] = []
        self.contexts_created = 0
        self.registered = 0
        self.bos_created = 0
        self.runs_created = 0
        self.starts = 0
        self.syncs: list[tuple[int, int, int, int]] = []
        """(bo serial, direction, size, offset) per sync."""
        self.loop_waits: list[str] = []
        self.open_error: str | None = None
        self.groups: dict[int, int] = {}
        """Memory group per kernel argument (0 unless set)."""

    def release_hung(self) -> None:
        for item in self.hung:
            item._hang = False
        self.hung.clear()


FAKE = State()


def _on_event_loop() -> bool:
    try:
        sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return False
    return True


def enumerate_devices() -> int:
    return FAKE.devices


def log_message(level: int, tag: str, message: str) -> None:
    """Messages go nowhere."""


class uuid:
    def __init__(self, uuid_str: str) -> None:
        self._text = str(_uuid.UUID(uuid_str))

    def to_string(self) -> str:
        return self._text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, uuid) and other._text == self._text

    def __hash__(self) -> int:
        return hash(self._text)


class xclbin:
    class xclbinkernel:
        def __init__(self) -> None:
            self._name = ""
            self._num_args = 0

        def get_name(self) -> str:
            return self._name

        def get_num_args(self) -> int:
            return self._num_args

    def __init__(self, *args: Any) -> None:
        self._kernels: list[xclbin.xclbinkernel] = []
        self._uuid = uuid("00000000-0000-0000-0000-000000000000")
        if not args:
            return
        if len(args) != 1 or not isinstance(args[0], str):
            raise TypeError("xclbin(): incompatible constructor arguments")
        try:
            data = Path(args[0]).read_bytes()
        except OSError as exc:
            raise RuntimeError(f"Failed to open xclbin file: {args[0]}") from exc
        if not data.startswith(XCLBIN_MAGIC):
            raise RuntimeError(f"Invalid xclbin file: {args[0]}")
        try:
            meta = json.loads(data[len(XCLBIN_MAGIC) :])
            self._uuid = uuid(meta["uuid"])
            self._kernels = [_kernel_info(k["name"], int(k["num_args"])) for k in meta["kernels"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise RuntimeError(f"Invalid xclbin file: {args[0]}") from exc

    def get_kernels(self) -> list[xclbin.xclbinkernel]:
        return list(self._kernels)

    def get_uuid(self) -> uuid:
        return self._uuid

    def get_xsa_name(self) -> str:
        return "fake"


def _kernel_info(name: str, num_args: int) -> xclbin.xclbinkernel:
    info = xclbin.xclbinkernel()
    info._name, info._num_args = name, num_args
    return info


def write_xclbin(path: str | Path, kernels: dict[str, int], ident: str | None = None) -> Path:
    """Write a file the fake reads as an xclbin with `kernels` (name -> argument count)."""
    meta = {
        "uuid": ident or str(_uuid.uuid4()),
        "kernels": [{"name": name, "num_args": count} for name, count in kernels.items()],
    }
    path = Path(path)
    path.write_bytes(XCLBIN_MAGIC + json.dumps(meta).encode())
    return path


class device:
    def __init__(self, *args: Any) -> None:
        self._xclbins: dict[uuid, xclbin] = {}
        if not args:
            self._index = -1
            return
        if len(args) != 1 or not isinstance(args[0], int | str) or isinstance(args[0], bool):
            raise TypeError("device(): incompatible constructor arguments")
        if FAKE.open_error is not None:
            raise RuntimeError(FAKE.open_error)
        index = args[0] if isinstance(args[0], int) else 0
        if not 0 <= index < FAKE.devices:
            raise RuntimeError(f"No such device with index '{index}'")
        self._index = index

    def register_xclbin(self, xclbin: xclbin) -> uuid:
        FAKE.registered += 1
        self._xclbins[xclbin.get_uuid()] = xclbin
        return xclbin.get_uuid()

    def load_xclbin(self, xclbin: Any) -> uuid:
        return self.register_xclbin(
            xclbin if not isinstance(xclbin, str) else globals()["xclbin"](xclbin)
        )

    def get_xclbin_uuid(self) -> uuid:
        return next(iter(self._xclbins), uuid("00000000-0000-0000-0000-000000000000"))

    def get_info(self, key: xrt_info_device) -> str:
        if key == xrt_info_device.name:
            return FAKE.device_name
        if key == xrt_info_device.bdf:
            return f"0000:c5:00.{self._index}"
        return "NA"


class hw_context:
    class access_mode(enum.IntEnum):
        exclusive = 0
        shared = 1

    exclusive = access_mode.exclusive
    shared = access_mode.shared

    def __init__(self, *args: Any) -> None:
        self._device: device | None = None
        self._xclbin: xclbin | None = None
        if not args:
            return
        if len(args) not in (2, 3) or not isinstance(args[0], device):
            raise TypeError("hw_context(): incompatible constructor arguments")
        dev, what = args[0], args[1]
        if isinstance(what, uuid):
            if what not in dev._xclbins:
                raise RuntimeError("No such xclbin registered")
            self._xclbin = dev._xclbins[what]
        elif isinstance(what, xclbin):
            dev.register_xclbin(what)
            self._xclbin = what
        elif isinstance(what, str):
            self._xclbin = xclbin(what)
            dev.register_xclbin(self._xclbin)
        else:
            raise TypeError("hw_context(): incompatible constructor arguments")
        self._device = dev
        FAKE.contexts_created += 1

    def get_device(self) -> device:
        assert self._device is not None
        return self._device

    def get_xclbin_uuid(self) -> uuid:
        assert self._xclbin is not None
        return self._xclbin.get_uuid()

    def get_xclbin(self) -> xclbin:
        assert self._xclbin is not None
        return self._xclbin


class _Memory:
    """The two copies of a root buffer's bytes."""

    def __init__(self, size: int) -> None:
        self.host = np.zeros(size, np.uint8)
        self.device = np.zeros(size, np.uint8)


class bo:
    class flags(enum.IntEnum):
        normal = 0
        cacheable = 1 << 24
        device_only = 1 << 25
        host_only = 1 << 29
        p2p = 1 << 30
        svm = 1 << 27

    normal = flags.normal
    cacheable = flags.cacheable
    device_only = flags.device_only
    host_only = flags.host_only
    p2p = flags.p2p
    svm = flags.svm

    def __init__(self, *args: Any) -> None:
        if len(args) == 3 and isinstance(args[0], bo):
            parent, size, offset = args
            if parent._offset or parent._parent is not None:
                raise RuntimeError("sub-buffer of a sub-buffer")
            if not (offset >= 0 and offset + size <= parent._size):
                raise RuntimeError("sub-buffer out of range")
            self._memory, self._offset, self._size = parent._memory, int(offset), int(size)
            self._parent: bo | None = parent
            self.flags_value = parent.flags_value
        elif len(args) == 4 and isinstance(args[0], device | hw_context):
            self._make(args[1], args[2])
        elif len(args) == 3 and isinstance(args[0], hw_context):
            self._make(args[1], bo.flags.normal)
        else:
            raise TypeError("bo(): incompatible constructor arguments")
        FAKE.bos_created += 1
        self.serial = FAKE.bos_created

    def _make(self, size: Any, flags: Any) -> None:
        if not isinstance(size, int) or size <= 0:
            raise RuntimeError(f"bad bo size {size!r}")
        self._memory, self._offset, self._size = _Memory(size), 0, size
        self._parent = None
        self.flags_value = int(flags)

    def _host(self) -> np.ndarray[Any, Any]:
        return self._memory.host[self._offset : self._offset + self._size]

    def _device_bytes(self) -> np.ndarray[Any, Any]:
        """The device's copy (test inspection)."""
        return self._memory.device[self._offset : self._offset + self._size]

    def write(self, buffer: Any, seek: int) -> None:
        data = np.frombuffer(memoryview(buffer).cast("B"), np.uint8)
        if seek + data.size > self._size:
            raise RuntimeError("write out of range")
        self._host()[seek : seek + data.size] = data

    def read(self, size: int, skip: int) -> np.ndarray[Any, Any]:
        if skip + size > self._size:
            raise RuntimeError("read out of range")
        return self._host()[skip : skip + size].view(np.int8).copy()

    def sync(self, *args: Any) -> None:
        if len(args) == 1:
            direction, size, offset = args[0], self._size, 0
        elif len(args) == 3:
            direction, size, offset = args
        else:
            raise TypeError("sync(): incompatible function arguments")
        direction = xclBOSyncDirection(direction)
        if offset < 0 or size < 0 or offset + size > self._size:
            raise RuntimeError("sync out of range")
        start = self._offset + offset
        FAKE.syncs.append((self.serial, int(direction), size, offset))
        memory = self._memory
        if direction == xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE:
            memory.device[start : start + size] = memory.host[start : start + size]
        elif direction == xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE:
            memory.host[start : start + size] = memory.device[start : start + size]

    def map(self) -> memoryview:
        return memoryview(self._host())

    def size(self) -> int:
        return self._size

    def address(self) -> int:
        return int(self._host().ctypes.data)


class kernel:
    class cu_access_mode(enum.IntEnum):
        exclusive = 0
        shared = 1
        none = 2

    def __init__(self, *args: Any) -> None:
        if len(args) != 2 or not isinstance(args[0], hw_context) or not isinstance(args[1], str):
            raise TypeError("kernel(): incompatible constructor arguments")
        ctx, name = args
        found = [k for k in ctx.get_xclbin().get_kernels() if k.get_name() == name]
        if not found:
            raise RuntimeError(f"No such kernel '{name}'")
        self._ctx = ctx
        self._name = name
        self._num_args = found[0].get_num_args()

    def __call__(self, *args: Any) -> run:
        started = run(self)
        for index, item in enumerate(args):
            if isinstance(item, bo | int):  # anything else is skipped without a word
                started.set_arg(index, item)
        started.start()
        return started

    def group_id(self, argno: int) -> int:
        if not 0 <= argno < self._num_args:
            raise RuntimeError(f"bad argument index {argno}")
        return FAKE.groups.get(argno, 0)


class run:
    def __init__(self, *args: Any) -> None:
        if len(args) > 1 or (args and not isinstance(args[0], kernel)):
            raise TypeError("run(): incompatible constructor arguments")
        self._kernel: kernel | None = args[0] if args else None
        self._args: dict[int, Any] = {}
        self._state: int = ert_cmd_state.ERT_CMD_STATE_NEW
        self._deadline = 0.0
        self._ends_in: int = ert_cmd_state.ERT_CMD_STATE_COMPLETED
        self._hang = False
        self._lock = threading.Lock()
        FAKE.runs_created += 1

    def set_arg(self, index: int, item: Any) -> None:
        if not isinstance(index, int) or not isinstance(item, bo | int):
            raise TypeError("set_arg(): incompatible function arguments")
        if self._kernel is None or not 0 <= index < self._kernel._num_args:
            raise RuntimeError(f"bad argument index {index}")
        self._args[index] = item

    def start(self) -> None:
        if self._kernel is None:
            raise RuntimeError("run has no kernel")
        with self._lock:
            if self._state in (ert_cmd_state.ERT_CMD_STATE_NEW,) or self._state >= 4:
                pass
            else:
                raise RuntimeError("run is already running")
            FAKE.starts += 1
            self._state = ert_cmd_state.ERT_CMD_STATE_SUBMITTED
            self._deadline = time.perf_counter() + FAKE.latency_s
            self._ends_in = (
                FAKE.faults.pop(0) if FAKE.faults else ert_cmd_state.ERT_CMD_STATE_COMPLETED
            )
            if FAKE.hang_next:
                FAKE.hang_next -= 1
                self._hang = True
                FAKE.hung.append(self)

    def state(self) -> Any:
        with self._lock:
            if self._state in (ert_cmd_state.ERT_CMD_STATE_SUBMITTED, RUNNING):
                if self._hang or time.perf_counter() < self._deadline:
                    self._state = RUNNING
                    return RUNNING
                self._finish()
            if self._state == RUNNING:
                return RUNNING
            return ert_cmd_state(self._state)

    def _finish(self) -> None:
        if self._ends_in == ert_cmd_state.ERT_CMD_STATE_COMPLETED:
            self._execute()
        self._state = self._ends_in

    def _execute(self) -> None:
        assert self._kernel is not None
        reference = FAKE.references.get(self._kernel._name)
        if reference is None:  # nothing to run it with: the command fails
            self._ends_in = ert_cmd_state.ERT_CMD_STATE_ERROR
            return
        _opcode, insts, count = (self._args.get(i) for i in range(3))
        if not isinstance(insts, bo) or not isinstance(count, int) or count <= 0:
            self._ends_in = ert_cmd_state.ERT_CMD_STATE_ERROR
            return
        words = insts._device_bytes().view(np.uint32)
        if count > words.size or not words[:count].any():
            self._ends_in = ert_cmd_state.ERT_CMD_STATE_ERROR  # instructions never synced
            return
        buffers = [self._args[i] for i in sorted(self._args) if i >= 3]
        reference([b._device_bytes() for b in buffers if isinstance(b, bo)])

    def wait(self, *args: Any) -> Any:
        if len(args) > 1:
            raise TypeError("wait(): incompatible function arguments")
        if _on_event_loop():
            FAKE.loop_waits.append(threading.current_thread().name)
            raise AssertionError("run.wait() called on the event loop's thread")
        limit = None if not args or not args[0] else time.perf_counter() + args[0] / 1000
        while True:
            state = self.state()
            if state != RUNNING and state >= 4:
                return state
            if limit is not None and time.perf_counter() > limit:
                return ert_cmd_state.ERT_CMD_STATE_TIMEOUT
            time.sleep(0.0005)

    def wait2(self, *args: Any) -> None:
        raise TypeError("wait2(): no conversion for std::chrono (not callable from Python)")

    def add_callback(self, *args: Any) -> None:
        raise TypeError("add_callback(): no conversion for std::function")


class _ExtBo(bo):
    def __init__(self, *args: Any) -> None:
        if len(args) == 2 and isinstance(args[0], device | hw_context) and isinstance(args[1], int):
            super().__init__(args[0], args[1], bo.flags.host_only, 0) if isinstance(
                args[0], device
            ) else super().__init__(args[0], args[1], 0)
            return
        raise TypeError("ext.bo(): the fake does not import exported handles")


def _ext() -> types.ModuleType:
    ext = types.ModuleType("pyxrt.ext")
    _ExtBo.__name__ = "bo"
    ext.bo = _ExtBo  # type: ignore[attr-defined]
    return ext


PUBLIC = (
    "XCL_BO_FLAGS_NONE",
    "xclBOSyncDirection",
    "ert_cmd_state",
    "xrt_info_device",
    "enumerate_devices",
    "log_message",
    "uuid",
    "xclbin",
    "device",
    "hw_context",
    "bo",
    "kernel",
    "run",
    "ext",
)
"""The names of the fake module, as the binding exports them."""


def install() -> types.ModuleType:
    """A fresh fake at `sys.modules["pyxrt"]` (and a fresh `FAKE` state); returns it."""
    global FAKE
    FAKE = State()
    module = sys.modules[__name__]
    module.FAKE = FAKE  # type: ignore[attr-defined]
    fake = types.ModuleType("pyxrt")
    for name in PUBLIC:
        if name != "ext":
            setattr(fake, name, getattr(module, name))
    fake.ext = _ext()  # type: ignore[attr-defined]
    sys.modules["pyxrt"] = fake
    return fake


def uninstall() -> None:
    sys.modules.pop("pyxrt", None)


@contextlib.contextmanager
def installed(
    references: dict[str, Callable[[list[np.ndarray[Any, Any]]], None]] | None = None,
) -> Iterator[types.ModuleType]:
    """The fake installed for one test, with host references per kernel name; the test
    fails if `run.wait()` was called on an event loop's thread."""
    module = install()
    FAKE.references.update(references or {})
    try:
        yield module
        assert FAKE.loop_waits == [], "run.wait() was called on an event loop's thread"
    finally:
        uninstall()


def affine(arrays: list[np.ndarray[Any, Any]]) -> None:
    """A reference NPU program of two buffers: c = a * 2 + 1 over int32."""
    a, c = arrays
    c.view(np.int32)[:] = a.view(np.int32) * 2 + 1
