"""Serving: the example app through httpx against ASGI, and the same app in a real uvicorn.

The in-process tests run the app's lifespan and talk to it with httpx's ASGI transport,
on asyncio and on trio. The real-server test starts uvicorn with the example in a
subprocess on a free port, sends a bounded concurrent burst from this process, checks
every answer and stops the server with SIGINT, expecting a drained runtime.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

import hrx_async as hrx  # noqa: E402
from hrx_async.serve import (  # noqa: E402
    PROMETHEUS_CONTENT_TYPE,
    RuntimeService,
    prometheus_text,
    runtime_threads,
)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "service.py"

pytestmark = pytest.mark.anyio


def load_example() -> ModuleType:
    name = "hrx_example_service"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@asynccontextmanager
async def serving(
    slots: int = 4, batch: int = 16
) -> AsyncIterator[tuple[Any, Any, RuntimeService[Any]]]:
    """The example app with its lifespan running, and an httpx client on it."""
    example = load_example()
    app = example.create_app("sim", slots, batch)
    service: RuntimeService[Any] = app.state.service
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://service") as client:
            yield example, client, service
    assert service.shutdown_report is not None and service.shutdown_report.drained


def binary_request(values: np.ndarray[Any, Any]) -> dict[str, Any]:
    return {
        "content": values.tobytes(),
        "headers": {"content-type": "application/octet-stream", "x-dtype": values.dtype.name},
    }


@pytest.mark.parametrize(("slots", "batch"), [(3, 1), (1, 16)])
async def test_concurrent_requests_get_correct_results(
    anyio_backend: str, slots: int, batch: int
) -> None:
    rng = np.random.default_rng(7)
    sizes = [1, 3, 1023, 1024, 1025, 4000, 16384, 16385, 70000, *rng.integers(1, 3000, 40)]
    dtypes = [np.float32, np.float64, np.int32]
    async with serving(slots, batch) as (example, client, service):
        results: dict[int, tuple[np.ndarray[Any, Any], bytes | list[float]]] = {}

        async def one(index: int, size: int) -> None:
            values = rng.normal(0, 3, int(size)).astype(dtypes[index % 3])
            if index % 4 == 0:
                response = await client.post("/v1/transform", json={"values": values.tolist()})
                assert response.status_code == 200, response.text
                results[index] = (values, response.json()["values"])
            else:
                response = await client.post("/v1/transform", **binary_request(values))
                assert response.status_code == 200, response.text
                assert response.headers["x-dtype"] == "float32"
                results[index] = (values, response.content)

        async with anyio.create_task_group() as tg:
            for index, size in enumerate(sizes):
                tg.start_soon(one, index, size)
        assert len(results) == len(sizes)
        for values, answer in results.values():
            expected = example.transform_reference(values)
            got = (
                np.frombuffer(answer, np.float32)
                if isinstance(answer, bytes)
                else np.asarray(answer, np.float32)
            )
            np.testing.assert_array_equal(got, expected)
        batchers = [b for _, b in service.resources.batchers]
        stats = service.statistics()
        assert sum(b.items for b in batchers) == len(sizes)
        assert stats.submissions == stats.completions == sum(b.batches for b in batchers)
        if batch == 1:
            assert stats.submissions == len(sizes)
        else:
            # One slot per class: requests that came while it was busy shared submissions.
            assert stats.submissions < len(sizes)
        # Per size class `slots` slots of 5 buffers, however many requests.
        assert stats.allocations <= slots * len(example.SIZE_CLASSES) * 5


BAD_PAYLOADS: list[tuple[str, dict[str, Any], int]] = [
    ("not json", {"content": b"{nope", "headers": {"content-type": "application/json"}}, 400),
    ("no values", {"json": {"vals": [1]}}, 422),
    ("values not a list", {"json": {"values": 3}}, 422),
    ("empty", {"json": {"values": []}}, 422),
    ("a string", {"json": {"values": [1, "2"]}}, 422),
    ("a bool", {"json": {"values": [1, True]}}, 422),
    ("nested", {"json": {"values": [[1.0]]}}, 422),
    ("bad dtype", {"json": {"values": [1], "dtype": "complex64"}}, 422),
    ("overflow", {"json": {"values": [1e39]}}, 422),
    ("too many", {"json": {"values": [0.0] * 262145}}, 413),
    (
        "nan bytes",
        binary_request(np.array([1.0, np.nan], np.float32)),
        422,
    ),
    (
        "ragged bytes",
        {"content": b"\x00" * 7, "headers": {"content-type": "application/octet-stream"}},
        422,
    ),
    (
        "unknown x-dtype",
        {
            "content": b"\x00" * 8,
            "headers": {"content-type": "application/octet-stream", "x-dtype": "uint8"},
        },
        422,
    ),
    (
        "no bytes",
        {"content": b"", "headers": {"content-type": "application/octet-stream"}},
        422,
    ),
    (
        "too many bytes",
        binary_request(np.zeros(262145, np.float32)),
        413,
    ),
    (
        "over the body limit",
        {
            "content": b"\x00" * (262144 * 24 + 8),
            "headers": {"content-type": "application/octet-stream", "x-dtype": "float64"},
        },
        413,
    ),
    ("text", {"content": b"1,2", "headers": {"content-type": "text/plain"}}, 415),
]


async def test_bad_payloads_get_4xx_and_leave_the_runtime_alone(anyio_backend: str) -> None:
    async with serving() as (_, client, service):
        for warm in (False, True):
            if warm:
                response = await client.post("/v1/transform", json={"values": [1.0, 2.0]})
                assert response.status_code == 200
            before = service.statistics()
            for name, request, status in BAD_PAYLOADS:
                response = await client.post("/v1/transform", **request)
                assert response.status_code == status, (name, response.text)
                assert response.json()["detail"], name
            assert service.statistics() == before
            assert (await client.get("/healthz")).status_code == 200


async def test_stats_and_metrics_report_the_runtime(anyio_backend: str) -> None:
    async with serving() as (_, client, service):
        for _ in range(3):
            assert (await client.post("/v1/transform", json={"values": [0.5]})).status_code == 200
        stats = await client.get("/stats")
        assert stats.status_code == 200
        assert stats.json() == service.statistics().to_dict()
        assert stats.json()["submissions"] == 3
        metrics = await client.get("/metrics")
        assert metrics.status_code == 200
        assert metrics.headers["content-type"] == PROMETHEUS_CONTENT_TYPE
        samples = dict(
            line.split(" ") for line in metrics.text.splitlines() if not line.startswith("#")
        )
        assert samples["hrx_submissions_total"] == "3"
        assert samples["hrx_healthy"] == "1"
        assert int(samples["hrx_live_bytes"]) == service.statistics().live_bytes > 0


async def test_device_lost_fails_health_and_requests(anyio_backend: str) -> None:
    async with serving() as (_, client, service):
        assert (await client.get("/healthz")).json() == {
            "ok": True,
            "state": "running",
            "backend": "sim",
        }
        rt = service.runtime

        def sticky_failure(arrays: list[Any], constants: bytes) -> None:
            raise hrx.DeviceLost("forced: the device fell off the bus")

        scratch = rt.allocate(64, hrx.GPU_LOCAL)
        kernel = rt.load_gpu_kernel(
            hrx.KernelSource(host=sticky_failure),
            "sticky",
            (1,),
            (1,),
            hrx.KernelContract([hrx.Binding(64, hrx.Access.WRITE)]),
        )
        graph = rt.graph("doomed")
        graph.gpu(kernel, [scratch.view()])
        with pytest.raises(hrx.DeviceLost):
            await graph.prepare().submit()
        health = await client.get("/healthz")
        assert health.status_code == 503
        assert health.json()["state"] == "device_lost"
        response = await client.post("/v1/transform", json={"values": [1.0]})
        assert response.status_code == 503
        assert "DeviceLost" in response.json()["detail"]
        metrics = await client.get("/metrics")
        assert "hrx_healthy 0" in metrics.text


async def test_lifespan_drains_and_closes(anyio_backend: str) -> None:
    async with serving() as (_, client, service):
        assert (await client.post("/v1/transform", json={"values": [1.0]})).status_code == 200
        runtime = service.runtime
    assert service.health().state == "closed" and not service.health().ok
    with pytest.raises(hrx.RuntimeClosed):
        _ = service.runtime
    with pytest.raises(hrx.RuntimeClosed):
        runtime.graph()
    report = service.shutdown_report
    assert report is not None and report.drained
    assert report.statistics.submissions == 1


async def test_service_with_async_setup_and_dependencies(anyio_backend: str) -> None:
    async def setup(rt: hrx.Runtime) -> dict[str, hrx.Buffer]:
        await anyio.sleep(0)
        return {"scratch": rt.allocate(16, hrx.HOST_VISIBLE)}

    service = RuntimeService(setup, backend="sim")
    assert service.health().state == "starting"
    with pytest.raises(hrx.RuntimeClosed, match="starting"):
        _ = service.resources
    async with service.lifespan():
        assert service.resources["scratch"].nbytes == 16
        assert service.runtime.statistics().allocations == 1
        assert service.health().ok
    with pytest.raises(hrx.RuntimeClosed):
        async with service.lifespan():
            pass
    bare = RuntimeService(backend="sim")
    async with bare.lifespan():
        with pytest.raises(hrx.ContractError, match="no setup"):
            _ = bare.resources
        assert await bare.runtime_dependency() is bare.runtime


def test_prometheus_text_lists_every_counter() -> None:
    stats = hrx.Statistics(submissions=5, completions=4, live_bytes=128, peak_bytes=256)
    text = prometheus_text(stats, healthy=True)
    assert "# TYPE hrx_submissions_total counter\nhrx_submissions_total 5\n" in text
    assert "# TYPE hrx_live_bytes gauge\nhrx_live_bytes 128\n" in text
    assert text.count("# TYPE") == 14 and text.endswith("hrx_healthy 1\n")
    assert "hrx_healthy" not in prometheus_text(stats)


def test_importing_the_package_does_not_import_web_frameworks() -> None:
    code = (
        "import sys, hrx_async, hrx_async.serve, hrx_async.slots, hrx_async.blocking\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('fastapi', 'starlette', 'uvicorn', 'httpx'))\n"
        "print(loaded)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- a real server --------------------------------------------------------------------------


def test_real_server_serves_a_concurrent_burst_and_stops_cleanly() -> None:
    pytest.importorskip("uvicorn")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    server = subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--port", "0", "--backend", "sim", "--slots", "4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lines: list[str] = []
    port_found = threading.Event()
    port: list[int] = []

    def pump() -> None:
        assert server.stdout is not None
        for line in server.stdout:
            lines.append(line)
            match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
            if match and not port:
                port.append(int(match.group(1)))
                port_found.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        assert port_found.wait(20), "server did not start:\n" + "".join(lines)
        anyio.run(burst, f"http://127.0.0.1:{port[0]}")
    finally:
        server.send_signal(signal.SIGINT)
        try:
            code = server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()
            raise
        reader.join(5)
    log = "".join(lines)
    assert code == 0, log
    closed = [line for line in lines if "hrx runtime closed" in line]
    assert closed, log
    # The lifespan drained every submission and no runtime thread outlived the runtime.
    match = re.search(
        r"drained=True submissions=(\d+) completions=(\d+) leftover_threads=none", closed[0]
    )
    assert match is not None, log
    assert match.group(1) == match.group(2) and 0 < int(match.group(1)) <= 96


async def burst(base: str) -> None:
    example = load_example()
    rng = np.random.default_rng(11)
    limits = httpx.Limits(max_connections=16)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=20) as client:
        health = await client.get("/healthz")
        assert health.status_code == 200 and health.json()["ok"]
        failures: list[str] = []

        async def one(index: int) -> None:
            values = rng.normal(0, 2, int(rng.integers(1, 20000))).astype(np.float32)
            response = await client.post("/v1/transform", **binary_request(values))
            if response.status_code != 200:
                failures.append(f"{index}: {response.status_code} {response.text}")
                return
            got = np.frombuffer(response.content, np.float32)
            if not np.array_equal(got, example.transform_reference(values)):
                failures.append(f"{index}: wrong result")

        async with anyio.create_task_group() as tg:
            for index in range(96):
                tg.start_soon(one, index)
        bad = await client.post("/v1/transform", json={"values": []})
        assert bad.status_code == 422
        stats = (await client.get("/stats")).json()
    assert not failures, failures
    # Batched: at most one submission per request.
    assert 0 < stats["submissions"] == stats["completions"] <= 96
    assert json.dumps(stats)  # plain JSON numbers


def test_runtime_threads_lists_only_runtime_threads() -> None:
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait, name="hrx-test-worker")
    other = threading.Thread(target=stop.wait, name="unrelated")
    worker.start()
    other.start()
    try:
        assert "hrx-test-worker" in runtime_threads()
        assert "unrelated" not in runtime_threads()
    finally:
        stop.set()
        worker.join()
        other.join()
    assert "hrx-test-worker" not in runtime_threads()
