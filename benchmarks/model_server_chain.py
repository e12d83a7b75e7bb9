"""Image requests through examples/model_server.py's `ModelServer.classify_image`, in
process: `--clients` concurrent clients for `--requests` requests in all, each 1..8 u8
pictures of 24x20. Prints one JSON line: requests/s, p50/p99 latency (ms) and host bytes
copied per request (uploads + downloads + host-side copies, from the runtime's counters),
and checks every answer (logits, and labels where the server takes them on the device)
against the numpy reference.

    python benchmarks/model_server_chain.py --backend sim --clients 8 --requests 400
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np
from model_server_load import load_example

import hrx_async as hrx

HOST_FIELDS = ("uploaded_bytes", "downloaded_bytes", "host_copied_bytes")


async def main(args: argparse.Namespace) -> dict[str, Any]:
    ms = load_example()
    path = Path(tempfile.mkdtemp()) / "weights.safetensors"
    ms.write_weights(path)
    weights = ms.make_weights()
    rng = np.random.default_rng(7)
    shape = (24, 20)
    latencies: list[float] = []
    async with hrx.Runtime(args.backend) as rt:
        server = ms.ModelServer(rt, path, args.slots)
        warm = rng.integers(0, 256, (8, *shape, 3), dtype=np.uint8)
        for n in (1, 2, 4, 8):
            await server.classify_image(warm[:n])
        before = rt.statistics().to_dict()
        remaining = args.requests

        async def client() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                n = int(rng.integers(1, 9))
                pictures = rng.integers(0, 256, (n, *shape, 3), dtype=np.uint8)
                start = time.perf_counter()
                answer = await server.classify_image(pictures)
                latencies.append(time.perf_counter() - start)
                logits, labels = answer if isinstance(answer, tuple) else (answer, None)
                want = ms.reference(ms.preprocess(pictures), weights)
                assert np.allclose(logits, want, rtol=1e-3, atol=1e-3), "wrong answer"
                if labels is not None:  # labels taken on the device
                    assert labels.tolist() == want.argmax(axis=1).tolist(), "wrong label"

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(args.clients):
                tg.start_soon(client)
        elapsed = time.perf_counter() - start
        after = rt.statistics().to_dict()
        await server.close()
    host = sum(after[f] - before[f] for f in HOST_FIELDS)
    lat = np.array(latencies) * 1e3
    return {
        "label": args.label,
        "backend": args.backend,
        "requests": len(latencies),
        "requests_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(float(np.percentile(lat, 50)), 3),
        "p99_ms": round(float(np.percentile(lat, 99)), 3),
        "host_bytes_per_request": round(host / len(latencies), 1),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="sim")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--label", default="")
    print(json.dumps(anyio.run(main, parser.parse_args())))
