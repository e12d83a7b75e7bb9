"""DLPack device types (the `DLDeviceType` numbers of dlpack.h), defined once for the
stream backends, which report where their memory lives, and for the runtime's interop,
which reads where an adopted tensor lives."""

from __future__ import annotations

DLPACK_CPU = 1
DLPACK_CUDA = 2
DLPACK_CUDA_HOST = 3
DLPACK_ROCM = 10
DLPACK_ROCM_HOST = 11
DLPACK_CUDA_MANAGED = 13

GPU_DLPACK_DEVICES = (
    DLPACK_CUDA,
    DLPACK_CUDA_HOST,
    DLPACK_CUDA_MANAGED,
    DLPACK_ROCM,
    DLPACK_ROCM_HOST,
)
"""The device types of memory a GPU backend can adopt."""

__all__ = [
    "DLPACK_CPU",
    "DLPACK_CUDA",
    "DLPACK_CUDA_HOST",
    "DLPACK_CUDA_MANAGED",
    "DLPACK_ROCM",
    "DLPACK_ROCM_HOST",
    "GPU_DLPACK_DEVICES",
]
