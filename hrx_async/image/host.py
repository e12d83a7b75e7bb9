"""The image kernels in numpy, for the sim backend: the formulas of `cxx`, step by step,
in float32, vectorised over the whole output.

Each host kernel follows `hrx_async._core.kernels`: one uint8 array per binding (the whole
bound view) and the contract's constant bytes, here one `ImageArgs` (see `args`),
read with `args.unpack` exactly as the device reads its struct.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .args import Args, unpack

Array = np.ndarray[Any, Any]
HostKernel = Callable[[list[Array], bytes], None]
F32 = np.float32
LIMIT = F32(1048576.0)


def image(raw: Array, dtype: np.dtype[Any], dims: Sequence[int], strides: Sequence[int]) -> Array:
    """The n x c x h x w image in `raw` (bytes) with element `strides`, no copy."""
    typed = raw.view(dtype)
    size = typed.itemsize
    view: Array = np.lib.stride_tricks.as_strided(
        typed, tuple(dims), tuple(s * size for s in strides), writeable=raw.flags.writeable
    )
    return view


def load(values: Array) -> Array:
    return values.astype(F32, copy=False)


def store(dst: Array, values: Array) -> None:
    """Write float32 `values`: u8 rounds half up and saturates, like `store_f`."""
    if dst.dtype == np.uint8:
        values = np.clip(np.floor(values + F32(0.5)), F32(0), F32(255))
    dst[...] = values


def linear_taps(d: int, src: int) -> tuple[Array, Array, Array]:
    """`linear_tap` for every destination index 0..d-1: (i0, i1, fraction)."""
    num = (2 * np.arange(d, dtype=np.int64) + 1) * src - d
    den = 2 * d
    q = num // den
    frac = (num - q * den).astype(F32) / F32(den)
    low = q < 0
    high = q >= src - 1
    q = np.where(low, 0, np.where(high, src - 1, q))
    frac = np.where(low | high, F32(0), frac).astype(F32)
    return q, np.minimum(q + 1, src - 1), frac


def nearest_taps(d: int, step: float, src: int) -> Array:
    """`nearest_tap`: floor(d * step) in double precision, capped at src - 1."""
    index = np.floor(np.arange(d, dtype=np.float64) * np.float64(step)).astype(np.int64)
    return np.minimum(index, src - 1)


def _images(arrays: list[Array], a: Args, dtype: np.dtype[Any]) -> tuple[Array, Array]:
    src = image(arrays[0], dtype, (a.n, a.c, a.sh, a.sw), a.ss)
    dst = image(arrays[1], dtype, (a.n, a.c, a.dh, a.dw), a.ds)
    return src, dst


def resize(dtype: np.dtype[Any]) -> HostKernel:
    def kernel(arrays: list[Array], constants: bytes) -> None:
        a = unpack(constants)
        src, dst = _images(arrays, a, dtype)
        if a.mode == 0:
            ys = nearest_taps(a.dh, a.sy, a.sh)
            xs = nearest_taps(a.dw, a.sx, a.sw)
            dst[...] = src[:, :, ys[:, None], xs[None, :]]
            return
        y0, y1, fy = linear_taps(a.dh, a.sh)
        x0, x1, fx = linear_taps(a.dw, a.sw)
        rows0, rows1 = src[:, :, y0, :], src[:, :, y1, :]
        gx = 1 - fx
        top = load(rows0[..., x0]) * gx + load(rows0[..., x1]) * fx
        bottom = load(rows1[..., x0]) * gx + load(rows1[..., x1]) * fx
        fy = fy[:, None]
        store(dst, top * (1 - fy) + bottom * fy)

    return kernel


def _clamp_position(values: Array) -> Array:
    """`sx > -limit ? (sx < limit ? sx : limit) : -limit` (NaN goes to -limit)."""
    inside = values > -LIMIT
    return np.where(inside, np.where(values < LIMIT, values, LIMIT), -LIMIT).astype(F32)


def affine(dtype: np.dtype[Any]) -> HostKernel:
    def kernel(arrays: list[Array], constants: bytes) -> None:
        a = unpack(constants)
        src, dst = _images(arrays, a, dtype)
        m = [F32(v) for v in a.m]
        x = np.arange(a.dw, dtype=F32)[None, :]
        y = np.arange(a.dh, dtype=F32)[:, None]
        sx = _clamp_position(m[0] * x + (m[1] * y + m[2]))
        sy = _clamp_position(m[3] * x + (m[4] * y + m[5]))
        x0f, y0f = np.floor(sx), np.floor(sy)
        fx, fy = sx - x0f, sy - y0f
        x0, y0 = x0f.astype(np.int64), y0f.astype(np.int64)
        gx = 1 - fx

        def tap(yy: Array, xx: Array) -> Array:
            if a.mode == 1:
                return load(src[:, :, np.clip(yy, 0, a.sh - 1), np.clip(xx, 0, a.sw - 1)])
            inside = (yy >= 0) & (xx >= 0) & (yy < a.sh) & (xx < a.sw)
            values = load(src[:, :, np.clip(yy, 0, a.sh - 1), np.clip(xx, 0, a.sw - 1)])
            return np.where(inside, values, F32(a.fill))

        top = tap(y0, x0) * gx + tap(y0, x0 + 1) * fx
        bottom = tap(y0 + 1, x0) * gx + tap(y0 + 1, x0 + 1) * fx
        store(dst, top * (1 - fy) + bottom * fy)

    return kernel


def normalize(dtype: np.dtype[Any]) -> HostKernel:
    def kernel(arrays: list[Array], constants: bytes) -> None:
        a = unpack(constants)
        src = image(arrays[0], dtype, (a.n, a.c, a.dh, a.dw), a.ss)
        dst = image(arrays[1], np.dtype(F32), (a.n, a.c, a.dh, a.dw), a.ds)
        mean = np.asarray(a.mean[: a.c], F32)[None, :, None, None]
        std = np.asarray(a.stdv[: a.c], F32)[None, :, None, None]
        dst[...] = (load(src) * F32(a.scale) - mean) / std

    return kernel


def composite(dtype: np.dtype[Any]) -> HostKernel:
    def kernel(arrays: list[Array], constants: bytes) -> None:
        a = unpack(constants)
        fg_channels = a.k + 1
        fg = image(arrays[0], dtype, (a.n, fg_channels, a.dh, a.dw), a.ss)
        bg = image(arrays[1], dtype, (a.n, a.c, a.dh, a.dw), a.bs)
        dst = image(arrays[2], dtype, (a.n, a.c, a.dh, a.dw), a.ds)
        scale = F32(a.scale)
        alpha = np.clip(load(fg[:, a.k : a.k + 1]) * scale, F32(0), F32(1))
        if a.mode == 0:
            f = load(fg[:, : a.c])
            store(dst, f * alpha + load(bg) * (1 - alpha))
            return
        colors = a.c - 1
        under = np.clip(load(bg[:, colors:]) * scale, F32(0), F32(1)) * (1 - alpha)
        out = alpha + under
        f, g = load(fg[:, :colors]), load(bg[:, :colors])
        with np.errstate(divide="ignore", invalid="ignore"):
            blended = np.where(out > 0, (f * alpha + g * under) / out, F32(0)).astype(F32)
        store(dst[:, :colors], blended)
        store(dst[:, colors:], out / scale)

    return kernel


def patchify(itemsize: int) -> HostKernel:
    dtype = np.dtype(f"u{itemsize}")

    def kernel(arrays: list[Array], constants: bytes) -> None:
        a = unpack(constants)
        k = a.k
        gh, gw = a.sh // k, a.sw // k
        sn, sc, sy, sx = a.ss
        cells = image(arrays[0], dtype, (a.n, a.c, gh, k, gw, k), (sn, sc, k * sy, sy, k * sx, sx))
        out = arrays[1].view(dtype)[: a.total].reshape(a.n, gh, gw, a.c, k, k)
        out[...] = cells.transpose(0, 2, 4, 1, 3, 5)

    return kernel


U8, FLOAT = np.dtype(np.uint8), np.dtype(F32)
KERNELS: dict[str, HostKernel] = {
    "hrx_resize_u8": resize(U8),
    "hrx_resize_f32": resize(FLOAT),
    "hrx_affine_u8": affine(U8),
    "hrx_affine_f32": affine(FLOAT),
    "hrx_normalize_u8": normalize(U8),
    "hrx_normalize_f32": normalize(FLOAT),
    "hrx_composite_u8": composite(U8),
    "hrx_composite_f32": composite(FLOAT),
    "hrx_patchify_b1": patchify(1),
    "hrx_patchify_b2": patchify(2),
    "hrx_patchify_b4": patchify(4),
}
"""Each device entry point's host twin, by the entry point's name."""

__all__ = ["KERNELS", "image", "linear_taps", "nearest_taps"]
