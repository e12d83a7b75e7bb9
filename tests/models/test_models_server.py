"""The model server example: answers match the numpy reference under concurrent load."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import numpy as np
import pytest

from tests.helpers import load_module

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")  # the example is a FastAPI app

pytestmark = pytest.mark.anyio
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "model_server.py"


def load_example() -> ModuleType:
    return load_module(EXAMPLE, "model_server_example")


@asynccontextmanager
async def serving(tmp_path: Path) -> AsyncIterator[tuple[ModuleType, Any, httpx.AsyncClient]]:
    example = load_example()
    app = example.create_app(
        "sim", tmp_path / "weights.safetensors", slots=2, generate_weights=True
    )
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


async def test_the_weights_file_is_checked_when_the_app_is_made(tmp_path: Path) -> None:
    example = load_example()
    path = tmp_path / "weights.safetensors"
    import hrx_async as hrx
    import hrx_async.models

    hrx.models.write_safetensors(path, {"w1": np.zeros((48, 63), np.float32)})
    with pytest.raises(
        hrx.models.MislabeledArtifact, match=r"missing tensors \['b1', 'b2', 'w2'\]"
    ):
        example.create_app("sim", path)


def raw_request(pictures: np.ndarray[Any, Any]) -> dict[str, Any]:
    shape = ",".join(str(d) for d in pictures.shape)
    return {
        "content": pictures.tobytes(),
        "headers": {"content-type": "application/octet-stream", "x-image-shape": shape},
    }


async def test_image_requests_are_preprocessed_on_the_device_like_the_reference(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path) as (example, _app, client):
        weights = example.make_weights()
        rng = np.random.default_rng(2)
        shapes = [(32, 32), (48, 64), (16, 16), (20, 36), (7, 5)]
        failures: list[str] = []

        async def one(i: int) -> None:
            n = int(rng.integers(1, 4)) if i % 5 else 5
            h, w = shapes[i % len(shapes)]
            pictures = rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8)
            request = raw_request(pictures if n > 1 or i % 2 else pictures[0])
            reply = await client.post("/v1/classify_image", **request)
            assert reply.status_code == 200, reply.text
            logits = np.array(reply.json()["logits"], np.float32)
            expected = example.reference(example.preprocess(pictures), weights)
            if logits.shape != expected.shape or not np.allclose(
                logits, expected, rtol=1e-4, atol=1e-5
            ):
                failures.append(f"request {i} ({n}x{h}x{w}): {logits} != {expected}")
            assert reply.json()["labels"] == expected.argmax(axis=1).tolist()

        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(one, i)
        assert failures == []
        stats = (await client.get("/v1/model/stats")).json()
        assert stats["residency"]["resources"] == 1 and stats["residency"]["misses"] == 1
        assert stats["image_plans"]["entries"] <= 8
        assert stats["jobs"]["submitted"] == 20


async def test_a_repeated_image_shape_prepares_nothing_new(tmp_path: Path) -> None:
    async with serving(tmp_path) as (example, app, client):
        weights = example.make_weights()
        rng = np.random.default_rng(3)
        runtime = app.state.service.resources.rt

        async def classify(shape: tuple[int, ...]) -> dict[str, Any]:
            pictures = rng.integers(0, 256, shape, dtype=np.uint8)
            reply = await client.post("/v1/classify_image", **raw_request(pictures))
            assert reply.status_code == 200, reply.text
            expected = example.reference(
                example.preprocess(pictures.reshape(-1, *shape[-3:])), weights
            )
            np.testing.assert_allclose(reply.json()["logits"], expected, rtol=1e-4, atol=1e-5)
            stats: dict[str, Any] = (await client.get("/v1/model/stats")).json()
            return stats

        first = await classify((40, 24, 3))
        # one preprocessing plan (both slots recorded), two image kernels (resize and
        # normalize; patchify is the classifier's): slot 1 reused slot 0's
        assert first["image_plans"]["misses"] == 1
        assert first["image_ops"]["kernels_loaded"] == 2
        assert first["image_ops"]["misses"] == 2 and first["image_ops"]["hits"] == 2
        before = runtime.statistics()
        for _ in range(3):
            again = await classify((40, 24, 3))
            assert again["image_ops"] == first["image_ops"]
            assert again["image_plans"]["misses"] == 1
        after = runtime.statistics()
        assert after.native_graphs_prepared == before.native_graphs_prepared
        assert again["image_plans"]["hits"] == 3
        # another picture size of the same batch: only its resize is new
        other = await classify((1, 64, 48, 3))
        assert other["image_plans"]["misses"] == 2
        assert other["image_ops"]["kernels_loaded"] == 3
        # preprocessing chains on the device into the float32 endpoint's classifier plan
        assert other["plans"]["misses"] == 1 and other["plans"]["hits"] >= 4


async def test_bad_image_requests_are_refused_with_a_reason(tmp_path: Path) -> None:
    async with serving(tmp_path) as (_example, _app, client):
        pixels = np.zeros((8, 8, 3), np.uint8).tobytes()
        octet = "application/octet-stream"
        cases: list[tuple[int, str, bytes, dict[str, str]]] = [
            (422, "header is missing", pixels, {}),
            (422, "X-Image-Shape", pixels, {"x-image-shape": "8,8"}),
            (422, "X-Image-Shape", pixels, {"x-image-shape": "eight,8,3"}),
            (422, "RGB", pixels, {"x-image-shape": "8,6,4"}),
            (422, "bytes do not hold", pixels, {"x-image-shape": "8,9,3"}),
            (422, "bytes do not hold", pixels[:-1], {"x-image-shape": "8,8,3"}),
            (422, "at least one pixel", b"", {"x-image-shape": "0,8,3"}),
            (422, "at least one pixel", b"", {"x-image-shape": "1,-8,8,3"}),
            (422, "at most 8 pictures", pixels * 9, {"x-image-shape": "9,8,8,3"}),
            (422, "u8", pixels, {"x-image-shape": "8,8,3", "x-image-dtype": "f32"}),
            (413, "at most 1024x1024", b"\0" * 3075, {"x-image-shape": "1,1025,3"}),
            (413, "too large", b"\0" * (8 * 1024 * 1024 * 3 + 1), {"x-image-shape": "8,8,3"}),
        ]
        for status, reason, body, headers in cases:
            reply = await client.post(
                "/v1/classify_image", content=body, headers={"content-type": octet, **headers}
            )
            assert reply.status_code == status, (headers, reply.text)
            assert reason in reply.json()["detail"], (headers, reply.text)
        reply = await client.post("/v1/classify_image", json={"images": [[[0, 0, 0]]]})
        assert reply.status_code == 415 and "octet-stream" in reply.json()["detail"]
        stats = (await client.get("/v1/model/stats")).json()
        assert stats["image_plans"]["misses"] == 0 and stats["image_ops"]["kernels_loaded"] == 0
        # refused requests leave the server serving
        reply = await client.post(
            "/v1/classify_image",
            content=pixels,
            headers={"content-type": octet, "x-image-shape": "8,8,3", "x-image-dtype": "u8"},
        )
        assert reply.status_code == 200 and len(reply.json()["labels"]) == 1


async def test_the_device_postprocess_takes_the_first_maximum_like_numpy(
    hrx_backend: str,
) -> None:
    """The argmax kernel (its numpy twin on sim) against numpy.argmax, ties included,
    chained after a device tensor with no host wait between them."""
    import hrx_async as hrx

    example = load_example()
    rng = np.random.default_rng(4)
    logits = rng.standard_normal((8, 10)).astype(np.float32)
    logits[1] = 0.5  # all tied: the first
    logits[2, [3, 7]] = 9.0  # two tied maxima: the first
    logits[3] = -np.inf
    logits[3, 9] = -1e30
    async with hrx.Runtime(backend=hrx_backend) as rt:
        ctx = hrx.models.ModelContext(rt)
        post = example.kernels.build_postprocess(rt, 8, 10, 1)
        x = await ctx.upload_tensor(hrx.models.TensorDesc("f32", (8, 10)), logits.tobytes())
        run = await post.submit([x])
        (raw,) = await run.download()
        assert np.frombuffer(raw, np.int32).tolist() == logits.argmax(axis=1).tolist()
        assert example.kernels.argmax_rows(logits).tolist() == logits.argmax(axis=1).tolist()


async def test_labels_come_from_the_device_after_the_classifier(tmp_path: Path) -> None:
    """Both routes answer labels read from the postprocess model's host-visible output,
    equal to numpy's argmax of the reference logits; warm requests prepare no graphs."""
    async with serving(tmp_path) as (example, app, _client):
        server = app.state.service.resources
        weights = example.make_weights()
        rng = np.random.default_rng(6)
        images = rng.standard_normal((3, 3, 16, 16)).astype(np.float32)
        logits, labels = await server.classify(images)
        want = example.reference(images, weights)
        np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-5)
        assert labels.dtype == np.int32 and labels.tolist() == want.argmax(axis=1).tolist()
        pictures = rng.integers(0, 256, (3, 20, 24, 3), dtype=np.uint8)
        await server.classify_image(pictures)
        before = server.rt.statistics()
        logits, labels = await server.classify_image(pictures)
        assert server.rt.statistics().native_graphs_prepared == before.native_graphs_prepared
        want = example.reference(example.preprocess(pictures), weights)
        assert labels.tolist() == want.argmax(axis=1).tolist()


def test_the_postprocess_kernel_is_portable_cxx(tmp_path: Path) -> None:
    """The argmax C++ uses no headers or CUDA-only calls and compiles as C++17."""
    import shutil
    import subprocess

    source = load_example().kernels.ARGMAX_CXX
    assert "#include" not in source and "__shfl" not in source
    compiler = shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no C++ compiler here")
    prelude = (
        "#define __global__\n#define BATCH 8\n#define CLASSES 10\n"
        "struct D3 { unsigned x, y, z; }; static D3 blockIdx, blockDim, threadIdx;\n"
    )
    path = tmp_path / "argmax.cpp"
    path.write_text(prelude + source)
    done = subprocess.run(
        [compiler, "-std=c++17", "-Wall", "-Werror", "-fsyntax-only", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
