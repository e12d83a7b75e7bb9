"""Face alignment per request: letterbox → similarity fit → packed affine crops → normalize.

Each timed request writes one 480x640 u8 frame and its detection rows ([faces, 16]
f32: box, score, five landmarks) into host-visible staging, submits their prepared
upload, then runs `RgbOps`: the letterbox resize to the
detector's 640x640 canvas, `similarity_2d` over a view of the rows' landmarks onto the
112x112 template, the packed affine crops through the inverse matrices, and the
symmetric RGB views (b/127.5 − 1, f32 NCHW) it downloads. The same work runs in
PyTorch on the GPU (`interpolate`, `affine_grid` + `grid_sample`) and in OpenCV on the
CPU (`resize`, `estimateAffinePartial2D`, `warpAffine`) when they are installed, each
timed alone; prints crops/s and p50 per request for each. The crops are checked
against OpenCV's (mean difference under one level) before timing.

usage: align [requests=100] [faces=16]
"""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import GPU_LOCAL, HOST_VISIBLE, PreparedGraph, Runtime
from ..image import RgbOps, RgbResize, letterbox
from ..models import ModelContext, Tensor, TensorDesc
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

NAME = "align"
USAGE = "usage: align [requests=100] [faces=16]"
FRAME = (480, 640)
CANVAS = 640
CROP = 112
TEMPLATE = np.array(
    [[38.29, 51.69], [73.53, 51.50], [56.02, 71.74], [41.55, 92.37], [70.73, 92.20]], np.float32
)
WARMUPS = 3
Array = np.ndarray[Any, Any]


@dataclass(frozen=True)
class Params:
    requests: int = 100
    faces: int = 16


def parse(args: Sequence[str]) -> Params:
    if len(args) > 2:
        raise UsageError(f"{USAGE.removeprefix('usage: ')} takes at most two arguments")
    values = [parse_count(a, n) for a, n in zip(args, ("requests", "faces"), strict=False)]
    params = Params(*values)
    if params.requests < 1 or not 1 <= params.faces <= 1024:
        raise UsageError(f"requests must be >= 1 and faces 1..1024, got {params}")
    return params


def scene(rng: np.random.Generator, faces: int) -> tuple[Array, Array]:
    """A smooth random frame and detection rows whose landmarks are random similarities
    of the template inside it."""
    h, w = FRAME
    coarse = rng.integers(0, 256, (h // 16 + 1, w // 16 + 1, 3)).astype(np.float32)
    frame = np.repeat(np.repeat(coarse, 16, 0), 16, 1)[:h, :w]
    frame = (frame + rng.integers(0, 32, (h, w, 3))).clip(0, 255).astype(np.uint8)
    rows = np.zeros((faces, 16), np.float32)
    for i in range(faces):
        scale, angle = rng.uniform(0.5, 1.5), rng.uniform(-0.4, 0.4)
        a, b = scale * np.cos(angle), scale * np.sin(angle)
        centre = rng.uniform([80, 80], [w - 80, h - 80])
        pts = (TEMPLATE - 56) @ np.array([[a, b], [-b, a]], np.float32) + centre
        rows[i, :5] = [*(centre - 60), 120, 120, 0.9]
        rows[i, 5:15] = pts.reshape(-1)
    return frame, rows


async def hrx_pipeline(
    backend: str, params: Params, frame: Array, rows: Array, report: Report
) -> tuple[list[float], Array, str]:
    async with Runtime(backend=backend, label=NAME) as rt:
        ctx = ModelContext(rt)
        ops = RgbOps(rt, capacity=16)
        h, w = FRAME
        f = params.faces
        image = ctx.tensor(TensorDesc("u8", (h * w * 3,)), GPU_LOCAL, "frame")
        nhwc = Tensor(TensorDesc("u8", (1, h, w, 3), layout="nhwc"), image.view)
        table = ctx.tensor(TensorDesc("f32", (f, 16)), GPU_LOCAL, "detections")
        marks = Tensor(TensorDesc("f32", (f, 5, 2), strides=(16, 2, 1)), table.view.slice(20))
        records = ctx.tensor(TensorDesc("u32", (f, 3)), GPU_LOCAL, "records")
        await ctx.upload(records, np.tile(np.array([0, w, h], np.uint32), (f, 1)))
        spec = RgbResize(CANVAS, CANVAS, letterbox(h, w, CANVAS, CANVAS))
        # Staging in host-visible memory and prepared copies, made once: a request
        # writes the frame and rows, submits the upload, and reads its views back.
        sizes = (frame.nbytes, rows.nbytes)
        stage_in = rt.allocate(sum(sizes), HOST_VISIBLE, "align-in")
        g = rt.graph("align-upload")
        g.copy(image.view, stage_in.view(0, sizes[0]))
        g.copy(table.view, stage_in.view(sizes[0], sizes[1]))
        upload = g.prepare()
        out_bytes = f * 3 * CROP * CROP * 4
        stage_out = rt.allocate(out_bytes, HOST_VISIBLE, "align-out")
        downloads: dict[tuple[int, int], PreparedGraph] = {}

        def download(views: Tensor) -> PreparedGraph:
            where = (id(views.view.buffer), views.view.offset)
            if where not in downloads:  # one per result slot the views come from
                g = rt.graph("align-download")
                g.copy(stage_out.view(), views.data)
                downloads[where] = g.prepare()
            return downloads[where]

        async def one() -> Array:
            async with stage_in.view().map_write() as memory:
                raw = np.frombuffer(memory, np.uint8)
                raw[: sizes[0]] = frame.reshape(-1)
                raw[sizes[0] :] = rows.view(np.uint8).reshape(-1)
            upload.submit()  # what follows reads these bytes: ordered after the copies
            canvas = await ops.resize_rgb(nhwc, spec)
            _, inv, status = await ops.similarity_2d(marks, TEMPLATE)
            crops = await ops.affine_rgb_packed(image, records, inv, CROP, CROP)
            views = await ops.encode_rgb(crops, 1, "symmetric")
            await download(views).submit()
            async with stage_out.view().map_read() as memory:
                out = np.frombuffer(memory, np.float32).reshape(views.shape).copy()
            if (await status.read()).any():
                raise ExampleFailed("a face's similarity fit failed")
            del canvas
            return out

        for _ in range(WARMUPS):
            first = await one()
        loaded = ops.kernels_loaded
        samples = []
        for index in range(params.requests):
            report.progress(f"request {index + 1}/{params.requests}")
            t0 = time.perf_counter()
            await one()
            samples.append(time.perf_counter() - t0)
        if ops.kernels_loaded != loaded:
            raise ExampleFailed("a plan was prepared while timing")
        return samples, first, rt.backend_name


def torch_pipeline(params: Params, frame: Array, rows: Array) -> list[float] | None:
    try:
        torch: Any = importlib.import_module("torch")
    except ImportError:
        return None
    F = torch.nn.functional
    if not torch.cuda.is_available():
        return None
    h, w = FRAME
    left, top, rw, rh = letterbox(h, w, CANVAS, CANVAS)
    tpl = torch.tensor(TEMPLATE, dtype=torch.float64, device="cuda")
    a_src = torch.tensor(
        [[2 / w, 0, 1 / w - 1], [0, 2 / h, 1 / h - 1], [0, 0, 1]],
        dtype=torch.float64,
        device="cuda",
    )
    b_crop = torch.tensor(
        [[CROP / 2, 0, (CROP - 1) / 2], [0, CROP / 2, (CROP - 1) / 2], [0, 0, 1]],
        dtype=torch.float64,
        device="cuda",
    )

    def one() -> Any:
        x = torch.from_numpy(frame).cuda().permute(2, 0, 1)[None].float()
        det = torch.from_numpy(rows).cuda()
        small = F.interpolate(x, size=(rh, rw), mode="bilinear", align_corners=False)
        canvas = F.pad(small, (left, CANVAS - rw - left, top, CANVAS - rh - top))
        p = det[:, 5:15].reshape(-1, 5, 2).double()
        pc, qc = p - p.mean(1, keepdim=True), tpl - tpl.mean(0)
        den = (pc**2).sum((1, 2))
        sa = (pc * qc).sum((1, 2)) / den
        sb = (pc[..., 0] * qc[..., 1] - pc[..., 1] * qc[..., 0]).sum(1) / den
        s2 = sa**2 + sb**2  # the inverse (template -> frame) directly
        ia, ib = sa / s2, -sb / s2
        pm, qm = p.mean(1), tpl.mean(0)
        tx = pm[:, 0] - (ia * qm[0] - ib * qm[1])
        ty = pm[:, 1] - (ib * qm[0] + ia * qm[1])
        inv = torch.stack([torch.stack([ia, -ib, tx], 1), torch.stack([ib, ia, ty], 1)], 1)
        full = torch.cat(
            [
                inv,
                torch.tensor([[[0, 0, 1]]], dtype=inv.dtype, device="cuda").expand(len(inv), 1, 3),
            ],
            1,
        )
        theta = (a_src @ full @ b_crop)[:, :2].float()
        grid = F.affine_grid(theta, [len(theta), 3, CROP, CROP], align_corners=False)
        crops = F.grid_sample(
            x.expand(len(theta), -1, -1, -1),
            grid,
            mode="bilinear",
            padding_mode="zeros",
            align_corners=False,
        )
        out = (crops.round() / 127.5 - 1).cpu()
        del canvas
        return out

    for _ in range(WARMUPS):
        one()
    samples = []
    for _ in range(params.requests):
        t0 = time.perf_counter()
        one()
        samples.append(time.perf_counter() - t0)
    return samples


def opencv_crops(frame: Array, rows: Array) -> Array:
    import cv2

    h, w = FRAME
    left, top, rw, rh = letterbox(h, w, CANVAS, CANVAS)
    small = cv2.resize(frame, (rw, rh), interpolation=cv2.INTER_LINEAR)
    cv2.copyMakeBorder(
        small, top, CANVAS - rh - top, left, CANVAS - rw - left, cv2.BORDER_CONSTANT, value=0
    )
    crops = []
    for row in rows:
        fwd, _ = cv2.estimateAffinePartial2D(row[5:15].reshape(5, 2), TEMPLATE, method=cv2.LMEDS)
        crops.append(cv2.warpAffine(frame, fwd, (CROP, CROP), flags=cv2.INTER_LINEAR))
    out: Array = (np.stack(crops).transpose(0, 3, 1, 2) / np.float32(127.5) - 1).astype(np.float32)
    return out


def opencv_pipeline(params: Params, frame: Array, rows: Array) -> list[float] | None:
    try:
        import cv2  # noqa: F401
    except ImportError:
        return None
    samples = []
    for _ in range(params.requests):
        t0 = time.perf_counter()
        opencv_crops(frame, rows)
        samples.append(time.perf_counter() - t0)
    return samples


async def run(params: Params, backend: str, report: Report) -> ExampleResult:
    frame, rows = scene(np.random.default_rng(11), params.faces)
    samples, out, name = await hrx_pipeline(backend, params, frame, rows, report)
    values: dict[str, Any] = {"backend": name, "requests": params.requests, "faces": params.faces}
    try:
        ref = opencv_crops(frame, rows)
    except ImportError:
        ref = None
    if ref is not None:
        levels = float(np.abs(out - ref).mean() * 127.5)
        if levels >= 1.0:
            raise ExampleFailed(f"crops differ from OpenCV's by {levels:.2f} levels on average")
        values["mean_levels_vs_opencv"] = levels
    runs: dict[str, list[float] | None] = {"hrx": samples}
    if backend != "sim":
        runs["torch"] = torch_pipeline(params, frame, rows)
    runs["opencv_cpu"] = opencv_pipeline(params, frame, rows)
    report.line(f"backend={name} frame={FRAME[0]}x{FRAME[1]} canvas={CANVAS} crop={CROP}")
    if "mean_levels_vs_opencv" in values:
        report.line(f"crops vs OpenCV: {values['mean_levels_vs_opencv']:.3f} levels on average")
    for label, found in runs.items():
        if found is None:
            report.line(f"{label}: not available")
            continue
        rate = params.faces * len(found) / sum(found)
        p50 = percentile(sorted(found), 50) * 1e3
        report.line(
            f"{label}: requests={len(found)} faces={params.faces} "
            f"crops_s={rate:.1f} p50_ms={p50:.3f}"
        )
        values[label] = {"crops_s": rate, "p50_ms": p50}
    return ExampleResult(values)


SPEC = ExampleSpec(NAME, USAGE, parse, run)


def main(argv: Sequence[str] | None = None) -> int:
    return main_for(SPEC, argv)


if __name__ == "__main__":
    sys.exit(main())
