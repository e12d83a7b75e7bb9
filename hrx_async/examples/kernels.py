"""The examples' kernels, each as CUDA C++ source and as a numpy host function.

GPU backends compile `cxx`; the sim backend runs `host`. NPU programs are
host functions for the sim NPU. Host kernels follow `hrx_async._core.kernels`: they
get one uint8 array per binding (the whole bound view) and the contract's
constant bytes, and write their outputs in place.

GPU kernel arguments are the bound buffers' device pointers in binding order,
then the contract's scalar constants in declaration order. bfloat16 values are
carried as their 16-bit patterns (`unsigned short` on the device), so the
sources need no half-precision headers.

NPU host programs keep their scratch arrays from construction on, so a replay
allocates nothing; one program object must not run on two lanes at once (a
lane runs one region at a time, so sharing it between graphs of one NPU is fine).
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from ..errors import ContractError

ByteArray = np.ndarray[Any, np.dtype[np.uint8]]
BLOCK = 256

# -- bfloat16 as bit patterns ---------------------------------------------------------


def bf16_from_f32(values: np.ndarray[Any, Any]) -> np.ndarray[Any, np.dtype[np.uint16]]:
    """bfloat16 bit patterns of float32 `values`, rounded to nearest even (NaN stays NaN)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(
        16
    )
    nan = np.isnan(values)
    result = rounded.astype(np.uint16)
    if nan.any():
        result[nan] = ((bits[nan] >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)
    return result


def f32_from_bf16(bits: np.ndarray[Any, Any]) -> np.ndarray[Any, np.dtype[np.float32]]:
    """float32 values of bfloat16 bit patterns (exact: bf16 is the top half of an f32)."""
    widened = np.left_shift(np.asarray(bits, dtype=np.uint16), 16, dtype=np.uint32)
    return widened.view(np.float32)


def _scalars(constants: bytes) -> tuple[int, float]:
    if len(constants) != 8:
        raise ContractError(
            f"kernel expects 8 constant bytes (u32 elements, f32 scalar), got {len(constants)}"
        )
    count, value = struct.unpack("<If", constants)
    return int(count), float(value)


# -- affine: out = in * 3 + 7 on int32 ------------------------------------------------------

AFFINE_CXX = r"""
extern "C" __global__ void affine(const int* __restrict__ input, int* __restrict__ output) {
  unsigned i = blockIdx.x * 256u + threadIdx.x;
  output[i] = input[i] * 3 + 7;
}
"""


def affine_host(arrays: list[ByteArray], constants: bytes) -> None:
    """`out = in * 3 + 7` over int32 (two in-place ufuncs: no temporaries)."""
    source = arrays[0].view(np.int32)
    target = arrays[1].view(np.int32)
    np.multiply(source, 3, out=target)
    np.add(target, 7, out=target)


# -- Euler step on bf16: a = a + scale * b --------------------------------------------------

EULER_CXX = r"""
__device__ inline float bf16_to_f32(unsigned short bits) {
  return __uint_as_float(((unsigned)bits) << 16);
}
__device__ inline unsigned short f32_to_bf16(float value) {
  unsigned bits = __float_as_uint(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((bits >> 16) | 0x40u);
  return (unsigned short)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}
extern "C" __global__ void krea2_euler(unsigned short* __restrict__ state,
                                       const unsigned short* __restrict__ velocity,
                                       unsigned elements, float step) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < elements) {
    state[i] = f32_to_bf16(bf16_to_f32(state[i]) + step * bf16_to_f32(velocity[i]));
  }
}
"""


def euler_host(arrays: list[ByteArray], constants: bytes) -> None:
    """`state += step * velocity` on bf16 bit patterns, computed in f32 like the device."""
    count, step = _scalars(constants)
    state = arrays[0].view(np.uint16)[:count]
    velocity = f32_from_bf16(arrays[1].view(np.uint16)[:count])
    updated = f32_from_bf16(state) + np.float32(step) * velocity
    state[:] = bf16_from_f32(updated)


# -- add a scalar to f32 values -------------------------------------------------------------

ADD_F32_CXX = r"""
extern "C" __global__ void add_f32(float* __restrict__ values, unsigned elements, float addend) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < elements) values[i] += addend;
}
"""


def add_f32_host(arrays: list[ByteArray], constants: bytes) -> None:
    count, addend = _scalars(constants)
    values = arrays[0].view(np.float32)[:count]
    np.add(values, np.float32(addend), out=values)


# -- NPU programs (sim NPU host functions) --------------------------------------------------


class BatchedGemmBf16:
    """`matrices` products of 8×8 bf16 matrices into 8×8 f32, like the batched NPU GEMM.

    Bindings: A (matrices·128 bytes, read), B (matrices·128, read), C (matrices·256, write).
    """

    def __init__(self, matrices: int) -> None:
        if matrices < 1:
            raise ContractError(f"matrices must be >= 1, got {matrices}")
        self.matrices = matrices
        self._a = np.zeros((matrices, 8, 8), np.uint32)
        self._b = np.zeros((matrices, 8, 8), np.uint32)

    def __call__(self, arrays: list[ByteArray], constants: bytes) -> None:
        shape = (self.matrices, 8, 8)
        np.left_shift(arrays[0].view(np.uint16).reshape(shape), 16, out=self._a, dtype=np.uint32)
        np.left_shift(arrays[1].view(np.uint16).reshape(shape), 16, out=self._b, dtype=np.uint32)
        product = arrays[2].view(np.float32)[: self.matrices * 64].reshape(shape)
        np.matmul(self._a.view(np.float32), self._b.view(np.float32), out=product)


class GemmBf16:
    """C[M×N] (f32) = A[M×K] · B[K×N] with bf16 inputs, accumulated in f32."""

    def __init__(self, m: int, k: int, n: int) -> None:
        self.m, self.k, self.n = m, k, n
        self._a = np.zeros((m, k), np.uint32)
        self._b = np.zeros((k, n), np.uint32)

    def __call__(self, arrays: list[ByteArray], constants: bytes) -> None:
        m, k, n = self.m, self.k, self.n
        a = arrays[0].view(np.uint16)[: m * k].reshape(m, k)
        b = arrays[1].view(np.uint16)[: k * n].reshape(k, n)
        np.left_shift(a, 16, out=self._a, dtype=np.uint32)
        np.left_shift(b, 16, out=self._b, dtype=np.uint32)
        product = arrays[2].view(np.float32)[: m * n].reshape(m, n)
        np.matmul(self._a.view(np.float32), self._b.view(np.float32), out=product)


def npu_copy(arrays: list[ByteArray], constants: bytes) -> None:
    """The NPU passthrough program: binding 1 = binding 0, byte for byte."""
    np.copyto(arrays[1], arrays[0])


__all__ = [
    "ADD_F32_CXX",
    "AFFINE_CXX",
    "BLOCK",
    "EULER_CXX",
    "BatchedGemmBf16",
    "GemmBf16",
    "add_f32_host",
    "affine_host",
    "bf16_from_f32",
    "euler_host",
    "f32_from_bf16",
    "npu_copy",
]
