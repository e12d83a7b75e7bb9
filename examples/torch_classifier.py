"""A FastAPI image classifier: a torchvision model run as a region of hrx_async graphs.

POST /v1/classify takes pictures and answers the model's five most likely ImageNet classes
for each, with their softmax probabilities:

    {"classes": [[238, 58, 381, 590, 76]], "scores": [[0.0865, 0.056, ...]], "model": "resnet18"}

A picture comes as raw u8 RGB pixels, channels last (`Content-Type:
application/octet-stream` with `X-Image-Shape: height,width,3`, or `n,height,width,3` for
n pictures of one size; `X-Image-Dtype`, when given, must be `u8`), or as one PNG or JPEG
file (`image/png`, `image/jpeg`; decoded by Pillow on a worker thread, off the event loop).

Each batch of pictures of one size runs as one prepared graph:

    upload (host staging -> GPU) -> resize (ImageOps, bilinear, half-pixel, u8 -> u8) ->
    normalize (ImageOps, (x/255 - mean) / std, u8 NHWC -> f32 NCHW) ->
    the classifier, softmax and top-5 (PyTorch, `hrx_async.torch.region`) -> download (5
    scores and 5 classes per picture)

The PyTorch part is a region of the graph like any kernel, over the region's buffers as
typed tensors: captured once into a CUDA graph when the graph is prepared (its shapes are
fixed), so each replay is one graph launch on the compute lane's own stream; the runtime
orders it after the normalize kernel and before the download by the bytes they share, on
the device, and the handler awaits the download like any other I/O. Only the 40 bytes per
picture of the answer come back to the host. On the `sim` backend the same graph runs on
the CPU: the image kernels are their numpy twins and the model runs with CPU PyTorch over
the buffers' numpy arrays.

The model is `torchvision.models.resnet18` (or `resnet50`, `--model`) with random weights
drawn from a fixed seed (nothing is downloaded; the same seed gives the same model and
the same answers on any machine), in eval mode, at `--size` pixels square (224 by
default). Requests are batched by the serving stack: per picture size a `Batcher` gathers
the pictures that arrive while every slot of the `SlotPool` is busy into one submission
(up to `--batch`, 16 by default); each slot keeps a prepared graph per batch size (1, 2, 4,
8, 16: a batch is padded up to the next) and picture size, built on first use.

Refusals (`hrx_async.serve.body` conventions): 400 a body that is not the image it claims
to be, 413 too large (from the Content-Length at once, or pictures past `--max-side`), 415
a content type the route does not take, 422 a missing or wrong X-Image-Shape, or a byte
count that does not match it. GET /v1/classifier/stats shows the batching and plan
counters; /healthz, /stats and /metrics come from `RuntimeService`.

PyTorch and torchvision are imported only when the app is made; without them it refuses
to start with a message saying what to install.

Run it:  python examples/torch_classifier.py --port 8000 [--backend sim|cuda|auto]
Exit status: 0, 1 (PyTorch, torchvision or the backend cannot be used), 64 (usage).
"""

# No `from __future__ import annotations`: FastAPI reads the handler's annotations.

import collections
import io
import logging
import os
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from types import ModuleType
from typing import Annotated, Any, NamedTuple

import anyio
import anyio.to_thread
import numpy as np
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse

import hrx_async as hrx
from hrx_async.image import ImageOps
from hrx_async.models import Tensor, TensorDesc
from hrx_async.serve import (
    Batcher,
    RequestRefused,
    RuntimeService,
    Slot,
    SlotPool,
    media_type,
    raw_pixels,
    read_body,
)

MODELS = ("resnet18", "resnet50")
"""torchvision classifiers this example builds (random weights from SEED, eval mode)."""
SEED = 20260126
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
"""ImageNet's per-channel mean and standard deviation (RGB, on the 0..1 scale)."""
C = 3
TOP = 5
CLASSES = 1000
BATCHES = (1, 2, 4, 8, 16)
"""Batch sizes the graphs are prepared for; a batch is padded up to the next one."""
ANSWER_BYTES = TOP * 8
"""Per picture: five float32 scores and five int32 classes."""
MAX_SIDE = 1024
"""Largest picture height or width taken by default."""
PLANS_PER_SLOT = 16
"""Prepared graphs (batch size, picture size) each slot keeps, least recently used dropped."""
OFFLOAD_BYTES = 1 << 20
"""Pictures of more bytes than this are copied into staging on a worker thread."""
DECODE_THREADS = 4
OCTETS = "application/octet-stream"
IMAGE_TYPES = {"image/png": "PNG", "image/jpeg": "JPEG", "image/jpg": "JPEG"}
Array = np.ndarray[Any, Any]
logger = logging.getLogger("torch_classifier")


class MissingLibrary(RuntimeError):
    """PyTorch, torchvision or Pillow is not installed where the example needs it."""


def import_torch() -> tuple[ModuleType, ModuleType]:
    """`torch` and `torchvision`, or MissingLibrary saying what to install."""
    try:
        import torch
        import torchvision
    except ImportError as exc:
        raise MissingLibrary(
            f"this example needs PyTorch and torchvision ({exc}); install them with "
            "`pip install torch torchvision` (a CPU build serves the sim backend)"
        ) from None
    return torch, torchvision


# -- the pipeline in PyTorch and numpy: the model, references ----------------------------


def build_model(name: str = "resnet18", device: str = "cpu", seed: int = SEED) -> Any:
    """The torchvision classifier `name` with random weights drawn from `seed` (on the CPU,
    so every device gets the same numbers), in eval mode, on `device`. The global random
    state of PyTorch is left as it was."""
    torch, torchvision = import_torch()
    if name not in MODELS:
        raise ValueError(f"model must be one of {', '.join(MODELS)}, got {name!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = getattr(torchvision.models, name)(weights=None)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model.eval().to(device)


def top5(model: Any, x: Any) -> tuple[Any, Any]:
    """Softmax probabilities and classes of the five most likely classes, best first, for
    f32 NCHW `x` (enqueued on the current stream; nothing waits)."""
    import torch

    with torch.inference_mode():
        probabilities = torch.softmax(model(x), dim=1)
        scores, classes = torch.topk(probabilities, TOP, dim=1)
    return scores, classes


def reference_preprocess(pictures: Array, size: int) -> Array:
    """What the graph's ImageOps steps compute, in numpy from their documented maths, float32
    step by step: u8 [n, h, w, 3] -> bilinear resize to size x size with half-pixel centres
    and clamped edges (source position (d + 0.5) * src / dst - 0.5, exact in integers),
    rounded half up to u8 -> (x / 255 - mean) / std -> f32 [n, 3, size, size].

    torchvision's `Resize` differs (on tensors it antialiases when it shrinks, and keeps
    floats), so the reference follows ImageOps instead; `torch_preprocess` is the same
    maths in PyTorch."""

    def taps(dst: int, src: int) -> tuple[Array, Array, Array]:
        num = (2 * np.arange(dst, dtype=np.int64) + 1) * src - dst
        low = num // (2 * dst)
        frac = (num - low * 2 * dst).astype(np.float32) / np.float32(2 * dst)
        edge = (low < 0) | (low >= src - 1)
        low = np.clip(low, 0, src - 1)
        return low, np.minimum(low + 1, src - 1), np.where(edge, np.float32(0), frac)

    p = np.asarray(pictures, np.uint8).astype(np.float32)
    y0, y1, fy = taps(size, p.shape[1])
    x0, x1, fx = taps(size, p.shape[2])
    fx, fy = fx[None, None, :, None], fy[None, :, None, None]

    def rows(y: Array) -> Array:
        picked = p[:, y]
        blended: Array = picked[:, :, x0] * (1 - fx) + picked[:, :, x1] * fx
        return blended

    small = np.clip(np.floor(rows(y0) * (1 - fy) + rows(y1) * fy + np.float32(0.5)), 0, 255)
    mean, std = np.asarray(MEAN, np.float32), np.asarray(STD, np.float32)
    x: Array = (small * np.float32(1 / 255) - mean) / std
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2), np.float32)


def torch_preprocess(pictures: Any, size: int) -> Any:
    """The same preprocessing as PyTorch users write it, for u8 NHWC `pictures` on any
    device: `interpolate(mode="bilinear", align_corners=False, antialias=False)` (half-pixel
    centres, clamped edges), rounded half up to u8 values as ImageOps stores them, then
    `(x / 255 - mean) / std`. PyTorch computes the source position in float32 rather than
    exactly, so a value may land one u8 level away from ImageOps' where it rounds at a half."""
    import torch
    import torch.nn.functional as F

    x = pictures.permute(0, 3, 1, 2).float()
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=False)
    x = x.add_(0.5).floor_().clamp_(0, 255)
    constants = _NORMALIZE.get(x.device)
    if constants is None:
        # Made once per device: a small tensor made from a list is a blocking copy to a GPU.
        mean = torch.tensor(MEAN, device=x.device).view(1, C, 1, 1)
        std = torch.tensor(STD, device=x.device).view(1, C, 1, 1)
        constants = _NORMALIZE[x.device] = (mean, std)
    mean, std = constants
    return x.mul_(1 / 255).sub_(mean).div_(std)


_NORMALIZE: dict[Any, tuple[Any, Any]] = {}
"""`torch_preprocess`' mean and std tensors, by device."""


def reference_top5(model: Any, pictures: Array, size: int) -> tuple[Array, Array]:
    """The whole pipeline run eagerly on the model's device: `reference_preprocess`, the
    model, softmax, top-5; scores [n, 5] float32 and classes [n, 5] int64 as numpy."""
    import torch

    device = next(model.parameters()).device
    x = torch.from_numpy(reference_preprocess(pictures, size)).to(device)
    scores, classes = top5(model, x)
    return scores.cpu().numpy(), classes.cpu().numpy()


# -- request bodies -------------------------------------------------------------------------


def decode_file(body: bytes, expected: str, max_side: int) -> Array:
    """A PNG or JPEG file as u8 [1, h, w, 3] RGB (a worker thread runs this). RequestRefused
    400 when it is not a picture of that format, 413 past `max_side`; the size is read from
    the header, before any pixel is decoded."""
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise MissingLibrary(
            "decoding PNG and JPEG needs Pillow (`pip install pillow`); raw u8 pixels "
            f"({OCTETS} with X-Image-Shape) need nothing more"
        ) from None
    too_large = f"pictures are at most {max_side}x{max_side} pixels"
    try:
        with Image.open(io.BytesIO(body), formats=[expected]) as picture:
            width, height = picture.size
            if height > max_side or width > max_side:
                raise RequestRefused(413, f"{too_large}, got {height}x{width}")
            pixels = np.asarray(picture.convert("RGB"), np.uint8)
    except RequestRefused:
        raise
    except Image.DecompressionBombError as exc:
        raise RequestRefused(413, f"{too_large}: {exc}") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise RequestRefused(400, f"the body is not a readable {expected} file: {exc}") from None
    return pixels.reshape(1, height, width, C)


# -- the runtime side -----------------------------------------------------------------------


class Answer(NamedTuple):
    """One picture's answer: classes and scores, best first."""

    classes: list[int]
    scores: list[float]


def record_model(
    g: hrx.Graph, model: Any, x: hrx.View, out: hrx.View, batch: int, size: int
) -> None:
    """Record the PyTorch work of one prepared graph (`hrx_async.torch.region`, captured):
    the model on f32 `x` [batch, 3, size, size], softmax, top-5, written into `out`, the
    slot's whole answer buffer: scores [batch, 5] f32, then classes [batch, 5] i32, then
    zeros. Writing all of it clears the poison a failed run left there (poison is cleared
    only by a whole-buffer write), so one failure does not fail the slot's later batches.

    Captured: the graph's shapes are fixed, so the model's kernels are recorded once into
    a CUDA graph when the graph is prepared, and each replay is one graph launch on the
    lane's stream (an eager forward pass would enqueue each layer from the event loop's
    thread, a few milliseconds of Python per batch). On sim it runs eagerly over CPU
    tensors on the lane's thread."""
    import torch

    import hrx_async.torch as hrx_torch

    half = batch * TOP * 4

    def forward(pictures: Any, answer: Any) -> None:
        scores, classes = top5(model, pictures)
        with torch.inference_mode():
            answer[:half].view(torch.float32).view(batch, TOP).copy_(scores)
            # int64 -> int32: class indices are below 1000
            answer[half : 2 * half].view(torch.int32).view(batch, TOP).copy_(classes)
            answer[2 * half :].zero_()

    hrx_torch.region(
        g,
        forward,
        reads=[(x, torch.float32, (batch, C, size, size))],
        writes=[(out, torch.uint8)],
        captured=True,
    )


@dataclass
class Pipeline:
    """One slot's buffers, sized for its largest batch of its largest pictures, and its
    prepared graphs by (batch size, height, width), least recently used dropped first."""

    staging_in: hrx.Buffer
    raw: hrx.Buffer
    small: hrx.Buffer
    x: hrx.Buffer
    out: hrx.Buffer
    staging_out: hrx.Buffer
    steps: collections.OrderedDict[tuple[int, int, int], hrx.PreparedGraph] = field(
        default_factory=collections.OrderedDict
    )


class Shape:
    """The batcher of one picture size and how many requests use it now."""

    __slots__ = ("batcher", "users")

    def __init__(self, batcher: Batcher[Pipeline, Array, Answer]) -> None:
        self.batcher = batcher
        self.users = 0


class Classifier:
    """The app's resources: the model, image operations, the slot pool and a batcher per
    picture size (kept while requests use it)."""

    def __init__(
        self,
        rt: hrx.Runtime,
        model: Any,
        model_name: str,
        size: int,
        slots: int,
        batch: int,
        max_side: int,
    ) -> None:
        self.rt = rt
        self.model = model
        self.model_name = model_name
        self.size = size
        self.max_batch = batch
        self.max_side = max_side
        self.batches = batch_sizes(batch)
        self.ops = ImageOps(rt, capacity=64)
        self.pool: SlotPool[Pipeline] = SlotPool(rt, slots, self._build_slot, "classifier")
        self.shapes: dict[tuple[int, int], Shape] = {}
        self.steps_prepared = 0
        self.steps_dropped = 0
        self.batches_run = 0
        self.pictures_run = 0

    def _build_slot(self, rt: hrx.Runtime, index: int) -> Pipeline:
        b, s, side = self.max_batch, self.size, self.max_side
        raw_bytes = b * side * side * C
        return Pipeline(
            rt.allocate(raw_bytes, hrx.HOST_VISIBLE, f"pictures-{index}"),
            rt.allocate(raw_bytes, hrx.GPU_LOCAL, f"raw-{index}"),
            rt.allocate(b * s * s * C, hrx.GPU_LOCAL, f"small-{index}"),
            rt.allocate(b * C * s * s * 4, hrx.GPU_LOCAL, f"x-{index}"),
            rt.allocate(b * ANSWER_BYTES, hrx.GPU_LOCAL, f"top5-{index}"),
            rt.allocate(b * ANSWER_BYTES, hrx.HOST_VISIBLE, f"answers-{index}"),
        )

    async def _record(
        self, pipeline: Pipeline, batch: int, height: int, width: int
    ) -> hrx.PreparedGraph:
        """upload -> resize -> normalize -> PyTorch -> download, for `batch` pictures."""
        s, raw_bytes, answer = self.size, batch * height * width * C, batch * ANSWER_BYTES
        raw = Tensor(
            TensorDesc("u8", (batch, height, width, C), layout="nhwc"), pipeline.raw.view()
        )
        small = Tensor(TensorDesc("u8", (batch, s, s, C), layout="nhwc"), pipeline.small.view())
        x = Tensor(TensorDesc("f32", (batch, C, s, s), layout="nchw"), pipeline.x.view())
        g = self.rt.graph(f"classify-b{batch}-{height}x{width}")
        g.copy(pipeline.raw.view(0, raw_bytes), pipeline.staging_in.view(0, raw_bytes))
        await self.ops.resize(g, raw, small, "bilinear")
        await self.ops.normalize(g, small, x, MEAN, STD)
        record_model(g, self.model, x.data, pipeline.out.view(), batch, s)
        g.copy(pipeline.staging_out.view(0, answer), pipeline.out.view(0, answer))
        step: hrx.PreparedGraph = g.prepare()
        return step

    async def step(
        self, pipeline: Pipeline, batch: int, height: int, width: int
    ) -> hrx.PreparedGraph:
        key = (batch, height, width)
        steps = pipeline.steps
        step = steps.get(key)
        if step is not None:
            steps.move_to_end(key)
            return step
        step = await self._record(pipeline, batch, height, width)
        self.steps_prepared += 1
        steps[key] = step
        if len(steps) > PLANS_PER_SLOT:
            steps.popitem(last=False)  # the slot is held and idle: nothing of it is running
            self.steps_dropped += 1
        return step

    async def prepare_for(self, pictures: Sequence[tuple[int, int]]) -> None:
        """Prepare every slot's graphs for every batch size of each picture size (height,
        width), so requests of those sizes never wait for a graph (and its model capture)
        to be prepared on the loop: for the sizes a service expects, at start-up."""
        check_pictures(pictures, self.max_side, len(self.batches))
        async with AsyncExitStack() as held:  # every slot, so each gets its graphs
            acquire = self.pool.acquire
            slots = [await held.enter_async_context(acquire()) for _ in range(self.pool.size)]
            for slot in slots:
                for height, width in pictures:
                    for batch in self.batches:
                        await self.step(slot.resources, batch, height, width)

    async def run_batch(self, slot: Slot[Pipeline], pictures: list[Array]) -> list[Answer]:
        """One submission for pictures of one size: each at its place in the slot's staging,
        the batch padded up to a prepared size (the padding's answers are not read)."""
        pipeline = slot.resources
        n = len(pictures)
        height, width, _ = pictures[0].shape
        batch = next(b for b in self.batches if b >= n)
        step = await self.step(pipeline, batch, height, width)
        # The slot is handed out idle, so nothing is pending on its staging.
        with pipeline.staging_in.map_write_nowait() as memory:
            count = n * height * width * C
            staging = np.frombuffer(memory, np.uint8, count).reshape(n, height, width, C)
            if staging.nbytes > OFFLOAD_BYTES:
                await anyio.to_thread.run_sync(_fill, staging, pictures)
            else:
                _fill(staging, pictures)
        await slot.submit(step)
        with pipeline.staging_out.map_read_nowait() as memory:
            scores = np.frombuffer(memory, np.float32, batch * TOP).reshape(batch, TOP)
            offset = batch * TOP * 4
            classes = np.frombuffer(memory, np.int32, batch * TOP, offset).reshape(batch, TOP)
            answers = [Answer(classes[i].tolist(), scores[i].tolist()) for i in range(n)]
        self.batches_run += 1
        self.pictures_run += n
        return answers

    async def classify_one(self, picture: Array) -> Answer:
        """`picture` (u8 [h, w, 3]) in the next batch of its size."""
        key = picture.shape[:2]
        shape = self.shapes.get(key)
        if shape is None:
            shape = self.shapes[key] = Shape(Batcher(self.pool, self.max_batch, self.run_batch))
        shape.users += 1
        try:
            return await shape.batcher.submit(picture)
        finally:
            shape.users -= 1
            if shape.users == 0 and self.shapes.get(key) is shape:
                del self.shapes[key]

    async def classify(self, pictures: Array) -> list[Answer]:
        """The answers for u8 [n, h, w, 3] pictures, each picture an item of the batcher."""
        if len(pictures) == 1:
            return [await self.classify_one(pictures[0])]
        answers: list[Answer | None] = [None] * len(pictures)

        async def one(index: int) -> None:
            answers[index] = await self.classify_one(pictures[index])

        async with anyio.create_task_group() as group:
            for index in range(len(pictures)):
                group.start_soon(one, index)
        return [a for a in answers if a is not None]

    def stats(self) -> dict[str, Any]:
        return {
            "model": self.model_name,
            "size": self.size,
            "batches": self.batches_run,
            "pictures": self.pictures_run,
            "mean_batch": self.pictures_run / self.batches_run if self.batches_run else 0.0,
            "steps_prepared": self.steps_prepared,
            "steps_dropped": self.steps_dropped,
            "slots_built": self.pool.built,
            "image_ops": self.ops.stats().to_dict(),
        }

    async def close(self) -> None:
        await self.ops.clear()


def batch_sizes(batch: int) -> tuple[int, ...]:
    """The batch sizes prepared for `batch` pictures a submission at most."""
    return (*(b for b in BATCHES if b < batch), batch)


def check_pictures(pictures: Sequence[tuple[int, int]], max_side: int, batches: int) -> None:
    """ValueError unless each is a (height, width) taken, and their graphs fit in a slot."""
    for shape in pictures:
        if (
            not isinstance(shape, tuple)
            or len(shape) != 2
            or not all(isinstance(side, int) and 1 <= side <= max_side for side in shape)
        ):
            raise ValueError(
                f"a picture size to prepare for is (height, width), each 1..{max_side}, "
                f"got {shape!r}"
            )
    if batches * len(pictures) > PLANS_PER_SLOT:
        raise ValueError(
            f"{len(pictures)} picture sizes need {batches * len(pictures)} graphs per slot; "
            f"a slot keeps {PLANS_PER_SLOT}"
        )


def _fill(staging: Array, pictures: list[Array]) -> None:
    for index, picture in enumerate(pictures):
        staging[index] = picture


def torch_device(backend_name: str) -> str:
    """Where PyTorch runs beside a runtime on `backend_name`: the runtime's GPU 0 ("cuda",
    as PyTorch also names ROCm devices), or the CPU for sim."""
    return "cpu" if backend_name == "sim" else "cuda:0"


def warm_up(model: Any, batches: Sequence[int], size: int) -> None:
    """Run each batch size once (loads the device's kernels before the first request) and
    wait for it; a worker thread runs this at start-up."""
    import torch

    device = next(model.parameters()).device
    for batch in batches:
        top5(model, torch.zeros((batch, C, size, size), device=device))
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- the app --------------------------------------------------------------------------------


def create_app(
    backend: str = "auto",
    model: str = "resnet18",
    size: int = 224,
    slots: int = 4,
    batch: int = 16,
    max_side: int = MAX_SIDE,
    warm: bool = True,
    pictures: Sequence[tuple[int, int]] = (),
) -> FastAPI:
    """The service as a FastAPI app with its own runtime (opened by the app's lifespan).

    `size`: the model's input side in pixels; `slots` concurrent submissions; `batch`
    pictures per submission at most (1: no batching); `max_side` the largest picture side
    taken (each slot stages `batch` pictures of that size); `pictures` the picture sizes
    (height, width) whose graphs every slot prepares at start-up, for every batch size
    (other sizes get theirs on first use). MissingLibrary now when PyTorch or torchvision
    is missing, ValueError (first) for a bad argument."""
    if model not in MODELS:
        raise ValueError(f"model must be one of {', '.join(MODELS)}, got {model!r}")
    for name, value, low in (("size", size, 32), ("slots", slots, 1), ("max_side", max_side, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= BATCHES[-1]:
        raise ValueError(f"batch must be an integer in 1..{BATCHES[-1]}, got {batch!r}")
    pictures = tuple(pictures)
    check_pictures(pictures, max_side, len(batch_sizes(batch)))
    import_torch()

    async def setup(rt: hrx.Runtime) -> Classifier:
        net = await anyio.to_thread.run_sync(build_model, model, torch_device(rt.backend_name))
        classifier = Classifier(rt, net, model, size, slots, batch, max_side)
        if warm and rt.backend_name != "sim":  # the CPU has no kernels to load
            await anyio.to_thread.run_sync(warm_up, net, classifier.batches, size)
        await classifier.prepare_for(pictures)
        logger.info("serving %s at %dx%d on %s", model, size, size, rt.backend_name)
        return classifier

    service: RuntimeService[Classifier] = RuntimeService(setup, backend=backend, npu=None)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with service.lifespan(app):
            try:
                yield
            finally:
                await service.resources.close()

    app = FastAPI(title="hrx_async torch classifier", lifespan=lifespan)
    app.state.service = service
    service.add_routes(app)
    limiter = anyio.CapacityLimiter(DECODE_THREADS)
    max_body = batch * max_side * max_side * C

    async def pictures_of(request: Request, classifier: Classifier) -> Array:
        kind = media_type(request.headers)
        if kind != OCTETS and kind not in IMAGE_TYPES:
            accepted = ", ".join([OCTETS, *IMAGE_TYPES])
            raise RequestRefused(415, f"send pictures as {accepted}, not {kind!r}")
        body = await read_body(request, max_body)
        if kind == OCTETS:
            headers = request.headers
            return raw_pixels(
                body,
                headers.get("x-image-shape"),
                headers.get("x-image-dtype"),
                classifier.max_side,
                classifier.max_batch,
            )
        pictures: Array = await anyio.to_thread.run_sync(
            decode_file, body, IMAGE_TYPES[kind], classifier.max_side, limiter=limiter
        )
        return pictures

    @app.post("/v1/classify")
    async def classify(
        request: Request,
        classifier: Annotated[Classifier, Depends(service.resources_dependency)],
    ) -> JSONResponse:
        try:
            pictures = await pictures_of(request, classifier)
        except RequestRefused as exc:
            raise HTTPException(exc.status, exc.detail) from None
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from None
        except MissingLibrary as exc:
            raise HTTPException(415, str(exc)) from None
        answers = await classifier.classify(pictures)
        return JSONResponse(
            {
                "classes": [a.classes for a in answers],
                "scores": [a.scores for a in answers],
                "model": classifier.model_name,
            }
        )

    @app.get("/v1/classifier/stats")
    async def classifier_stats(
        classifier: Annotated[Classifier, Depends(service.resources_dependency)],
    ) -> JSONResponse:
        return JSONResponse(classifier.stats())

    return app


def picture_size(text: str) -> tuple[int, int]:
    """'480x640' as (480, 640); argparse reports the ValueError of anything else."""
    height, sep, width = text.lower().partition("x")
    if not sep or not height.isdigit() or not width.isdigit():
        raise ValueError(f"a picture size is HEIGHTxWIDTH (480x640), got {text!r}")
    return int(height), int(width)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until interrupted; exit status 0, 1 (a library or the backend is unusable), 64
    (usage)."""
    from hrx_async.backends import resolve
    from hrx_async.examples.common import BACKENDS, EXIT_FAILURE, EXIT_OK
    from hrx_async.tools.cli import Parser

    parser = Parser(prog="torch_classifier.py", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    backend = os.environ.get("HRX_BACKEND", "auto")
    parser.add_argument("--backend", default=backend, choices=BACKENDS, help="GPU backend")
    parser.add_argument("--model", default="resnet18", choices=MODELS)
    parser.add_argument("--size", type=int, default=224, help="model input side, pixels")
    parser.add_argument("--slots", type=int, default=4, help="concurrent submissions")
    parser.add_argument("--batch", type=int, default=16, help="pictures per submission at most")
    parser.add_argument("--max-side", type=int, default=MAX_SIDE, help="largest picture side")
    parser.add_argument(
        "--prepare",
        type=picture_size,
        action="append",
        default=[],
        metavar="HxW",
        help="a picture size whose graphs are prepared at start-up (repeatable)",
    )
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be in 0..65535, got {args.port}")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        resolve(args.backend)  # said now in one line, not as a traceback at start-up
        app = create_app(
            args.backend,
            args.model,
            args.size,
            args.slots,
            args.batch,
            args.max_side,
            pictures=args.prepare,
        )
    except ValueError as exc:
        parser.error(str(exc))
    except (hrx.HrxError, MissingLibrary) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    import uvicorn

    uvicorn.run(app, host=args.host, port=args.port)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
