"""The CUDA backend: a driver table over cuda-bindings, NVRTC, and `open_backend`.

Everything stream-shaped lives in `_stream.py` and its `_stream_*.py` parts;
this module maps their driver table onto the CUDA runtime API (memory,
streams, events, graphs) and the driver API (modules, kernel metadata,
launches), compiles `KernelSource(cxx=...)` with NVRTC for the device's
`sm_XY`, and decides when CUDA is unavailable. cuda-bindings is imported here
only, and only when the backend is opened.

Kernel arguments follow `_stream_programs`' convention: one pointer parameter
per binding, then the contract's constants split by the sizes
`cuFuncGetParamInfo` reports for the remaining parameters. Declare kernels
`extern "C"`.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import sys
from typing import Any

from .._core.dlpack import DLPACK_CUDA
from .._core.install import install_hint
from ..errors import BackendError, BackendUnavailable, CompileError, ContractError
from ._stream import StreamBackend
from ._stream_calls import ReplayCalls
from ._stream_driver import make_error
from .kernel_cache import KernelCache

INSTALL = install_hint("cuda")  # which brings NVRTC too
DRIVER_LIBRARY = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"
DRIVER_INSTALL = "the NVIDIA driver for your GPU (it provides " + DRIVER_LIBRARY + ")"


def nvrtc_install() -> str:
    """What brings NVRTC: NVIDIA's NVRTC wheel matching the installed cuda-bindings."""
    try:
        major = int(importlib.metadata.version("cuda-bindings").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        major = 12
    package = f"nvidia-cuda-nvrtc-cu{major}" if major <= 12 else "nvidia-cuda-nvrtc"
    return f"pip install {package} (NVRTC for cuda-bindings {major}.x), or a CUDA toolkit"


def nvidia_driver_present() -> bool:
    """Whether the NVIDIA driver's library loads (CUDA calls report its absence vaguely)."""
    try:
        ctypes.CDLL(DRIVER_LIBRARY)
    except OSError:
        return False
    return True


def _no_driver() -> BackendUnavailable:
    return BackendUnavailable(
        "cuda", f"no NVIDIA driver ({DRIVER_LIBRARY} could not be loaded)", DRIVER_INSTALL
    )


# Errors after which the context can run nothing more (CUDA's "sticky" errors), as both
# the runtime API and the driver API name them.
STICKY_ERRORS = frozenset(
    {
        "cudaErrorIllegalAddress",
        "cudaErrorLaunchFailure",
        "cudaErrorMisalignedAddress",
        "cudaErrorIllegalInstruction",
        "cudaErrorHardwareStackError",
        "cudaErrorAssert",
        "cudaErrorInvalidAddressSpace",
        "cudaErrorInvalidPc",
        "cudaErrorLaunchTimeout",
        "cudaErrorECCUncorrectable",
        "cudaErrorContextIsDestroyed",
        "cudaErrorUnknown",
        "cudaErrorDevicesUnavailable",
        "cudaErrorNvlinkUncorrectable",
        "cudaErrorExternalDevice",
        "cudaErrorTensorMemoryLeak",
        "cudaErrorIllegalState",
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        "CUDA_ERROR_LAUNCH_FAILED",
        "CUDA_ERROR_MISALIGNED_ADDRESS",
        "CUDA_ERROR_ILLEGAL_INSTRUCTION",
        "CUDA_ERROR_HARDWARE_STACK_ERROR",
        "CUDA_ERROR_ASSERT",
        "CUDA_ERROR_INVALID_ADDRESS_SPACE",
        "CUDA_ERROR_INVALID_PC",
        "CUDA_ERROR_LAUNCH_TIMEOUT",
        "CUDA_ERROR_ECC_UNCORRECTABLE",
        "CUDA_ERROR_CONTEXT_IS_DESTROYED",
        "CUDA_ERROR_UNKNOWN",
        "CUDA_ERROR_NVLINK_UNCORRECTABLE",
        "CUDA_ERROR_EXTERNAL_DEVICE",
        "CUDA_ERROR_ILLEGAL_STATE",
    }
)

_FENCE_WAIT_ENV = "HRX_CUDA_FENCE_WAIT"
"""'spin' (the default: waiter threads spin in the driver, the fastest wake-up) or 'blocking'
(they sleep until the driver's interrupt: no busy core, about 20 µs later on an H200)."""


def _bindings() -> tuple[Any, Any]:
    """(runtime, driver) modules of cuda-bindings, or BackendUnavailable."""
    try:
        from cuda.bindings import driver, runtime
    except ImportError as exc:
        raise BackendUnavailable(
            "cuda", f"cuda-bindings is not installed ({exc})", INSTALL
        ) from None
    return runtime, driver


def _nvrtc() -> Any:
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise BackendUnavailable(
            "cuda", f"cuda-bindings is not installed ({exc})", INSTALL
        ) from None
    return nvrtc


def nvrtc_version() -> str:
    """NVRTC's version as "nvrtc-MAJOR.MINOR" (part of every compiled kernel's cache key)."""
    nvrtc = _nvrtc()
    try:
        status, major, minor = nvrtc.nvrtcVersion()
    except Exception as exc:  # the library itself may be missing
        raise BackendUnavailable(
            "cuda", f"NVRTC could not be loaded: {exc}", nvrtc_install()
        ) from None
    if status:
        raise BackendError("cuda", "nvrtcVersion", status.name)
    return f"nvrtc-{major}.{minor}"


def compile_options(target: str, defines: dict[str, str]) -> list[str]:
    """NVRTC options for `target` ("sm_90") and `-D` defines, in a stable order."""
    if not target.startswith("sm_") or not target[3:].isdigit():
        raise ContractError(f"a CUDA target looks like 'sm_90', got {target!r}")
    options = [f"--gpu-architecture={target}"]
    for key in sorted(defines):
        if not key or not key.replace("_", "a").isalnum() or key[0].isdigit():
            raise ContractError(f"define names are C identifiers, got {key!r}")
        options.append(f"-D{key}={defines[key]}")
    return options


def compile_cxx(source: str, name: str, options: list[str]) -> bytes:
    """Compile CUDA C++ with NVRTC to a cubin; `CompileError` carries NVRTC's log."""
    nvrtc = _nvrtc()

    def check(result: tuple[Any, ...], operation: str) -> Any:
        status = result[0]
        if status:
            _, text = nvrtc.nvrtcGetErrorString(status)
            raise BackendError("cuda", operation, status.name, text.decode(errors="replace"))
        return result[1] if len(result) > 1 else None

    program = check(
        nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], []),
        "nvrtcCreateProgram",
    )
    try:
        encoded = [option.encode() for option in options]
        (status,) = nvrtc.nvrtcCompileProgram(program, len(encoded), encoded)
        if status:
            size = check(nvrtc.nvrtcGetProgramLogSize(program), "nvrtcGetProgramLogSize")
            log = b" " * size
            check(nvrtc.nvrtcGetProgramLog(program, log), "nvrtcGetProgramLog")
            raise CompileError(
                f"NVRTC could not compile kernel {name!r} ({' '.join(options)})",
                log.rstrip(b"\0 ").decode(errors="replace"),
            )
        size = check(nvrtc.nvrtcGetCUBINSize(program), "nvrtcGetCUBINSize")
        cubin = b" " * size
        check(nvrtc.nvrtcGetCUBIN(program, cubin), "nvrtcGetCUBIN")
        return bytes(cubin)
    finally:
        nvrtc.nvrtcDestroyProgram(program)


class CudaTable:
    """The `DriverTable` of CUDA: runtime API for memory/streams/graphs, driver API for code."""

    name = "cuda"
    dlpack_device_type = DLPACK_CUDA

    def __init__(self) -> None:
        self.rt, self.dr = _bindings()
        rt = self.rt
        self._memcpy_default = rt.cudaMemcpyKind.cudaMemcpyDefault
        self._host_flags = rt.cudaHostAllocMapped | rt.cudaHostAllocPortable
        self._not_ready = rt.cudaError_t.cudaErrorNotReady
        self._capture_mode = rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        self._max_threads = self.dr.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
        self._max_dynamic_shared = (
            self.dr.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        )
        self.replay_calls = ReplayCalls(
            self.error,
            "cuda",
            rt.cudaGraphLaunch,
            rt.cudaMemcpyAsync,
            self._memcpy_default,
            rt.cudaEventRecord,
            rt.cudaStreamWaitEvent,
            rt.cudaEventQuery,
            self._not_ready,
        )

    # -- errors --------------------------------------------------------------------------

    def error(self, operation: str, status: Any) -> BackendError:
        name = getattr(status, "name", str(status))
        message = ""
        try:
            if name.startswith("CUDA_"):
                _, text = self.dr.cuGetErrorString(status)
            else:
                _, text = self.rt.cudaGetErrorString(status)
            message = text.decode(errors="replace") if text else ""
        except Exception:  # describing an error must not raise another
            pass
        return make_error("cuda", operation, name, message, STICKY_ERRORS)

    def _check(self, result: tuple[Any, ...], operation: str) -> Any:
        status = result[0]
        if status:
            raise self.error(operation, status)
        if len(result) == 2:
            return result[1]
        return result[1:] if len(result) > 2 else None

    # -- device --------------------------------------------------------------------------

    def set_device(self, device: int) -> None:
        self._check(self.rt.cudaSetDevice(device), "cudaSetDevice")

    def can_access_peer(self, device: int, peer: int) -> bool:
        answer = self._check(
            self.rt.cudaDeviceCanAccessPeer(device, peer), "cudaDeviceCanAccessPeer"
        )
        return bool(answer)

    def enable_peer_access(self, peer: int) -> None:
        rt = self.rt
        status = rt.cudaDeviceEnablePeerAccess(peer, 0)[0]
        if status and status != rt.cudaError_t.cudaErrorPeerAccessAlreadyEnabled:
            raise self.error("cudaDeviceEnablePeerAccess", status)

    def describe(self, device: int) -> dict[str, Any]:
        rt = self.rt
        props = self._check(rt.cudaGetDeviceProperties(device), "cudaGetDeviceProperties")
        free, total = self._check(rt.cudaMemGetInfo(), "cudaMemGetInfo")
        driver = self._check(rt.cudaDriverGetVersion(), "cudaDriverGetVersion")
        runtime = self._check(rt.cudaRuntimeGetVersion(), "cudaRuntimeGetVersion")
        count = self._check(rt.cudaGetDeviceCount(), "cudaGetDeviceCount")
        try:
            import cuda.bindings as bindings

            bindings_version = str(bindings.__version__)
        except (ImportError, AttributeError):
            bindings_version = "unknown"
        try:
            compiler = nvrtc_version()
        except (BackendUnavailable, BackendError) as exc:
            compiler = f"unavailable ({exc})"
        name = props.name
        return {
            "name": name.decode(errors="replace").rstrip("\0") if isinstance(name, bytes) else name,
            "compute_capability": f"{props.major}.{props.minor}",
            "driver_version": _version(driver),
            "runtime_version": _version(runtime),
            "cuda_bindings": bindings_version,
            "compiler": compiler,
            "memory_total_bytes": int(total),
            "memory_free_bytes": int(free),
            "multiprocessors": int(props.multiProcessorCount),
            "devices_visible": int(count),
        }

    # -- memory --------------------------------------------------------------------------

    def malloc(self, nbytes: int) -> int:
        return int(self._check(self.rt.cudaMalloc(nbytes), "cudaMalloc"))

    def free(self, pointer: int) -> None:
        self._check(self.rt.cudaFree(pointer), "cudaFree")

    def host_alloc(self, nbytes: int) -> int:
        return int(self._check(self.rt.cudaHostAlloc(nbytes, self._host_flags), "cudaHostAlloc"))

    def host_free(self, pointer: int) -> None:
        self._check(self.rt.cudaFreeHost(pointer), "cudaFreeHost")

    def host_device_pointer(self, pointer: int) -> int:
        return int(
            self._check(self.rt.cudaHostGetDevicePointer(pointer, 0), "cudaHostGetDevicePointer")
        )

    def pointer_kind(self, pointer: int) -> tuple[str, int]:
        attributes = self._check(
            self.rt.cudaPointerGetAttributes(pointer), "cudaPointerGetAttributes"
        )
        kinds = {
            "cudaMemoryTypeDevice": "device",
            "cudaMemoryTypeHost": "host",
            "cudaMemoryTypeManaged": "managed",
        }
        kind = kinds.get(getattr(attributes.type, "name", ""), "unregistered")
        return kind, int(attributes.device)

    def memset_async(self, pointer: int, value: int, nbytes: int, stream: Any) -> None:
        self._check(self.rt.cudaMemsetAsync(pointer, value, nbytes, stream), "cudaMemsetAsync")

    def memcpy_async(self, dst: int, src: int, nbytes: int, stream: Any) -> None:
        self.replay_calls.memcpy_async(dst, src, nbytes, stream)

    # -- streams and events --------------------------------------------------------------

    def stream_create(self) -> Any:
        rt = self.rt
        return self._check(
            rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking), "cudaStreamCreateWithFlags"
        )

    def stream_destroy(self, stream: Any) -> None:
        self._check(self.rt.cudaStreamDestroy(stream), "cudaStreamDestroy")

    def stream_synchronize(self, stream: Any) -> None:
        self._check(self.rt.cudaStreamSynchronize(stream), "cudaStreamSynchronize")

    def stream_handle(self, stream: Any) -> int:
        return int(stream)

    def event_create(self, blocking: bool) -> Any:
        rt = self.rt
        flags = rt.cudaEventDisableTiming | (rt.cudaEventBlockingSync if blocking else 0)
        return self._check(rt.cudaEventCreateWithFlags(flags), "cudaEventCreateWithFlags")

    def event_destroy(self, event: Any) -> None:
        self._check(self.rt.cudaEventDestroy(event), "cudaEventDestroy")

    def event_record(self, event: Any, stream: Any) -> None:
        self.replay_calls.event_record(event, stream)

    def event_query(self, event: Any) -> bool:
        return self.replay_calls.event_query(event)

    def event_synchronize(self, event: Any) -> None:
        status = self.rt.cudaEventSynchronize(event)[0]
        if status:
            raise self.error("cudaEventSynchronize", status)

    def stream_wait_event(self, stream: Any, event: Any) -> None:
        self.replay_calls.stream_wait_event(stream, event)

    # -- graphs --------------------------------------------------------------------------

    def begin_capture(self, stream: Any) -> None:
        self._check(
            self.rt.cudaStreamBeginCapture(stream, self._capture_mode), "cudaStreamBeginCapture"
        )

    def end_capture(self, stream: Any) -> Any:
        return self._check(self.rt.cudaStreamEndCapture(stream), "cudaStreamEndCapture")

    def abort_capture(self, stream: Any) -> None:
        status, graph = self.rt.cudaStreamEndCapture(stream)
        if not status and graph is not None and int(graph):
            self.rt.cudaGraphDestroy(graph)

    def graph_instantiate(self, graph: Any) -> Any:
        return self._check(self.rt.cudaGraphInstantiate(graph, 0), "cudaGraphInstantiate")

    def graph_launch(self, graph_exec: Any, stream: Any) -> None:
        self.replay_calls.graph_launch(graph_exec, stream)

    def graph_destroy(self, graph: Any) -> None:
        self._check(self.rt.cudaGraphDestroy(graph), "cudaGraphDestroy")

    def graph_exec_destroy(self, graph_exec: Any) -> None:
        self._check(self.rt.cudaGraphExecDestroy(graph_exec), "cudaGraphExecDestroy")

    # -- code ----------------------------------------------------------------------------

    def module_load(self, image: bytes) -> Any:
        return self._check(self.dr.cuModuleLoadData(image), "cuModuleLoadData")

    def module_unload(self, module: Any) -> None:
        self._check(self.dr.cuModuleUnload(module), "cuModuleUnload")

    def module_function(self, module: Any, name: str) -> Any:
        status, function = self.dr.cuModuleGetFunction(module, name.encode())
        if status == self.dr.CUresult.CUDA_ERROR_NOT_FOUND:
            raise ContractError(
                f'kernel {name!r} is not in the loaded code; declare it extern "C" '
                "(C++ names are mangled) and check the spelling"
            )
        if status:
            raise self.error("cuModuleGetFunction", status)
        return function

    def function_param_sizes(self, function: Any) -> list[int] | None:
        get_info = getattr(self.dr, "cuFuncGetParamInfo", None)
        if get_info is None:
            return None
        invalid = self.dr.CUresult.CUDA_ERROR_INVALID_VALUE
        sizes: list[int] = []
        while True:
            status, _offset, size = get_info(function, len(sizes))
            if status == invalid:
                return sizes
            if status:
                # Old drivers do not support the query; the contract cannot be checked.
                return None
            sizes.append(int(size))

    def function_max_threads(self, function: Any) -> int:
        value = self._check(
            self.dr.cuFuncGetAttribute(self._max_threads, function), "cuFuncGetAttribute"
        )
        return int(value)

    def function_set_dynamic_shared(self, function: Any, nbytes: int) -> None:
        self._check(
            self.dr.cuFuncSetAttribute(function, self._max_dynamic_shared, nbytes),
            "cuFuncSetAttribute",
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
            self.dr.cuLaunchKernel(
                function, *grid, *block, shared_bytes, stream, params_address, 0
            ),
            "cuLaunchKernel",
        )

    def compile_options(self, target: str, defines: dict[str, str]) -> list[str]:
        return compile_options(target, defines)

    def compiler_version(self) -> str:
        return nvrtc_version()

    def compile(self, source: str, name: str, options: list[str]) -> bytes:
        return compile_cxx(source, name, options)


def _version(number: int) -> str:
    """CUDA's 12040 → "12.4"."""
    return f"{number // 1000}.{number % 1000 // 10}"


def detect_target(device: int = 0) -> str:
    """The `sm_XY` target of CUDA device `device` (BackendUnavailable when none answers)."""
    table = _open_table(device)
    major, minor = _capability(table, device)
    return f"sm_{major}{minor}"


def _capability(table: CudaTable, device: int) -> tuple[int, int]:
    rt = table.rt
    attr = rt.cudaDeviceAttr
    major = table._check(
        rt.cudaDeviceGetAttribute(attr.cudaDevAttrComputeCapabilityMajor, device),
        "cudaDeviceGetAttribute",
    )
    minor = table._check(
        rt.cudaDeviceGetAttribute(attr.cudaDevAttrComputeCapabilityMinor, device),
        "cudaDeviceGetAttribute",
    )
    return int(major), int(minor)


def _open_table(device: int) -> CudaTable:
    table = CudaTable()
    rt = table.rt
    try:
        status, count = rt.cudaGetDeviceCount()
    except Exception as exc:  # the driver library itself could not be loaded
        if not nvidia_driver_present():
            raise _no_driver() from None
        raise BackendUnavailable("cuda", f"the NVIDIA driver could not be loaded: {exc}") from None
    if status:
        # Without libcuda the runtime reports an "insufficient" driver: say what is wrong.
        if not nvidia_driver_present():
            raise _no_driver()
        reason = table.error("cudaGetDeviceCount", status)
        raise BackendUnavailable("cuda", f"no CUDA device answers ({reason})")
    if count == 0:
        raise BackendUnavailable("cuda", "the CUDA driver reports no devices")
    if device >= count:
        raise BackendUnavailable(
            "cuda",
            f"device {device} was asked for; CUDA reports {count} device(s) (0..{count - 1})",
        )
    try:
        table.set_device(device)
        # cudaFree(0) makes the primary context current, so driver-API calls see it too.
        table.free(0)
    except BackendError as exc:
        raise BackendUnavailable("cuda", f"device {device} could not be opened ({exc})") from None
    return table


def open_backend(device: int = 0, cache: KernelCache | None = None) -> StreamBackend:
    """The CUDA backend on `device`; `BackendUnavailable` says why when it cannot open."""
    table = _open_table(device)
    major, minor = _capability(table, device)
    mode = os.environ.get(_FENCE_WAIT_ENV, "spin")
    if mode not in ("blocking", "spin"):
        raise ContractError(f"{_FENCE_WAIT_ENV} must be 'blocking' or 'spin', got {mode!r}")
    return StreamBackend(
        table, device, f"sm_{major}{minor}", blocking_sync=mode == "blocking", cache=cache
    )


__all__ = [
    "INSTALL",
    "STICKY_ERRORS",
    "CudaTable",
    "compile_cxx",
    "compile_options",
    "detect_target",
    "nvrtc_version",
    "open_backend",
]
