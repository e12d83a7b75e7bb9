"""Load test: the example service against the same service doing the numpy work directly.

Three servers run side by side, each in its own process with uvicorn:

* runtime:   `examples/service.py` as it is: requests go through slots of the prepared
  upload -> GPU kernel -> NPU kernel -> download graph, batched while slots are busy.
* unbatched: the same with `batch=1`: one submission per request.
* direct:    the same FastAPI app, validation and kernel functions, but the handler calls
  the numpy work itself through `run_in_threadpool` (no runtime).

A separate load process keeps `--clients` HTTP/1.1 keep-alive connections busy for
`--seconds` against one server at a time, first back to back (saturating), then paced at
half the lower throughput; each server records its event-loop lag (`LoopLag`, 1 ms ticks)
during each phase. Rounds run the variants in order, then reversed, and so on; each round
reports the throughput ratios against direct.

    python benchmarks/service_load.py --backend sim
    python benchmarks/service_load.py --backend cuda --sizes 4096 65536 --pairs 5

`serve` and `load` are the subcommands the run uses for its child processes.
"""

# No `from __future__ import annotations`: FastAPI reads the baseline handler's
# annotations, which name classes imported inside a function.

import argparse
import asyncio
import cProfile
import gc
import json
import os
import platform
import pstats
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from example_module import load_example
from http_exchange import exchange

HERE = Path(__file__).resolve().parent
VARIANTS = ("runtime", "unbatched", "direct")
"""The example service (batching), the same with one request per submission, the baseline."""
RUNTIME_VARIANTS = VARIANTS[:2]


# -- servers --------------------------------------------------------------------------------


def direct_app(example: ModuleType) -> Any:
    """The baseline: same validation, same kernel functions, run in Starlette's threadpool."""
    from fastapi import FastAPI, HTTPException, Request, Response
    from fastapi.responses import JSONResponse
    from starlette.concurrency import run_in_threadpool

    def work(values: np.ndarray[Any, Any]) -> bytes:
        # The runtime variant's steps, all in the worker thread: convert into a float32
        # "staging" array, GPU kernel, NPU kernel, and the answer's bytes.
        x = values.astype(np.float32)
        y = np.empty_like(x)
        z = np.empty_like(x)
        example.scale_shift_host([x.view(np.uint8), y.view(np.uint8)], b"")
        example.clip_host([y.view(np.uint8), z.view(np.uint8)], b"")
        return z.tobytes()

    app = FastAPI(title="direct baseline")

    @app.get("/healthz")
    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    @app.post("/v1/transform")
    async def transform(request: Request) -> Response:
        try:
            values, binary = await example.read_payload(request)
        except example.PayloadError as exc:
            raise HTTPException(exc.status, exc.detail) from None
        result = await run_in_threadpool(work, values)
        if binary:
            return Response(
                result, media_type="application/octet-stream", headers={"X-Dtype": "float32"}
            )
        return JSONResponse({"values": np.frombuffer(result, np.float32).tolist()})

    return app


def add_lag_meter(app: Any, gc_freeze: bool = False, profile_to: str | None = None) -> None:
    """POST /lag/start begins a LoopLag on the server's loop; POST /lag/stop ends it and
    answers its summary in milliseconds, with the garbage collector's pauses meanwhile.
    `gc_freeze`: once the app has started, collect and freeze what exists (as
    latency-sensitive services do), so later collections scan only newer objects.
    `profile_to`: also profile the loop's thread (cProfile) from start to stop, and append
    its busiest functions to that file."""
    import anyio
    import anyio.abc
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response

    from hrx_async.tools.benchmark import LoopLag, percentile

    inner: Callable[[Any], AbstractAsyncContextManager[Any]] = app.router.lifespan_context
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[Any]:
        async with inner(app) as value, anyio.create_task_group() as group:
            state["group"] = group
            if gc_freeze:
                gc.collect()
                gc.freeze()
            yield value
            group.cancel_scope.cancel()

    pauses: list[float] = []
    began: list[float] = []

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        # The collector's pauses stop the loop like any blocking call: timed, to tell them
        # apart from the loop's own work.
        if phase == "start":
            began.append(time.perf_counter())
        elif began:
            pauses.append((time.perf_counter() - began.pop()) * 1000.0)

    async def start(request: Request) -> Response:
        lag = LoopLag(0.001)
        scope = anyio.CancelScope()
        pauses.clear()
        gc.callbacks.append(on_gc)
        if profile_to is not None:
            state["profile"] = profile = cProfile.Profile()
            profile.enable()

        async def tick() -> None:
            with scope:
                await lag.run()

        group: anyio.abc.TaskGroup = state["group"]
        group.start_soon(tick)
        state["lag"], state["scope"] = lag, scope
        return JSONResponse({"started": True})

    async def stop(request: Request) -> Response:
        lag, scope = state.pop("lag"), state.pop("scope")
        scope.cancel()
        if on_gc in gc.callbacks:
            gc.callbacks.remove(on_gc)
        samples = sorted(lag.samples_ms)
        profile = state.pop("profile", None)
        if profile is not None and profile_to is not None:
            profile.disable()
            with open(profile_to, "a") as out:
                out.write(f"== {len(samples)} lag samples, p99 {percentile(samples, 99)} ms\n")
                pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(40)
        return JSONResponse(
            {
                "count": len(samples),
                "p50_ms": percentile(samples, 50),
                "p99_ms": percentile(samples, 99),
                "max_ms": samples[-1],
                "gc_pauses": len(pauses),
                "gc_pause_max_ms": round(max(pauses, default=0.0), 3),
                "gc_pause_total_ms": round(sum(pauses), 3),
            }
        )

    app.router.lifespan_context = lifespan
    app.add_route("/lag/start", start, methods=["POST"])
    app.add_route("/lag/stop", stop, methods=["POST"])


def serve(variant: str, backend: str, slots: int, batch: int) -> None:
    import uvicorn

    example = load_example("service.py", "hrx_example_service")
    if variant == "direct":
        app = direct_app(example)
    else:
        app = example.create_app(backend, slots, batch if variant == "runtime" else 1)
    add_lag_meter(app)
    # IPPROTO_TCP explicitly: asyncio turns Nagle off (TCP_NODELAY) only on sockets whose
    # protocol says TCP, and accepted sockets inherit it; with 0 every answer waits ~40 ms.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    print(f"READY {sock.getsockname()[1]}", flush=True)
    server.run(sockets=[sock])


# -- load -----------------------------------------------------------------------------------


async def load(
    port: int, clients: int, seconds: float, size: int, seed: int, rate: float = 0.0
) -> dict[str, Any]:
    """Requests from `clients` connections for `seconds`: back to back, or with `rate` > 0
    each client sends on a fixed schedule so that all together send `rate` per second."""
    example = load_example("service.py", "hrx_example_service")
    rng = np.random.default_rng(seed)
    values = rng.normal(0, 2, size).astype(np.float32)
    expected = example.transform_reference(values).tobytes()
    body = values.tobytes()
    head = (
        "POST /v1/transform HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/octet-stream\r\nX-Dtype: float32\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    request = head + body
    latencies: list[float] = []
    errors: list[str] = []
    checked = 0
    started = time.perf_counter()
    deadline = started + seconds

    async def client(index: int) -> None:
        nonlocal checked
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        period = clients / rate if rate > 0 else 0.0
        due = started + period * index / clients
        try:
            while time.perf_counter() < deadline:
                if period:
                    # Open loop: a late answer delays this client's next request, never the
                    # schedule of the others.
                    await asyncio.sleep(max(0.0, due - time.perf_counter()))
                    due += period
                sent = time.perf_counter()
                status, answer = await exchange(reader, writer, request)
                latencies.append(time.perf_counter() - sent)
                if not status.startswith(b"HTTP/1.1 200"):
                    errors.append(status.decode(errors="replace").strip())
                elif checked < 50 or len(answer) != len(expected):
                    checked += 1
                    if answer != expected:
                        errors.append("wrong result")
        finally:
            writer.close()

    await asyncio.gather(*(client(index) for index in range(clients)))
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "requests": len(latencies),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "seconds": elapsed,
        "rps": len(latencies) / elapsed,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
    }


# -- orchestration --------------------------------------------------------------------------


def start_server(
    variant: str, backend: str, slots: int, batch: int
) -> tuple[subprocess.Popen[str], int]:
    command = [sys.executable, __file__, "serve", variant, "--backend", backend]
    command += ["--slots", str(slots), "--batch", str(batch)]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("READY "):
        process.kill()
        raise RuntimeError(f"{variant} server did not start: {line!r}")
    port = int(line.split()[1])
    for _ in range(100):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                return process, port
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"{variant} server never became healthy")


def post(port: int, path: str) -> dict[str, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method="POST", data=b"")
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, Any] = json.loads(response.read())
        return answer


def run_load(port: int, clients: int, seconds: float, size: int, rate: float) -> dict[str, Any]:
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "load",
            str(port),
            "--clients",
            str(clients),
            "--seconds",
            str(seconds),
            "--size",
            str(size),
            "--rate",
            str(rate),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def phase(port: int, clients: int, seconds: float, size: int, rate: float = 0.0) -> dict[str, Any]:
    post(port, "/lag/start")
    result = run_load(port, clients, seconds, size, rate)
    result["lag"] = post(port, "/lag/stop")
    if result["errors"]:
        raise RuntimeError(f"{result['errors']} bad responses, first: {result['first_error']}")
    return result


def machine() -> str:
    from importlib.metadata import version

    model = platform.processor()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    packages = ", ".join(
        f"{name} {version(name)}" for name in ("numpy", "anyio", "fastapi", "uvicorn")
    )
    return f"{os.cpu_count()} CPUs ({model}), Python {platform.python_version()}, {packages}"


def median(values: Sequence[float]) -> float:
    return float(np.median(values))


def alternating(
    servers: dict[str, tuple[subprocess.Popen[str], int]],
    args: argparse.Namespace,
    size: int,
    rate: float,
) -> dict[str, list[dict[str, Any]]]:
    """`args.pairs` rounds of one phase per variant, in order then reversed, and so on."""
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for index in range(args.pairs):
        order = VARIANTS if index % 2 == 0 else VARIANTS[::-1]
        for variant in order:
            port = servers[variant][1]
            results[variant].append(phase(port, args.clients, args.seconds, size, rate))
    return results


def run(args: argparse.Namespace) -> None:
    slots = {"runtime": args.slots, "unbatched": args.unbatched_slots, "direct": 0}
    servers = {v: start_server(v, args.backend, slots[v], args.batch) for v in VARIANTS}
    try:
        print(f"machine: {machine()}")
        print(
            f"backend {args.backend}; {args.clients} clients; {args.seconds} s per phase; "
            f"{args.pairs} rounds per size and load; runtime: {args.slots} slots per size "
            f"class, batches of up to {args.batch}; unbatched: {args.unbatched_slots} slots"
        )
        for size in args.sizes:
            for variant in VARIANTS:  # warm-up: slots built, code paths hot
                phase(servers[variant][1], args.clients, min(1.0, args.seconds), size)
            saturated = alternating(servers, args, size, 0.0)
            report(size, "back to back (saturating)", saturated)
            # The same clients at half the lower throughput: the loop has room, so its lag
            # shows blocking rather than a full run queue.
            rate = args.paced * min(median([r["rps"] for r in saturated[v]]) for v in VARIANTS)
            report(size, f"paced at {rate:.0f} requests/s", alternating(servers, args, size, rate))
    finally:
        for process, _ in servers.values():
            process.terminate()
            process.wait(20)


def report(size: int, load: str, results: dict[str, list[dict[str, Any]]]) -> None:
    print()
    print(f"### {size} float32 values per request ({size * 4} bytes each way), {load}")
    print()
    print(
        "| variant | requests/s | p50 latency ms | p99 latency ms | loop lag p99 ms | lag max ms |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for variant in VARIANTS:
        rows = results[variant]
        print(
            f"| {variant} | {median([r['rps'] for r in rows]):.0f} "
            f"| {median([r['p50_ms'] for r in rows]):.2f} "
            f"| {median([r['p99_ms'] for r in rows]):.2f} "
            f"| {median([r['lag']['p99_ms'] for r in rows]):.2f} "
            f"| {max(r['lag']['max_ms'] for r in rows):.2f} |"
        )
    print()
    for variant in RUNTIME_VARIANTS:
        ratios = [
            a["rps"] / b["rps"] for a, b in zip(results[variant], results["direct"], strict=True)
        ]
        per_round = " ".join(f"{r:.3f}" for r in ratios)
        print(f"throughput {variant}/direct per round: {per_round} (median {median(ratios):.3f})")
    for variant in VARIANTS:
        rps = " ".join(f"{r['rps']:.0f}" for r in results[variant])
        lag = " ".join(f"{r['lag']['p99_ms']:.2f}" for r in results[variant])
        print(f"{variant}: requests/s per phase {rps}; loop lag p99 ms per phase {lag}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command")
    serve_cmd = commands.add_parser("serve", help="run one server (a child process)")
    serve_cmd.add_argument("variant", choices=VARIANTS)
    load_cmd = commands.add_parser("load", help="generate load (a child process)")
    load_cmd.add_argument("port", type=int)
    for command in (parser, serve_cmd):
        command.add_argument("--backend", default="sim", help="sim, cuda, hip or auto")
        command.add_argument("--slots", type=int, default=4, help="slots per size class")
        command.add_argument("--batch", type=int, default=16, help="requests per submission")
    parser.add_argument("--unbatched-slots", type=int, default=16)
    for command in (parser, load_cmd):
        command.add_argument("--clients", type=int, default=64)
        command.add_argument("--seconds", type=float, default=3.0)
    load_cmd.add_argument("--size", type=int, default=4096)
    load_cmd.add_argument("--seed", type=int, default=1)
    load_cmd.add_argument("--rate", type=float, default=0.0, help="requests/s; 0: no pacing")
    parser.add_argument(
        "--paced",
        type=float,
        default=0.5,
        help="paced phases run at this fraction of the lower saturated throughput",
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 65536])
    parser.add_argument("--pairs", type=int, default=4)
    args = parser.parse_args(argv)
    if args.command == "serve":
        serve(args.variant, args.backend, args.slots, args.batch)
    elif args.command == "load":
        result = asyncio.run(
            load(args.port, args.clients, args.seconds, args.size, args.seed, args.rate)
        )
        print(json.dumps(result))
    else:
        run(args)


if __name__ == "__main__":
    main()
