"""A FastAPI service that runs each request through a prepared GPU + NPU graph.

POST /v1/transform takes a vector, either as JSON (`{"values": [...]}`) or as
raw bytes (`Content-Type: application/octet-stream`, element type in the
`X-Dtype` header: float32, float64 or int32), and returns
`clip(2 * x + 1, 0, 6)` in the same form (binary answers are float32). A JSON
body may declare its values' `dtype` (float32 by default): each value must fit it
(int32: a whole number in int32's range) and be a finite float32, which the
service computes in; one that does not is refused, never wrapped or clamped. The
work is a prepared graph:

    upload (host staging -> GPU) -> GPU kernel 2x+1 -> NPU kernel clip(.., 0, 6)
    -> download (-> host staging)

On the sim backend both kernels are numpy functions; on CUDA the GPU kernel is
compiled from the C++ source below. Requests go to the smallest of a few size
classes that fits them. Each class has a pool of slots (own buffers and graphs,
built on first use, so serving allocates nothing after warm-up) and a batcher:
requests that arrive while every slot is busy share the next submission, each
at its own offset in the slot's staging. Bad input is refused with a 4xx before
it reaches the runtime (`hrx_async.serve.body`: 400 malformed, such as a body that is
not JSON; 413 too large, from the Content-Length at once or as the body streams in;
415 an unknown Content-Type; 422 well-formed but unusable values), and a client that
goes away mid-body is let go quietly.
`/healthz`, `/stats` and `/metrics` come from `RuntimeService.add_routes`.

Run it:  python examples/service.py --port 8000 [--backend sim|cuda|hip|auto]
or:      uvicorn --app-dir examples service:app   (HRX_BACKEND, HRX_SLOTS, HRX_BATCH)
"""

# No `from __future__ import annotations`: FastAPI reads the handler's annotations,
# which name a local dependency.

import logging
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.responses import JSONResponse

import hrx_async as hrx
from hrx_async.serve import RequestRefused, RuntimeService, load_json, media_type, read_body
from hrx_async.serve.slots import Batcher, Slot, SlotPool

SCALE = 2.0
SHIFT = 1.0
CEILING = 6.0

SIZE_CLASSES = (1024, 4096, 16384, 65536, 262144)
"""Vector lengths the graphs are prepared for; a request uses the smallest that fits."""
MAX_VALUES = SIZE_CLASSES[-1]
DTYPES: dict[str, np.dtype[Any]] = {
    name: np.dtype(name) for name in ("float32", "float64", "int32")
}
MAX_BODY_BYTES = MAX_VALUES * 24
"""Raw bytes of the largest float64 vector, or a JSON list of MAX_VALUES numbers written
with up to 23 characters each."""
MAX_JSON_DEPTH = 2
"""An object holding a flat list: arrays and objects nest no deeper in a JSON body."""

SCALE_SHIFT_CXX = r"""
extern "C" __global__ void scale_shift(const float* x, float* y) {
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) {
        y[i] = x[i] * SCALE + SHIFT;
    }
}
"""


def transform_reference(values: np.ndarray[Any, Any]) -> np.ndarray[Any, np.dtype[np.float32]]:
    """What the service computes, in plain numpy (float32 throughout, like the kernels)."""
    x = np.asarray(values, dtype=np.float32)
    y = x * np.float32(SCALE) + np.float32(SHIFT)
    result: np.ndarray[Any, np.dtype[np.float32]] = np.clip(y, np.float32(0.0), np.float32(CEILING))
    return result


def scale_shift_host(arrays: list[np.ndarray[Any, Any]], constants: bytes) -> None:
    """The GPU kernel for the sim backend: y = x * SCALE + SHIFT."""
    x, y = arrays[0].view(np.float32), arrays[1].view(np.float32)
    np.multiply(x, np.float32(SCALE), out=y)
    np.add(y, np.float32(SHIFT), out=y)


def clip_host(arrays: list[np.ndarray[Any, Any]], constants: bytes) -> None:
    """The NPU kernel (sim NPU): z = clip(y, 0, CEILING)."""
    y, z = arrays[0].view(np.float32), arrays[1].view(np.float32)
    np.clip(y, np.float32(0.0), np.float32(CEILING), out=z)


# -- input validation ---------------------------------------------------------------------


Vector = np.ndarray[Any, np.dtype[Any]]
"""A validated request vector: float32, float64 or int32, every value a finite float32."""

_FLOAT32_MAX = float(np.finfo(np.float32).max)
_INT32 = np.iinfo(np.int32)


def _show(value: object, limit: int = 40) -> str:
    """A value for an error message, cut short: a client's value can be megabytes long."""
    if isinstance(value, list | dict):
        return f"a JSON {'array' if isinstance(value, list) else 'object'}"
    text = repr(value)
    if isinstance(value, int) and len(text) > limit:
        return f"an integer of {len(text.lstrip('-'))} digits"
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def parse_json(body: bytes) -> Vector:
    """`{"values": [numbers], "dtype": "float32"}` (dtype optional) -> a validated vector."""
    document = load_json(body, MAX_JSON_DEPTH, 'an object with a flat "values" list of numbers')
    if not isinstance(document, dict) or not isinstance(document.get("values"), list):
        raise RequestRefused(422, 'JSON body must be an object with a "values" list of numbers')
    dtype = document.get("dtype", "float32")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise RequestRefused(422, f"dtype must be one of {', '.join(DTYPES)}, got {_show(dtype)}")
    integral = DTYPES[dtype].kind == "i"
    low, high = (_INT32.min, _INT32.max) if integral else (-_FLOAT32_MAX, _FLOAT32_MAX)
    values = document["values"]
    _check_count(len(values))
    for index, value in enumerate(values):
        # bool is an int; a true/false in a vector of numbers is a client bug.
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise RequestRefused(422, f"values[{index}] must be a number, got {_show(value)}")
        # Python ints have no size limit, so they are checked here, before any conversion.
        if isinstance(value, int) and not low <= value <= high:
            raise RequestRefused(422, f"values[{index}] = {_show(value)} {_range_text(dtype)}")
    vector = np.asarray(values, dtype=np.float64)
    if integral:
        return _check_int32(vector)
    return _check_values(vector)


def _range_text(dtype: str) -> str:
    if dtype == "int32":
        return f"is out of range for int32 ({_INT32.min}..{_INT32.max})"
    return f"is out of float32's range (magnitude at most {_FLOAT32_MAX:.8g})"


def _check_int32(values: Vector) -> Vector:
    """float64 values declared int32: each must be a whole number in int32's range."""
    with np.errstate(invalid="ignore"):
        bad = ~((values >= _INT32.min) & (values <= _INT32.max) & (values == np.trunc(values)))
    if bad.any():
        index = int(np.flatnonzero(bad)[0])
        value = values[index].item()
        if not math.isfinite(value):
            problem = "is not a finite number"
        elif not _INT32.min <= value <= _INT32.max:
            problem = _range_text("int32")
        else:
            problem = "is not a whole number, as int32 values are"
        raise RequestRefused(422, f"values[{index}] = {_show(value)} {problem}")
    return values.astype(np.int32)


def parse_binary(body: bytes, dtype_name: str) -> Vector:
    """Raw little-endian elements of `dtype_name` -> a validated vector over `body` (no copy)."""
    dtype = DTYPES.get(dtype_name)
    if dtype is None:
        raise RequestRefused(
            422, f"X-Dtype must be one of {', '.join(DTYPES)}, got {_show(dtype_name)}"
        )
    if len(body) % dtype.itemsize:
        raise RequestRefused(
            422, f"body has {len(body)} bytes, not a whole number of {dtype_name} elements"
        )
    _check_count(len(body) // dtype.itemsize)
    return _check_values(np.frombuffer(body, dtype=dtype.newbyteorder("<")))


def _check_count(count: int) -> None:
    if count == 0:
        raise RequestRefused(422, "the vector is empty; send 1 or more values")
    if count > MAX_VALUES:
        raise RequestRefused(413, f"the vector has {count} values; at most {MAX_VALUES} allowed")


def _check_values(values: Vector) -> Vector:
    """Every value must be finite as a float32 (checked without converting the vector)."""
    if values.dtype.kind != "f":
        return values  # int32 always fits
    with np.errstate(invalid="ignore"):
        bad = ~(np.abs(values) <= _FLOAT32_MAX)  # NaN compares false: caught too
    if bad.any():
        index = int(np.flatnonzero(bad)[0])
        raise RequestRefused(
            422, f"values[{index}] = {values[index].item()!r} is not a finite float32 number"
        )
    return values


async def read_payload(request: Request) -> tuple[Vector, bool]:
    """The request's vector and whether it came as binary; `RequestRefused` when refused."""
    kind = media_type(request.headers)
    if kind not in ("application/json", "application/octet-stream"):
        raise RequestRefused(
            415, f"Content-Type must be application/json or application/octet-stream, got {kind!r}"
        )
    # Refused at once when declared too large, else counted as it arrives (never held
    # whole past the limit); a client gone mid-body gets a 400 nobody reads, no traceback.
    body = await read_body(request, MAX_BODY_BYTES)
    if kind == "application/json":
        return parse_json(body), False
    return parse_binary(body, request.headers.get("x-dtype", "float32")), True


# -- the runtime side ---------------------------------------------------------------------


@dataclass
class Kernels:
    """The two kernels for `count` values (the GPU kernel's size is compiled in)."""

    count: int
    gpu: hrx.GpuKernel
    npu: hrx.NpuKernel


def load_kernels(rt: hrx.Runtime, count: int) -> Kernels:
    nbytes = count * 4
    contract = hrx.KernelContract(
        [hrx.Binding(nbytes, hrx.Access.READ), hrx.Binding(nbytes, hrx.Access.WRITE)]
    )
    block = 256
    gpu_kernel = rt.load_gpu_kernel(
        hrx.KernelSource(cxx=SCALE_SHIFT_CXX, host=scale_shift_host),
        "scale_shift",
        grid=(math.ceil(count / block), 1, 1),
        block=(block, 1, 1),
        contract=contract,
        defines={"N": count, "SCALE": f"{SCALE}f", "SHIFT": f"{SHIFT}f"},
    )
    npu_kernel = rt.npu(0).load_artifact(hrx.KernelSource(host=clip_host), "clip", 1, contract)
    return Kernels(count, gpu_kernel, npu_kernel)


@dataclass
class SizeClass:
    """Requests of up to `size` values, run `capacity` at a time at most."""

    size: int
    capacity: int
    kernels: dict[int, Kernels]
    """Per batch length k (1, 2, 4, ... capacity): kernels over k * size values."""


@dataclass
class Pipeline:
    """One slot's resources: host staging in and out, and per batch length k a prepared
    graph over the first k requests' values."""

    size: int
    staging_in: hrx.Buffer
    staging_out: hrx.Buffer
    steps: dict[int, hrx.PreparedGraph]

    def step_for(self, requests: int) -> hrx.PreparedGraph:
        return self.steps[min(k for k in self.steps if k >= requests)]


def build_pipeline(rt: hrx.Runtime, size_class: SizeClass) -> Pipeline:
    """upload -> GPU kernel -> NPU kernel -> download, once per batch length."""
    nbytes = size_class.size * size_class.capacity * 4
    staging_in = rt.allocate(nbytes, hrx.HOST_VISIBLE, "staging-in")
    x = rt.allocate(nbytes, hrx.GPU_LOCAL, "x")
    y = rt.allocate(nbytes, hrx.shared(0), "y")
    z = rt.allocate(nbytes, hrx.shared(0), "z")
    staging_out = rt.allocate(nbytes, hrx.HOST_VISIBLE, "staging-out")
    steps: dict[int, hrx.PreparedGraph] = {}
    for k, kernels in size_class.kernels.items():
        used = k * size_class.size * 4
        g = rt.graph(f"transform-{size_class.size}x{k}")
        g.copy(x.view(0, used), staging_in.view(0, used))
        g.gpu(kernels.gpu, [x.view(0, used), y.view(0, used)])
        g.npu(kernels.npu, [y.view(0, used), z.view(0, used)])
        g.copy(staging_out.view(0, used), z.view(0, used))
        steps[k] = g.prepare()
    return Pipeline(size_class.size, staging_in, staging_out, steps)


async def run_batch(slot: Slot[Pipeline], requests: list[Vector]) -> list[bytes]:
    """One submission for a batch: each request's values at its own offset in staging."""
    pipeline = slot.resources
    size = pipeline.size
    # The slot is idle when handed out, so nothing is pending on its staging and the
    # non-waiting maps cannot fail. Converting straight into staging is one pass.
    with pipeline.staging_in.map_write_nowait() as memory:
        staging = np.frombuffer(memory, np.float32)
        for index, values in enumerate(requests):
            start = index * size
            np.copyto(staging[start : start + values.size], values, casting="unsafe")
    await slot.submit(pipeline.step_for(len(requests)))
    with pipeline.staging_out.map_read_nowait() as memory:
        return [
            bytes(memory[index * size * 4 : (index * size + values.size) * 4])
            for index, values in enumerate(requests)
        ]


MAX_BATCH_VALUES = 262144
"""A batch holds at most this many values, so the largest requests run one at a time."""


class Transformer:
    """The app's resources: per size class a slot pool and a batcher in front of it."""

    def __init__(
        self, rt: hrx.Runtime, slots: int, batch: int, sizes: Sequence[int] = SIZE_CLASSES
    ) -> None:
        self.batchers: list[tuple[int, Batcher[Pipeline, Vector, bytes]]] = []
        for size in sorted(sizes):
            capacity = max(1, min(batch, MAX_BATCH_VALUES // size))
            lengths = [1 << i for i in range(capacity.bit_length()) if 1 << i < capacity]
            kernels = {k: load_kernels(rt, k * size) for k in [*lengths, capacity]}
            size_class = SizeClass(size, capacity, kernels)
            pool = SlotPool(rt, slots, pipeline_builder(size_class), f"n{size}")
            self.batchers.append((size, Batcher(pool, capacity, run_batch)))

    def batcher_for(self, count: int) -> Batcher[Pipeline, Vector, bytes]:
        for size, batcher in self.batchers:
            if count <= size:
                return batcher
        raise RequestRefused(413, f"the vector has {count} values; at most {MAX_VALUES} allowed")

    async def run(self, values: Vector) -> bytes:
        """The transform of `values` as float32 bytes."""
        return await self.batcher_for(values.size).submit(values)


def pipeline_builder(size_class: SizeClass) -> Callable[[hrx.Runtime, int], Pipeline]:
    """A slot pool's `build`: every slot of a size class gets its own pipeline."""
    return lambda rt, _index: build_pipeline(rt, size_class)


# -- the app ------------------------------------------------------------------------------


def create_app(backend: str = "auto", slots: int = 4, batch: int = 16) -> FastAPI:
    """The service as a FastAPI app with its own runtime (opened by the app's lifespan).

    `slots` per size class; `batch` requests at most per submission (1: no batching).
    """
    service: RuntimeService[Transformer] = RuntimeService(
        lambda rt: Transformer(rt, slots, batch), backend=backend
    )
    app = FastAPI(title="hrx_async transform service", lifespan=service.lifespan)
    app.state.service = service
    service.add_routes(app)

    @app.post("/v1/transform")
    async def transform(
        request: Request, transformer: Annotated[Transformer, Depends(service.resources_dependency)]
    ) -> Response:
        try:
            values, binary = await read_payload(request)
            result = await transformer.run(values)
        except RequestRefused as exc:
            raise HTTPException(exc.status, exc.detail) from None
        if binary:
            return Response(
                result, media_type="application/octet-stream", headers={"X-Dtype": "float32"}
            )
        return JSONResponse({"values": np.frombuffer(result, np.float32).tolist()})

    return app


app = create_app(
    os.environ.get("HRX_BACKEND", "auto"),
    int(os.environ.get("HRX_SLOTS", "4")),
    int(os.environ.get("HRX_BATCH", "16")),
)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until interrupted. Exit status: 0, 1 (the backend cannot open), 64 (usage)."""
    import uvicorn

    from hrx_async.backends import resolve
    from hrx_async.examples.common import BACKENDS, EXIT_FAILURE, EXIT_OK
    from hrx_async.tools.cli import Parser

    parser = Parser(prog="service.py", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument("--backend", default="auto", choices=BACKENDS, help="GPU backend")
    parser.add_argument("--slots", type=int, default=4, help="slots per size class")
    parser.add_argument("--batch", type=int, default=16, help="requests per submission at most")
    args = parser.parse_args(argv)
    for option in ("slots", "batch"):
        if getattr(args, option) < 1:
            parser.error(f"--{option} must be >= 1, got {getattr(args, option)}")
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be in 0..65535, got {args.port}")
    try:
        # The app opens its runtime when it starts; say now, without a traceback, if it cannot.
        resolve(args.backend)
    except hrx.HrxError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    app = create_app(args.backend, args.slots, args.batch)
    uvicorn.run(app, host=args.host, port=args.port)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
