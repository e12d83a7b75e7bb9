"""Load test of examples/model_server.py against the same model run with numpy in a thread pool.

Both apps are driven in process through httpx's ASGI transport by `--clients` concurrent
clients for `--seconds`, each request carrying 1..8 random images as raw float32. A
probe task sleeps 1 ms at a time and records how late it wakes (event loop lag).
Prints one line per app: requests/s, p50/p99 latency and loop lag p99, and checks every
answer against the numpy reference.

    python benchmarks/model_server_load.py --backend sim --clients 16 --seconds 5
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import numpy as np
from example_module import load_example
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


def numpy_app(example: Any) -> FastAPI:
    weights = example.make_weights()
    limiter = anyio.CapacityLimiter(4)
    app = FastAPI()

    @app.post("/v1/classify")
    async def classify(request: Request) -> JSONResponse:
        body = await request.body()
        images = np.frombuffer(body, np.float32).reshape(-1, 3, 16, 16)
        logits = await anyio.to_thread.run_sync(example.reference, images, weights, limiter=limiter)
        return JSONResponse({"logits": logits.tolist(), "labels": logits.argmax(1).tolist()})

    return app


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[max(0, int(np.ceil(len(ordered) * p / 100)) - 1)] if ordered else float("nan")


async def drive(app: FastAPI, example: Any, clients: int, seconds: float) -> dict[str, Any]:
    weights = example.make_weights()
    latencies: list[float] = []
    lags: list[float] = []
    wrong = 0
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            deadline = time.perf_counter() + seconds

            async def probe() -> None:
                while time.perf_counter() < deadline:
                    start = time.perf_counter()
                    await anyio.sleep(0.001)
                    lags.append(time.perf_counter() - start - 0.001)

            async def worker(seed: int) -> None:
                nonlocal wrong
                rng = np.random.default_rng(seed)
                while time.perf_counter() < deadline:
                    images = rng.standard_normal((int(rng.integers(1, 9)), 3, 16, 16)).astype(
                        np.float32
                    )
                    start = time.perf_counter()
                    reply = await client.post(
                        "/v1/classify",
                        content=images.tobytes(),
                        headers={"content-type": "application/octet-stream"},
                    )
                    latencies.append(time.perf_counter() - start)
                    got = np.array(reply.json()["logits"], np.float32)
                    if not np.allclose(got, example.reference(images, weights), 1e-4, 1e-5):
                        wrong += 1

            async with anyio.create_task_group() as tg:
                tg.start_soon(probe)
                for seed in range(clients):
                    tg.start_soon(worker, seed)
    return {
        "requests_s": round(len(latencies) / seconds, 1),
        "p50_ms": round(percentile(latencies, 50) * 1e3, 3),
        "p99_ms": round(percentile(latencies, 99) * 1e3, 3),
        "loop_lag_p99_ms": round(percentile(lags, 99) * 1e3, 3),
        "wrong": wrong,
    }


async def main(args: argparse.Namespace) -> None:
    example = load_example("model_server.py", "model_server")
    weights = Path(args.weights) if args.weights else None
    results = {
        "hrx": await drive(
            example.create_app(args.backend, weights, args.slots, generate_weights=weights is None),
            example,
            args.clients,
            args.seconds,
        ),
        "numpy_threads": await drive(numpy_app(example), example, args.clients, args.seconds),
    }
    for name, result in results.items():
        print(name, " ".join(f"{k}={v}" for k, v in result.items()))
    if args.json:
        Path(args.json).write_text(json.dumps({"backend": args.backend, **results}, indent=2))
    if any(r["wrong"] for r in results.values()):
        raise SystemExit("some answers did not match the numpy reference")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="sim")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--weights", default=None)
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--loop", default="asyncio", choices=["asyncio", "trio"])
    arguments = parser.parse_args()
    anyio.run(main, arguments, backend=arguments.loop)
