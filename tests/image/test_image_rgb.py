"""RgbOps: the original's scenarios for letterbox resize, affine crops (+ packed) and
similarity fitting, result leases, typed errors that change nothing, and references.

References and tolerances:

* resize_rgb: bit-exact against `slow_resize`, a per-pixel transcription of the integer
  rule written here apart from the kernels; within one level of cv2.resize INTER_LINEAR
  (OpenCV rounds once with 11-bit weights, the rule twice with 14 to 15 bits).
* affine_rgb: bit-exact between sim and device (one set of expected bytes); within one
  level of a float64 bilinear (`slow_affine`); equal to cv2.warpAffine for integer
  shifts (OpenCV quantizes sub-pixel positions to 1/32, so only there is it exact).
* similarity: on exact similarities the host fit maps the points onto the template
  within 1e-9·(1 + 1/scale) px, and within 1e-3 px (1e-5 of the template's extent) of
  cv2.estimateAffinePartial2D's (LMEDS, whose refinement stops near 2e-6 relative);
  the device within 1e-5·max(|e|, 1) of the host fit.
"""

from __future__ import annotations

import gc
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hrx_async as hrx
from hrx_async.image import RgbOps, RgbResize, fit_similarity_2d, invert_affine, letterbox
from hrx_async.image.rgb_kernels import precision

pytestmark = pytest.mark.anyio
Array = np.ndarray[Any, Any]
MAX = 2**32 - 1
SETTINGS = settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


async def device(
    ctx: hrx.models.ModelContext, array: Any, layout: str = "general"
) -> hrx.models.Tensor:
    array = np.asarray(array)
    tensor = ctx.tensor(hrx.models.TensorDesc.of_array(array, layout), hrx.GPU_LOCAL)
    await ctx.upload(tensor, array)
    return tensor


# -- resize_rgb ------------------------------------------------------------------------


def slow_taps(i: int, src: int, out: int, p: int) -> tuple[int, int, int, int]:
    x = (i + 0.5) * src / out - 0.5
    s = np.floor(x)
    if s < 0:
        return 0, 0, 1 << p, 0
    if s >= src - 1:
        return src - 1, src - 1, 1 << p, 0
    f = x - s
    return int(s), int(s) + 1, int(np.floor((1 - f) * 2**p + 0.5)), int(np.floor(f * 2**p + 0.5))


def slow_resize(img: Array, h: int, w: int, region: tuple[int, int, int, int]) -> Array:
    """The integer rule pixel by pixel: vertical pass to u8, then horizontal."""
    n, sh, sw, _ = img.shape
    left, top, rw, rh = region
    py, px = precision(rh, sh), precision(rw, sw)
    mid = np.zeros((n, rh, sw, 3), np.int64)
    for y in range(rh):
        y0, y1, w0, w1 = slow_taps(y, sh, rh, py)
        v = img[:, y0].astype(np.int64) * w0 + img[:, y1].astype(np.int64) * w1
        mid[:, y] = np.minimum((v + (1 << (py - 1))) >> py, 255)
    out = np.zeros((n, h, w, 3), np.uint8)
    for x in range(rw):
        x0, x1, w0, w1 = slow_taps(x, sw, rw, px)
        v = mid[:, :, x0] * w0 + mid[:, :, x1] * w1
        out[:, top : top + rh, left + x] = np.minimum((v + (1 << (px - 1))) >> px, 255)
    return out


def test_letterbox_geometry_is_checked() -> None:
    assert letterbox(100, 200, 640, 640) == (0, 0, 640, 320)
    assert letterbox(200, 100, 640, 640, centered=True) == (160, 0, 320, 640)
    assert letterbox(101, 200, 640, 641, centered=True) == (0, 158, 641, 323)
    assert letterbox(10, 3, 10, 10, centered=True) == (3, 0, 3, 10)  # the odd pixel right
    for bad in ((0, 1, 1, 1), (1, 1, 0, 1), (1, 1000, 10, 10), (1.5, 1, 1, 1)):
        with pytest.raises(hrx.ContractError):
            letterbox(*bad)  # type: ignore[arg-type]


async def test_resize_padding_batches_and_leases(hrx_backend: str) -> None:
    async with hrx.Runtime(backend=hrx_backend) as rt:
        ctx = hrx.models.ModelContext(rt)
        ops = RgbOps(rt)
        images = np.stack([np.full((4, 6, 3), 37, np.uint8), np.full((4, 6, 3), 191, np.uint8)])
        src = await device(ctx, images, "nhwc")
        spec = RgbResize(5, 7, (1, 1, 4, 3))
        runs = [await ops.resize_rgb(src, spec) for _ in range(3)]
        with pytest.raises(hrx.Busy):
            await ops.resize_rgb(src, spec)
        for r in runs:
            got = await ctx.download(r)
            want = np.zeros((2, 5, 7, 3), np.uint8)
            want[0, 1:4, 1:5] = 37
            want[1, 1:4, 1:5] = 191
            np.testing.assert_array_equal(got, want)  # black outside on every replay
        del runs, r
        gc.collect()
        again = await ops.resize_rgb(src, spec)
        assert ops.stats().misses == 1 and again.shape == (2, 5, 7, 3)
        async with hrx.Runtime(backend="sim") as other:
            foreign = await device(hrx.models.ModelContext(other), images, "nhwc")
            with pytest.raises(hrx.ContractError, match="another runtime"):
                await ops.resize_rgb(foreign, spec)
        rgba = await device(ctx, np.zeros((1, 4, 6, 4), np.uint8), "nhwc")
        general = await device(ctx, images)
        for call in (
            lambda: ops.resize_rgb(src, RgbResize(5, 7, (MAX, 0, 1, 1))),
            lambda: ops.resize_rgb(src, RgbResize(5, 7, (0, 0, 8, 1))),
            lambda: ops.resize_rgb(src, RgbResize(5, 7, (0, 0, 0, 1))),
            lambda: ops.resize_rgb(src, RgbResize(0, 7, (0, 0, 1, 1))),
            lambda: ops.resize_rgb(src, (5, 7, (0, 0, 1, 1))),
            lambda: ops.resize_rgb(rgba, spec),
            lambda: ops.resize_rgb(general, spec),
        ):
            with pytest.raises(hrx.ContractError):
                await call()
        assert ops.stats().misses == 1


@SETTINGS
@given(
    n=st.integers(1, 2),
    sh=st.integers(1, 40),
    sw=st.integers(1, 40),
    h=st.integers(1, 48),
    w=st.integers(1, 48),
    centered=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
async def test_resize_rgb_is_bit_exact_to_the_integer_rule(
    hrx_backend: str, n: int, sh: int, sw: int, h: int, w: int, centered: bool, seed: int
) -> None:
    if (w * sh <= h * sw and sh * w // sw == 0) or (w * sh > h * sw and sw * h // sh == 0):
        return  # a letterbox with a side of zero: refused, checked above
    region = letterbox(sh, sw, h, w, centered)
    img = np.random.default_rng(seed).integers(0, 256, (n, sh, sw, 3), dtype=np.uint8)
    async with hrx.Runtime(backend=hrx_backend) as rt:
        ctx = hrx.models.ModelContext(rt)
        out = await RgbOps(rt).resize_rgb(await device(ctx, img, "nhwc"), RgbResize(h, w, region))
        got = await ctx.download(out)
    np.testing.assert_array_equal(got, slow_resize(img, h, w, region))
    cv2 = pytest.importorskip("cv2")
    left, top, rw, rh = region
    for b in range(n):
        ref = cv2.resize(img[b], (rw, rh), interpolation=cv2.INTER_LINEAR)
        diff = np.abs(got[b, top : top + rh, left : left + rw].astype(int) - ref.astype(int))
        assert diff.max() <= 1


# -- affine_rgb and the packed form ----------------------------------------------------


def slow_affine(src: Array, m: Array, h: int, w: int, mode: str) -> Array:
    """float64 bilinear per pixel with the rule's borders, rounded half up."""
    sh, sw = src.shape[:2]
    out = np.zeros((h, w, 3))
    for y in range(h):
        for x in range(w):
            xx = m[0, 0] * x + m[0, 1] * y + m[0, 2]
            yy = m[1, 0] * x + m[1, 1] * y + m[1, 2]
            if mode == "black_ties_even" and not (-1 < xx < sw and -1 < yy < sh):
                continue
            x0, y0 = int(np.floor(xx)), int(np.floor(yy))
            fx, fy = xx - x0, yy - y0
            for ty, wy in ((y0, 1 - fy), (y0 + 1, fy)):
                for tx, wx in ((x0, 1 - fx), (x0 + 1, fx)):
                    if mode == "black_ties_even" and not (0 <= ty < sh and 0 <= tx < sw):
                        continue
                    cy, cx = min(max(ty, 0), sh - 1), min(max(tx, 0), sw - 1)
                    out[y, x] += src[cy, cx] * wx * wy
    return out


@SETTINGS
@given(
    sh=st.integers(1, 24),
    sw=st.integers(1, 24),
    h=st.integers(1, 12),
    w=st.integers(1, 12),
    crops=st.integers(1, 3),
    mode=st.sampled_from(["black_ties_even", "replicate_half_up"]),
    seed=st.integers(0, 2**32 - 1),
)
async def test_affine_rgb_matches_float64_bilinear(
    hrx_backend: str, sh: int, sw: int, h: int, w: int, crops: int, mode: str, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    img = rng.integers(0, 256, (1, sh, sw, 3), dtype=np.uint8)
    angle = rng.uniform(-np.pi, np.pi, crops)
    scale = rng.uniform(0.3, 3, crops)
    mats = np.zeros((crops, 2, 3), np.float32)
    mats[:, 0, 0] = mats[:, 1, 1] = scale * np.cos(angle)
    mats[:, 1, 0] = scale * np.sin(angle)
    mats[:, 0, 1] = -mats[:, 1, 0]
    mats[:, :, 2] = rng.uniform(-4, max(sh, sw) + 4, (crops, 2))
    async with hrx.Runtime(backend=hrx_backend) as rt:
        ctx = hrx.models.ModelContext(rt)
        ops = RgbOps(rt)
        src, m = await device(ctx, img, "nhwc"), await device(ctx, mats)
        got = await ctx.download(await ops.affine_rgb(src, m, h, w, mode))
    for i in range(crops):
        want = slow_affine(img[0], mats[i].astype(np.float64), h, w, mode)
        assert np.abs(got[i].astype(float) - want).max() <= 1.0


async def test_affine_rgb_equals_opencv_on_integer_shifts(hrx_backend: str) -> None:
    cv2 = pytest.importorskip("cv2")
    img = np.random.default_rng(3).integers(0, 256, (1, 9, 11, 3), dtype=np.uint8)
    mats = np.array([[[1, 0, 2], [0, 1, -3]], [[1, 0, -1], [0, 1, 4]]], np.float32)
    async with hrx.Runtime(backend=hrx_backend) as rt:
        ctx = hrx.models.ModelContext(rt)
        ops = RgbOps(rt)
        src, m = await device(ctx, img, "nhwc"), await device(ctx, mats)
        for mode, border in (
            ("black_ties_even", cv2.BORDER_CONSTANT),
            ("replicate_half_up", cv2.BORDER_REPLICATE),
        ):
            got = await ctx.download(await ops.affine_rgb(src, m, 8, 10, mode))
            for i in range(2):
                flags = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP
                ref = cv2.warpAffine(img[0], mats[i], (10, 8), flags=flags, borderMode=border)
                np.testing.assert_array_equal(got[i], ref)


async def test_affine_rgb_nonfinite_matrices_give_black(hrx_backend: str) -> None:
    img = np.full((1, 4, 4, 3), 200, np.uint8)
    mats = np.zeros((4, 2, 3), np.float32)
    mats[:, 0, 0] = mats[:, 1, 1] = 1
    mats[0, 0, 2], mats[1, 1, 2], mats[2, 0, 2], mats[3, 0, 0] = np.nan, np.inf, 1e30, -1e30
    async with hrx.Runtime(backend=hrx_backend) as rt:
        ctx = hrx.models.ModelContext(rt)
        ops = RgbOps(rt)
        src, m = await device(ctx, img, "nhwc"), await device(ctx, mats)
        for mode in ("black_ties_even", "replicate_half_up"):
            got = await ctx.download(await ops.affine_rgb(src, m, 3, 3, mode))
            assert not got[:3].any()
            assert not got[3, :, 1:].any()  # x = 0 keeps a finite position in column 0


async def test_packed_affine_reuses_geometry_and_bounds_invalid_records(
    hrx_backend: str,
) -> None:
    data = np.arange(48, dtype=np.uint8)
    eye = np.tile(np.array([[1, 0, 0], [0, 1, 0]], np.float32), (4, 1, 1))
    async with hrx.Runtime(backend=hrx_backend) as rt:
        ctx = hrx.models.ModelContext(rt)
        ops = RgbOps(rt)
        image, m = await device(ctx, data), await device(ctx, eye)
        records = ctx.tensor(hrx.models.TensorDesc("u32", (4, 3)), hrx.GPU_LOCAL)
        await ctx.upload(records, np.array([[12, 3, 2], [0, 2, 2], [12, 3, 2], [30, 2, 3]], "u4"))
        got = await ctx.download(await ops.affine_rgb_packed(image, records, m, 2, 2))
        rows = [got[i].reshape(-1).tolist() for i in range(4)]
        assert rows[0] == rows[2] == [*range(12, 18), *range(21, 27)]
        assert rows[1] == list(range(12))
        assert rows[3] == [*range(30, 36), *range(36, 42)]
        bad = np.array([[MAX, 2, 2], [0, 0, 1], [0, MAX, MAX], [47, 2, 2]], "u4")
        await ctx.upload(records, bad)  # the same tensors: the same plan, new records
        got = await ctx.download(await ops.affine_rgb_packed(image, records, m, 2, 2))
        assert not got.any()
        assert ops.stats().misses == 1
        f32 = await device(ctx, np.zeros(48, np.float32))
        i32 = await device(ctx, np.zeros((4, 3), np.int32))
        for call in (
            lambda: ops.affine_rgb_packed(f32, records, m, 2, 2),
            lambda: ops.affine_rgb_packed(image, i32, m, 2, 2),
            lambda: ops.affine_rgb_packed(image, records, m, 0, 2),
            lambda: ops.affine_rgb_packed(image, records, m, 2, 40000),
            lambda: ops.affine_rgb_packed(image, records, m, 2, 2, "cubic"),
            lambda: ops.affine_rgb(image, m, 2, 2),
        ):
            with pytest.raises(hrx.ContractError):
                await call()
        assert ops.stats().misses == 1


# -- similarity ------------------------------------------------------------------------

TEMPLATE = np.array(
    [[38.29, 51.69], [73.53, 51.50], [56.02, 71.74], [41.55, 92.37], [70.73, 92.20]], np.float32
)


def test_invert_affine_and_the_host_fit_are_checked() -> None:
    inv = invert_affine([[2, 0, 4], [0, 2, -6]])
    np.testing.assert_array_equal(inv, [[0.5, -0.0, -2], [-0.0, 0.5, 3]])
    for bad in ([[1e-11, 0, 0], [0, 1e-11, 0]], [[np.nan, 0, 0], [0, 1, 0]]):
        with pytest.raises(hrx.ContractError):
            invert_affine(bad)
    for p, q in (
        (TEMPLATE[:1], TEMPLATE[:1]),
        (TEMPLATE, TEMPLATE[:4]),
        (np.full((3, 2), np.nan), TEMPLATE[:3]),
        (np.zeros((5, 2)), TEMPLATE),
    ):
        with pytest.raises(hrx.ContractError):
            fit_similarity_2d(p, q)


@settings(max_examples=30, deadline=None)
@given(
    angle=st.floats(-3.1, 3.1),
    scale=st.floats(0.2, 20),  # faces of 4 to 400 pixels; OpenCV drifts beyond
    tx=st.floats(-500, 500),
    ty=st.floats(-500, 500),
)
def test_host_fit_matches_opencv_estimate_affine_partial(
    angle: float, scale: float, tx: float, ty: float
) -> None:
    cv2 = pytest.importorskip("cv2")
    a, b = scale * np.cos(angle), scale * np.sin(angle)
    m = np.array([[a, -b, tx], [b, a, ty]])
    points = TEMPLATE.astype(np.float64) @ m[:, :2].T + m[:, 2]
    got = fit_similarity_2d(points, TEMPLATE)
    ref, _ = cv2.estimateAffinePartial2D(points, TEMPLATE.astype(np.float64), method=cv2.LMEDS)

    def mapped(matrix: Array) -> Array:
        return points @ matrix[:, :2].T + matrix[:, 2]

    np.testing.assert_allclose(mapped(got), TEMPLATE, rtol=0, atol=1e-9 * (1 + 1 / scale))
    np.testing.assert_allclose(mapped(got), mapped(ref), rtol=0, atol=1e-5 * 100)


async def test_similarity_fitting_checks_geometry_and_accepts_detection_row_views(
    hrx_backend: str,
) -> None:
    t = TEMPLATE
    big = np.finfo(np.float32).max
    faces = [
        t,
        np.stack([2 * t[:, 1] + 37, -2 * t[:, 0] + 91], 1),
        t * 0.001,
        np.zeros_like(t),
        np.full_like(t, np.nan),
        np.full_like(t, big),
    ]
    rows = np.zeros((6, 16), np.float32)
    for i, f in enumerate(faces):
        rows[i, :5] = [i, i, 10, 10, 0.9]
        rows[i, 5:15] = f.reshape(-1)
    async with hrx.Runtime(backend=hrx_backend) as rt:
        ctx = hrx.models.ModelContext(rt)
        ops = RgbOps(rt)
        table = await device(ctx, rows)
        view = hrx.models.Tensor(
            hrx.models.TensorDesc("f32", (6, 5, 2), strides=(16, 2, 1)), table.view.slice(20)
        )
        fwd, inv, status = await ops.similarity_2d(view, TEMPLATE)
        assert status.view.buffer.placement.host_mappable
        assert (await status.read()).tolist() == [0, 0, 0, 1, 1, 1]
        f, i = await ctx.download(fwd), await ctx.download(inv)
        for k in range(3):
            host = fit_similarity_2d(faces[k], TEMPLATE)
            for got, want in ((f[k], host), (i[k], invert_affine(host))):
                assert np.all(np.abs(got - want) <= 1e-5 * np.maximum(np.abs(want), 1))
        assert np.isnan(f[3:]).all() and np.isnan(i[3:]).all()
        for call in (
            lambda: ops.similarity_2d(view, TEMPLATE[:4]),
            lambda: ops.similarity_2d(view, np.full((5, 2), np.nan)),
            lambda: ops.similarity_2d(table, TEMPLATE),
            lambda: ops.similarity_2d(view, np.zeros((65, 2))),
        ):
            with pytest.raises(hrx.ContractError):
                await call()
        assert ops.stats().misses == 1


def test_the_rgb_and_tensor_kernel_sources_compile_as_portable_cxx(tmp_path: Path) -> None:
    """No headers, no CUDA-only intrinsics (hipRTC compiles them too); valid C++."""
    from hrx_async.image.rgb_kernels import SOURCE as RGB
    from hrx_async.tensor.kernels import SOURCE as TENSOR

    for source in (RGB, TENSOR):
        assert "#include" not in source and "asm" not in source and "__shfl" not in source
        calls = set(re.findall(r"\b(__[a-z_]+\w*)\s*\(", source))
        assert calls <= {"__syncthreads"}, calls
    compiler = shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no C++ compiler here")
    prelude = (
        "#include <math.h>\n#define __global__\n#define __device__\n#define __shared__ static\n"
        "static void __syncthreads() {}\n"
        "struct D3 { unsigned x, y, z; }; static D3 blockIdx, blockDim, threadIdx;\n"
    )
    for name, source in (("rgb", RGB), ("tensor", TENSOR)):
        path = tmp_path / f"{name}.cpp"
        path.write_text(prelude + source)
        result = subprocess.run(
            [compiler, "-std=c++17", "-Wall", "-Werror", "-fsyntax-only", str(path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr


# -- RGB views and composite_rgb -------------------------------------------------------


@pytest.mark.parametrize("encoding", ["unit", "symmetric"])
@pytest.mark.parametrize("factor", [1, 2, 3])
async def test_rgb_views_roundtrip_batches_and_reject_invalid_shapes(
    hrx_backend: str, encoding: str, factor: int
) -> None:
    img = np.random.default_rng(factor).integers(0, 256, (2, 6, 6, 3), dtype=np.uint8)
    f = factor
    async with hrx.Runtime(backend=hrx_backend) as rt:
        ctx = hrx.models.ModelContext(rt)
        ops = RgbOps(rt)
        src = await device(ctx, img, "nhwc")
        views = await ops.encode_rgb(src, f, encoding)
        assert views.shape == (2 * f * f, 3, 6 // f, 6 // f)
        got = await ctx.download(views)
        cells = img.reshape(2, 6 // f, f, 6 // f, f, 3).transpose(0, 2, 4, 5, 1, 3)
        scaled = cells.reshape(views.shape).astype(np.float64)
        want = scaled / 255 if encoding == "unit" else scaled / 127.5 - 1
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-7)
        back = await ctx.download(await ops.decode_rgb(views, f, encoding))
        assert back.nbytes == 4 * img.nbytes
        if encoding == "symmetric":
            np.testing.assert_array_equal(back, img)
        else:
            np.testing.assert_allclose(back, img, rtol=0, atol=2e-5)
        rgba = await device(ctx, np.zeros((1, 6, 6, 4), np.uint8), "nhwc")
        f32 = await device(ctx, np.zeros((1, 6, 6, 3), np.float32), "nhwc")
        empty = ctx.tensor(hrx.models.TensorDesc("u8", (0, 6, 6, 3), layout="nhwc"), hrx.GPU_LOCAL)
        big = ctx.tensor(hrx.models.TensorDesc("u8", (1, 6, 12, 3), layout="nhwc"), hrx.GPU_LOCAL)
        strided = hrx.models.Tensor(
            hrx.models.TensorDesc("u8", (1, 6, 6, 3), strides=(216, 36, 3, 1), layout="nhwc"),
            big.view,
        )
        odd = await device(ctx, np.zeros((3, 3, 2, 2), np.float32), "nchw")
        for call in (
            lambda: ops.encode_rgb(src, 0, encoding),
            lambda: ops.encode_rgb(src, 4, encoding),
            lambda: ops.encode_rgb(src, 2**64 - 1, encoding),
            lambda: ops.encode_rgb(src, 1, "signed"),
            lambda: ops.encode_rgb(empty, 1, encoding),
            lambda: ops.encode_rgb(rgba, 1, encoding),
            lambda: ops.encode_rgb(f32, 1, encoding),
            lambda: ops.encode_rgb(strided, 1, encoding),
            lambda: ops.decode_rgb(odd, 2, encoding),
        ):
            with pytest.raises(hrx.ContractError):
                await call()
        assert ops.stats().misses == 2


def composite_want(alpha: float, blend: float, mode: str) -> int:
    a = min(max(alpha, 0.0), 1.0)
    crop = np.floor(200.25 + 0.5) if mode == "quantized" else 200.25
    v = np.floor(min(max(21 * (1 - a) + crop * a, 0), 255))
    return int(np.rint(21 * (1 - blend) + v * blend)) if mode == "quantized" else int(v)


async def test_composite_masks_regions_and_nonfinite_coordinates_preserve_contracts(
    hrx_backend: str,
) -> None:
    async with hrx.Runtime(backend=hrx_backend) as rt:
        ctx = hrx.models.ModelContext(rt)
        ops = RgbOps(rt)
        frame = await device(ctx, np.full((1, 1, 4, 3), 21, np.uint8), "nhwc")
        crop = await device(ctx, np.full((1, 1, 4, 3), 200.25, np.float32), "nhwc")
        mask = ctx.tensor(hrx.models.TensorDesc("f32", (1, 4)), hrx.GPU_LOCAL)
        eye = np.array([[[1, 0, 0], [0, 1, 0]]], np.float32)
        matrix = await device(ctx, eye)
        for alpha in (-1.0, 0.0, 0.5, 1.0, 2.0):
            await ctx.upload(mask, np.full((1, 4), alpha, np.float32))
            for blend in (0.0, 0.5, 1.0):
                for mode in ("truncate", "quantized"):
                    out = await ops.composite_rgb(
                        frame, crop, mask, matrix, (1, 0, 3, 1), blend, mode
                    )
                    got = (await ctx.download(out)).reshape(-1)
                    want = np.full(12, 21)
                    want[3:9] = composite_want(alpha, blend, mode)
                    np.testing.assert_array_equal(got, want, err_msg=f"{alpha} {blend} {mode}")
        await ctx.upload(mask, np.ones((1, 4), np.float32))
        for tx in (np.nan, np.inf, 1e30, -1e30):
            m = eye.copy()
            m[0, 0, 2] = tx
            await ctx.upload(matrix, m)
            out = await ops.composite_rgb(frame, crop, mask, matrix, (0, 0, 4, 1), 1.0)
            assert (await ctx.download(out) == 21).all()
        misses = ops.stats().misses
        for region, blend in (
            ((0, 0, 4, 2), 1.0),
            ((2, 0, 1, 1), 1.0),
            ((0, 0, 1, 1), np.nan),
            ((0, 0, 1, 1), 2.0),
            ((0, 0, 5, 1), 0.5),
        ):
            with pytest.raises(hrx.ContractError):
                await ops.composite_rgb(frame, crop, mask, matrix, region, blend)
        with pytest.raises(hrx.ContractError):
            await ops.composite_rgb(frame, crop, matrix, matrix, (0, 0, 1, 1))
        assert ops.stats().misses == misses
