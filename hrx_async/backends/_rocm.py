"""ROCm on this machine, as far as it can be found without hip-python's calls.

Where the HIP runtime library is and whether the dynamic loader accepts it,
the ROCm device nodes and whether this user may open them, which hip-python
distribution is installed, and how HIP's numbers and C strings read as text.
`hip.py` uses these to open the backend and for `hrx-async doctor`; nothing
here imports hip-python at module level.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
from typing import Any

LIBRARY = "libamdhip64.so"
ROCM_HINT = f"ROCm: {LIBRARY} and libhiprtc.so in $ROCM_PATH/lib, /opt/rocm/lib or LD_LIBRARY_PATH"


def c_text(value: Any) -> str:
    """A C string from the bindings (bytes or str, NUL-padded) as str."""
    if isinstance(value, bytes):
        return value.decode(errors="replace").rstrip("\0")
    return str(value).rstrip("\0")


def hip_version_text(number: int) -> str:
    """HIP's MAJOR*10_000_000 + MINOR*100_000 + PATCH as "MAJOR.MINOR.PATCH"."""
    return f"{number // 10_000_000}.{number // 100_000 % 100}.{number % 100_000}"


def hip_python_version() -> str | None:
    """The installed hip-python distribution's version, or None."""
    for name in ("hip-python", "rocm-bindings-hip"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def library_path() -> str:
    """Where hip-python looks for the runtime (its own search order), else the bare name."""
    try:
        from rocm.bindings.util.paths import get_library_path
    except ImportError:  # hip-python releases before the rocm.bindings layout
        return LIBRARY
    try:
        return os.fsdecode(get_library_path("amdhip64"))
    except Exception:  # a search that fails leaves the system loader to decide
        return LIBRARY


def load_error(path: str) -> str | None:
    """The dynamic loader's complaint about `path`, or None when it loads."""
    try:
        ctypes.CDLL(path)
    except OSError as exc:
        return str(exc)
    return None


def device_node(path: str) -> dict[str, Any]:
    """Whether the device node `path` exists and this user may read and write it."""
    present = os.path.exists(path)
    return {
        "path": path,
        "present": present,
        "accessible": present and os.access(path, os.R_OK | os.W_OK),
    }


__all__ = [
    "LIBRARY",
    "ROCM_HINT",
    "c_text",
    "device_node",
    "hip_python_version",
    "hip_version_text",
    "library_path",
    "load_error",
]
