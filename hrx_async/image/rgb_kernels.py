"""The RGB operations' kernels: C++ for NVRTC and hipRTC and, beside each, its numpy twin.

Every entry point takes its tensors' pointers, then one `ImageArgs` (see `args`). The
rules (the original's), and why the two forms give the same bits:

* `hrx_resize_rgb` (u8 NHWC RGB → u8 canvas, black outside `region`): per output index
  i of an axis, x = (i + 0.5)·src/out − 0.5 and s = floor(x) in double precision; s < 0
  is the tap (0, weight 1), s ≥ src − 1 the tap (src − 1, weight 1), else (s, s + 1)
  with weights (1 − (x − s), x − s). Weights become integers round(w·2^p) (round half
  up), p per axis from `letterbox_bits`. The vertical pass runs first:
  t = min(255, (Σ v·w + 2^(p−1)) >> p), then the horizontal one over t, alike. All
  integer after the taps, so sim and device agree to the bit.
* `hrx_affine_rgb_*` (crop i from matrix i, crop pixel → source position): positions
  in double (the products of a float32 entry and a pixel index are exact, so a fused
  multiply-add rounds alike); weights and sums in float32 with every product rounded on
  its own (`mul`: a volatile store keeps the compiler from fusing it into the add).
  Mode 0 "black, ties to even": inside iff −1 < x < W and −1 < y < H (NaN is outside:
  black); taps outside the source count 0; sum of (v·wx)·wy rounded to nearest even.
  Mode 1 "replicate, half up": |x|, |y| < 1e12 (else black); taps clamped to the
  source; sum of v·(wx·wy), floor(+0.5). Both saturate to 0..255. The packed form reads
  crop i from a byte image at records[i] = (offset, width, height); a record is valid
  iff offset < bytes, 1 ≤ width, height ≤ 32767 and width·height·3 ≤ bytes − offset; an
  invalid one gives a black crop.
* `hrx_rgb_encode` / `hrx_rgb_decode`: RGB views (`k` the factor, mode 0 unit b/255 and
  v·255 unclipped, 1 symmetric b/127.5 − 1 and rint((clamp(v, ±1) + 1)·127.5)). Only
  divisions, adds and products that no compiler fuses: the same bits.
* `hrx_composite_rgb`: a frame pixel in the region [left, right) x [top, bottom) whose
  frame → crop position is within 1e12 on each axis takes the crop sampled bilinearly
  (replicated borders) through α = clamp(mask sampled with zero borders, 0, 1):
  v = trunc(clamp(orig·(1 − α) + crop·α, 0, 255)); "quantized" (mode 1) rounds the
  crop sample half up first and ends with rint(orig·(1 − β) + v·β), β = clamp(blend,
  0, 1). Every other pixel is the frame's. Products rounded on their own, as above.
* `hrx_similarity_2d`: per face, the centred least-squares similarity from its points
  to the template, in double (`fit` below is the formula); status 1 and NaN matrices
  when a point is not finite, a determinant a² + b² of either matrix is not in
  (1e-20, FLT_MAX] or a translation is not finite as a float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .args import CXX_STRUCT, unpack

Array = np.ndarray[Any, Any]
HostKernel = Callable[[list[Array], bytes], None]
F32 = np.float32
F32_MAX = float(np.finfo(np.float32).max)
MAX_SIDE = 32767

_BODY = r"""
__device__ inline float mul(float a, float b) { volatile float p = a * b; return p; }
__device__ inline float quiet_nan() {
  union { unsigned u; float f; } c;
  c.u = 0x7fc00000u;
  return c.f;
}

struct Tap { unsigned i0, i1; long long w0, w1; };
__device__ inline Tap resize_tap(unsigned i, unsigned src, unsigned out, unsigned p) {
  double x = ((double)i + 0.5) * (double)src / (double)out - 0.5;
  double s = floor(x);
  double scale = (double)(1u << p);
  Tap t;
  if (s < 0.0) { t.i0 = 0u; t.i1 = 0u; t.w0 = 1LL << p; t.w1 = 0; return t; }
  if (s >= (double)src - 1.0) {
    t.i0 = src - 1u; t.i1 = src - 1u; t.w0 = 1LL << p; t.w1 = 0; return t;
  }
  double f = x - s;
  t.i0 = (unsigned)s; t.i1 = (unsigned)s + 1u;
  t.w0 = (long long)floor((1.0 - f) * scale + 0.5);
  t.w1 = (long long)floor(f * scale + 0.5);
  return t;
}
__device__ inline long long pass(long long sum, unsigned p) {
  long long v = (sum + (1LL << (p - 1u))) >> p;
  return v > 255 ? 255 : (v < 0 ? 0 : v);
}

extern "C" __global__ void hrx_resize_rgb(const unsigned char* src, unsigned char* dst,
                                          ImageArgs a) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.total) return;
  unsigned ch = i % 3u, x = (i / 3u) % a.dw, y = (i / 3u / a.dw) % a.dh;
  unsigned b = i / 3u / a.dw / a.dh;
  unsigned l = a.region[0], t = a.region[1], rw = a.region[2], rh = a.region[3];
  unsigned char v = 0;
  if (x >= l && x < l + rw && y >= t && y < t + rh) {
    Tap ty = resize_tap(y - t, a.sh, rh, a.bits[0]);
    Tap tx = resize_tap(x - l, a.sw, rw, a.bits[1]);
    unsigned long long base = (unsigned long long)b * a.ss[0] + (unsigned long long)ch * a.ss[1];
    unsigned long long r0 = base + (unsigned long long)ty.i0 * a.ss[2];
    unsigned long long r1 = base + (unsigned long long)ty.i1 * a.ss[2];
    long long c0 = pass(src[r0 + (unsigned long long)tx.i0 * a.ss[3]] * ty.w0
                        + src[r1 + (unsigned long long)tx.i0 * a.ss[3]] * ty.w1, a.bits[0]);
    long long c1 = pass(src[r0 + (unsigned long long)tx.i1 * a.ss[3]] * ty.w0
                        + src[r1 + (unsigned long long)tx.i1 * a.ss[3]] * ty.w1, a.bits[0]);
    v = (unsigned char)pass(c0 * tx.w0 + c1 * tx.w1, a.bits[1]);
  }
  dst[i] = v;
}

// One crop pixel channel of an h x w x 3 source at `src` with element strides (row, col).
__device__ unsigned char affine_px(const unsigned char* src, unsigned sh, unsigned sw,
                                   unsigned rs, unsigned cs, const float* m, unsigned mode,
                                   unsigned x, unsigned y, unsigned ch) {
  double xx = (double)m[0] * (double)x + (double)m[1] * (double)y + (double)m[2];
  double yy = (double)m[3] * (double)x + (double)m[4] * (double)y + (double)m[5];
  float acc = 0.0f;
  if (mode == 0u) {
    if (!(xx > -1.0 && xx < (double)sw && yy > -1.0 && yy < (double)sh)) return 0;
  } else if (!(fabs(xx) < 1e12 && fabs(yy) < 1e12)) {
    return 0;
  }
  double x0 = floor(xx), y0 = floor(yy);
  float fx = (float)(xx - x0), fy = (float)(yy - y0);
  float wx[2] = {1.0f - fx, fx}, wy[2] = {1.0f - fy, fy};
  for (int dy = 0; dy < 2; ++dy) {
    for (int dx = 0; dx < 2; ++dx) {
      double ty = y0 + dy, tx = x0 + dx;
      if (mode == 0u) {
        if (ty < 0.0 || tx < 0.0 || ty >= (double)sh || tx >= (double)sw) continue;
      } else {
        ty = ty < 0.0 ? 0.0 : (ty > (double)sh - 1.0 ? (double)sh - 1.0 : ty);
        tx = tx < 0.0 ? 0.0 : (tx > (double)sw - 1.0 ? (double)sw - 1.0 : tx);
      }
      float v = (float)src[(unsigned long long)ty * rs + (unsigned long long)tx * cs + ch];
      float p = mode == 0u ? mul(mul(v, wx[dx]), wy[dy]) : mul(v, mul(wx[dx], wy[dy]));
      acc = acc + p;
    }
  }
  float r = mode == 0u ? rintf(acc) : floorf(acc + 0.5f);
  return (unsigned char)(r < 0.0f ? 0.0f : (r > 255.0f ? 255.0f : r));
}

// Output [crops, dh, dw, 3] contiguous; matrices [crops, 2, 3] f32 contiguous.
extern "C" __global__ void hrx_affine_rgb(const unsigned char* src, const float* m,
                                          unsigned char* dst, ImageArgs a) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.total) return;
  unsigned ch = i % 3u, x = (i / 3u) % a.dw, y = (i / 3u / a.dw) % a.dh;
  unsigned crop = i / 3u / a.dw / a.dh;
  dst[i] = affine_px(src, a.sh, a.sw, a.ss[2], a.ss[3], m + 6u * crop, a.mode, x, y, ch);
}

// The packed form: sources in one byte image of a.k bytes, records [crops, 3] u32.
extern "C" __global__ void hrx_affine_rgb_packed(const unsigned char* image,
                                                 const unsigned* records, const float* m,
                                                 unsigned char* dst, ImageArgs a) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.total) return;
  unsigned ch = i % 3u, x = (i / 3u) % a.dw, y = (i / 3u / a.dw) % a.dh;
  unsigned crop = i / 3u / a.dw / a.dh;
  unsigned long long off = records[3u * crop], w = records[3u * crop + 1u];
  unsigned long long h = records[3u * crop + 2u], bytes = a.k;
  bool ok = off < bytes && w >= 1u && w <= 32767u && h >= 1u && h <= 32767u
            && w * h * 3u <= bytes - off;
  dst[i] = ok ? affine_px(image + off, (unsigned)h, (unsigned)w, (unsigned)w * 3u, 3u,
                          m + 6u * crop, a.mode, x, y, ch)
              : (unsigned char)0;
}

// One thread per face: points [n, dh, 2] f32 at element strides ss[0..2]; template in
// tpl[2 * dh]; forward (points -> template) and inverse [n, 2, 3]; status [n].
extern "C" __global__ void hrx_similarity_2d(const float* pts, const float* tpl,
                                             float* fwd, float* inv, int* status,
                                             ImageArgs a) {
  unsigned f = blockIdx.x * blockDim.x + threadIdx.x;
  if (f >= a.n) return;
  unsigned count = a.dh;
  const double big = 3.4028234663852886e38;
  double px = 0, py = 0, qx = 0, qy = 0;
  bool ok = true;
  for (unsigned j = 0; j < count; ++j) {
    double x = pts[f * a.ss[0] + j * a.ss[1]], y = pts[f * a.ss[0] + j * a.ss[1] + a.ss[2]];
    if (!(fabs(x) <= big && fabs(y) <= big)) ok = false;
    px += x; py += y; qx += tpl[2u * j]; qy += tpl[2u * j + 1u];
  }
  px /= count; py /= count; qx /= count; qy /= count;
  double num_a = 0, num_b = 0, den = 0;
  for (unsigned j = 0; j < count; ++j) {
    double x = pts[f * a.ss[0] + j * a.ss[1]] - px;
    double y = pts[f * a.ss[0] + j * a.ss[1] + a.ss[2]] - py;
    double u = tpl[2u * j] - qx, v = tpl[2u * j + 1u] - qy;
    num_a += x * u + y * v; num_b += x * v - y * u; den += x * x + y * y;
  }
  double sa = num_a / den, sb = num_b / den;
  double m[6] = {sa, -sb, qx - sa * px + sb * py, sb, sa, qy - sb * px - sa * py};
  double det = sa * sa + sb * sb;
  double ia = sa / det, ib = -sb / det;
  double n[6] = {ia, -ib, -(ia * m[2] - ib * m[5]), ib, ia, -(ib * m[2] + ia * m[5])};
  double idet = ia * ia + ib * ib;
  ok = ok && det > 1e-20 && det <= big && idet > 1e-20 && idet <= big;
  for (int k = 0; k < 6; ++k) ok = ok && fabs((double)(float)m[k]) <= big
                                      && fabs((double)(float)n[k]) <= big;
  for (int k = 0; k < 6; ++k) {
    fwd[6u * f + k] = ok ? (float)m[k] : quiet_nan();
    inv[6u * f + k] = ok ? (float)n[k] : quiet_nan();
  }
  status[f] = ok ? 0 : 1;
}

// RGB views: u8 NHWC [B, H, W, 3] <-> f32 NCHW [B * f * f, 3, H / f, W / f]; view
// b * f * f + dy * f + dx holds pixel (y * f + dy, x * f + dx). mode 0 unit, 1 symmetric.
extern "C" __global__ void hrx_rgb_encode(const unsigned char* src, float* dst, ImageArgs a) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.total) return;
  unsigned f = a.k, x = i % a.dw, y = (i / a.dw) % a.dh, ch = (i / a.dw / a.dh) % 3u;
  unsigned v = i / a.dw / a.dh / 3u, b = v / (f * f), dy = (v % (f * f)) / f, dx = v % f;
  float s = (float)src[(((unsigned long long)b * a.sh + y * f + dy) * a.sw + x * f + dx) * 3u + ch];
  dst[i] = a.mode == 0u ? s / 255.0f : s / 127.5f - 1.0f;
}
extern "C" __global__ void hrx_rgb_decode(const float* src, float* dst, ImageArgs a) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.total) return;
  unsigned f = a.k, ch = i % 3u, px = (i / 3u) % a.dw, py = (i / 3u / a.dw) % a.dh;
  unsigned b = i / 3u / a.dw / a.dh, v = b * f * f + (py % f) * f + px % f;
  float s = src[(((unsigned long long)v * 3u + ch) * a.sh + py / f) * a.sw + px / f];
  if (a.mode == 0u) {
    dst[i] = s * 255.0f;
  } else {
    float c = s < -1.0f ? -1.0f : (s > 1.0f ? 1.0f : s);
    dst[i] = rintf((c + 1.0f) * 127.5f);
  }
}

// composite_rgb: frame u8 [1, H, W, 3], crop f32 [1, ch, cw, 3], mask f32 [ch, cw],
// matrix f32 [6] frame -> crop, params f32 [5] = left, top, right, bottom, blend.
// mode 0 truncate, 1 quantized blend.
__device__ inline float crop_tap(const float* p, unsigned h, unsigned w, unsigned c,
                                 double y, double x, unsigned ch, bool zero) {
  if (zero && (y < 0.0 || x < 0.0 || y >= (double)h || x >= (double)w)) return 0.0f;
  y = y < 0.0 ? 0.0 : (y > (double)h - 1.0 ? (double)h - 1.0 : y);
  x = x < 0.0 ? 0.0 : (x > (double)w - 1.0 ? (double)w - 1.0 : x);
  return p[((unsigned long long)y * w + (unsigned long long)x) * c + ch];
}
__device__ inline float bilinear(const float* p, unsigned h, unsigned w, unsigned c,
                                 double yy, double xx, unsigned ch, bool zero) {
  double x0 = floor(xx), y0 = floor(yy);
  float fx = (float)(xx - x0), fy = (float)(yy - y0);
  float top = mul(crop_tap(p, h, w, c, y0, x0, ch, zero), 1.0f - fx)
            + mul(crop_tap(p, h, w, c, y0, x0 + 1.0, ch, zero), fx);
  float bottom = mul(crop_tap(p, h, w, c, y0 + 1.0, x0, ch, zero), 1.0f - fx)
               + mul(crop_tap(p, h, w, c, y0 + 1.0, x0 + 1.0, ch, zero), fx);
  return mul(top, 1.0f - fy) + mul(bottom, fy);
}
extern "C" __global__ void hrx_composite_rgb(const unsigned char* frame, const float* crop,
                                             const float* mask, const float* m,
                                             const float* prm, unsigned char* dst,
                                             ImageArgs a) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.total) return;
  unsigned ch = i % 3u, x = (i / 3u) % a.dw, y = i / 3u / a.dw;
  unsigned char orig = frame[i];
  dst[i] = orig;
  if ((float)x < prm[0] || (float)x >= prm[2] || (float)y < prm[1] || (float)y >= prm[3]) return;
  double cx = (double)m[0] * x + (double)m[1] * y + (double)m[2];
  double cy = (double)m[3] * x + (double)m[4] * y + (double)m[5];
  if (!(fabs(cx) <= 1e12 && fabs(cy) <= 1e12)) return;
  float c = bilinear(crop, a.sh, a.sw, 3u, cy, cx, ch, false);
  float alpha = bilinear(mask, a.sh, a.sw, 1u, cy, cx, 0u, true);
  alpha = alpha < 0.0f ? 0.0f : (alpha > 1.0f ? 1.0f : alpha);
  if (a.mode == 1u) c = floorf(c + 0.5f);
  float o = (float)orig;
  float v = mul(o, 1.0f - alpha) + mul(c, alpha);
  v = v < 0.0f ? 0.0f : (v > 255.0f ? 255.0f : v);
  v = floorf(v);
  if (a.mode == 1u) {
    float beta = prm[4] < 0.0f ? 0.0f : (prm[4] > 1.0f ? 1.0f : prm[4]);
    v = rintf(mul(o, 1.0f - beta) + mul(v, beta));
  }
  dst[i] = (unsigned char)v;
}
"""

SOURCE = CXX_STRUCT + _BODY


# -- the numpy twins ------------------------------------------------------------------


def resize_taps(out: int, src: int, p: int) -> tuple[Array, Array, Array, Array]:
    """`resize_tap` for every output index 0..out-1: (i0, i1, w0, w1), weights integer."""
    x = (np.arange(out, dtype=np.float64) + 0.5) * float(src) / float(out) - 0.5
    s = np.floor(x)
    f = x - s
    scale = float(1 << p)
    low, high = s < 0, s >= src - 1
    edge = low | high
    i0 = np.where(low, 0, np.where(high, src - 1, s)).astype(np.int64)
    i1 = np.where(edge, i0, i0 + 1)
    w0 = np.where(edge, 1 << p, np.floor((1.0 - f) * scale + 0.5)).astype(np.int64)
    w1 = np.where(edge, 0, np.floor(f * scale + 0.5)).astype(np.int64)
    return i0, i1, w0, w1


def precision(out: int, src: int) -> int:
    """The pass's fixed-point bits: the first p < 22 with round(max_w·2^(p+1)) ≥ 32768
    (max_w the largest weight of the axis' taps), else 21."""
    x = (np.arange(out, dtype=np.float64) + 0.5) * float(src) / float(out) - 0.5
    s = np.floor(x)
    f = x - s
    edge = (s < 0) | (s >= src - 1)
    weights = np.where(edge, 1.0, np.maximum(1.0 - f, f))
    largest = float(weights.max())
    for p in range(22):
        if math.floor(largest * 2.0 ** (p + 1) + 0.5) >= 32768:
            return p
    return 21


def _pass(total: Array, p: int) -> Array:
    out: Array = np.clip((total + (1 << (p - 1))) >> p, 0, 255)
    return out


def resize_rgb(arrays: list[Array], constants: bytes) -> None:
    a = unpack(constants)
    from .host import image

    src = image(arrays[0], np.dtype(np.uint8), (a.n, 3, a.sh, a.sw), a.ss).astype(np.int64)
    left, top, rw, rh = a.region
    py, px = a.bits
    y0, y1, wy0, wy1 = resize_taps(rh, a.sh, py)
    x0, x1, wx0, wx1 = resize_taps(rw, a.sw, px)
    rows = _pass(src[:, :, y0, :] * wy0[:, None] + src[:, :, y1, :] * wy1[:, None], py)
    cols = _pass(rows[..., x0] * wx0 + rows[..., x1] * wx1, px)
    canvas = np.zeros((a.n, a.dh, a.dw, 3), np.uint8)
    canvas[:, top : top + rh, left : left + rw, :] = cols.transpose(0, 2, 3, 1)
    arrays[1][: canvas.size] = canvas.reshape(-1)


def affine_crop(src: Array, m: Array, mode: int, dh: int, dw: int) -> Array:
    """One crop [dh, dw, 3] u8 from an [h, w, 3] u8 source through matrix `m` [6] f32."""
    sh, sw = src.shape[:2]
    x = np.arange(dw, dtype=np.float64)[None, :]
    y = np.arange(dh, dtype=np.float64)[:, None]
    md = m.astype(np.float64)
    xx = md[0] * x + md[1] * y + md[2]
    yy = md[3] * x + md[4] * y + md[5]
    with np.errstate(invalid="ignore"):
        if mode == 0:
            inside = (xx > -1) & (xx < sw) & (yy > -1) & (yy < sh)
        else:
            inside = (np.abs(xx) < 1e12) & (np.abs(yy) < 1e12)
    xx, yy = np.where(inside, xx, 0.0), np.where(inside, yy, 0.0)
    x0, y0 = np.floor(xx), np.floor(yy)
    fx, fy = (xx - x0).astype(F32), (yy - y0).astype(F32)
    acc = np.zeros((dh, dw, 3), F32)
    for dy, wy in ((0, F32(1) - fy), (1, fy)):
        for dx, wx in ((0, F32(1) - fx), (1, fx)):
            ty, tx = y0 + dy, x0 + dx
            if mode == 0:
                valid = (ty >= 0) & (tx >= 0) & (ty < sh) & (tx < sw)
            else:
                valid = np.ones_like(ty, bool)
            ty = np.clip(ty, 0, sh - 1).astype(np.int64)
            tx = np.clip(tx, 0, sw - 1).astype(np.int64)
            v = src[ty, tx].astype(F32)
            p = (v * wx[..., None]) * wy[..., None] if mode == 0 else v * (wx * wy)[..., None]
            acc = acc + np.where(valid[..., None], p, F32(0)).astype(F32)
    r = np.rint(acc) if mode == 0 else np.floor(acc + F32(0.5))
    out = np.clip(r, 0, 255).astype(np.uint8)
    out[~inside] = 0
    return out


def affine_rgb(arrays: list[Array], constants: bytes) -> None:
    a = unpack(constants)
    from .host import image

    src = image(arrays[0], np.dtype(np.uint8), (a.sh, a.sw, 3), (a.ss[2], a.ss[3], a.ss[1]))
    m = arrays[1].view(F32)[: 6 * a.n].reshape(a.n, 6)
    crops = [affine_crop(src, m[i], a.mode, a.dh, a.dw) for i in range(a.n)]
    arrays[2][: a.total] = np.stack(crops).reshape(-1)


def record_valid(offset: int, width: int, height: int, nbytes: int) -> bool:
    return (
        offset < nbytes
        and 1 <= width <= MAX_SIDE
        and 1 <= height <= MAX_SIDE
        and width * height * 3 <= nbytes - offset
    )


def affine_rgb_packed(arrays: list[Array], constants: bytes) -> None:
    a = unpack(constants)
    data = arrays[0][: a.k]
    records = arrays[1].view(np.uint32)[: 3 * a.n].reshape(a.n, 3).astype(np.int64)
    m = arrays[2].view(F32)[: 6 * a.n].reshape(a.n, 6)
    crops = []
    for i, (offset, width, height) in enumerate(records.tolist()):
        if not record_valid(offset, width, height, a.k):
            crops.append(np.zeros((a.dh, a.dw, 3), np.uint8))
            continue
        src = data[offset : offset + width * height * 3].reshape(height, width, 3)
        crops.append(affine_crop(src, m[i], a.mode, a.dh, a.dw))
    arrays[3][: a.total] = np.stack(crops).reshape(-1)


def fit(points: Array, template: Array) -> tuple[Array, bool]:
    """The similarity [2, 3] (float64) from `points` [P, 2] to `template` [P, 2], by
    centred least squares, and whether the kernel's checks pass."""
    p = points.astype(np.float64)
    q = template.astype(np.float64)
    ok = bool(np.all(np.abs(p) <= F32_MAX))
    pm, qm = p.mean(axis=0), q.mean(axis=0)
    x, y = (p - pm).T
    u, v = (q - qm).T
    with np.errstate(all="ignore"):
        den = np.sum(x * x + y * y)
        sa = np.sum(x * u + y * v) / den
        sb = np.sum(x * v - y * u) / den
        m = np.array(
            [[sa, -sb, qm[0] - sa * pm[0] + sb * pm[1]], [sb, sa, qm[1] - sb * pm[0] - sa * pm[1]]]
        )
        det = sa * sa + sb * sb
        ia, ib = sa / det, -sb / det
        n = np.array(
            [[ia, -ib, -(ia * m[0, 2] - ib * m[1, 2])], [ib, ia, -(ib * m[0, 2] + ia * m[1, 2])]]
        )
        idet = ia * ia + ib * ib
        ok = ok and 1e-20 < det <= F32_MAX and 1e-20 < idet <= F32_MAX
        ok = ok and bool(np.all(np.abs(m.astype(F32)) <= F32_MAX))
        ok = ok and bool(np.all(np.abs(n.astype(F32)) <= F32_MAX))
    return np.stack([m, n]), ok


def similarity_2d(arrays: list[Array], constants: bytes) -> None:
    a = unpack(constants)
    from .host import image

    pts = image(arrays[0], np.dtype(F32), (a.n, a.dh, 2, 1), (a.ss[0], a.ss[1], a.ss[2], 1))
    template = arrays[1].view(F32)[: 2 * a.dh].reshape(a.dh, 2)
    fwd = arrays[2].view(F32)[: 6 * a.n].reshape(a.n, 6)
    inv = arrays[3].view(F32)[: 6 * a.n].reshape(a.n, 6)
    status = arrays[4].view(np.int32)[: a.n]
    for f in range(a.n):
        both, ok = fit(pts[f, :, :, 0], template)
        with np.errstate(over="ignore", invalid="ignore"):
            fwd[f] = both[0].reshape(-1).astype(F32) if ok else np.nan
            inv[f] = both[1].reshape(-1).astype(F32) if ok else np.nan
        status[f] = 0 if ok else 1


def rgb_encode(arrays: list[Array], constants: bytes) -> None:
    a = unpack(constants)
    f, n = a.k, a.n
    src = arrays[0][: n * a.sh * a.sw * 3].reshape(n, a.sh // f, f, a.sw // f, f, 3)
    s = src.transpose(0, 2, 4, 5, 1, 3).astype(F32)  # b, dy, dx, ch, y, x
    v = s / F32(255) if a.mode == 0 else s / F32(127.5) - F32(1)
    arrays[1].view(F32)[: a.total] = v.reshape(-1)


def rgb_decode(arrays: list[Array], constants: bytes) -> None:
    a = unpack(constants)
    f, n = a.k, a.n
    views = arrays[0].view(F32)[: a.total].reshape(n, f, f, 3, a.sh, a.sw)
    s = views.transpose(0, 4, 1, 5, 2, 3)  # b, y, dy, x, dx, ch
    if a.mode == 0:
        v = s * F32(255)
    else:
        v = np.rint((np.clip(s, F32(-1), F32(1)) + F32(1)) * F32(127.5))
    arrays[1].view(F32)[: a.total] = v.astype(F32).reshape(-1)


def _bilinear(p: Array, yy: Array, xx: Array, zero: bool) -> Array:
    """`bilinear` over an [h, w, c] f32 image at positions `yy`, `xx` (float64)."""
    h, w = p.shape[:2]
    x0, y0 = np.floor(xx), np.floor(yy)
    fx, fy = (xx - x0).astype(F32)[..., None], (yy - y0).astype(F32)[..., None]

    def tap(y: Array, x: Array) -> Array:
        v = p[np.clip(y, 0, h - 1).astype(np.int64), np.clip(x, 0, w - 1).astype(np.int64)]
        if zero:
            inside = (y >= 0) & (x >= 0) & (y < h) & (x < w)
            v = np.where(inside[..., None], v, F32(0))
        return v.astype(F32)

    top = tap(y0, x0) * (F32(1) - fx) + tap(y0, x0 + 1) * fx
    bottom = tap(y0 + 1, x0) * (F32(1) - fx) + tap(y0 + 1, x0 + 1) * fx
    out: Array = (top * (F32(1) - fy) + bottom * fy).astype(F32)
    return out


def composite_rgb(arrays: list[Array], constants: bytes) -> None:
    a = unpack(constants)
    frame = arrays[0][: a.total].reshape(a.dh, a.dw, 3)
    crop = arrays[1].view(F32)[: a.sh * a.sw * 3].reshape(a.sh, a.sw, 3)
    mask = arrays[2].view(F32)[: a.sh * a.sw].reshape(a.sh, a.sw, 1)
    m = arrays[3].view(F32)[:6].astype(np.float64)
    left, top, right, bottom, blend = arrays[4].view(F32)[:5]
    out = arrays[5][: a.total].reshape(a.dh, a.dw, 3)
    out[...] = frame
    x = np.arange(a.dw, dtype=np.float64)[None, :]
    y = np.arange(a.dh, dtype=np.float64)[:, None]
    xf, yf = x.astype(F32), y.astype(F32)
    region = (xf >= left) & (xf < right) & (yf >= top) & (yf < bottom)
    cx = m[0] * x + m[1] * y + m[2]
    cy = m[3] * x + m[4] * y + m[5]
    with np.errstate(invalid="ignore"):
        use = region & (np.abs(cx) <= 1e12) & (np.abs(cy) <= 1e12)
    cx, cy = np.where(use, cx, 0.0), np.where(use, cy, 0.0)
    c = _bilinear(crop, cy, cx, False)
    alpha = np.clip(_bilinear(mask, cy, cx, True), F32(0), F32(1))
    if a.mode == 1:
        c = np.floor(c + F32(0.5))
    o = frame.astype(F32)
    v = np.floor(np.clip(o * (F32(1) - alpha) + c * alpha, F32(0), F32(255)))
    if a.mode == 1:
        beta = np.clip(blend, F32(0), F32(1))
        v = np.rint(o * (F32(1) - beta) + v * beta)
    out[use] = v.astype(np.uint8)[use]


KERNELS: dict[str, HostKernel] = {
    "hrx_resize_rgb": resize_rgb,
    "hrx_affine_rgb": affine_rgb,
    "hrx_affine_rgb_packed": affine_rgb_packed,
    "hrx_similarity_2d": similarity_2d,
    "hrx_rgb_encode": rgb_encode,
    "hrx_rgb_decode": rgb_decode,
    "hrx_composite_rgb": composite_rgb,
}

__all__ = ["KERNELS", "SOURCE", "affine_crop", "fit", "precision", "record_valid", "resize_taps"]
