"""A FastAPI image classifier served through hrx_async's model layer.

The model is a small vision classifier: 16x16 RGB images (NCHW float32) are cut into
4x4 patches, embedded by a matrix product with bias and ReLU, mean-pooled over the 16
patches and classified into 10 classes by a second matrix product:

    x[B,3,16,16] -> patchify (GPU) -> patches[B*16,48] @ w1 (NPU) -> h[B*16,64]
    -> +b1, relu, mean over patches (GPU) -> pooled[B,64] @ w2 (NPU) -> +b2 (GPU) -> logits

The weights are generated deterministically and saved as safetensors when asked
(`--generate-weights`; nothing is downloaded), and checked when the server starts: a
missing or bad weights file stops it with a one-line error. Serving uses every part of
the layer:

* a `Residency` holds the weights (loaded by `load_safetensors` into shared GPU/NPU
  buffers, checked against the expected dtypes and shapes),
* a `PlanCache` keyed by batch size (1, 2, 4, 8: a request is padded to the next size)
  holds one `PreparedModel` per size, each with its own kernels and a lease on the
  weights,
* the prepared model's slots give each request its own I/O and prepared graph, with
  host staging made on first use,
* `Jobs` decode request bodies on worker threads, off the event loop,
* the labels (argmax) are taken on the device by a postprocess model per batch size
  (`model_server_post.py`), chained after the classifier: a request waits once, at the end.

POST /v1/classify takes `{"images": [[[[...]]]]}` (n x 3 x 16 x 16 numbers) or raw
float32 bytes (`Content-Type: application/octet-stream`) and answers
`{"logits": [[...10 numbers]...], "labels": [...]}`.

POST /v1/classify_image takes pictures of any size: raw u8 pixels, HWC (RGB), as
`application/octet-stream` with `X-Image-Shape: height,width,3` (or `n,height,width,3`
for n pictures of one size; `X-Image-Dtype`, when given, must be `u8`). The
preprocessing runs on the device through `hrx_async.image.ImageOps`, as a prepared model
whose output device tensor is fed to the classifier, whose logits feed the postprocess
(chained: no host round trip between them):

    raw u8 [B,h,w,3] nhwc -> resize (bilinear, half-pixel) -> u8 [B,16,16,3] -> normalize
    ((x/255 - mean) / std) -> f32 x [B,3,16,16] => classifier(x) => argmax -> labels

and answers like /v1/classify. Its plans are cached by (batch size, height, width) and
the image kernels by shape in `ImageOps`' own cache, so a repeated shape prepares
nothing. GET /v1/model/stats shows the layer's counters; /healthz, /stats and /metrics
come from `RuntimeService`.

Refusals follow examples/service.py (`hrx_async.serve.body`): 400 malformed (not JSON),
413 too large (from the Content-Length at once, or as the body streams in), 415 a content
type the route does not take, 422 well-formed but unusable (shape, non-finite numbers).

Run it:  python examples/model_server.py --generate-weights --port 8000 [--backend sim|cuda|auto]
Exit status: 0, 1 (the weights or the backend cannot be used), 64 (usage).
"""

# No `from __future__ import annotations`: FastAPI reads the handler's annotations.

import importlib.util
import logging
import math
import os
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any, NamedTuple

import numpy as np
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse

import hrx_async as hrx
import hrx_async.models
from hrx_async.image import ImageOps
from hrx_async.serve import (
    RequestRefused,
    RuntimeService,
    load_json,
    media_type,
    raw_pixels,
    read_body,
)


def _sibling(name: str) -> ModuleType:
    """The example module `name` beside this file (the examples are not a package)."""
    found = sys.modules.get(name)
    if found is not None:
        return found
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


kernels = _sibling("model_server_kernels")
C, H, W, P, CELLS, K, D, CLASSES = (
    kernels.C, kernels.H, kernels.W, kernels.P, kernels.CELLS, kernels.K, kernels.D, kernels.CLASSES
)  # fmt: skip
patchify, contract, R, WR = kernels.patchify, kernels.contract, kernels.R, kernels.WR
BATCHES = (1, 2, 4, 8)
MAX_BATCH = BATCHES[-1]
SEED = 20240601
EXPECT = {
    "w1": ("f32", (K, D)),
    "b1": ("f32", (D,)),
    "w2": ("f32", (D, CLASSES)),
    "b2": ("f32", (CLASSES,)),
}
WEIGHTS_KEY = "classifier"
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
MAX_SIDE = 1024  # largest picture height or width /v1/classify_image takes
IMAGE_PLANS = 8  # (batch size, height, width) plans kept for /v1/classify_image
MAX_CLASSIFY_BYTES = MAX_BATCH * C * H * W * 32  # JSON numbers of up to ~30 characters
MAX_IMAGE_BYTES = MAX_BATCH * MAX_SIDE * MAX_SIDE * C
IMAGES_DEPTH = 5  # {"images": n x 3 x 16 x 16}: an object and four arrays
IMAGES_USAGE = f'expected {{"images": n x {C} x {H} x {W} numbers}}'
JSON, OCTETS = "application/json", "application/octet-stream"
logger = logging.getLogger("model_server")


def make_weights() -> dict[str, np.ndarray[Any, Any]]:
    rng = np.random.default_rng(SEED)
    return {
        "w1": (rng.standard_normal((K, D)) / math.sqrt(K)).astype(np.float32),
        "b1": (rng.standard_normal(D) * 0.1).astype(np.float32),
        "w2": (rng.standard_normal((D, CLASSES)) / math.sqrt(D)).astype(np.float32),
        "b2": (rng.standard_normal(CLASSES) * 0.1).astype(np.float32),
    }


def write_weights(path: Path) -> None:
    """Write the deterministic weights to `path` (whole or not at all)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    hrx.models.write_safetensors(path, make_weights(), metadata={"model": "patch-mlp"})


def reference(images: np.ndarray[Any, Any], weights: dict[str, Any]) -> np.ndarray[Any, Any]:
    """The model in plain numpy (float32 throughout)."""
    h = patchify(np.asarray(images, np.float32)) @ weights["w1"]
    h = np.maximum(h + weights["b1"], np.float32(0))
    pooled = h.reshape(-1, CELLS, D).mean(axis=1, dtype=np.float32)
    return (pooled @ weights["w2"] + weights["b2"]).astype(np.float32)


def preprocess(pictures: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """/v1/classify_image's preprocessing in numpy, float32 step by step: u8 [n,h,w,3] ->
    bilinear resize to 16x16 with half-pixel centres and clamped edges (OpenCV's
    INTER_LINEAR), rounded half up to u8 -> (x/255 - mean) / std as f32 [n,3,16,16]."""

    def taps(dst: int, src: int) -> tuple[Any, Any, Any]:
        num = (2 * np.arange(dst) + 1) * src - dst  # source position = num / (2 dst) - 1/2
        i0 = num // (2 * dst)
        frac = (num - i0 * 2 * dst).astype(np.float32) / np.float32(2 * dst)
        edge = (i0 < 0) | (i0 >= src - 1)
        i0 = np.clip(i0, 0, src - 1)
        return i0, np.minimum(i0 + 1, src - 1), np.where(edge, np.float32(0), frac)

    p = np.asarray(pictures, np.uint8).astype(np.float32)
    y0, y1, fy = taps(H, p.shape[1])
    x0, x1, fx = taps(W, p.shape[2])
    fx, fy = fx[None, None, :, None], fy[None, :, None, None]

    def row(y: Any) -> Any:
        return p[:, y][:, :, x0] * (1 - fx) + p[:, y][:, :, x1] * fx

    small = np.clip(np.floor(row(y0) * (1 - fy) + row(y1) * fy + np.float32(0.5)), 0, 255)
    mean, std = np.asarray(MEAN, np.float32), np.asarray(STD, np.float32)
    x: np.ndarray[Any, Any] = (small * np.float32(1 / 255) - mean) / std
    return x.transpose(0, 3, 1, 2).astype(np.float32)


class Plan:
    """The prepared model for one batch size (and picture size), leasing the weights; a
    classifier plan also has its postprocess (labels on the device)."""

    def __init__(
        self,
        model: hrx.models.PreparedModel,
        lease: hrx.models.Lease[hrx.models.Weights],
        post: hrx.models.PreparedModel | None = None,
    ) -> None:
        self.model = model
        self.lease = lease
        self.post = post

    @property
    def idle(self) -> bool:
        return self.model.idle

    def close(self) -> None:
        self.lease.release()


class Head(NamedTuple):
    """The model after the patches: its four kernels for one batch size."""

    mm1: hrx.NpuKernel
    pool: hrx.GpuKernel
    mm2: hrx.NpuKernel
    bias: hrx.GpuKernel


def gpu_kernel(
    rt: hrx.Runtime, batch: int, cxx: str, name: str, host: Any, threads: int, *bindings: Any
) -> hrx.GpuKernel:
    defines = {
        "BATCH": batch,
        "CELLS": CELLS,
        "K": K,
        "D": D,
        "CLASSES": CLASSES,
        "C": C,
        "H": H,
        "W": W,
        "P": P,
    }
    return rt.load_gpu_kernel(
        hrx.KernelSource(cxx=cxx, host=host),
        name,
        (math.ceil(threads / 128), 1, 1),
        (128, 1, 1),
        contract(*bindings),
        defines=defines,
    )


def load_head(rt: hrx.Runtime, batch: int) -> Head:
    def npu(m: int, k: int, n: int) -> hrx.NpuKernel:
        return rt.npu(0).load_artifact(
            hrx.KernelSource(host=kernels.matmul_host(m, k, n)),
            f"matmul_{m}x{k}x{n}",
            1,
            contract((m * k, R), (k * n, R), (m * n, WR)),
        )

    rows, out = batch * CELLS, batch * CLASSES
    pool = gpu_kernel(
        rt, batch, kernels.POOL_CXX, "bias_relu_pool", kernels.pool_host, batch * D,
        (rows * D, R), (D, R), (batch * D, WR),
    )  # fmt: skip
    bias = gpu_kernel(
        rt,
        batch,
        kernels.BIAS_CXX,
        "add_bias",
        kernels.bias_host,
        out,
        (out, R),
        (CLASSES, R),
        (out, WR),
    )
    return Head(npu(rows, K, D), pool, npu(batch, D, CLASSES), bias)


def record_head(
    ctx: hrx.models.ModelContext,
    g: hrx.Graph,
    head: Head,
    weights: hrx.models.Weights,
    patches: hrx.models.Tensor,
) -> hrx.models.Tensor:
    """Record patches [B*16, 48] -> logits [B, 10] into `g`; the logits tensor."""
    batch, npu_memory, t = patches.shape[0] // CELLS, hrx.shared(0), ctx.tensor
    h = t(hrx.models.TensorDesc("f32", (batch * CELLS, D)), npu_memory, "h")
    pooled = t(hrx.models.TensorDesc("f32", (batch, D)), npu_memory, "pooled")
    raw = t(hrx.models.TensorDesc("f32", (batch, CLASSES)), npu_memory, "raw")
    logits = t(hrx.models.TensorDesc("f32", (batch, CLASSES)), hrx.GPU_LOCAL, "logits")
    g.npu(head.mm1, [patches.view, weights["w1"].view, h.view])
    g.gpu(head.pool, [h.view, weights["b1"].view, pooled.view])
    g.npu(head.mm2, [pooled.view, weights["w2"].view, raw.view])
    g.gpu(head.bias, [raw.view, weights["b2"].view, logits.view])
    return logits


def patches_tensor(ctx: hrx.models.ModelContext, batch: int) -> hrx.models.Tensor:
    desc = hrx.models.TensorDesc("f32", (batch * CELLS, K), layout="rows")
    return ctx.tensor(desc, hrx.shared(0), "patches")


def build_plan(
    rt: hrx.Runtime, weights: hrx.models.Weights, batch: int, slots: int
) -> hrx.models.PreparedModel:
    rows, n_in = batch * CELLS, batch * C * H * W
    k_patch = gpu_kernel(
        rt,
        batch,
        kernels.PATCHIFY_CXX,
        "patchify",
        kernels.patchify_host,
        rows * K,
        (n_in, R),
        (rows * K, WR),
    )
    head = load_head(rt, batch)

    def factory(ctx: hrx.models.ModelContext, index: int) -> hrx.models.SlotIO:
        x = ctx.tensor(
            hrx.models.TensorDesc("f32", (batch, C, H, W), layout="nchw"), hrx.GPU_LOCAL, "x"
        )
        patches = patches_tensor(ctx, batch)
        g = rt.graph(f"classifier-b{batch}")
        g.gpu(k_patch, [x.view, patches.view])
        logits = record_head(ctx, g, head, weights, patches)
        return hrx.models.SlotIO({"x": x}, {"logits": logits}, g.prepare())

    return hrx.models.PreparedModel(
        hrx.models.ModelContext(rt), slots, factory, f"classifier-b{batch}"
    )


async def build_image_plan(
    rt: hrx.Runtime, ops: ImageOps, shape: tuple[int, int, int], slots: int
) -> hrx.models.PreparedModel:
    """Device preprocessing of u8 [batch, height, width, 3] pictures into the classifier's
    f32 input x; every slot is recorded here (image operations are awaited for plans)."""
    batch, height, width = shape
    ctx, label = hrx.models.ModelContext(rt), f"preprocess-b{batch}-{height}x{width}"
    slot_ios: list[hrx.models.SlotIO] = []
    for _ in range(slots):
        t = ctx.tensor
        raw = t(
            hrx.models.TensorDesc("u8", (batch, height, width, C), layout="nhwc"),
            hrx.GPU_LOCAL,
            "image",
        )
        small = t(
            hrx.models.TensorDesc("u8", (batch, H, W, C), layout="nhwc"), hrx.GPU_LOCAL, "small"
        )
        x = t(hrx.models.TensorDesc("f32", (batch, C, H, W), layout="nchw"), hrx.GPU_LOCAL, "x")
        g = rt.graph(label)
        await ops.resize(g, raw, small, "bilinear")
        await ops.normalize(g, small, x, MEAN, STD)
        slot_ios.append(hrx.models.SlotIO({"image": raw}, {"x": x}, g.prepare()))
    return hrx.models.PreparedModel(ctx, slots, lambda _ctx, i: slot_ios[i], label, eager=True)


def decode(body: bytes, kind: str) -> np.ndarray[Any, Any]:
    """A request body as float32 images [n, 3, 16, 16] (runs on a worker thread); else
    ValueError (422), or RequestRefused (400 not JSON, 422 nesting deeper than images)."""
    if kind == OCTETS:
        if not body or len(body) % (C * H * W * 4):
            raise ValueError(f"{len(body)} bytes is not a whole number of {C}x{H}x{W} f32 images")
        images = np.frombuffer(body, np.float32).reshape(-1, C, H, W)
    else:
        images = images_from(load_json(body, IMAGES_DEPTH, IMAGES_USAGE))
    if images.shape[0] > MAX_BATCH:
        raise ValueError(f"at most {MAX_BATCH} images per request, got {images.shape[0]}")
    if not np.isfinite(images).all():
        raise ValueError("images must be finite float32 numbers")
    return images


def images_from(payload: Any) -> np.ndarray[Any, Any]:
    """`{"images": [...]}` as float32 [n, 3, 16, 16]; ValueError naming what is wrong."""
    if not isinstance(payload, dict) or "images" not in payload:
        kinds = {dict: 'an object without "images"', list: "an array", str: "a string"}
        raise ValueError(f"{IMAGES_USAGE}, got {kinds.get(type(payload), 'a lone value')}")
    # Objects first: numpy would turn strings and booleans into numbers.
    cells = np.asarray(payload["images"], dtype=object)
    if cells.ndim != 4 or cells.shape[1:] != (C, H, W) or cells.shape[0] < 1:
        raise ValueError(f"images must be n x {C} x {H} x {W}, got {list(cells.shape)}")
    if not all(type(v) in (int, float) for v in cells.flat):
        raise ValueError("images must hold numbers only (no strings, booleans or null)")
    try:
        return cells.astype(np.float32)
    except OverflowError:
        raise ValueError("images must be finite float32 numbers") from None


def decode_image(body: bytes, shape: str | None, dtype: str | None) -> np.ndarray[Any, Any]:
    """Raw u8 HWC pixels with their shape as u8 [n, h, w, 3] (runs on a worker thread);
    `RequestRefused` (413 or 422) saying what is wrong."""
    return raw_pixels(body, shape, dtype, MAX_SIDE, MAX_BATCH)


class ModelServer:
    """The app's resources: weights residency, a plan cache by batch size, and jobs."""

    def __init__(self, rt: hrx.Runtime, weights_path: Path, slots: int = 2) -> None:
        self.rt = rt
        self.weights_path = weights_path
        self.slots = slots
        self.residency: hrx.models.Residency[hrx.models.Weights] = hrx.models.Residency(
            1 << 20, label="weights"
        )
        self.plans: hrx.models.PlanCache[Plan] = hrx.models.PlanCache(
            len(BATCHES), release=Plan.close, label="plans"
        )
        self.image_plans: hrx.models.PlanCache[Plan] = hrx.models.PlanCache(
            IMAGE_PLANS, release=Plan.close, label="image plans"
        )
        self.ops = ImageOps(rt, capacity=32)
        self.jobs: hrx.models.Jobs | None = None

    async def lease_weights(self) -> hrx.models.Lease[hrx.models.Weights]:
        return await hrx.models.load_safetensors(
            self.rt,
            self.residency,
            WEIGHTS_KEY,
            self.weights_path,
            hrx.shared(0),
            EXPECT,
            wait=True,
            timeout=30,
        )

    async def prepare(self, batch: int) -> Plan:
        lease = await self.lease_weights()
        try:
            model = build_plan(self.rt, lease.value, batch, self.slots)
            return Plan(
                model, lease, kernels.build_postprocess(self.rt, batch, CLASSES, self.slots)
            )
        except BaseException:
            lease.release()
            raise

    async def prepare_image(self, shape: tuple[int, int, int]) -> Plan:
        lease = await self.lease_weights()
        try:
            return Plan(await build_image_plan(self.rt, self.ops, shape, self.slots), lease)
        except BaseException:
            lease.release()
            raise

    async def classify(self, images: np.ndarray[Any, Any]) -> tuple[Any, Any]:
        """Logits [n, 10] and labels [n] of f32 images [n, 3, 16, 16]."""
        n = images.shape[0]
        batch = next(b for b in BATCHES if b >= n)
        padded = np.zeros((batch, C, H, W), np.float32)
        padded[:n] = images
        raw = padded.tobytes()
        async with self.plans.use(batch, lambda: self.prepare(batch), timeout=30) as plan:
            run = await plan.model.submit_host_with(lambda i, m: m.__setitem__(slice(None), raw))
            return await self.postprocess(plan, run, n)

    async def postprocess(self, plan: Plan, run: hrx.models.Inference, n: int) -> tuple[Any, Any]:
        """Labels taken on the device from `run`'s logits; both read back once, at the end."""
        assert plan.post is not None
        labels = await plan.post.submit(run.outputs)
        (logits,), (picked,) = await run.download(), await labels.download()
        return (
            np.frombuffer(logits, np.float32).reshape(-1, CLASSES)[:n],
            np.frombuffer(picked, np.int32)[:n],
        )

    async def classify_image(self, pictures: np.ndarray[Any, Any]) -> tuple[Any, Any]:
        """Logits and labels of u8 pictures [n, h, w, 3]."""
        n, height, width, _ = pictures.shape
        batch = next(b for b in BATCHES if b >= n)
        padded = np.zeros((batch, height, width, C), np.uint8)
        padded[:n] = pictures
        key, raw = (batch, height, width), padded.tobytes()
        # preprocess -> classifier -> argmax on the device: only the answers come back.
        async with (
            self.image_plans.use(key, lambda: self.prepare_image(key), timeout=30) as pre,
            self.plans.use(batch, lambda: self.prepare(batch), timeout=30) as plan,
        ):
            x = await pre.model.submit_host_with(lambda i, m: m.__setitem__(slice(None), raw))
            return await self.postprocess(plan, await plan.model.submit(x.outputs), n)

    async def close(self) -> None:
        await self.plans.clear()
        await self.image_plans.clear()
        await self.ops.clear()
        await self.residency.clear()

    def stats(self) -> dict[str, Any]:
        jobs = self.jobs
        return {
            "plans": self.plans.stats().to_dict(),
            "image_plans": self.image_plans.stats().to_dict(),
            "image_ops": self.ops.stats().to_dict(),
            "residency": self.residency.stats().to_dict(),
            "jobs": None
            if jobs is None
            else {
                "submitted": jobs.submitted,
                "succeeded": jobs.succeeded,
                "failed": jobs.failed,
            },
        }


def default_weights_path() -> Path:
    """$HRX_MODEL_DIR/patch_mlp.safetensors, or in the system's temporary directory."""
    root = os.environ.get("HRX_MODEL_DIR") or os.path.join(tempfile.gettempdir(), "hrx_models")
    return Path(root) / "patch_mlp.safetensors"


def prepare_weights(weights: Path | None, generate: bool = False) -> Path:
    """The checked weights file (`weights` or the default), written first if `generate` is
    set and it is missing; `hrx.models.ArtifactError` when it cannot be used ("no such file")."""
    path = weights if weights is not None else default_weights_path()
    if generate and not path.exists():
        logger.info("writing the generated weights to %s", path)
        write_weights(path)
    hrx.models.read_safetensors_header(path, expect=EXPECT)  # this model's tensors, or why not
    logger.info("weights: %s", path)
    return path


@contextmanager
def answered() -> Iterator[None]:
    """Each refusal a request may meet as its HTTP answer (see the module's docstring)."""
    try:
        yield
    except RequestRefused as exc:
        raise HTTPException(exc.status, exc.detail) from None
    except hrx.Busy as exc:
        raise HTTPException(503, str(exc)) from None
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None


def create_app(
    backend: str = "auto",
    weights: Path | None = None,
    slots: int = 2,
    generate_weights: bool = False,
) -> FastAPI:
    """The app serving `weights` (see `prepare_weights`), checked now: a missing or bad file
    fails here, not on every request."""
    path = prepare_weights(weights, generate_weights)
    service: RuntimeService[ModelServer] = RuntimeService(
        lambda rt: ModelServer(rt, path, slots), backend=backend
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with service.lifespan(app):
            server = service.resources
            async with hrx.models.Jobs(workers=2, capacity=256, label="decode") as jobs:
                server.jobs = jobs
                try:
                    yield
                finally:
                    server.jobs = None
                    await server.close()

    app = FastAPI(title="hrx_async model server", lifespan=lifespan)
    app.state.service = service
    service.add_routes(app)

    @app.post("/v1/classify")
    async def classify(
        request: Request, server: Annotated[ModelServer, Depends(service.resources_dependency)]
    ) -> JSONResponse:
        kind = media_type(request.headers, JSON)
        if kind not in (JSON, OCTETS):
            raise HTTPException(415, f"send images as {JSON} or {OCTETS}, not {kind!r}")
        assert server.jobs is not None
        with answered():
            body = await read_body(request, MAX_CLASSIFY_BYTES)
            images = await server.jobs.run(decode, body, kind)
        logits, labels = await server.classify(images)
        return JSONResponse({"logits": logits.tolist(), "labels": labels.tolist()})

    @app.post("/v1/classify_image")
    async def classify_image(
        request: Request, server: Annotated[ModelServer, Depends(service.resources_dependency)]
    ) -> JSONResponse:
        kind = media_type(request.headers, "")
        if kind != OCTETS:
            raise HTTPException(415, f"send raw u8 HWC pixels as {OCTETS}, not {kind!r}")
        shape, dtype = request.headers.get("x-image-shape"), request.headers.get("x-image-dtype")
        assert server.jobs is not None
        with answered():
            body = await read_body(request, MAX_IMAGE_BYTES)
            pictures = await server.jobs.run(decode_image, body, shape, dtype)
        logits, labels = await server.classify_image(pictures)
        return JSONResponse({"logits": logits.tolist(), "labels": labels.tolist()})

    @app.get("/v1/model/stats")
    async def model_stats(
        server: Annotated[ModelServer, Depends(service.resources_dependency)],
    ) -> JSONResponse:
        return JSONResponse(server.stats())

    return app


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until interrupted; exit status 0, 1 (weights or backend unusable), 64 (usage)."""
    import uvicorn

    from hrx_async.backends import resolve
    from hrx_async.examples.common import BACKENDS, EXIT_FAILURE, EXIT_OK
    from hrx_async.tools.cli import Parser

    parser = Parser(prog="model_server.py", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    backend = os.environ.get("HRX_BACKEND", "auto")
    parser.add_argument("--backend", default=backend, choices=BACKENDS, help="GPU backend")
    default = f"default: {default_weights_path()}, in $HRX_MODEL_DIR when set"
    parser.add_argument("--weights", type=Path, help=f"safetensors file ({default})")
    parser.add_argument(
        "--generate-weights", action="store_true", help="write the weights file if it is missing"
    )
    parser.add_argument("--slots", type=int, default=2, help="slots per batch size")
    args = parser.parse_args(argv)
    if args.slots < 1:
        parser.error(f"--slots must be >= 1, got {args.slots}")
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be in 0..65535, got {args.port}")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    path = args.weights if args.weights is not None else default_weights_path()
    try:
        # Said now in one line, not as a traceback when the app starts.
        resolve(args.backend)
        app = create_app(args.backend, path, args.slots, args.generate_weights)
    except (hrx.HrxError, OSError) as exc:  # OSError: writing the generated weights
        missing = not args.generate_weights and not os.path.lexists(path)
        hint = " (--generate-weights writes the example's weights there)" if missing else ""
        print(f"{parser.prog}: error: {exc}{hint}", file=sys.stderr)
        return EXIT_FAILURE
    uvicorn.run(app, host=args.host, port=args.port)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
