"""Load test: a PyTorch classifier served three ways, as users write it today and with hrx_async.

Every server does the same pipeline for a picture sent as raw u8 HWC pixels (POST
/v1/classify with X-Image-Shape) or, with `--encoding jpeg|png`, as a file that each server
decodes with Pillow on a worker thread: decode -> resize to `--size` (bilinear, half-pixel,
rounded to u8 levels) -> normalize (ImageNet mean/std) -> torchvision classifier (random
weights from the example's seed, eval mode) -> softmax, top-5 -> the 5 classes and scores
back on the host, answered as JSON:

* threads:    FastAPI with a plain `def` endpoint, which FastAPI runs in its thread pool:
  `torch.from_numpy(...).to("cuda")`, `interpolate`, normalize, the model, `.cpu()`. One
  request at a time per thread, all on PyTorch's default stream; `.cpu()` blocks the thread.
* event_poll: an `async def` endpoint issuing the same PyTorch work on one of `--streams`
  CUDA streams (pinned input, non-blocking copies both ways), then polling a
  `torch.cuda.Event` with `await asyncio.sleep(0)` until the answer is on the host: the
  loop never blocks on the GPU, but every waiting request spins it.
* runtime:    `examples/torch_classifier.py`: the upload, ImageOps' resize and normalize
  kernels, the model as a captured PyTorch region on the compute lane's stream and the
  download of the answer are one prepared graph per batch size; requests that arrive
  while every slot is busy are batched (`Batcher`, up to `--batch`). Every slot prepares
  its graphs for the benchmark's picture size at start-up, as a service that knows the
  sizes it gets does (`--no-prepare`: each on its first batch, on the loop, instead).

What is measured, and why: requests/s and p50/p99 latency seen by `--clients` HTTP/1.1
keep-alive connections (1, 8 and 64 by default) driven from a separate process over
loopback for `--seconds` per phase, so the client's work never shares the servers' loop or
GIL; and each server's event-loop lag (a 1 ms ticker inside the server, its p99 and
maximum lateness), which shows how long the loop could not answer anything else (a health
check, another request's bytes), with the garbage collector's pauses meanwhile
(`--gc-freeze` freezes every server's start-up objects, so collections scan fewer). Each
server runs in its own process with uvicorn; phases alternate between the servers (in
order, then reversed, for `--rounds` rounds) after a warm-up phase each, so drift on the
machine spreads over all three. Before any load every server's answer for the benchmark's
picture is checked against the same pipeline run eagerly on the CPU (ImageOps' resize
maths in numpy, the same model), and during load every answer must be a 200; those naming
other classes than that first one are counted (`other_answers`: a GPU may order near ties
differently in another batch size).

Output: the command line and the machine, one JSON line per (server, clients) with the
medians over the rounds (and each round's requests/s), then a markdown table.

    python benchmarks/torch_service_load.py --backend cuda
    python benchmarks/torch_service_load.py --backend cuda --clients 1 8 64 --seconds 5 --rounds 3
    python benchmarks/torch_service_load.py --backend sim --size 64 --seconds 1 --clients 1 8

On `--backend sim` only the runtime server runs (the model on the CPU with CPU PyTorch):
threads and event_poll issue their work to a CUDA GPU directly and are skipped, with a
note. `serve` and `load` are the subcommands the run uses for its child processes.
"""

# No `from __future__ import annotations`: FastAPI reads the baseline handlers' annotations.

import argparse
import asyncio
import itertools
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any

import numpy as np
from example_module import load_example
from http_exchange import exchange

from hrx_async.serve import RequestRefused, media_type, raw_pixels

HERE = Path(__file__).resolve().parent
VARIANTS = ("threads", "event_poll", "runtime")
"""The plain `def` endpoint, the async endpoint polling a CUDA event, this runtime."""
GPU_ONLY = VARIANTS[:2]
READY_TIMEOUT_S = 180.0
"""Import PyTorch, open CUDA, build and warm the model: a server may take this long."""


ENCODINGS = {"raw": "application/octet-stream", "jpeg": "image/jpeg", "png": "image/png"}
"""How a request carries its picture (`--encoding`), and the content type it says so with."""
FORMATS = {"jpeg": "JPEG", "png": "PNG"}


def picture_of(shape: tuple[int, int], seed: int, encoding: str = "raw") -> np.ndarray[Any, Any]:
    """The benchmark's picture, u8 RGB pixels of `shape` (height, width): random for raw
    pixels (their size does not depend on them); for a file, a smooth scene with a little
    grain, which compresses as photographs do (noise would not)."""
    rng = np.random.default_rng(seed)
    if encoding == "raw":
        return rng.integers(0, 256, (*shape, 3), dtype=np.uint8)
    y, x = np.mgrid[0 : shape[0], 0 : shape[1]] / max(shape)
    channels = []
    for _ in range(3):
        fx, fy, phase = rng.uniform(1, 6, 3)
        channels.append(np.sin(2 * np.pi * (fx * x + fy * y) + phase))
    scene = (np.stack(channels, -1) * 0.5 + 0.5) * 235 + rng.normal(0, 4, (*shape, 3))
    return np.clip(scene, 0, 255).astype(np.uint8)


def body_of(picture: np.ndarray[Any, Any], encoding: str) -> bytes:
    """The request body carrying `picture`."""
    if encoding == "raw":
        return picture.tobytes()
    import io

    from PIL import Image

    out = io.BytesIO()
    options = {"quality": 90} if encoding == "jpeg" else {}
    Image.fromarray(picture).save(out, FORMATS[encoding], **options)
    return out.getvalue()


def request_headers(shape: tuple[int, int], encoding: str) -> dict[str, str]:
    headers = {"Content-Type": ENCODINGS[encoding]}
    if encoding == "raw":
        headers["X-Image-Shape"] = f"{shape[0]},{shape[1]},3"
    return headers


def baseline_pictures(
    example: ModuleType, body: bytes, headers: Any, max_side: int
) -> np.ndarray[Any, Any]:
    """A baseline server's pictures from its request, as the runtime example reads them (a
    worker thread runs this for files)."""
    image_format = example.IMAGE_TYPES.get(media_type(headers))
    if image_format is not None:
        pictures: np.ndarray[Any, Any] = example.decode_file(body, image_format, max_side)
        return pictures
    return raw_pixels(body, headers.get("x-image-shape"), None, max_side, 16)


# -- servers --------------------------------------------------------------------------------


def threads_app(
    example: ModuleType, model_name: str, size: int, max_side: int, device: str = "cuda"
) -> Any:
    """(a) A plain `def` endpoint: FastAPI runs it in its thread pool (anyio's, 40 threads),
    eagerly: PyTorch's default stream, a blocking copy in, `.cpu()` out. Answers are made
    as the runtime's are (a JSONResponse), so only the serving path differs."""
    import torch
    from fastapi import Depends, FastAPI, HTTPException, Request
    from fastapi.responses import JSONResponse

    model = example.build_model(model_name, device)
    app = FastAPI(title="threads baseline")

    async def read_body(request: Request) -> bytes:
        return await request.body()

    @app.get("/healthz")
    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    @app.post("/v1/classify")
    def classify(request: Request, body: Annotated[bytes, Depends(read_body)]) -> JSONResponse:
        try:
            pictures = baseline_pictures(example, body, request.headers, max_side)
        except RequestRefused as exc:
            raise HTTPException(exc.status, exc.detail) from None
        with torch.inference_mode():
            x = torch.from_numpy(pictures).to(device)
            scores, classes = example.top5(model, example.torch_preprocess(x, size))
            answer = {"classes": classes.cpu().tolist(), "scores": scores.cpu().tolist()}
        return JSONResponse({**answer, "model": model_name})

    return app


def event_poll_app(
    example: ModuleType,
    model_name: str,
    size: int,
    max_side: int,
    streams: int,
    device: str = "cuda",
) -> Any:
    """(b) An `async def` endpoint: the work on one of `streams` streams in turn, then
    `sleep(0)` until an event recorded after it has passed."""
    import torch
    from fastapi import FastAPI, HTTPException, Request
    from fastapi.responses import JSONResponse

    model = example.build_model(model_name, device)
    pool = itertools.cycle([torch.cuda.Stream() for _ in range(streams)])
    app = FastAPI(title="event-poll baseline")

    @app.get("/healthz")
    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    @app.post("/v1/classify")
    async def classify(request: Request) -> JSONResponse:
        body = await request.body()
        try:
            if media_type(request.headers) in example.IMAGE_TYPES:
                pictures = await asyncio.to_thread(
                    baseline_pictures, example, body, request.headers, max_side
                )
            else:
                pictures = baseline_pictures(example, body, request.headers, max_side)
        except RequestRefused as exc:
            raise HTTPException(exc.status, exc.detail) from None
        n = len(pictures)
        with torch.inference_mode(), torch.cuda.stream(next(pool)):
            staged = torch.from_numpy(pictures).pin_memory()
            x = staged.to(device, non_blocking=True)
            scores, classes = example.top5(model, example.torch_preprocess(x, size))
            scores_host = torch.empty((n, example.TOP), pin_memory=True)
            classes_host = torch.empty((n, example.TOP), dtype=torch.int64, pin_memory=True)
            scores_host.copy_(scores, non_blocking=True)
            classes_host.copy_(classes, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
        while not done.query():
            await asyncio.sleep(0)
        answer = {"classes": classes_host.tolist(), "scores": scores_host.tolist()}
        return JSONResponse({**answer, "model": model_name})

    return app


def serve(variant: str, args: argparse.Namespace) -> None:
    import warnings

    import uvicorn
    from service_load import add_lag_meter

    # The request body is read-only bytes; PyTorch warns that it could not write to it.
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    example = load_example("torch_classifier.py", "torch_classifier_example")
    if variant == "threads":
        app = threads_app(example, args.model, args.size, args.max_side)
    elif variant == "event_poll":
        app = event_poll_app(example, args.model, args.size, args.max_side, args.streams)
    else:
        options = {"slots": args.slots, "batch": args.batch, "max_side": args.max_side}
        pictures = [] if args.no_prepare else [args.picture]
        app = example.create_app(args.backend, args.model, args.size, pictures=pictures, **options)
    profile_to = f"{args.profile_loop}/{variant}.txt" if args.profile_loop else None
    add_lag_meter(app, args.gc_freeze, profile_to)
    # IPPROTO_TCP explicitly: asyncio turns Nagle off (TCP_NODELAY) only on sockets whose
    # protocol says TCP, and accepted sockets inherit it; with 0 every answer waits ~40 ms.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="on", http=args.http
    )
    print(f"READY {sock.getsockname()[1]}", flush=True)
    uvicorn.Server(config).run(sockets=[sock])


# -- load (a child process: numpy and asyncio only) -----------------------------------------


async def load(
    port: int,
    clients: int,
    seconds: float,
    shape: tuple[int, int],
    seed: int,
    expect: str,
    encoding: str,
) -> dict[str, Any]:
    """Requests back to back from `clients` keep-alive connections for `seconds`. Each
    answer must be 200 (else an error); one naming other classes than `expect` (JSON) is
    counted, not refused: a GPU may order near ties differently in another batch size."""
    body = body_of(picture_of(shape, seed, encoding), encoding)
    fields = "".join(f"{k}: {v}\r\n" for k, v in request_headers(shape, encoding).items())
    head = (
        f"POST /v1/classify HTTP/1.1\r\nHost: 127.0.0.1\r\n{fields}"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    request = head + body
    expected = json.loads(expect)
    latencies: list[float] = []
    errors: list[str] = []
    others = 0
    started = time.perf_counter()
    deadline = started + seconds

    async def client() -> None:
        nonlocal others
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.perf_counter() < deadline:
                sent = time.perf_counter()
                status, answer = await exchange(reader, writer, request)
                latencies.append(time.perf_counter() - sent)
                if not status.startswith(b"HTTP/1.1 200"):
                    errors.append(f"{status.decode(errors='replace').strip()}: {answer[:200]!r}")
                elif json.loads(answer)["classes"] != [expected]:
                    others += 1
        finally:
            writer.close()

    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "requests": len(latencies),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "other_answers": others,
        "seconds": elapsed,
        "rps": len(latencies) / elapsed,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
    }


# -- orchestration --------------------------------------------------------------------------


def start_servers(variants: Sequence[str], args: argparse.Namespace) -> dict[str, Any]:
    """Every server started at once; each answers /healthz once its model is ready."""
    options = ["--backend", args.backend, "--model", args.model, "--size", str(args.size)]
    options += ["--slots", str(args.slots), "--batch", str(args.batch)]
    options += ["--streams", str(args.streams), "--max-side", str(args.max_side)]
    options += ["--picture", f"{args.picture[0]}x{args.picture[1]}"]
    options += ["--no-prepare"] * args.no_prepare + ["--gc-freeze"] * args.gc_freeze
    options += ["--profile-loop", args.profile_loop] if args.profile_loop else []
    options += ["--http", args.http]
    started = {
        variant: subprocess.Popen(
            [sys.executable, __file__, "serve", variant, *options],
            stdout=subprocess.PIPE,
            text=True,
        )
        for variant in variants
    }
    servers: dict[str, Any] = {}
    try:
        for variant, process in started.items():
            assert process.stdout is not None
            line = process.stdout.readline()
            if not line.startswith("READY "):
                raise RuntimeError(f"the {variant} server did not start: {line!r}")
            servers[variant] = (process, int(line.split()[1]))
        deadline = time.monotonic() + READY_TIMEOUT_S
        for variant, (process, port) in servers.items():
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                        break
                except OSError:
                    if process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"the {variant} server never became healthy") from None
                    time.sleep(0.2)
    except BaseException:
        for process in started.values():
            process.kill()
        raise
    return servers


def request(
    port: int, path: str, data: bytes | None = None, headers: dict[str, str] | None = None
) -> Any:
    method = "GET" if data is None else "POST"
    call = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data, headers or {}, method=method
    )
    with urllib.request.urlopen(call, timeout=60) as response:
        return json.loads(response.read())


def check(servers: dict[str, Any], args: argparse.Namespace, example: ModuleType) -> dict[str, Any]:
    """Each server's answer for the picture, checked against the pipeline run eagerly on the
    CPU (ImageOps' maths in numpy, the same model): each class it names must have the score
    it gives. GPU convolutions (TF32 by default in PyTorch) allow a 5% difference."""
    import torch

    picture = picture_of(args.picture, args.seed, args.encoding)
    body = body_of(picture, args.encoding)
    if args.encoding != "raw":  # what every server decodes
        picture = example.decode_file(body, FORMATS[args.encoding], args.max_side)[0]
    model = example.build_model(args.model, "cpu")
    x = torch.from_numpy(example.reference_preprocess(picture[None], args.size))
    with torch.inference_mode():
        probabilities = torch.softmax(model(x), 1)[0].numpy()
    answers: dict[str, Any] = {}
    headers = request_headers(args.picture, args.encoding)
    for variant, (_, port) in servers.items():
        answer = request(port, "/v1/classify", body, headers)
        classes, scores = answer["classes"][0], answer["scores"][0]
        if not np.allclose(scores, probabilities[classes], rtol=0.05, atol=1e-3):
            raise RuntimeError(
                f"{variant} answered {answer}; the CPU reference gives those classes "
                f"{probabilities[classes].tolist()}"
            )
        answers[variant] = classes
    return answers


def phase(
    variant: str, port: int, clients: int, seconds: float, args: argparse.Namespace, expect: Any
) -> dict[str, Any]:
    """One load phase against one server, with its loop lag and (runtime) batching."""
    stats = "/v1/classifier/stats"
    before = request(port, stats) if variant == "runtime" else None
    request(port, "/lag/start", b"")
    command = [sys.executable, __file__, "load", str(port), "--clients", str(clients)]
    command += ["--seconds", str(seconds), "--picture", "x".join(map(str, args.picture))]
    command += ["--seed", str(args.seed), "--expect", json.dumps(expect)]
    command += ["--encoding", args.encoding]
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(out.stdout)
    result["lag"] = request(port, "/lag/stop", b"")
    if before is not None:
        after = request(port, stats)
        batches = after["batches"] - before["batches"]
        result["mean_batch"] = (after["pictures"] - before["pictures"]) / max(1, batches)
    if result["errors"]:
        raise RuntimeError(
            f"{variant}: {result['errors']} bad answers, first: {result['first_error']}"
        )
    return result


def machine(backend: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    model = platform.processor()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    found = []
    for name in ("torch", "torchvision", "numpy", "fastapi", "uvicorn", "uvloop"):
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            found.append(f"{name} (not installed)")
    gpu = ""
    if backend != "sim":
        import torch

        gpu = f"; GPU {torch.cuda.get_device_name(0)}"
    return (
        f"{os.cpu_count()} CPUs ({model}){gpu}; Python {platform.python_version()}; "
        + ", ".join(found)
    )


def median(values: Sequence[float]) -> float:
    return float(np.median(values))


def summary(
    variant: str, clients: int, rows: list[dict[str, Any]], args: argparse.Namespace
) -> dict[str, Any]:
    line: dict[str, Any] = {
        "server": variant,
        "clients": clients,
        "backend": args.backend,
        "model": args.model,
        "size": args.size,
        "picture": "x".join(map(str, args.picture)),
        "encoding": args.encoding,
        "requests_per_s": round(median([r["rps"] for r in rows]), 1),
        "p50_ms": round(median([r["p50_ms"] for r in rows]), 3),
        "p99_ms": round(median([r["p99_ms"] for r in rows]), 3),
        "loop_lag_p99_ms": round(median([r["lag"]["p99_ms"] for r in rows]), 3),
        "loop_lag_max_ms": round(max(r["lag"]["max_ms"] for r in rows), 3),
        "gc_pauses": sum(r["lag"]["gc_pauses"] for r in rows),
        "gc_pause_max_ms": max(r["lag"]["gc_pause_max_ms"] for r in rows),
        "gc_frozen": args.gc_freeze,
        "http": args.http,
        "requests": sum(r["requests"] for r in rows),
        "other_answers": sum(r["other_answers"] for r in rows),
        "rounds_requests_per_s": [round(r["rps"], 1) for r in rows],
    }
    if variant == "runtime":
        line["mean_batch"] = round(median([r["mean_batch"] for r in rows]), 2)
    return line


def table(lines: list[dict[str, Any]]) -> str:
    out = [
        "| server | clients | requests/s | p50 ms | p99 ms | loop lag p99 ms | lag max ms |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in lines:
        batch = f" (batches of {r['mean_batch']:.1f})" if "mean_batch" in r else ""
        out.append(
            f"| {r['server']}{batch} | {r['clients']} | {r['requests_per_s']:.0f} "
            f"| {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['loop_lag_p99_ms']:.2f} "
            f"| {r['loop_lag_max_ms']:.2f} |"
        )
    return "\n".join(out)


def run(args: argparse.Namespace, example: ModuleType) -> None:
    variants = [v for v in VARIANTS if args.backend != "sim" or v not in GPU_ONLY]
    print(f"command: {shlex.join([Path(sys.executable).name, *sys.argv])}")
    print(f"machine: {machine(args.backend)}")
    if args.backend == "sim":
        print(
            "note: threads and event_poll issue their PyTorch work to a CUDA GPU directly: "
            "skipped on sim; the runtime runs the model with CPU PyTorch"
        )
    print(
        f"pipeline: {args.picture[0]}x{args.picture[1]} picture ({args.encoding}, "
        f"{len(body_of(picture_of(args.picture, args.seed, args.encoding), args.encoding))} "
        f"bytes) -> {args.size}x{args.size} "
        f"-> {args.model} -> top-5; runtime: {args.slots} slots, batches of up to "
        f"{args.batch}; event_poll: {args.streams} streams; {args.seconds} s per phase, "
        f"{args.rounds} rounds",
        flush=True,
    )
    servers = start_servers(variants, args)
    lines: list[dict[str, Any]] = []
    try:
        expect = check(servers, args, example)
        for clients in args.clients:
            for variant in variants:  # warm-up: slots and graphs built, code paths hot
                phase(variant, servers[variant][1], clients, args.warmup, args, expect[variant])
            results: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
            for index in range(args.rounds):
                for variant in variants if index % 2 == 0 else variants[::-1]:
                    port = servers[variant][1]
                    row = phase(variant, port, clients, args.seconds, args, expect[variant])
                    results[variant].append(row)
            for variant in variants:
                line = summary(variant, clients, results[variant], args)
                lines.append(line)
                print(json.dumps(line), flush=True)
    finally:
        for process, _ in servers.values():
            process.terminate()
        for process, _ in servers.values():
            process.wait(30)
    print()
    print(table(lines))
    if args.json:
        with open(args.json, "w") as out:
            for line in lines:
                out.write(json.dumps(line) + "\n")


def picture_shape(text: str) -> tuple[int, int]:
    try:
        height, width = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a picture size is HEIGHTxWIDTH, got {text!r}") from None
    if height < 1 or width < 1:
        raise argparse.ArgumentTypeError(f"a picture needs at least one pixel, got {text!r}")
    return height, width


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command")
    serve_cmd = commands.add_parser("serve", help="run one server (a child process)")
    serve_cmd.add_argument("variant", choices=VARIANTS)
    load_cmd = commands.add_parser("load", help="generate load (a child process)")
    load_cmd.add_argument("port", type=int)
    load_cmd.add_argument("--clients", type=int, default=8)
    load_cmd.add_argument("--expect", required=True, help="the classes every answer names")
    for command in (parser, serve_cmd):
        command.add_argument("--backend", default="cuda", help="cuda, or sim (runtime only)")
        command.add_argument("--model", default="resnet18", help="resnet18 or resnet50")
        command.add_argument("--size", type=int, default=224, help="model input side, pixels")
        command.add_argument("--slots", type=int, default=4, help="runtime: slots")
        command.add_argument("--batch", type=int, default=16, help="runtime: pictures per batch")
        command.add_argument("--streams", type=int, default=4, help="event_poll: CUDA streams")
        command.add_argument("--max-side", type=int, default=640, help="largest picture side")
        command.add_argument(
            "--no-prepare",
            action="store_true",
            help="runtime: prepare no graphs at start-up (each on its first batch instead)",
        )
        command.add_argument(
            "--gc-freeze",
            action="store_true",
            help="every server: gc.collect(); gc.freeze() once started",
        )
        command.add_argument(
            "--http",
            choices=("auto", "h11", "httptools"),
            default="auto",
            help="every server: uvicorn's HTTP parser (auto: httptools where installed)",
        )
        command.add_argument(
            "--profile-loop",
            default=None,
            metavar="DIR",
            help="every server profiles its loop thread in each phase: DIR/SERVER.txt",
        )
    for command in (parser, serve_cmd, load_cmd):
        command.add_argument("--seconds", type=float, default=3.0, help="per phase")
        command.add_argument("--picture", type=picture_shape, default=(480, 640))
        command.add_argument("--seed", type=int, default=1, help="of the random picture")
        command.add_argument(
            "--encoding",
            choices=tuple(ENCODINGS),
            default="raw",
            help="how requests carry the picture: raw u8 pixels, or a JPEG or PNG file",
        )
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--rounds", type=int, default=2, help="phases per server and clients")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds of warm-up load")
    parser.add_argument("--json", default=None, help="also write the JSON lines here")
    args = parser.parse_args(argv)
    if args.command == "serve":
        serve(args.variant, args)
    elif args.command == "load":
        result = asyncio.run(
            load(
                args.port,
                args.clients,
                args.seconds,
                args.picture,
                args.seed,
                args.expect,
                args.encoding,
            )
        )
        print(json.dumps(result))
    else:
        if args.backend not in ("cuda", "sim"):
            parser.error(f"--backend must be cuda or sim, got {args.backend!r}")
        if max(args.picture) > args.max_side:
            parser.error(f"--picture {args.picture} is larger than --max-side {args.max_side}")
        example = load_example("torch_classifier.py", "torch_classifier_example")
        try:
            example.import_torch()
        except example.MissingLibrary as exc:
            parser.exit(1, f"{parser.prog}: error: {exc}\n")
        run(args, example)


if __name__ == "__main__":
    main()
