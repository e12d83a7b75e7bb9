"""The image kernels in C++ for NVRTC and hipRTC: plain C++ with `extern "C" __global__`
entry points, no intrinsics and no headers. One thread per output element.

Every entry point takes its tensors' pointers, then one `ImageArgs` by value (see
`args`). The host kernels in `host` compute the same values with the same formulas and
float32 arithmetic; a compiler may fuse a multiply and an add into one rounding, so the
two agree to the last bit or within an ulp or two (which can move a u8 result by one
level where it lands on a half).

Conventions (the kernels' and the host's):

* resize, bilinear: half-pixel centres. Destination pixel d samples source position
  (d + 0.5) · src / dst − 0.5, computed exactly in integers; a position below 0 is
  clamped to 0, one at or past the last pixel to it (OpenCV's INTER_LINEAR, PyTorch's
  `interpolate(mode="bilinear", align_corners=False)`). Rows are blended first, then
  columns of the two rows.
* resize, nearest: source index floor(d · (1 / (dst / src))) in double precision,
  capped at the last pixel (OpenCV's INTER_NEAREST, PyTorch's mode "nearest"): not
  half-pixel.
* affine: destination pixel (x, y) samples source (m0·x + m1·y + m2, m3·x + m4·y + m5),
  pixel centres at integer coordinates (cv2.warpAffine with WARP_INVERSE_MAP); each of
  the four bilinear taps outside the source reads the constant `fill` (border
  "constant") or the nearest edge pixel (border "replicate").
* u8 results round half up and saturate to 0..255.
"""

from __future__ import annotations

from .args import CXX_STRUCT

_BODY = r"""
__device__ inline float load_f(const unsigned char* p, unsigned long long i) { return (float)p[i]; }
__device__ inline float load_f(const float* p, unsigned long long i) { return p[i]; }
__device__ inline void store_f(unsigned char* p, unsigned long long i, float v) {
  v = floorf(v + 0.5f);
  v = v < 0.0f ? 0.0f : (v > 255.0f ? 255.0f : v);
  p[i] = (unsigned char)v;
}
__device__ inline void store_f(float* p, unsigned long long i, float v) { p[i] = v; }

__device__ inline unsigned long long at(const unsigned* s, unsigned b, unsigned ch,
                                        unsigned y, unsigned x) {
  return (unsigned long long)b * s[0] + (unsigned long long)ch * s[1]
       + (unsigned long long)y * s[2] + (unsigned long long)x * s[3];
}

// Output element i as (batch, channel, row, column) of an n x c x h x w image.
struct Pos { unsigned b, ch, y, x; };
__device__ inline Pos position(unsigned i, unsigned c, unsigned h, unsigned w) {
  Pos p;
  p.x = i % w; i /= w;
  p.y = i % h; i /= h;
  p.ch = i % c;
  p.b = i / c;
  return p;
}

// The half-pixel source position of destination index d along an axis, exactly:
// (2d + 1) * src - dst over 2 * dst, split into a clamped index and a fraction.
__device__ inline void linear_tap(unsigned d, unsigned src, unsigned dst,
                                  unsigned* i0, unsigned* i1, float* frac) {
  long long num = (2LL * d + 1LL) * (long long)src - (long long)dst;
  long long den = 2LL * (long long)dst;
  long long q = num >= 0 ? num / den : -((-num + den - 1) / den);
  float f = (float)(num - q * den) / (float)den;
  if (q < 0) { q = 0; f = 0.0f; }
  if (q >= (long long)src - 1) { q = (long long)src - 1; f = 0.0f; }
  *i0 = (unsigned)q;
  *i1 = (unsigned)(q + 1 < (long long)src ? q + 1 : q);
  *frac = f;
}

__device__ inline unsigned nearest_tap(unsigned d, double step, unsigned src) {
  double s = floor((double)d * step);
  unsigned i = (unsigned)s;
  return i < src - 1 ? i : src - 1;
}

template <typename T>
__device__ void resize_impl(const T* src, T* dst, const ImageArgs& a) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.total) return;
  Pos p = position(i, a.c, a.dh, a.dw);
  float v;
  if (a.mode == 0u) {
    unsigned y = nearest_tap(p.y, a.sy, a.sh), x = nearest_tap(p.x, a.sx, a.sw);
    v = load_f(src, at(a.ss, p.b, p.ch, y, x));
  } else {
    unsigned y0, y1, x0, x1;
    float fy, fx;
    linear_tap(p.y, a.sh, a.dh, &y0, &y1, &fy);
    linear_tap(p.x, a.sw, a.dw, &x0, &x1, &fx);
    float top = load_f(src, at(a.ss, p.b, p.ch, y0, x0)) * (1.0f - fx)
              + load_f(src, at(a.ss, p.b, p.ch, y0, x1)) * fx;
    float bottom = load_f(src, at(a.ss, p.b, p.ch, y1, x0)) * (1.0f - fx)
                 + load_f(src, at(a.ss, p.b, p.ch, y1, x1)) * fx;
    v = top * (1.0f - fy) + bottom * fy;
  }
  store_f(dst, at(a.ds, p.b, p.ch, p.y, p.x), v);
}

template <typename T>
__device__ inline float affine_tap(const T* src, const ImageArgs& a, unsigned b, unsigned ch,
                                   int y, int x) {
  if (a.mode == 1u) {
    y = y < 0 ? 0 : (y >= (int)a.sh ? (int)a.sh - 1 : y);
    x = x < 0 ? 0 : (x >= (int)a.sw ? (int)a.sw - 1 : x);
  } else if (y < 0 || x < 0 || y >= (int)a.sh || x >= (int)a.sw) {
    return a.fill;
  }
  return load_f(src, at(a.ss, b, ch, (unsigned)y, (unsigned)x));
}

template <typename T>
__device__ void affine_impl(const T* src, T* dst, const ImageArgs& a) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.total) return;
  Pos p = position(i, a.c, a.dh, a.dw);
  float fxd = (float)p.x, fyd = (float)p.y;
  float sx = a.m[0] * fxd + (a.m[1] * fyd + a.m[2]);
  float sy = a.m[3] * fxd + (a.m[4] * fyd + a.m[5]);
  // Far outside the source, every tap is border (or the edge): clamping the position
  // keeps the int conversion in range without changing the result; NaN goes to -limit.
  const float limit = 1048576.0f;
  sx = sx > -limit ? (sx < limit ? sx : limit) : -limit;
  sy = sy > -limit ? (sy < limit ? sy : limit) : -limit;
  float x0f = floorf(sx), y0f = floorf(sy);
  float fx = sx - x0f, fy = sy - y0f;
  int x0 = (int)x0f, y0 = (int)y0f;
  float top = affine_tap(src, a, p.b, p.ch, y0, x0) * (1.0f - fx)
            + affine_tap(src, a, p.b, p.ch, y0, x0 + 1) * fx;
  float bottom = affine_tap(src, a, p.b, p.ch, y0 + 1, x0) * (1.0f - fx)
               + affine_tap(src, a, p.b, p.ch, y0 + 1, x0 + 1) * fx;
  float v = top * (1.0f - fy) + bottom * fy;
  store_f(dst, at(a.ds, p.b, p.ch, p.y, p.x), v);
}

template <typename T>
__device__ void normalize_impl(const T* src, float* dst, const ImageArgs& a) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.total) return;
  Pos p = position(i, a.c, a.dh, a.dw);
  float v = load_f(src, at(a.ss, p.b, p.ch, p.y, p.x)) * a.scale;
  dst[at(a.ds, p.b, p.ch, p.y, p.x)] = (v - a.mean[p.ch]) / a.stdv[p.ch];
}

__device__ inline float unit(float v) { return v < 0.0f ? 0.0f : (v > 1.0f ? 1.0f : v); }

template <typename T>
__device__ void composite_impl(const T* fg, const T* bg, T* dst, const ImageArgs& a) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.total) return;
  Pos p = position(i, a.c, a.dh, a.dw);
  float alpha = unit(load_f(fg, at(a.ss, p.b, a.k, p.y, p.x)) * a.scale);
  float v;
  if (a.mode == 0u) {
    float f = load_f(fg, at(a.ss, p.b, p.ch, p.y, p.x));
    float g = load_f(bg, at(a.bs, p.b, p.ch, p.y, p.x));
    v = f * alpha + g * (1.0f - alpha);
  } else {
    float under = unit(load_f(bg, at(a.bs, p.b, a.c - 1u, p.y, p.x)) * a.scale) * (1.0f - alpha);
    float out = alpha + under;
    if (p.ch == a.c - 1u) {
      v = out / a.scale;
    } else if (out > 0.0f) {
      float f = load_f(fg, at(a.ss, p.b, p.ch, p.y, p.x));
      float g = load_f(bg, at(a.bs, p.b, p.ch, p.y, p.x));
      v = (f * alpha + g * under) / out;
    } else {
      v = 0.0f;
    }
  }
  store_f(dst, at(a.ds, p.b, p.ch, p.y, p.x), v);
}

// Patches: output [n, cells, c * k * k] row-major; cell = gy * (w / k) + gx, feature
// f = (ch * k + py) * k + px.
template <typename T>
__device__ void patchify_impl(const T* src, T* dst, const ImageArgs& a) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.total) return;
  unsigned k = a.k, features = a.c * k * k, across = a.sw / k;
  unsigned f = i % features, row = i / features;
  unsigned cells = (a.sh / k) * across;
  unsigned b = row / cells, cell = row % cells;
  unsigned ch = f / (k * k), py = (f / k) % k, px = f % k;
  unsigned y = (cell / across) * k + py, x = (cell % across) * k + px;
  dst[i] = src[at(a.ss, b, ch, y, x)];
}

#define HRX_IMAGE_ENTRIES(NAME, T)                                                         \
  extern "C" __global__ void hrx_resize_##NAME(const T* src, T* dst, ImageArgs a) {        \
    resize_impl<T>(src, dst, a);                                                           \
  }                                                                                        \
  extern "C" __global__ void hrx_affine_##NAME(const T* src, T* dst, ImageArgs a) {        \
    affine_impl<T>(src, dst, a);                                                           \
  }                                                                                        \
  extern "C" __global__ void hrx_normalize_##NAME(const T* src, float* dst, ImageArgs a) { \
    normalize_impl<T>(src, dst, a);                                                        \
  }                                                                                        \
  extern "C" __global__ void hrx_composite_##NAME(const T* fg, const T* bg, T* dst,        \
                                                  ImageArgs a) {                           \
    composite_impl<T>(fg, bg, dst, a);                                                     \
  }

HRX_IMAGE_ENTRIES(u8, unsigned char)
HRX_IMAGE_ENTRIES(f32, float)

extern "C" __global__ void hrx_patchify_b1(const unsigned char* s, unsigned char* d,
                                           ImageArgs a) { patchify_impl(s, d, a); }
extern "C" __global__ void hrx_patchify_b2(const unsigned short* s, unsigned short* d,
                                           ImageArgs a) { patchify_impl(s, d, a); }
extern "C" __global__ void hrx_patchify_b4(const unsigned* s, unsigned* d,
                                           ImageArgs a) { patchify_impl(s, d, a); }
"""

SOURCE = CXX_STRUCT + _BODY
"""The whole translation unit: the argument struct, then the kernels."""

__all__ = ["SOURCE"]
