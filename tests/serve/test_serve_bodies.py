"""Hostile requests to both example services: bodies limited while they stream in,
Content-Length checked before reading, JSON that cannot be parsed or used answered with a
4xx (never a 500), and the model server's start-up errors in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
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
import hrx_async.models  # noqa: E402
from hrx_async.serve import RequestRefused, load_json  # noqa: E402
from hrx_async.serve.body import declared_length  # noqa: E402
from tests.helpers import load_module  # noqa: E402

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]
MODEL_SERVER = ROOT / "examples" / "model_server.py"
SERVICE = ROOT / "examples" / "service.py"
CHUNK = 64 * 1024


def model_server() -> ModuleType:
    return load_module(MODEL_SERVER, "model_server_example")


def service() -> ModuleType:
    return load_module(SERVICE, "hrx_example_service")


@asynccontextmanager
async def running(app: Any) -> AsyncIterator[Any]:
    async with app.router.lifespan_context(app):
        yield app


@asynccontextmanager
async def model_app(tmp_path: Path) -> AsyncIterator[Any]:
    app = model_server().create_app("sim", tmp_path / "w.safetensors", generate_weights=True)
    async with running(app):
        yield app


@asynccontextmanager
async def service_app() -> AsyncIterator[Any]:
    async with running(service().create_app("sim", 2, 4)) as app:
        yield app


class Sent:
    """What an app answered at the ASGI level, and how many body bytes it pulled."""

    def __init__(self) -> None:
        self.status = 0
        self.body = b""
        self.pulled = 0
        self.receives = 0

    @property
    def detail(self) -> str:
        detail: str = json.loads(self.body)["detail"]
        return detail


async def post(
    app: Any, path: str, headers: dict[str, str], chunks: Iterator[bytes] | None
) -> Sent:
    """POST at the ASGI level; `chunks` None: the body never comes (receive waits)."""
    sent = Sent()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 50000),
        "server": ("service", 80),
    }
    pending = None if chunks is None else next(chunks, None)

    async def receive() -> dict[str, Any]:
        nonlocal pending
        sent.receives += 1
        if chunks is None:
            await anyio.sleep_forever()
        chunk, pending = pending, next(chunks, None) if chunks is not None else None
        sent.pulled += len(chunk or b"")
        return {"type": "http.request", "body": chunk or b"", "more_body": pending is not None}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            sent.status = message["status"]
        elif message["type"] == "http.response.body":
            sent.body += message.get("body", b"")

    with anyio.fail_after(60):
        await app(scope, receive, send)
    return sent


def stream(total: int) -> Iterator[bytes]:
    """`total` zero bytes in CHUNK pieces, made as they are asked for."""
    while total > 0:
        yield b"\0" * min(CHUNK, total)
        total -= CHUNK


BIG = 150 * 1024 * 1024
ROUTES = [
    ("model", "/v1/classify", {"content-type": "application/octet-stream"}),
    ("model", "/v1/classify", {"content-type": "application/json"}),
    ("model", "/v1/classify_image", {"content-type": "application/octet-stream"}),
    ("service", "/v1/transform", {"content-type": "application/octet-stream"}),
]


@asynccontextmanager
async def app_for(which: str, tmp_path: Path) -> AsyncIterator[Any]:
    if which == "model":
        async with model_app(tmp_path) as app:
            yield app
    else:
        async with service_app() as app:
            yield app


@pytest.mark.parametrize(("which", "path", "headers"), ROUTES)
async def test_a_body_past_the_limit_is_refused_as_it_streams_in(
    tmp_path: Path, which: str, path: str, headers: dict[str, str]
) -> None:
    async with app_for(which, tmp_path) as app:
        sent = await post(app, path, headers, stream(BIG))  # no Content-Length: chunked
        assert sent.status == 413, sent.body
        assert "too large" in sent.detail
        # Read only up to the route's limit (at most 24 MiB), not the 150 MiB sent.
        assert sent.pulled <= 24 * 1024 * 1024 + CHUNK
        assert app.state.service.health().ok


@pytest.mark.parametrize(("which", "path", "headers"), ROUTES)
@pytest.mark.parametrize(
    ("length", "status"),
    [
        (str(10**20), 413),
        (str(BIG), 413),
        ("9" * 5000, 413),
        ("1e20", 413),  # too large, however it is written
        ("inf", 413),
        ("1e2", 400),
        ("nan", 400),
        ("-1", 400),
        ("12abc", 400),
        ("", 400),
        ("0x10", 400),
        ("10, 20", 400),
    ],
)
async def test_a_bad_content_length_is_refused_before_any_body_is_read(
    tmp_path: Path, which: str, path: str, headers: dict[str, str], length: str, status: int
) -> None:
    async with app_for(which, tmp_path) as app:
        sent = await post(app, path, {**headers, "content-length": length}, None)
        assert sent.status == status, sent.body
        assert sent.receives == 0
        assert ("too large" if status == 413 else "Content-Length") in sent.detail


def test_declared_lengths() -> None:
    assert declared_length([]) is None
    assert declared_length(["0"]) == 0
    assert declared_length([" 42 "]) == 42
    assert declared_length(["42, 42", "42"]) == 42
    assert declared_length(["0" * 30 + "7"]) == 7
    assert declared_length(["1" * 30]) == 2**64
    assert declared_length(["100"], limit=100) == 100
    for values, limit in ((["101"], 100), (["1e20"], 100), (["9" * 5000], 10**9)):
        with pytest.raises(RequestRefused) as caught:
            declared_length(values, limit)
        assert caught.value.status == 413
    for bad in (["4 2"], ["+4"], ["４２"], ["42", "43"], ["1.0"]):
        with pytest.raises(RequestRefused) as caught:
            declared_length(bad)
        assert caught.value.status == 400


def nested(depth: int) -> bytes:
    return b'{"images": ' + b"[" * depth + b"]" * depth + b"}"


def images(value: Any, first: Any = None) -> list[Any]:
    """One image of `value`s, its first number `first` when given."""
    rows = [[[value] * 16 for _ in range(16)] for _ in range(3)]
    if first is not None:
        rows[0][0][0] = first
    return [rows]


JSON_REFUSALS: list[tuple[str, bytes, int, str]] = [
    ("a 400-digit integer", b'{"images": [[[[1' + b"0" * 400 + b"]]]]}", 422, "n x 3 x 16 x 16"),
    (
        "a 400-digit integer in place",
        json.dumps({"images": images(0, 10**400)}).encode(),
        422,
        "finite float32",
    ),
    ("a 5000-digit integer", b'{"images": ' + b"7" * 5000 + b"}", 422, "5000 digits"),
    ("50000 nested arrays", nested(50_000), 422, "nests arrays/objects 50001 deep"),
    ("the wrong key", b'{"imgs": 1}', 422, '{"images": n x 3 x 16 x 16 numbers}'),
    ("a list, not an object", b"[1, 2]", 422, '{"images"'),
    ("not JSON", b'{"images": [1, 2', 400, "not valid JSON"),
    ("not UTF-8", b'{"images": "\xff"}', 400, "not UTF-8"),
    ("empty", b"", 400, "not valid JSON"),
    ("strings", json.dumps({"images": images("1.5")}).encode(), 422, "numbers only"),
    ("booleans", json.dumps({"images": images(True)}).encode(), 422, "numbers only"),
    ("nulls", json.dumps({"images": images(None)}).encode(), 422, "numbers only"),
    ("ragged rows", b'{"images": [[[[1, 2], [3]]]]}', 422, "n x 3 x 16 x 16"),
    ("a number", b'{"images": 1}', 422, "n x 3 x 16 x 16"),
    ("no images", b'{"images": []}', 422, "n x 3 x 16 x 16"),
]


async def test_hostile_json_is_answered_with_a_4xx_and_a_reason(tmp_path: Path) -> None:
    async with model_app(tmp_path) as app:
        transport = httpx.ASGITransport(app=app)  # raises what the app does not answer
        async with httpx.AsyncClient(transport=transport, base_url="http://model") as client:
            for name, body, status, reason in JSON_REFUSALS:
                reply = await client.post(
                    "/v1/classify", content=body, headers={"content-type": "application/json"}
                )
                assert reply.status_code == status, (name, reply.text)
                detail = reply.json()["detail"]
                assert reason in detail, (name, detail)
                assert "KeyError" not in detail and len(detail) < 300, (name, detail)
            reply = await client.post(
                "/v1/classify", content=b"1,2", headers={"content-type": "text/plain"}
            )
            assert reply.status_code == 415
            good = {"images": np.zeros((1, 3, 16, 16)).tolist()}
            assert (await client.post("/v1/classify", json=good)).status_code == 200
            stats = (await client.get("/v1/model/stats")).json()
            assert stats["plans"]["misses"] == 1  # refusals prepared nothing


async def test_malformed_json_is_400_in_both_services(tmp_path: Path) -> None:
    headers = {"content-type": "application/json"}
    async with model_app(tmp_path) as app:
        assert (await post(app, "/v1/classify", headers, iter([b"{"]))).status == 400
    async with service_app() as app:
        assert (await post(app, "/v1/transform", headers, iter([b"{"]))).status == 400
        sent = await post(
            app, "/v1/transform", headers, iter([b'{"values": [' + b"9" * 5000 + b"]}"])
        )
        assert sent.status == 422 and "5000 digits" in sent.detail


def test_load_json_refuses_by_kind() -> None:
    assert load_json(b'{"a": [1, 2.5, "x"]}', 2) == {"a": [1, 2.5, "x"]}
    assert load_json(b'{"a": "[[[[[["}', 1) == {"a": "[[[[[["}  # brackets in a string
    for body, status in ((b"[[[]]]", 422), (b"[1,", 400), (b"\xfe\xff", 400)):
        with pytest.raises(RequestRefused) as caught:
            load_json(body, 2)
        assert caught.value.status == status


# -- start-up ---------------------------------------------------------------------------


def run_server(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(MODEL_SERVER), "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]


def test_an_unknown_backend_is_a_usage_error(tmp_path: Path) -> None:
    done = run_server("--backend", "bogus", "--weights", str(tmp_path / "w.safetensors"))
    assert done.returncode == 64, done.stderr
    assert "Traceback" not in done.stderr
    assert "invalid choice: 'bogus'" in done.stderr


def test_bad_weights_stop_the_server_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x07garbage")
    done = run_server("--backend", "sim", "--weights", str(bad))
    assert done.returncode == 1, done.stderr
    assert one_line(done.stderr).startswith("model_server.py: error: ")
    assert str(bad) in done.stderr


def test_missing_weights_are_no_such_file_unless_generated(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "w.safetensors"
    done = run_server("--backend", "sim", "--weights", str(missing))
    assert done.returncode == 1, done.stderr
    line = one_line(done.stderr)
    assert "no such file" in line and "--generate-weights" in line
    assert not missing.parent.exists()


def test_the_default_weights_location_is_in_help_and_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HRX_MODEL_DIR", str(tmp_path))
    example = model_server()
    with pytest.raises(SystemExit) as exited:
        example.main(["--help"])
    assert exited.value.code == 0
    out = "".join(capsys.readouterr().out.split())  # argparse wraps lines, at hyphens too
    assert str(tmp_path / "patch_mlp.safetensors") in out and "--generate-weights" in out
    done = run_server("--backend", "sim", env={"HRX_MODEL_DIR": str(tmp_path)})
    assert done.returncode == 1 and str(tmp_path / "patch_mlp.safetensors") in done.stderr


def test_generated_weights_are_written_checked_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO")
    example = model_server()
    path = tmp_path / "new" / "w.safetensors"
    assert example.prepare_weights(path, generate=True) == path
    assert f"weights: {path}" in caplog.text
    header = hrx.models.read_safetensors_header(path)
    assert {name: str(e.desc) for name, e in header.entries.items()} == {
        "w1": "f32[48, 64]",
        "b1": "f32[64]",
        "w2": "f32[64, 10]",
        "b2": "f32[10]",
    }
    before = path.read_bytes()
    example.prepare_weights(path, generate=True)  # there already: read, not rewritten
    assert path.read_bytes() == before


def test_raw_pixels_are_checked_against_their_shape_header() -> None:
    import numpy as np

    from hrx_async.serve import RequestRefused, raw_pixels

    pixels = np.arange(2 * 4 * 5 * 3, dtype=np.uint8)
    got = raw_pixels(pixels.tobytes(), "2,4,5,3", "u8", 16, 4)
    assert got.shape == (2, 4, 5, 3) and (got.reshape(-1) == pixels).all()
    assert raw_pixels(pixels[:60].tobytes(), " 4, 5,3", None, 16, 4).shape == (1, 4, 5, 3)
    body = pixels[:60].tobytes()
    for shape, dtype, reason in [
        (None, None, "header is missing"),
        ("4,5", None, "X-Image-Shape must be"),
        ("four,5,3", None, "X-Image-Shape must be"),
        ("4,5,4", None, "RGB, channels last"),
        ("0,5,3", None, "at least one pixel"),
        ("5,4,5,3", None, "at most 4 pictures"),
        ("4,6,3", None, "60 bytes do not hold 1x4x6x3"),
        ("4,5,3", "f32", "must be u8"),
    ]:
        with pytest.raises(RequestRefused, match=reason) as caught:
            raw_pixels(body, shape, dtype, 16, 4)
        assert caught.value.status == 422
    with pytest.raises(RequestRefused, match="at most 16x16") as caught:
        raw_pixels(b"\0" * 17 * 3, "1,17,3", None, 16, 4)
    assert caught.value.status == 413
