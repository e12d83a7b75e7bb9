"""The HIP backend for AMD GPUs: a driver table over hip-python and hipRTC, and `open_backend`.

Everything stream-shaped lives in `_stream.py` and its `_stream_*.py` parts;
this module maps their driver table onto HIP (memory, streams, events,
graphs, modules, launches), compiles `KernelSource(cxx=...)` with hipRTC for
the device's gfx target, decides when HIP is unavailable, and reports what
`hrx-async doctor` shows for AMD GPUs (`hip_doctor`; finding the ROCm library
and device nodes is `_rocm.py`'s part). hip-python
(`pip install "hrx-async[hip]"`) is imported here only, and only when the
backend is opened or the doctor asks.

Kernels follow `_stream_programs`' argument convention: one pointer
parameter per binding, then the contract's constants split by the sizes
`hipKernelGetParamInfo` reports for the remaining parameters. Declare kernels
`extern "C"`. Prebuilt code objects go in `KernelSource.binary` under the
bare gfx name (`{"gfx1151": "k.hsaco"}`); hipRTC compiles for the device's
full `gcnArchName`, feature flags included (`gfx90a:sramecc+:xnack-`), and
that full name is part of every cached kernel's key through the options.

Where HIP and CUDA differ, and what this table does about it:

=================  =================================  =======================================
topic              CUDA (cuda.py)                     HIP (this module)
=================  =================================  =======================================
capture mode       cudaStreamCaptureModeThreadLocal   hipStreamCaptureModeThreadLocal (HIP
                                                      also has Global and Relaxed, as CUDA)
graph instantiate  cudaGraphInstantiate(g, flags)     hipGraphInstantiate(g, log_bytes)
                   -> (err, exec)                     -> (err, exec, error_node, log): the
                                                      log goes into the BackendError
event flags        DisableTiming | BlockingSync       the same two; the default system-scope
                                                      release is kept (no
                                                      hipEventDisableSystemFence): the host
                                                      reads mapped memory after a fence
sticky errors      illegal address, launch failed,    STICKY_ERRORS below: illegal address,
                   misaligned address, illegal        launch failure, assert, timeout, ECC,
                   instruction, stack error, ...      context destroyed, deinitialized, prior
                                                      launch failure, unknown. No codes for
                                                      misaligned or illegal instructions, and
                                                      ROCm aborts the process on a GPU page
                                                      fault by default, so a fault may never
                                                      come back as an error
not ready          cudaErrorNotReady                  hipErrorNotReady
pinned memory      cudaHostAlloc(Mapped|Portable)     hipHostMalloc(hipHostMallocMapped |
                                                      hipHostMallocPortable)
parameter sizes    cuFuncGetParamInfo(f, i)           hipKernelGetParamInfo(f, i); None where
                                                      the runtime lacks it
dynamic shared     opt-in above 48 KiB                all LDS allowed by default;
                   (cuFuncSetAttribute)               hipKernelSetAttribute only above the
                                                      function's current limit
code               cubin/PTX, NVRTC,                  code objects (.hsaco), hipRTC,
                   --gpu-architecture=sm_XY           --offload-arch=<gcnArchName>
return shapes      (status, *outputs)                 (status, *outputs); pointers come back
                                                      as Pointer/DeviceArray (int() is the
                                                      address); handles also accept ints
launch extra       0                                  None
DLPack device      2 (kDLCUDA)                        10 (kDLROCM)
=================  =================================  =======================================
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any

from .._core.dlpack import DLPACK_ROCM
from .._core.install import install_hint
from ..errors import BackendError, BackendUnavailable, CompileError, ContractError
from ._rocm import (
    LIBRARY,
    ROCM_HINT,
    c_text,
    device_node,
    hip_python_version,
    hip_version_text,
    library_path,
    load_error,
)
from ._stream import StreamBackend
from ._stream_calls import ReplayCalls
from ._stream_driver import make_error
from .kernel_cache import KernelCache

INSTALL = install_hint("hip")

STICKY_ERRORS = frozenset(
    {
        "hipErrorIllegalAddress",
        "hipErrorLaunchFailure",
        "hipErrorAssert",
        "hipErrorLaunchTimeOut",
        "hipErrorECCNotCorrectable",
        "hipErrorContextIsDestroyed",
        "hipErrorDeinitialized",
        "hipErrorPriorLaunchFailure",
        "hipErrorUnknown",
    }
)
"""Errors after which the device context can run nothing more."""

GRAPH_LOG_BYTES = 1024
"""Room for the reason `hipGraphInstantiate` gives when it fails."""

_FENCE_WAIT_ENV = "HRX_HIP_FENCE_WAIT"
"""'blocking' (the default: waiter threads sleep in the runtime) or 'spin'."""

_TARGET = re.compile(r"gfx[0-9][0-9a-z-]*(:[a-z]+[+-])*")


def _bindings() -> tuple[Any, Any]:
    """(hip, hiprtc) modules of hip-python, or BackendUnavailable."""
    try:
        from hip import hip, hiprtc
    except ImportError as exc:
        raise BackendUnavailable(
            "hip", f"hip-python is not installed ({exc}); it drives {LIBRARY}", INSTALL
        ) from None
    return hip, hiprtc


def _hiprtc() -> Any:
    return _bindings()[1]


def hiprtc_version() -> str:
    """The compiler as "hiprtc-MAJOR.MINOR+hip-VERSION", part of every cached kernel's key.

    The HIP runtime's full version rides along because hipRTC reports no patch
    level, and a patch release may change the code it generates.
    """
    hip, hiprtc = _bindings()
    try:
        status, major, minor = hiprtc.hiprtcVersion()
    except Exception as exc:  # the library itself may be missing
        raise BackendUnavailable(
            "hip", f"hipRTC (libhiprtc.so) could not be loaded: {exc}", ROCM_HINT
        ) from None
    if status:
        raise BackendError("hip", "hiprtcVersion", status.name)
    try:
        runtime_status, runtime = hip.hipRuntimeGetVersion()
    except Exception:  # compiling needs hipRTC only; the runtime's version is a refinement
        runtime_status, runtime = 1, 0
    suffix = f"+hip-{int(runtime)}" if not runtime_status else ""
    return f"hiprtc-{major}.{minor}{suffix}"


def compile_options(target: str, defines: dict[str, str]) -> list[str]:
    """hipRTC options for `target` ("gfx1151", "gfx90a:xnack-") and `-D` defines, stable order."""
    if not isinstance(target, str) or not _TARGET.fullmatch(target):
        raise ContractError(
            f"a HIP target looks like 'gfx1151' or 'gfx90a:sramecc+:xnack-', got {target!r}"
        )
    options = [f"--offload-arch={target}"]
    for key in sorted(defines):
        if not key or not key.replace("_", "a").isalnum() or key[0].isdigit():
            raise ContractError(f"define names are C identifiers, got {key!r}")
        options.append(f"-D{key}={defines[key]}")
    return options


def compile_cxx(source: str, name: str, options: list[str]) -> bytes:
    """Compile HIP C++ with hipRTC to a code object; `CompileError` carries hipRTC's log."""
    hiprtc = _hiprtc()

    def check(result: tuple[Any, ...], operation: str) -> Any:
        status = result[0]
        if status:
            raise BackendError("hip", operation, status.name, _hiprtc_text(hiprtc, status))
        return result[1] if len(result) > 1 else None

    try:
        created = hiprtc.hiprtcCreateProgram(source.encode(), f"{name}.hip".encode(), 0, [], [])
    except RuntimeError as exc:  # libhiprtc.so could not be loaded
        raise BackendUnavailable(
            "hip", f"hipRTC (libhiprtc.so) could not be loaded: {exc}", ROCM_HINT
        ) from None
    program = check(created, "hiprtcCreateProgram")
    try:
        encoded = [option.encode() for option in options]
        (status,) = hiprtc.hiprtcCompileProgram(program, len(encoded), encoded)
        if status:
            size = check(hiprtc.hiprtcGetProgramLogSize(program), "hiprtcGetProgramLogSize")
            log = bytearray(max(1, int(size)))
            check(hiprtc.hiprtcGetProgramLog(program, log), "hiprtcGetProgramLog")
            raise CompileError(
                f"hipRTC could not compile kernel {name!r} ({' '.join(options)}): {status.name}",
                bytes(log).rstrip(b"\0 ").decode(errors="replace"),
            )
        size = check(hiprtc.hiprtcGetCodeSize(program), "hiprtcGetCodeSize")
        code = bytearray(int(size))
        check(hiprtc.hiprtcGetCode(program, code), "hiprtcGetCode")
        return bytes(code)
    finally:
        # hiprtcDestroyProgram takes the address of the program handle.
        hiprtc.hiprtcDestroyProgram(program.createRef())


def _hiprtc_text(hiprtc: Any, status: Any) -> str:
    try:
        _, text = hiprtc.hiprtcGetErrorString(status)
    except Exception:  # describing an error must not raise another
        return ""
    return c_text(text) if text is not None else ""


class HipTable:
    """The `DriverTable` of HIP: one hip-python call per operation."""

    name = "hip"
    dlpack_device_type = DLPACK_ROCM

    def __init__(self) -> None:
        self.hip, self.rtc = _bindings()
        hip = self.hip
        self.device = 0
        self.arch = ""
        """The device's full gcnArchName (set when the backend opens)."""
        self._memcpy_default = hip.hipMemcpyKind.hipMemcpyDefault
        self._host_flags = hip.hipHostMallocMapped | hip.hipHostMallocPortable
        self._not_ready = hip.hipError_t.hipErrorNotReady
        self._not_found = hip.hipError_t.hipErrorNotFound
        self._invalid_value = hip.hipError_t.hipErrorInvalidValue
        self._foreign_code = frozenset(
            {
                hip.hipError_t.hipErrorNoBinaryForGpu,
                hip.hipError_t.hipErrorInvalidImage,
                hip.hipError_t.hipErrorInvalidKernelFile,
            }
        )
        self._capture_mode = hip.hipStreamCaptureMode.hipStreamCaptureModeThreadLocal
        self._max_threads = hip.hipFunction_attribute.HIP_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
        self._max_dynamic_shared = (
            hip.hipFunction_attribute.HIP_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        )
        self.replay_calls = ReplayCalls(
            self.error,
            "hip",
            hip.hipGraphLaunch,
            hip.hipMemcpyAsync,
            self._memcpy_default,
            hip.hipEventRecord,
            hip.hipStreamWaitEvent,
            hip.hipEventQuery,
            self._not_ready,
        )
        self._pointer_kinds = {
            hip.hipMemoryType.hipMemoryTypeDevice: "device",
            hip.hipMemoryType.hipMemoryTypeHost: "host",
            hip.hipMemoryType.hipMemoryTypeManaged: "managed",
            hip.hipMemoryType.hipMemoryTypeUnified: "managed",
        }

    # -- errors --------------------------------------------------------------------------

    def error(self, operation: str, status: Any) -> BackendError:
        name = getattr(status, "name", str(status))
        message = ""
        try:
            _, text = self.hip.hipGetErrorString(status)
            message = c_text(text) if text is not None else ""
        except Exception:  # describing an error must not raise another
            pass
        return make_error("hip", operation, name, message, STICKY_ERRORS)

    def _check(self, result: tuple[Any, ...], operation: str) -> Any:
        status = result[0]
        if status:
            raise self.error(operation, status)
        if len(result) == 2:
            return result[1]
        return result[1:] if len(result) > 2 else None

    # -- device --------------------------------------------------------------------------

    def set_device(self, device: int) -> None:
        self._check(self.hip.hipSetDevice(device), "hipSetDevice")
        self.device = device

    def can_access_peer(self, device: int, peer: int) -> bool:
        hip = self.hip
        return bool(self._check(hip.hipDeviceCanAccessPeer(device, peer), "hipDeviceCanAccessPeer"))

    def enable_peer_access(self, peer: int) -> None:
        hip = self.hip
        status = hip.hipDeviceEnablePeerAccess(peer, 0)[0]
        if status and status != hip.hipError_t.hipErrorPeerAccessAlreadyEnabled:
            raise self.error("hipDeviceEnablePeerAccess", status)

    def describe(self, device: int) -> dict[str, Any]:
        hip = self.hip
        props = self._check(hip.hipGetDeviceProperties(device), "hipGetDeviceProperties")
        free, total = self._check(hip.hipMemGetInfo(), "hipMemGetInfo")
        driver = self._check(hip.hipDriverGetVersion(), "hipDriverGetVersion")
        runtime = self._check(hip.hipRuntimeGetVersion(), "hipRuntimeGetVersion")
        count = self._check(hip.hipGetDeviceCount(), "hipGetDeviceCount")
        try:
            compiler = hiprtc_version()
        except (BackendUnavailable, BackendError) as exc:
            compiler = f"unavailable ({exc})"
        return {
            "name": c_text(props.name),
            "gcn_arch": c_text(props.gcnArchName),
            "driver_version": hip_version_text(int(driver)),
            "runtime_version": hip_version_text(int(runtime)),
            "hip_python": hip_python_version(),
            "compiler": compiler,
            "memory_total_bytes": int(total),
            "memory_free_bytes": int(free),
            "multiprocessors": int(props.multiProcessorCount),
            "devices_visible": int(count),
        }

    # -- memory --------------------------------------------------------------------------

    def malloc(self, nbytes: int) -> int:
        return int(self._check(self.hip.hipMalloc(nbytes), "hipMalloc"))

    def free(self, pointer: int) -> None:
        self._check(self.hip.hipFree(pointer), "hipFree")

    def host_alloc(self, nbytes: int) -> int:
        return int(self._check(self.hip.hipHostMalloc(nbytes, self._host_flags), "hipHostMalloc"))

    def host_free(self, pointer: int) -> None:
        self._check(self.hip.hipHostFree(pointer), "hipHostFree")

    def host_device_pointer(self, pointer: int) -> int:
        return int(
            self._check(self.hip.hipHostGetDevicePointer(pointer, 0), "hipHostGetDevicePointer")
        )

    def pointer_kind(self, pointer: int) -> tuple[str, int]:
        status, attributes = self.hip.hipPointerGetAttributes(pointer)
        if status == self._invalid_value:
            # Older HIP runtimes answer this for memory they do not know.
            return "unregistered", -1
        if status:
            raise self.error("hipPointerGetAttributes", status)
        kind = self._pointer_kinds.get(attributes.type, "unregistered")
        return kind, int(attributes.device)

    def memset_async(self, pointer: int, value: int, nbytes: int, stream: Any) -> None:
        self._check(self.hip.hipMemsetAsync(pointer, value, nbytes, stream), "hipMemsetAsync")

    def memcpy_async(self, dst: int, src: int, nbytes: int, stream: Any) -> None:
        self.replay_calls.memcpy_async(dst, src, nbytes, stream)

    # -- streams and events --------------------------------------------------------------

    def stream_create(self) -> Any:
        hip = self.hip
        return self._check(
            hip.hipStreamCreateWithFlags(hip.hipStreamNonBlocking), "hipStreamCreateWithFlags"
        )

    def stream_destroy(self, stream: Any) -> None:
        self._check(self.hip.hipStreamDestroy(stream), "hipStreamDestroy")

    def stream_synchronize(self, stream: Any) -> None:
        self._check(self.hip.hipStreamSynchronize(stream), "hipStreamSynchronize")

    def stream_handle(self, stream: Any) -> int:
        return int(stream)

    def event_create(self, blocking: bool) -> Any:
        hip = self.hip
        flags = hip.hipEventDisableTiming | (hip.hipEventBlockingSync if blocking else 0)
        return self._check(hip.hipEventCreateWithFlags(flags), "hipEventCreateWithFlags")

    def event_destroy(self, event: Any) -> None:
        self._check(self.hip.hipEventDestroy(event), "hipEventDestroy")

    def event_record(self, event: Any, stream: Any) -> None:
        self.replay_calls.event_record(event, stream)

    def event_query(self, event: Any) -> bool:
        return self.replay_calls.event_query(event)

    def event_synchronize(self, event: Any) -> None:
        (status,) = self.hip.hipEventSynchronize(event)
        if status:
            raise self.error("hipEventSynchronize", status)

    def stream_wait_event(self, stream: Any, event: Any) -> None:
        self.replay_calls.stream_wait_event(stream, event)

    # -- graphs --------------------------------------------------------------------------

    def begin_capture(self, stream: Any) -> None:
        self._check(
            self.hip.hipStreamBeginCapture(stream, self._capture_mode), "hipStreamBeginCapture"
        )

    def end_capture(self, stream: Any) -> Any:
        return self._check(self.hip.hipStreamEndCapture(stream), "hipStreamEndCapture")

    def abort_capture(self, stream: Any) -> None:
        status, graph = self.hip.hipStreamEndCapture(stream)
        if not status and graph is not None and int(graph):
            self.hip.hipGraphDestroy(graph)

    def graph_instantiate(self, graph: Any) -> Any:
        status, graph_exec, _error_node, log = self.hip.hipGraphInstantiate(graph, GRAPH_LOG_BYTES)
        if status:
            described = self.error("hipGraphInstantiate", status).message
            reason = str(log).strip("\0 \n") if log is not None else ""
            message = "; ".join(part for part in (described, reason) if part)
            raise make_error("hip", "hipGraphInstantiate", status.name, message, STICKY_ERRORS)
        return graph_exec

    def graph_launch(self, graph_exec: Any, stream: Any) -> None:
        self.replay_calls.graph_launch(graph_exec, stream)

    def graph_destroy(self, graph: Any) -> None:
        self._check(self.hip.hipGraphDestroy(graph), "hipGraphDestroy")

    def graph_exec_destroy(self, graph_exec: Any) -> None:
        self._check(self.hip.hipGraphExecDestroy(graph_exec), "hipGraphExecDestroy")

    # -- code ----------------------------------------------------------------------------

    def module_load(self, image: bytes) -> Any:
        status, module = self.hip.hipModuleLoadData(image)
        if status in self._foreign_code:
            raise ContractError(
                f"the code object cannot run on this GPU ({self.arch or 'unknown target'}): "
                f"{status.name}; build it with --offload-arch={self.arch or '<gcnArchName>'}"
            )
        if status:
            raise self.error("hipModuleLoadData", status)
        return module

    def module_unload(self, module: Any) -> None:
        self._check(self.hip.hipModuleUnload(module), "hipModuleUnload")

    def module_function(self, module: Any, name: str) -> Any:
        status, function = self.hip.hipModuleGetFunction(module, name.encode())
        if status == self._not_found:
            raise ContractError(
                f'kernel {name!r} is not in the loaded code; declare it extern "C" '
                "(C++ names are mangled) and check the spelling"
            )
        if status:
            raise self.error("hipModuleGetFunction", status)
        return function

    def function_param_sizes(self, function: Any) -> list[int] | None:
        sizes: list[int] = []
        while True:
            try:
                status, _offset, size = self.hip.hipKernelGetParamInfo(function, len(sizes))
            except RuntimeError:  # a HIP runtime without the query
                return None
            if status == self._invalid_value:
                return sizes
            if status:
                # The runtime cannot describe this kernel; the contract cannot be checked.
                return None
            sizes.append(int(size))

    def function_max_threads(self, function: Any) -> int:
        value = self._check(
            self.hip.hipFuncGetAttribute(self._max_threads, function), "hipFuncGetAttribute"
        )
        return int(value)

    def function_set_dynamic_shared(self, function: Any, nbytes: int) -> None:
        hip = self.hip
        status, allowed = hip.hipFuncGetAttribute(self._max_dynamic_shared, function)
        if not status and nbytes <= int(allowed):
            return  # AMD GPUs need no opt-in below the function's limit
        self._check(
            hip.hipKernelSetAttribute(self._max_dynamic_shared, nbytes, function, self.device),
            "hipKernelSetAttribute",
        )

    def launch(
        self,
        function: Any,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_bytes: int,
        stream: Any,
        params_address: int,
    ) -> None:
        self._check(
            self.hip.hipModuleLaunchKernel(
                function,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                shared_bytes,
                stream,
                params_address,
                None,
            ),
            "hipModuleLaunchKernel",
        )

    def compile_options(self, target: str, defines: dict[str, str]) -> list[str]:
        # The backend's target is the bare gfx name; compile for the device's feature flags.
        arch = self.arch if self.arch.split(":")[0] == target else target
        return compile_options(arch, defines)

    def compiler_version(self) -> str:
        return hiprtc_version()

    def compile(self, source: str, name: str, options: list[str]) -> bytes:
        return compile_cxx(source, name, options)


def _open_table(device: int) -> HipTable:
    table = HipTable()
    hip = table.hip
    try:
        status, count = hip.hipGetDeviceCount()
    except Exception as exc:  # hip-python raises RuntimeError when the dlopen fails
        reason = load_error(library_path()) or str(exc)
        raise BackendUnavailable(
            "hip", f"the ROCm runtime {LIBRARY} could not be loaded: {reason}", ROCM_HINT
        ) from None
    if status == hip.hipError_t.hipErrorNoDevice or (not status and count == 0):
        raise BackendUnavailable("hip", f"{LIBRARY} loaded but reports no HIP devices")
    if status:
        raise BackendUnavailable(
            "hip", f"no HIP device answers ({table.error('hipGetDeviceCount', status)})"
        )
    if device >= count:
        raise BackendUnavailable(
            "hip",
            f"device {device} was asked for; HIP reports {count} device(s) (0..{count - 1})",
        )
    try:
        table.set_device(device)
        props = table._check(hip.hipGetDeviceProperties(device), "hipGetDeviceProperties")
    except BackendError as exc:
        raise BackendUnavailable("hip", f"device {device} could not be opened ({exc})") from None
    table.arch = c_text(props.gcnArchName)
    if not _TARGET.fullmatch(table.arch):
        raise BackendUnavailable(
            "hip", f"device {device} reports gcnArchName {table.arch!r}, which is no gfx target"
        )
    return table


def detect_target(device: int = 0) -> str:
    """The full gfx target of HIP device `device` ("gfx90a:sramecc+:xnack-")."""
    return _open_table(device).arch


def open_backend(device: int = 0, cache: KernelCache | None = None) -> StreamBackend:
    """The HIP backend on `device`; `BackendUnavailable` says why when it cannot open."""
    mode = os.environ.get(_FENCE_WAIT_ENV, "blocking")
    if mode not in ("blocking", "spin"):
        raise ContractError(f"{_FENCE_WAIT_ENV} must be 'blocking' or 'spin', got {mode!r}")
    table = _open_table(device)
    target = table.arch.split(":")[0]
    return StreamBackend(table, device, target, blocking_sync=mode == "blocking", cache=cache)


# -- doctor ------------------------------------------------------------------------------


def hip_doctor() -> dict[str, Any]:
    """What stands between this machine and the HIP backend. Looks only; never installs.

    Reports whether hip-python imports, whether `libamdhip64.so` loads (with
    the loader's error when it does not), the HIP devices with their gfx
    targets, and the ROCm device nodes (`/dev/kfd`, `/dev/dri/renderD*`) with
    whether this user may open them.
    """
    report: dict[str, Any] = {
        "hip_python": {"importable": False, "version": hip_python_version(), "error": None},
        "library": {"name": LIBRARY, "path": None, "loaded": False, "error": None},
        "devices": [],
        "devices_error": None,
        "kfd": device_node("/dev/kfd"),
        "render_nodes": [device_node(path) for path in sorted(glob.glob("/dev/dri/renderD*"))],
    }
    hip: Any = None
    try:
        hip, _ = _bindings()
        report["hip_python"]["importable"] = True
    except BackendUnavailable as exc:
        report["hip_python"]["error"] = exc.reason
    library = report["library"]
    library["path"] = library_path() if hip is not None else LIBRARY
    library["error"] = load_error(library["path"])
    library["loaded"] = library["error"] is None
    if hip is not None and library["loaded"]:
        try:
            report["devices"] = _devices(hip)
        except Exception as exc:  # a broken runtime is a finding, not a crash
            report["devices_error"] = f"{type(exc).__name__}: {exc}"
    return report


def _devices(hip: Any) -> list[dict[str, Any]]:
    status, count = hip.hipGetDeviceCount()
    if status == hip.hipError_t.hipErrorNoDevice:
        return []
    if status:
        raise BackendError("hip", "hipGetDeviceCount", status.name)
    devices: list[dict[str, Any]] = []
    for index in range(int(count)):
        status, props = hip.hipGetDeviceProperties(index)
        if status:
            devices.append({"index": index, "error": status.name})
            continue
        arch = c_text(props.gcnArchName)
        devices.append(
            {
                "index": index,
                "name": c_text(props.name),
                "gcn_arch": arch,
                "target": arch.split(":")[0],
                "memory_total_bytes": int(props.totalGlobalMem),
            }
        )
    return devices


__all__ = [
    "INSTALL",
    "LIBRARY",
    "STICKY_ERRORS",
    "HipTable",
    "compile_cxx",
    "compile_options",
    "detect_target",
    "hip_doctor",
    "hiprtc_version",
    "open_backend",
]
