"""TensorOps' kernels: the C++ for NVRTC and hipRTC and, beside each, its numpy twin.

Every entry point takes its tensors' pointers and then one `OpArgs` (eight unsigned
integers, `u`) by value. The two forms compute the same bits:

* `hrx_gather_rows`: byte i of the output (row r = i / row_bytes) is byte i % row_bytes
  of source row ids[r]; an id past the source selects row 0 (the host checks ids first,
  so only a bound view's stale id can reach that).
  u = (output bytes, row_bytes, source rows).
* `hrx_finite`: flag[0] = 1 when some |x| > FLT_MAX or x is NaN (the graph zeroes the
  flag first); every writer writes the same 1. u = (count,).
* `hrx_linear{1,2,3}_{bf16,f32}`: y[n] = Σ_k x[k]·w[n,k] for the rows of one to three
  bf16 weights laid end to end in one output. One block of 128 threads per output row:
  thread t adds x[j·128+t]·w[n, j·128+t] for j = 0, 1, ... in f32 (the product of two
  bf16 values is exact in f32, so a fused multiply-add rounds the same), then the 128
  partial sums are added pairwise (t += t + 64, + 32, ... + 1). The numpy twin adds in
  exactly that order, so sim and device agree to the bit; bf16 outputs round the f32 sum
  to nearest even. u = (K, n1, n2, n3).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from ..models.tensor import bf16_from_f32, f32_from_bf16

Array = np.ndarray[Any, Any]
HostKernel = Callable[[list[Array], bytes], None]
ARGS = 8
LANES = 128


def pack(*values: int) -> bytes:
    return struct.pack(f"<{ARGS}I", *values, *([0] * (ARGS - len(values))))


def unpack(constants: bytes) -> tuple[int, ...]:
    return struct.unpack(f"<{ARGS}I", constants)


SOURCE = r"""
struct OpArgs { unsigned u[8]; };

extern "C" __global__ void hrx_gather_rows(const unsigned char* src, const int* ids,
                                           unsigned char* dst, OpArgs a) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.u[0]) return;
  unsigned row = i / a.u[1], byte = i % a.u[1];
  int id = ids[row];
  unsigned from = (id >= 0 && (unsigned)id < a.u[2]) ? (unsigned)id : 0u;
  dst[i] = src[(unsigned long long)from * a.u[1] + byte];
}

extern "C" __global__ void hrx_finite(const float* x, int* flag, OpArgs a) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.u[0]) return;
  float v = x[i];
  if (!(v <= 3.40282347e+38f && v >= -3.40282347e+38f)) flag[0] = 1;
}

__device__ inline float bf16_value(unsigned short bits) {
  union { unsigned u; float f; } c;
  c.u = (unsigned)bits << 16;
  return c.f;
}
__device__ inline unsigned short bf16_bits(float value) {
  union { unsigned u; float f; } c;
  c.f = value;
  if (value != value) return (unsigned short)((c.u >> 16) | 0x40u);
  return (unsigned short)((c.u + 0x7FFFu + ((c.u >> 16) & 1u)) >> 16);
}
__device__ inline void put(float* y, unsigned n, float v) { y[n] = v; }
__device__ inline void put(unsigned short* y, unsigned n, float v) { y[n] = bf16_bits(v); }

template <typename O>
__device__ void linear_row(const unsigned short* x, const unsigned short* w, O* y,
                           unsigned row, unsigned out, unsigned k) {
  __shared__ float part[128];
  unsigned t = threadIdx.x;
  const unsigned short* wr = w + (unsigned long long)row * k;
  float acc = 0.0f;
  for (unsigned j = t; j < k; j += 128u) acc += bf16_value(x[j]) * bf16_value(wr[j]);
  part[t] = acc;
  __syncthreads();
  for (unsigned half = 64u; half > 0u; half >>= 1) {
    if (t < half) part[t] = part[t] + part[t + half];
    __syncthreads();
  }
  if (t == 0u) put(y, out, part[0]);
}

#define HRX_LINEAR(NAME, O)                                                              \
  extern "C" __global__ void hrx_linear1_##NAME(const unsigned short* x,                 \
      const unsigned short* w1, O* y, OpArgs a) {                                        \
    linear_row(x, w1, y, blockIdx.x, blockIdx.x, a.u[0]);                                \
  }                                                                                      \
  extern "C" __global__ void hrx_linear2_##NAME(const unsigned short* x,                 \
      const unsigned short* w1, const unsigned short* w2, O* y, OpArgs a) {              \
    unsigned n = blockIdx.x;                                                             \
    if (n < a.u[1]) linear_row(x, w1, y, n, n, a.u[0]);                                  \
    else linear_row(x, w2, y, n - a.u[1], n, a.u[0]);                                    \
  }                                                                                      \
  extern "C" __global__ void hrx_linear3_##NAME(const unsigned short* x,                 \
      const unsigned short* w1, const unsigned short* w2, const unsigned short* w3,      \
      O* y, OpArgs a) {                                                                  \
    unsigned n = blockIdx.x, n12 = a.u[1] + a.u[2];                                      \
    if (n < a.u[1]) linear_row(x, w1, y, n, n, a.u[0]);                                  \
    else if (n < n12) linear_row(x, w2, y, n - a.u[1], n, a.u[0]);                       \
    else linear_row(x, w3, y, n - n12, n, a.u[0]);                                       \
  }

HRX_LINEAR(f32, float)
HRX_LINEAR(bf16, unsigned short)
"""


def gather_rows(arrays: list[Array], constants: bytes) -> None:
    total, row_bytes, rows = unpack(constants)[:3]
    src, ids, dst = arrays
    picked = ids.view(np.int32)[: total // row_bytes].astype(np.int64)
    picked = np.where((picked >= 0) & (picked < rows), picked, 0)
    table = src[: rows * row_bytes].reshape(rows, row_bytes)
    dst[:total] = table[picked].reshape(-1)


def finite(arrays: list[Array], constants: bytes) -> None:
    count = unpack(constants)[0]
    x = arrays[0].view(np.float32)[:count]
    limit = np.float32(np.finfo(np.float32).max)
    with np.errstate(invalid="ignore"):
        bad = not bool(np.all((x <= limit) & (x >= -limit)))
    if bad:
        arrays[1].view(np.int32)[0] = 1


def linear_sums(x: Array, w: Array) -> Array:
    """The kernel's f32 sums of bf16 bits `x` [K] against `w` [N, K], in its order."""
    k = x.shape[0]
    xs = f32_from_bf16(x).reshape(k // LANES, LANES)
    ws = f32_from_bf16(w).reshape(w.shape[0], k // LANES, LANES)
    acc = np.zeros((w.shape[0], LANES), np.float32)
    for j in range(k // LANES):
        acc += ws[:, j, :] * xs[j]  # exact products, one rounding per add as on the device
    half = LANES // 2
    while half:
        acc = acc[:, :half] + acc[:, half : 2 * half]
        half //= 2
    out: Array = acc[:, 0]
    return out


def linear(count: int, out_dtype: str) -> HostKernel:
    def kernel(arrays: list[Array], constants: bytes) -> None:
        k, *ns = unpack(constants)[: 1 + count]
        x = arrays[0].view(np.uint16)[:k]
        sums = [
            linear_sums(x, arrays[1 + i].view(np.uint16)[: n * k].reshape(n, k))
            for i, n in enumerate(ns)
        ]
        y = np.concatenate(sums)
        out = arrays[1 + count]
        if out_dtype == "f32":
            out.view(np.float32)[: y.size] = y
        else:
            out.view(np.uint16)[: y.size] = bf16_from_f32(y)

    return kernel


KERNELS: dict[str, HostKernel] = {
    "hrx_gather_rows": gather_rows,
    "hrx_finite": finite,
    **{f"hrx_linear{c}_{d}": linear(c, d) for c in (1, 2, 3) for d in ("f32", "bf16")},
}
"""Each device entry point's host twin, by the entry point's name."""

__all__ = ["KERNELS", "LANES", "SOURCE", "linear_sums", "pack", "unpack"]
