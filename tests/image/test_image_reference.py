"""The image operations against references users trust, on random shapes (hypothesis).

resize and affine are compared with OpenCV (`cv2.resize` INTER_LINEAR / INTER_NEAREST,
`cv2.warpAffine` INTER_LINEAR | WARP_INVERSE_MAP with BORDER_CONSTANT / BORDER_REPLICATE);
normalize, composite and patchify with their numpy formulas in float64. Tolerances:

* nearest resize and patchify: exact;
* bilinear resize and affine, f32 inputs in [0, 1): 1e-4 absolute (about 3e-6 is seen;
  float32 sample positions and fused multiply-adds account for the rest);
* u8 results: one level (OpenCV's u8 resize uses 11-bit fixed-point weights; halves can
  round either way);
* normalize and composite, f32: 1e-5 relative + 1e-5 absolute.

Each example runs the operation through a runtime on every usable backend (sim here,
cuda or hip where a device answers), loop chosen at random between asyncio and trio.
"""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hrx_async as hrx
import hrx_async.models
from hrx_async.image import ImageOps

cv2 = pytest.importorskip("cv2")

Array = np.ndarray[Any, Any]
SETTINGS = settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
LOOPS = st.sampled_from(["asyncio", "trio"])


def to_layout(images_nhwc: Array, layout: str) -> Array:
    return (
        images_nhwc if layout == "nhwc" else np.ascontiguousarray(images_nhwc.transpose(0, 3, 1, 2))
    )


def from_layout(array: Array, layout: str) -> Array:
    return array if layout == "nhwc" else array.transpose(0, 2, 3, 1)


def image_shape(n: int, c: int, h: int, w: int, layout: str) -> tuple[int, int, int, int]:
    return (n, h, w, c) if layout == "nhwc" else (n, c, h, w)


async def apply(
    backend: str,
    op: str,
    inputs: list[tuple[Array, str]],
    out: tuple[str, tuple[int, ...], str],
    **params: Any,
) -> Array:
    """Run one image operation through a runtime: inputs uploaded to GPU-local tensors,
    the output downloaded."""
    async with hrx.Runtime(backend=backend) as rt:
        ctx = hrx.models.ModelContext(rt)
        ops = ImageOps(rt)
        tensors = []
        for array, layout in inputs:
            tensor = ctx.tensor(hrx.models.TensorDesc.of_array(array, layout), hrx.GPU_LOCAL)
            await ctx.upload(tensor, array)
            tensors.append(tensor)
        dtype, shape, layout = out
        dst = ctx.tensor(hrx.models.TensorDesc(dtype, shape, layout=layout), hrx.GPU_LOCAL)
        graph = rt.graph(op)
        await getattr(ops, op)(graph, *tensors, dst, **params)
        await graph.prepare().submit()
        return await ctx.download(dst)


def run(loop: str, *args: Any, **kwargs: Any) -> Array:
    async def main() -> Array:
        return await apply(*args, **kwargs)

    result: Array = anyio.run(main, backend=loop)
    return result


def random_images(rng: np.random.Generator, dtype: str, shape: tuple[int, ...]) -> Array:
    if dtype == "u8":
        return rng.integers(0, 256, shape, dtype=np.uint8)
    return rng.random(shape, dtype=np.float32)


def check_close(got: Array, want: Array, dtype: str, atol: float = 1e-4) -> None:
    if dtype == "u8":
        diff = np.abs(got.astype(np.int32) - np.asarray(want).astype(np.int32))
        assert diff.max(initial=0) <= 1, f"u8 results differ by up to {diff.max()} levels"
    else:
        np.testing.assert_allclose(got, want, rtol=0, atol=atol)


def cv_each(images_nhwc: Array, fn: Any) -> Array:
    out = [fn(image) for image in images_nhwc]
    return np.stack([o if o.ndim == 3 else o[..., None] for o in out])


dims = st.integers(1, 40)


@SETTINGS
@given(
    n=st.integers(1, 2),
    c=st.sampled_from([1, 3, 4]),
    sh=dims,
    sw=dims,
    dh=dims,
    dw=dims,
    dtype=st.sampled_from(["u8", "f32"]),
    mode=st.sampled_from(["bilinear", "nearest"]),
    layouts=st.tuples(st.sampled_from(["nchw", "nhwc"]), st.sampled_from(["nchw", "nhwc"])),
    seed=st.integers(0, 2**32 - 1),
    loop=LOOPS,
)
def test_resize_matches_opencv(
    hrx_backend: str,
    n: int,
    c: int,
    sh: int,
    sw: int,
    dh: int,
    dw: int,
    dtype: str,
    mode: str,
    layouts: tuple[str, str],
    seed: int,
    loop: str,
) -> None:
    images = random_images(np.random.default_rng(seed), dtype, (n, sh, sw, c))
    src_layout, dst_layout = layouts
    got = run(
        loop,
        hrx_backend,
        "resize",
        [(to_layout(images, src_layout), src_layout)],
        (dtype, image_shape(n, c, dh, dw, dst_layout), dst_layout),
        mode=mode,
    )
    flag = cv2.INTER_LINEAR if mode == "bilinear" else cv2.INTER_NEAREST
    want = cv_each(images, lambda i: cv2.resize(i, (dw, dh), interpolation=flag))
    if mode == "nearest":
        np.testing.assert_array_equal(from_layout(got, dst_layout), want)
    else:
        check_close(from_layout(got, dst_layout), want, dtype, 1e-4)


def random_matrix(rng: np.random.Generator, sh: int, sw: int) -> Array:
    angle = rng.uniform(-np.pi, np.pi)
    scale = rng.uniform(0.5, 2.0)
    shear = rng.uniform(-0.3, 0.3)
    cos, sin = np.cos(angle) * scale, np.sin(angle) * scale
    linear = np.array([[cos, -sin + shear], [sin, cos]])
    shift = rng.uniform([-sw / 2, -sh / 2], [sw * 1.5, sh * 1.5])
    return np.hstack([linear, shift[:, None]])


@pytest.mark.skipif(
    int(cv2.__version__.split(".")[0]) < 5,
    reason="OpenCV 4 samples warpAffine at 1/32-pixel steps; the tolerance is for OpenCV 5",
)
@SETTINGS
@given(
    n=st.integers(1, 2),
    c=st.sampled_from([1, 3, 4]),
    sh=dims,
    sw=dims,
    dh=dims,
    dw=dims,
    dtype=st.sampled_from(["u8", "f32"]),
    border=st.sampled_from(["constant", "replicate"]),
    layout=st.sampled_from(["nchw", "nhwc"]),
    src_to_dst=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    loop=LOOPS,
)
def test_affine_matches_opencv_warp_affine(
    hrx_backend: str,
    n: int,
    c: int,
    sh: int,
    sw: int,
    dh: int,
    dw: int,
    dtype: str,
    border: str,
    layout: str,
    src_to_dst: bool,
    seed: int,
    loop: str,
) -> None:
    rng = np.random.default_rng(seed)
    images = random_images(rng, dtype, (n, sh, sw, c))
    matrix = random_matrix(rng, sh, sw)
    fill = 17.0 if dtype == "u8" else 0.25
    got = run(
        loop,
        hrx_backend,
        "affine",
        [(to_layout(images, layout), layout)],
        (dtype, image_shape(n, c, dh, dw, layout), layout),
        matrix=matrix,
        border=border,
        border_value=fill,
        src_to_dst=src_to_dst,
    )
    flags = cv2.INTER_LINEAR | (0 if src_to_dst else cv2.WARP_INVERSE_MAP)
    mode = cv2.BORDER_CONSTANT if border == "constant" else cv2.BORDER_REPLICATE
    want = cv_each(
        images,
        lambda i: cv2.warpAffine(
            i, matrix, (dw, dh), flags=flags, borderMode=mode, borderValue=(fill,) * 4
        ),
    )
    check_close(from_layout(got, layout), want, dtype, 1e-4)


@SETTINGS
@given(
    n=st.integers(1, 2),
    c=st.integers(1, 5),
    h=dims,
    w=dims,
    dtype=st.sampled_from(["u8", "f32"]),
    layouts=st.tuples(st.sampled_from(["nchw", "nhwc"]), st.sampled_from(["nchw", "nhwc"])),
    seed=st.integers(0, 2**32 - 1),
    loop=LOOPS,
)
def test_normalize_matches_its_formula(
    hrx_backend: str,
    n: int,
    c: int,
    h: int,
    w: int,
    dtype: str,
    layouts: tuple[str, str],
    seed: int,
    loop: str,
) -> None:
    rng = np.random.default_rng(seed)
    images = random_images(rng, dtype, (n, h, w, c))
    mean = rng.uniform(-1, 1, c).astype(np.float32)
    std = rng.uniform(0.1, 2, c).astype(np.float32)
    src_layout, dst_layout = layouts
    got = run(
        loop,
        hrx_backend,
        "normalize",
        [(to_layout(images, src_layout), src_layout)],
        ("f32", image_shape(n, c, h, w, dst_layout), dst_layout),
        mean=mean.tolist(),
        std=std.tolist(),
    )
    scale = 1 / 255 if dtype == "u8" else 1.0
    want = (images.astype(np.float64) * scale - mean) / std
    np.testing.assert_allclose(from_layout(got, dst_layout), want, rtol=1e-5, atol=1e-5)


def over(fg: Array, bg: Array, dtype: str) -> Array:
    """Straight-alpha "over" in float64, channels last, alpha last."""
    top = 255.0 if dtype == "u8" else 1.0
    f, b = fg.astype(np.float64), bg.astype(np.float64)
    a = np.clip(f[..., -1:] / top, 0, 1)
    if fg.shape[-1] == bg.shape[-1] + 1:
        return f[..., :-1] * a + b * (1 - a)
    under = np.clip(b[..., -1:] / top, 0, 1) * (1 - a)
    out = a + under
    with np.errstate(divide="ignore", invalid="ignore"):
        colors = np.where(out > 0, (f[..., :-1] * a + b[..., :-1] * under) / out, 0)
    return np.concatenate([colors, out * top], axis=-1)


@SETTINGS
@given(
    n=st.integers(1, 2),
    colors=st.integers(1, 3),
    bg_alpha=st.booleans(),
    h=dims,
    w=dims,
    dtype=st.sampled_from(["u8", "f32"]),
    layout=st.sampled_from(["nchw", "nhwc"]),
    seed=st.integers(0, 2**32 - 1),
    loop=LOOPS,
)
def test_composite_matches_alpha_over(
    hrx_backend: str,
    n: int,
    colors: int,
    bg_alpha: bool,
    h: int,
    w: int,
    dtype: str,
    layout: str,
    seed: int,
    loop: str,
) -> None:
    rng = np.random.default_rng(seed)
    fg = random_images(rng, dtype, (n, h, w, colors + 1))
    bg = random_images(rng, dtype, (n, h, w, colors + int(bg_alpha)))
    if dtype == "u8":  # fully transparent and fully opaque pixels are the edge cases
        fg[..., -1][rng.random((n, h, w)) < 0.2] = 0
        fg[..., -1][rng.random((n, h, w)) < 0.2] = 255
    got = run(
        loop,
        hrx_backend,
        "composite",
        [(to_layout(fg, layout), layout), (to_layout(bg, layout), layout)],
        (dtype, to_layout(bg, layout).shape, layout),
    )
    want = over(fg, bg, dtype)
    if dtype == "u8":
        want = np.floor(want + 0.5)
        check_close(from_layout(got, layout), want, dtype)
    else:
        np.testing.assert_allclose(from_layout(got, layout), want, rtol=1e-5, atol=1e-5)


@SETTINGS
@given(
    n=st.integers(1, 2),
    c=st.integers(1, 4),
    patch=st.integers(1, 6),
    cells=st.tuples(st.integers(1, 5), st.integers(1, 5)),
    dtype=st.sampled_from(["u8", "f16", "f32"]),
    layout=st.sampled_from(["nchw", "nhwc"]),
    rows=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    loop=LOOPS,
)
def test_patchify_matches_reshape_and_transpose(
    hrx_backend: str,
    n: int,
    c: int,
    patch: int,
    cells: tuple[int, int],
    dtype: str,
    layout: str,
    rows: bool,
    seed: int,
    loop: str,
) -> None:
    gh, gw = cells
    h, w = gh * patch, gw * patch
    rng = np.random.default_rng(seed)
    nchw = rng.standard_normal((n, c, h, w)).astype(hrx.models.DType.of(dtype).numpy)
    source = nchw if layout == "nchw" else np.ascontiguousarray(nchw.transpose(0, 2, 3, 1))
    features = c * patch * patch
    shape = (n * gh * gw, features) if rows else (n, gh * gw, features)
    got = run(
        loop, hrx_backend, "patchify", [(source, layout)], (dtype, shape, "general"), patch=patch
    )
    want = nchw.reshape(n, c, gh, patch, gw, patch).transpose(0, 2, 4, 1, 3, 5)
    np.testing.assert_array_equal(got, want.reshape(shape))
