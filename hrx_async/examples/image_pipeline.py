"""Vision preprocessing on the device: resize → normalize → patchify, per request image.

Each timed request uploads one u8 NHWC picture, then replays a prepared graph of three
image kernels (bilinear resize to size×size, per-channel normalize into f32 NCHW,
patchify into [1, cells, 3·patch·patch]) and downloads the patches. One graph is
prepared per distinct input shape and kept in a bounded `PlanCache`; the pictures
alternate between two shapes, so after the warm-ups nothing is prepared or loaded
(checked). The output is checked against numpy; prints images/s and p50/p95 per image.

usage: image_pipeline [images=200] [size=224] [patch=16]
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import GPU_LOCAL, PreparedGraph, Runtime
from ..image import ImageOps
from ..models import ModelContext, PlanCache, Tensor, TensorDesc
from ..tools.benchmark import percentile
from .common import (
    ExampleFailed,
    ExampleResult,
    ExampleSpec,
    Report,
    UsageError,
    main_for,
    parse_count,
)

NAME = "image_pipeline"
USAGE = "usage: image_pipeline [images=200] [size=224] [patch=16]"
SHAPES = ((480, 640), (375, 500))
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
WARMUPS = 4


@dataclass(frozen=True)
class Params:
    images: int = 200
    size: int = 224
    patch: int = 16


def parse(args: Sequence[str]) -> Params:
    if len(args) > 3:
        raise UsageError(f"{USAGE.removeprefix('usage: ')} takes at most three arguments")
    values = [parse_count(a, n) for a, n in zip(args, ("images", "size", "patch"), strict=False)]
    params = Params(*values)
    if params.images < 1:
        raise UsageError(f"images must be >= 1, got {params.images}")
    if params.patch < 1 or params.size < params.patch or params.size % params.patch:
        raise UsageError(f"patch must divide size, got size={params.size} patch={params.patch}")
    if params.size > 4096:
        raise UsageError(f"size must be at most 4096, got {params.size}")
    return params


class Pipeline:
    """The prepared graph for one input shape, with its own tensors."""

    def __init__(self, raw: Tensor, patches: Tensor, graph: PreparedGraph) -> None:
        self.raw = raw
        self.patches = patches
        self.graph = graph


async def build(rt: Runtime, ops: ImageOps, shape: tuple[int, int], params: Params) -> Pipeline:
    ctx = ModelContext(rt)
    h, w = shape
    size, k = params.size, params.patch
    raw = ctx.tensor(TensorDesc("u8", (1, h, w, 3), layout="nhwc"), GPU_LOCAL, "raw")
    small = ctx.tensor(TensorDesc("u8", (1, size, size, 3), layout="nhwc"), GPU_LOCAL, "small")
    x = ctx.tensor(TensorDesc("f32", (1, 3, size, size), layout="nchw"), GPU_LOCAL, "x")
    cells = (size // k) ** 2
    patches = ctx.tensor(TensorDesc("f32", (1, cells, 3 * k * k)), GPU_LOCAL, "patches")
    g = rt.graph(f"preprocess-{h}x{w}")
    await ops.resize(g, raw, small, "bilinear")
    await ops.normalize(g, small, x, MEAN, STD)
    await ops.patchify(g, x, patches, k)
    return Pipeline(raw, patches, g.prepare())


def reference(picture: np.ndarray[Any, Any], params: Params) -> np.ndarray[Any, Any]:
    """The same preprocessing in numpy (the sim host kernels' formulas, float64 here)."""
    from ..image.host import linear_taps

    h, w, _ = picture.shape
    size, k = params.size, params.patch
    y0, y1, fy = linear_taps(size, h)
    x0, x1, fx = linear_taps(size, w)
    p = picture.astype(np.float64)
    top = p[y0][:, x0] * (1 - fx)[None, :, None] + p[y0][:, x1] * fx[None, :, None]
    bottom = p[y1][:, x0] * (1 - fx)[None, :, None] + p[y1][:, x1] * fx[None, :, None]
    small = np.floor(top * (1 - fy)[:, None, None] + bottom * fy[:, None, None] + 0.5)
    x: np.ndarray[Any, Any] = ((small / 255 - MEAN) / STD).transpose(2, 0, 1)
    g = size // k
    return x.reshape(3, g, k, g, k).transpose(1, 3, 0, 2, 4).reshape(1, g * g, 3 * k * k)


async def run(params: Params, backend: str, report: Report) -> ExampleResult:
    rng = np.random.default_rng(7)
    pictures = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in SHAPES]
    async with Runtime(backend=backend, label=NAME) as rt:
        ops = ImageOps(rt, capacity=8)
        pipelines: PlanCache[Pipeline] = PlanCache(len(SHAPES), label="pipelines")
        ctx = ModelContext(rt)

        async def one(index: int) -> np.ndarray[Any, Any]:
            picture = pictures[index % len(pictures)]
            shape = (picture.shape[0], picture.shape[1])
            loader = lambda: build(rt, ops, shape, params)  # noqa: E731
            async with pipelines.use(shape, loader) as pipeline:
                await ctx.upload(pipeline.raw, picture[None])
                await pipeline.graph.submit()
                return await ctx.download(pipeline.patches)

        for index in range(WARMUPS):
            out = await one(index)
            want = reference(pictures[index % len(pictures)], params)
            # u8 rounding after the resize may differ by one level: 1/255/std at most
            if not np.allclose(out, want, rtol=0, atol=1.01 / 255 / min(STD)):
                raise ExampleFailed("preprocessed patches differ from the numpy reference")
        before = rt.statistics()
        loaded = ops.stats().kernels_loaded
        samples: list[float] = []
        start = time.perf_counter()
        for index in range(params.images):
            report.progress(f"image {index + 1}/{params.images}")
            t0 = time.perf_counter()
            await one(index)
            samples.append(time.perf_counter() - t0)
        wall = time.perf_counter() - start
        after = rt.statistics()
        if after.native_graphs_prepared != before.native_graphs_prepared:
            raise ExampleFailed("a graph was prepared while timing")
        if ops.stats().kernels_loaded != loaded or pipelines.stats().misses != len(SHAPES):
            raise ExampleFailed("a plan was prepared while timing")
        samples.sort()
        p50, p95 = percentile(samples, 50) * 1e3, percentile(samples, 95) * 1e3
        rate = params.images / wall
        report.line(f"backend={rt.backend_name} shapes={'+'.join(f'{h}x{w}' for h, w in SHAPES)}")
        report.line(
            f"images={params.images} size={params.size} patch={params.patch} "
            f"images_s={rate:.1f} p50_ms={p50:.3f} p95_ms={p95:.3f}"
        )
        report.line(f"plans={ops.stats().to_dict()}")
        values = {
            "backend": rt.backend_name,
            "images": params.images,
            "size": params.size,
            "patch": params.patch,
            "images_s": rate,
            "p50_ms": p50,
            "p95_ms": p95,
            "plans": ops.stats().to_dict(),
        }
    return ExampleResult(values)


SPEC = ExampleSpec(NAME, USAGE, parse, run)


def main(argv: Sequence[str] | None = None) -> int:
    return main_for(SPEC, argv)


if __name__ == "__main__":
    sys.exit(main())
