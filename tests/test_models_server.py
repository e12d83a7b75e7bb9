"""The model server example: answers match the numpy reference under concurrent load."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import httpx
import numpy as np
import pytest

pytestmark = pytest.mark.anyio
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "model_server.py"


def load_example() -> ModuleType:
    name = "model_server_example"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@asynccontextmanager
async def serving(tmp_path: Path) -> AsyncIterator[tuple[ModuleType, Any, httpx.AsyncClient]]:
    example = load_example()
    app = example.create_app("sim", tmp_path / "weights.safetensors", slots=2)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://model") as client:
            yield example, app, client


async def test_concurrent_requests_match_the_reference(tmp_path: Path) -> None:
    async with serving(tmp_path) as (example, app, client):
        weights = example.make_weights()
        rng = np.random.default_rng(1)
        failures: list[str] = []

        async def one(i: int) -> None:
            n = int(rng.integers(1, 9))
            images = rng.standard_normal((n, 3, 16, 16)).astype(np.float32)
            if i % 2:
                reply = await client.post(
                    "/v1/classify",
                    content=images.tobytes(),
                    headers={"content-type": "application/octet-stream"},
                )
            else:
                reply = await client.post("/v1/classify", json={"images": images.tolist()})
            assert reply.status_code == 200, reply.text
            logits = np.array(reply.json()["logits"], np.float32)
            expected = example.reference(images, weights)
            if not np.allclose(logits, expected, rtol=1e-4, atol=1e-5):
                failures.append(f"request {i}: {np.abs(logits - expected).max()}")
            assert reply.json()["labels"] == expected.argmax(axis=1).tolist()

        async with anyio.create_task_group() as tg:
            for i in range(24):
                tg.start_soon(one, i)
        assert failures == []
        stats = (await client.get("/v1/model/stats")).json()
        assert stats["residency"]["resources"] == 1 and stats["residency"]["misses"] == 1
        assert stats["residency"]["reserved_bytes"] == 4 * (48 * 64 + 64 + 64 * 10 + 10)
        assert stats["plans"]["misses"] <= 4 and stats["plans"]["entries"] <= 4
        assert stats["jobs"]["submitted"] == 24
        assert (await client.get("/healthz")).status_code == 200
    service = app.state.service
    assert service.shutdown_report is not None and service.shutdown_report.drained


async def test_a_wrong_model_is_caught_and_bad_requests_refused(tmp_path: Path) -> None:
    async with serving(tmp_path) as (example, _app, client):
        images = np.ones((1, 3, 16, 16), np.float32)
        reply = await client.post("/v1/classify", json={"images": images.tolist()})
        wrong = dict(example.make_weights())
        wrong["b2"] = wrong["b2"] + 1
        assert not np.allclose(reply.json()["logits"], example.reference(images, wrong))
        for body in (
            {"images": [[1, 2]]},
            {"images": np.ones((9, 3, 16, 16)).tolist()},
            {"pixels": []},
            {"images": [[[[float("nan")] * 16] * 16] * 3]},
        ):
            reply = await client.post(
                "/v1/classify",
                content=json.dumps(body).encode(),
                headers={"content-type": "application/json"},
            )
            assert reply.status_code == 422, body
        reply = await client.post(
            "/v1/classify",
            content=b"\0" * 10,
            headers={"content-type": "application/octet-stream"},
        )
        assert reply.status_code == 422


async def test_the_weights_file_is_checked(tmp_path: Path) -> None:
    example = load_example()
    path = tmp_path / "weights.safetensors"
    import hrx_async as hrx

    hrx.write_safetensors(path, {"w1": np.zeros((48, 63), np.float32)})
    app = example.create_app("sim", path)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=True)
        async with httpx.AsyncClient(transport=transport, base_url="http://model") as client:
            with pytest.raises(hrx.MislabeledArtifact):
                await client.post("/v1/classify", json={"images": np.ones((1, 3, 16, 16)).tolist()})
