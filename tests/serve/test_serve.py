"""Serving: the example app through httpx against ASGI, and the same app in a real uvicorn.

The in-process tests run the app's lifespan and talk to it with httpx's ASGI transport,
on asyncio and on trio. The real-server test starts uvicorn with the example in a
subprocess on a free port, sends a bounded concurrent burst from this process, checks
every answer and stops the server with SIGINT, expecting a drained runtime.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
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
from tests.helpers import load_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "service.py"

pytestmark = pytest.mark.anyio


def load_example() -> ModuleType:
    return load_module(EXAMPLE, "hrx_example_service")


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


def json_body(text: bytes) -> dict[str, Any]:
    return {"content": text, "headers": {"content-type": "application/json"}}


DEEP = b"[" * 100_000 + b"]" * 100_000

# Refused with the status and a detail that names the problem.
REFUSED: list[tuple[str, dict[str, Any], int, str]] = [
    (
        "deeply nested values",
        json_body(b'{"values": ' + DEEP + b"}"),
        422,
        "nests arrays/objects 100001 deep; at most 2 allowed",
    ),
    (
        "deeply nested elsewhere",
        json_body(b'{"values": [1], "meta": ' + DEEP + b"}"),
        422,
        "nests arrays/objects 100001 deep",
    ),
    (
        "deeply nested objects",
        json_body(b'{"values": [1], "m": ' + b'{"a": ' * 50_000 + b"1" + b"}" * 50_000 + b"}"),
        422,
        "nests arrays/objects 50001 deep",
    ),
    ("nested 3 deep", {"json": {"values": [1.0, [2.0]]}}, 422, "nests arrays/objects 3 deep"),
    (
        "an integer beyond 64 bits",
        {"json": {"values": [1.0, 10**400]}},
        422,
        "values[1] = an integer of 401 digits is out of float32's range",
    ),
    (
        "an integer beyond 64 bits for int32",
        {"json": {"values": [-(10**50)], "dtype": "int32"}},
        422,
        "values[0] = an integer of 51 digits is out of range for int32",
    ),
    (
        "dtype not a string",
        {"json": {"values": [1], "dtype": ["int32"]}},
        422,
        "dtype must be one of float32, float64, int32, got a JSON array",
    ),
    (
        "dtype an object",
        {"json": {"values": [1], "dtype": {"name": "int32"}}},
        422,
        "got a JSON object",
    ),
    (
        "int32 above its range",
        {"json": {"values": [0, 2**31], "dtype": "int32"}},
        422,
        "values[1] = 2147483648 is out of range for int32 (-2147483648..2147483647)",
    ),
    (
        "int32 below its range",
        {"json": {"values": [-(2**31) - 1], "dtype": "int32"}},
        422,
        "values[0] = -2147483649 is out of range for int32",
    ),
    (
        "int32 as a float above its range",
        {"json": {"values": [1, 3e9], "dtype": "int32"}},
        422,
        "values[1] = 3000000000.0 is out of range for int32",
    ),
    (
        "int32 not whole",
        {"json": {"values": [1, 2, 2.5], "dtype": "int32"}},
        422,
        "values[2] = 2.5 is not a whole number",
    ),
    (
        "int32 infinite",
        json_body(b'{"values": [1e400], "dtype": "int32"}'),
        422,
        "values[0] = inf is not a finite number",
    ),
    (
        "a long string",
        {"json": {"values": [1, "x" * 100_000]}},
        422,
        "values[1] must be a number, got 'xxxx",
    ),
]
BAD_PAYLOADS += [(name, request, status) for name, request, status, _ in REFUSED]


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


async def test_refusals_say_what_is_wrong(anyio_backend: str) -> None:
    async with serving() as (_, client, service):
        before = service.statistics()
        for name, request, status, reason in REFUSED:
            response = await client.post("/v1/transform", **request)
            assert response.status_code == status, (name, response.text)
            detail = response.json()["detail"]
            assert reason in detail, (name, detail)
            assert len(detail) < 200, (name, detail)  # a client's huge value is not echoed
        assert service.statistics() == before


async def test_values_that_fit_the_declared_dtype_are_served(anyio_backend: str) -> None:
    documents: list[dict[str, Any]] = [
        {"values": [-(2**31), 2**31 - 1, 7, 2.0, -3.0, 0], "dtype": "int32"},
        {"values": [2**70, -(2**100), 0.25, 1]},
        {"values": [1e38, -1e-45, 3], "dtype": "float64"},
        # Brackets inside strings are no nesting; a flat list beside "values" is fine.
        {"values": [1.5, -2], "note": '[[[{{{ \\" ]]] "[[', "tags": ["a[", "]b"]},
    ]
    async with serving() as (example, client, _):
        for document in documents:
            response = await client.post("/v1/transform", json=document)
            assert response.status_code == 200, (document, response.text)
            expected = example.transform_reference(np.asarray(document["values"], np.float64))
            got = np.asarray(response.json()["values"], np.float32)
            np.testing.assert_array_equal(got, expected)


def http_scope(content_type: str, length: int) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/transform",
        "raw_path": b"/v1/transform",
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"service"),
            (b"content-type", content_type.encode()),
            (b"content-length", str(length).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("service", 80),
    }


async def post_then_disconnect(app: Any, content_type: str, chunks: list[bytes]) -> list[Any]:
    """POST `chunks` of a 100000-byte body, then the client goes; what the app sent back."""
    incoming = [{"type": "http.request", "body": chunk, "more_body": True} for chunk in chunks]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(http_scope(content_type, 100_000), receive, send)
    return sent


async def test_a_client_gone_mid_body_is_let_go_quietly(
    anyio_backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """ASGI level: the body stops with `http.disconnect`; the app returns, logs nothing."""
    caplog.set_level(logging.DEBUG)
    example = load_example()
    app = example.create_app("sim", 2, 4)
    service: RuntimeService[Any] = app.state.service
    async with app.router.lifespan_context(app):
        before = service.statistics()
        for content_type, first in (
            ("application/json", [b'{"values": [1.0, 2.', b"5, 3"]),
            ("application/octet-stream", [b"\x00" * 4096]),
            ("application/json", []),
        ):
            caplog.clear()
            sent = await post_then_disconnect(app, content_type, first)
            statuses = [m["status"] for m in sent if m["type"] == "http.response.start"]
            assert all(400 <= status < 500 for status in statuses), statuses
            noisy = [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING]
            assert not noisy, [r.getMessage() for r in noisy]
        assert service.statistics() == before
        assert service.health().ok


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
    assert text.count("# TYPE") == 15 and text.endswith("hrx_healthy 1\n")
    assert "hrx_healthy" not in prometheus_text(stats)


def test_importing_the_package_does_not_import_web_frameworks() -> None:
    code = (
        "import sys, hrx_async, hrx_async.serve, hrx_async.serve.slots, hrx_async.blocking\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('fastapi', 'starlette', 'uvicorn', 'httpx'))\n"
        "print(loaded)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- a real server --------------------------------------------------------------------------


@dataclass
class RealServer:
    """The example in uvicorn in a subprocess: its address, its log so far, its exit code."""

    port: int = 0
    lines: list[str] = field(default_factory=list)
    code: int | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> str:
        return "".join(self.lines)


@contextmanager
def real_server() -> Iterator[RealServer]:
    """Start the example on a free port; stop it with SIGINT when the block ends."""
    pytest.importorskip("uvicorn")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    server = subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--port", "0", "--backend", "sim", "--slots", "4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    state = RealServer()
    port_found = threading.Event()

    def pump() -> None:
        assert server.stdout is not None
        for line in server.stdout:
            state.lines.append(line)
            match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
            if match and not port_found.is_set():
                state.port = int(match.group(1))
                port_found.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        assert port_found.wait(20), "server did not start:\n" + state.log
        yield state
    finally:
        server.send_signal(signal.SIGINT)
        try:
            state.code = server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()
            raise
        reader.join(5)


def test_real_server_serves_a_concurrent_burst_and_stops_cleanly() -> None:
    with real_server() as server:
        anyio.run(burst, server.base)
    log, lines = server.log, server.lines
    assert server.code == 0, log
    closed = [line for line in lines if "hrx runtime closed" in line]
    assert closed, log
    # The lifespan drained every submission and no runtime thread outlived the runtime.
    match = re.search(
        r"drained=True submissions=(\d+) completions=(\d+) leftover_threads=none", closed[0]
    )
    assert match is not None, log
    assert match.group(1) == match.group(2) and 0 < int(match.group(1)) <= 96


def test_real_server_lets_a_client_gone_mid_body_go_quietly() -> None:
    """Clients that send part of a body and hang up leave no traceback in uvicorn's log."""
    with real_server() as server:
        for content_type, partial in (
            ("application/json", b'{"values": [1.0, 2.0, 3'),
            ("application/octet-stream", b"\x00" * 1000),
        ):
            head = (
                "POST /v1/transform HTTP/1.1\r\nHost: service\r\n"
                f"Content-Type: {content_type}\r\nContent-Length: 100000\r\n\r\n"
            )
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
                sock.sendall(head.encode() + partial)
                time.sleep(0.3)  # the handler is reading the body when the client goes
        # The server still serves, and shutting down waits for the abandoned requests.
        response = httpx.post(f"{server.base}/v1/transform", json={"values": [1.0]}, timeout=10)
        assert response.status_code == 200 and response.json() == {"values": [3.0]}
    assert server.code == 0, server.log
    assert "Traceback" not in server.log and "Exception in ASGI" not in server.log, server.log
    assert "drained=True" in server.log, server.log


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
