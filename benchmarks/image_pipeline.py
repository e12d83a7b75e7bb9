"""Images/s of one preprocessing pipeline, hrx_async against the usual libraries, one run.

The pipeline, per 480x640 u8 RGB picture: rotate 10 degrees about the centre (bilinear,
constant border), resize to 224x224 (bilinear), normalize per channel into f32 NCHW,
cut into 16x16 patches ([196, 768]). Inputs are uploaded and patches downloaded each
time, for every contender.

* `--backend sim` (default): hrx_async on the sim backend (its numpy host kernels)
  against OpenCV on the CPU (cv2.warpAffine, cv2.resize, numpy normalize and patchify).
* `--backend cuda`: hrx_async on the GPU against the same pipeline in PyTorch
  (`grid_sample` for the rotation, `interpolate` for the resize) and in CuPy
  (`cupyx.scipy.ndimage.affine_transform` and `zoom`), each imported only then and
  skipped when missing.

Contenders alternate round by round (the order flips every round) and the median
images/s of the rounds is printed, so drift hits all of them alike.

    python benchmarks/image_pipeline.py [--backend sim|cuda] [--images 100] [--rounds 5]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import numpy as np

import hrx_async as hrx
import hrx_async.models
from hrx_async.image import ImageOps

H, W, SIZE, PATCH = 480, 640, 224, 16
ANGLE = 10.0
MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)
Array = np.ndarray[Any, Any]


def rotation() -> Array:
    """Destination pixel -> source position: a rotation by ANGLE about the centre."""
    a = math.radians(ANGLE)
    cx, cy = (W - 1) / 2, (H - 1) / 2
    c, s = math.cos(a), math.sin(a)
    return np.array([[c, -s, cx - c * cx + s * cy], [s, c, cy - s * cx - c * cy]])


def patchify(x: Array) -> Array:
    g = SIZE // PATCH
    return x.reshape(3, g, PATCH, g, PATCH).transpose(1, 3, 0, 2, 4).reshape(g * g, -1)


def opencv_pipeline() -> Callable[[Array], Array]:
    import cv2

    m = rotation()

    def run(picture: Array) -> Array:
        turned = cv2.warpAffine(
            picture, m, (W, H), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP, borderValue=0
        )
        small = cv2.resize(turned, (SIZE, SIZE), interpolation=cv2.INTER_LINEAR)
        x = ((small.astype(np.float32) / 255 - MEAN) / STD).transpose(2, 0, 1)
        return np.ascontiguousarray(patchify(x))

    return run


async def hrx_pipeline(rt: hrx.Runtime) -> Callable[[Array], Awaitable[Array]]:
    ctx = hrx.models.ModelContext(rt)
    ops = ImageOps(rt)
    t = ctx.tensor
    raw = t(hrx.models.TensorDesc("u8", (1, H, W, 3), layout="nhwc"), hrx.GPU_LOCAL, "raw")
    turned = t(hrx.models.TensorDesc("u8", (1, H, W, 3), layout="nhwc"), hrx.GPU_LOCAL, "turned")
    small = t(
        hrx.models.TensorDesc("u8", (1, SIZE, SIZE, 3), layout="nhwc"), hrx.GPU_LOCAL, "small"
    )
    x = t(hrx.models.TensorDesc("f32", (1, 3, SIZE, SIZE), layout="nchw"), hrx.GPU_LOCAL, "x")
    cells = (SIZE // PATCH) ** 2
    patches = t(hrx.models.TensorDesc("f32", (cells, 3 * PATCH * PATCH)), hrx.GPU_LOCAL, "patches")
    up = rt.allocate(raw.nbytes, hrx.HOST_VISIBLE, "up")
    down = rt.allocate(patches.nbytes, hrx.HOST_VISIBLE, "down")
    g = rt.graph("image-pipeline")
    g.copy(raw.data, up.view())
    await ops.affine(g, raw, turned, rotation())
    await ops.resize(g, turned, small)
    await ops.normalize(g, small, x, MEAN.tolist(), STD.tolist())
    await ops.patchify(g, x, patches, PATCH)
    g.copy(down.view(), patches.data)
    step = g.prepare()

    async def run(picture: Array) -> Array:
        async with up.map_write() as memory:
            np.frombuffer(memory, np.uint8)[:] = picture.reshape(-1)
        await step.submit()
        async with down.map_read() as memory:
            return np.frombuffer(memory, np.float32).reshape(cells, -1).copy()

    return run


def torch_pipeline() -> Callable[[Array], Array] | None:
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    device = torch.device("cuda")
    m = rotation()
    # affine_grid works in normalised coordinates (align_corners=False: pixel centres at
    # (2i + 1) / size - 1); conjugate the pixel matrix into them.
    to_pixels = np.array([[W / 2, 0, W / 2 - 0.5], [0, H / 2, H / 2 - 0.5], [0, 0, 1]])
    theta = np.linalg.inv(to_pixels) @ np.vstack([m, [0, 0, 1]]) @ to_pixels
    theta_t = torch.tensor(theta[:2], dtype=torch.float32, device=device)[None]
    grid = F.affine_grid(theta_t, [1, 3, H, W], align_corners=False)
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1)

    def run(picture: Array) -> Array:
        src = torch.from_numpy(picture).to(device).permute(2, 0, 1)[None].float()
        turned = F.grid_sample(
            src, grid, mode="bilinear", padding_mode="zeros", align_corners=False
        )
        small = F.interpolate(turned, size=(SIZE, SIZE), mode="bilinear", align_corners=False)
        x = (small.round().clamp(0, 255) / 255 - mean) / std
        cells = F.unfold(x, PATCH, stride=PATCH)[0].transpose(0, 1)
        return cells.contiguous().cpu().numpy()

    return run


def cupy_pipeline() -> Callable[[Array], Array] | None:
    try:
        import cupy as cp
        from cupyx.scipy import ndimage
    except ImportError:
        return None
    m = rotation()
    # ndimage works in (row, column) order: matrix and offset for (y, x).
    matrix = cp.asarray([[m[1, 1], m[1, 0], 0], [m[0, 1], m[0, 0], 0], [0, 0, 1]])
    offset = cp.asarray([m[1, 2], m[0, 2], 0])
    mean, std = cp.asarray(MEAN), cp.asarray(STD)

    def run(picture: Array) -> Array:
        src = cp.asarray(picture).astype(cp.float32)
        turned = ndimage.affine_transform(src, matrix, offset, order=1, cval=0.0)
        small = ndimage.zoom(turned, (SIZE / H, SIZE / W, 1), order=1, grid_mode=True)
        x = ((cp.clip(cp.rint(small), 0, 255) / 255 - mean) / std).transpose(2, 0, 1)
        g = SIZE // PATCH
        cells = x.reshape(3, g, PATCH, g, PATCH).transpose(1, 3, 0, 2, 4).reshape(g * g, -1)
        return cp.asnumpy(cells)

    return run


async def main_async(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(3)
    pictures = [rng.integers(0, 256, (H, W, 3), dtype=np.uint8) for _ in range(8)]
    async with hrx.Runtime(backend=args.backend) as rt:
        ours = await hrx_pipeline(rt)
        contenders: dict[str, Callable[[Array], Any]] = {f"hrx_async ({rt.backend_name})": ours}
        if args.backend == "sim":
            contenders["opencv (cpu)"] = opencv_pipeline()
        else:
            for name, make in (("pytorch", torch_pipeline), ("cupy", cupy_pipeline)):
                fn = make()
                if fn is None:
                    print(f"# {name}: not installed, skipped")
                else:
                    contenders[name] = fn
        reference = opencv_pipeline()(pictures[0])
        check = await ours(pictures[0])
        worst = float(np.abs(check - reference).max())
        print(f"# hrx_async vs opencv on one picture: max |diff| = {worst:.4f} (u8 levels/std)")
        rates: dict[str, list[float]] = {name: [] for name in contenders}
        names = list(contenders)
        for name in names:  # warm-up
            for picture in pictures[:2]:
                result = contenders[name](picture)
                if not isinstance(result, np.ndarray):
                    await result
        for round_index in range(args.rounds):
            order = names if round_index % 2 == 0 else names[::-1]
            for name in order:
                fn = contenders[name]
                start = time.perf_counter()
                for index in range(args.images):
                    result = fn(pictures[index % len(pictures)])
                    if not isinstance(result, np.ndarray):
                        await result
                rates[name].append(args.images / (time.perf_counter() - start))
        print(
            f"| pipeline ({H}x{W} u8 -> rotate -> {SIZE}x{SIZE} -> normalize -> "
            f"{PATCH}x{PATCH} patches) | images/s (median of {args.rounds}) | rounds |"
        )
        print("| --- | ---: | --- |")
        for name in names:
            spread = ", ".join(f"{r:.0f}" for r in rates[name])
            print(f"| {name} | {statistics.median(rates[name]):.1f} | {spread} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sim", "cuda"), default="sim")
    parser.add_argument("--images", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    anyio.run(main_async, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
