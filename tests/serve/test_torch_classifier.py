"""The PyTorch classifier example (examples/torch_classifier.py): its answers against the
same pipeline run eagerly in PyTorch, under concurrent requests, on every backend here;
bad input refused with a 4xx and a reason.

The reference preprocesses with ImageOps' documented maths in numpy
(`reference_preprocess`: torchvision's own `Resize` antialiases and keeps floats, so it is
not the same pipeline), then runs the same model (same seed) on the runtime's device.
Tests that need PyTorch and torchvision skip without them; the request decoding and the
refusal to start without PyTorch are checked everywhere.
"""

from __future__ import annotations

import io
import sys
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

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torch_classifier.py"
OCTETS = "application/octet-stream"
LEVEL = 1 / 255 / min(0.229, 0.224, 0.225)
"""One u8 level after normalizing, at the smallest std: how far a rounding may move x."""


def load_example() -> ModuleType:
    return load_module(EXAMPLE, "torch_classifier_example")


def torch_or_skip() -> ModuleType:
    pytest.importorskip("torchvision")
    torch: ModuleType = pytest.importorskip("torch")
    return torch


def raw(pictures: np.ndarray[Any, Any]) -> dict[str, Any]:
    shape = ",".join(str(d) for d in pictures.shape)
    headers = {"content-type": OCTETS, "x-image-shape": shape}
    return {"content": pictures.tobytes(), "headers": headers}


def encoded(picture: np.ndarray[Any, Any], fmt: str) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(picture).save(out, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return out.getvalue()


def decoded(data: bytes) -> np.ndarray[Any, Any]:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as picture:
        return np.asarray(picture.convert("RGB"), np.uint8)[None]


# -- without PyTorch: decoding and the refusal to start -----------------------------------


def test_png_and_jpeg_files_decode_to_rgb_pixels() -> None:
    pytest.importorskip("PIL")
    example = load_example()
    rng = np.random.default_rng(4)
    picture = rng.integers(0, 256, (12, 9, 3), dtype=np.uint8)
    png = example.decode_file(encoded(picture, "PNG"), "PNG", 64)
    assert png.shape == (1, 12, 9, 3) and (png[0] == picture).all()
    jpeg = encoded(picture, "JPEG")
    assert (example.decode_file(jpeg, "JPEG", 64) == decoded(jpeg)).all()
    with pytest.raises(example.RequestRefused, match="not a readable PNG") as caught:
        example.decode_file(jpeg, "PNG", 64)
    assert caught.value.status == 400
    with pytest.raises(example.RequestRefused, match="not a readable JPEG"):
        example.decode_file(b"no picture", "JPEG", 64)
    with pytest.raises(example.RequestRefused, match="at most 8x8 pixels, got 12x9") as caught:
        example.decode_file(encoded(picture, "PNG"), "PNG", 8)
    assert caught.value.status == 413


def test_without_pytorch_the_example_refuses_to_start_and_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    example = load_example()
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    with pytest.raises(example.MissingLibrary, match="pip install torch torchvision"):
        example.create_app("sim")
    assert example.main(["--backend", "sim", "--port", "0"]) == 1
    assert "needs PyTorch and torchvision" in capsys.readouterr().err


def test_bad_options_are_usage_errors() -> None:
    example = load_example()
    with pytest.raises(SystemExit) as caught:
        example.main(["--port", "70000"])
    assert caught.value.code == 64
    with pytest.raises(SystemExit) as caught:
        example.main(["--prepare", "64by64"])
    assert caught.value.code == 64
    assert example.picture_size("480x640") == (480, 640)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"batch": 17}, "batch must be an integer in 1..16"),
        ({"size": 16}, "size must be an integer >= 32"),
        ({"model": "alexnet"}, "model must be one of resnet18, resnet50"),
        ({"pictures": [(0, 64)]}, "a picture size to prepare for is"),
        ({"pictures": [(64, 2000)]}, "a picture size to prepare for is"),
        ({"pictures": [(64, 64)] * 4}, "need 20 graphs per slot; a slot keeps 16"),
    ]
    for options, reason in cases:
        with pytest.raises(ValueError, match=reason):
            example.create_app("sim", **options)


# -- the preprocessing references ----------------------------------------------------------


def test_pytorch_interpolate_agrees_with_the_imageops_reference_within_a_level() -> None:
    torch = torch_or_skip()
    example = load_example()
    rng = np.random.default_rng(5)
    for shape, size in [((2, 50, 70, 3), 64), ((1, 300, 200, 3), 224), ((1, 17, 9, 3), 32)]:
        pictures = rng.integers(0, 256, shape, dtype=np.uint8)
        ours = example.reference_preprocess(pictures, size)
        theirs = example.torch_preprocess(torch.from_numpy(pictures), size).numpy()
        assert ours.shape == theirs.shape == (shape[0], 3, size, size)
        # PyTorch finds the source position in float32, ImageOps exactly: only a value that
        # rounds at a half can move, and by one level.
        assert np.abs(ours - theirs).max() <= LEVEL * 1.001
        assert (np.abs(ours - theirs) > 1e-5).mean() < 1e-3


# -- served ---------------------------------------------------------------------------------


@asynccontextmanager
async def serving(
    backend: str,
    size: int,
    batch: int = 4,
    slots: int = 2,
    max_side: int = 96,
    pictures: tuple[tuple[int, int], ...] = (),
) -> AsyncIterator[tuple[ModuleType, Any, Any]]:
    torch = torch_or_skip()
    if backend != "sim" and not torch.cuda.is_available():
        pytest.skip(f"this PyTorch has no GPU support for the {backend} backend")
    example = load_example()
    app = example.create_app(
        backend, size=size, slots=slots, batch=batch, max_side=max_side, pictures=pictures
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://classifier") as client:
            yield example, app, client
    report = app.state.service.shutdown_report
    assert report is not None and report.drained, report


class Reference:
    """The pipeline run eagerly: the example's model on the runtime's device."""

    def __init__(self, example: ModuleType, backend: str, size: int) -> None:
        self.example = example
        self.size = size
        self.model = example.build_model("resnet18", example.torch_device(backend))
        self.tight = backend == "sim"  # the same numpy image maths and CPU kernels

    def check(self, pictures: np.ndarray[Any, Any], answer: dict[str, Any]) -> None:
        import torch

        x = torch.from_numpy(self.example.reference_preprocess(pictures, self.size))
        with torch.inference_mode():
            probabilities = torch.softmax(self.model(x.to(self._device)), 1).cpu().numpy()
        classes = np.array(answer["classes"])
        scores = np.array(answer["scores"], np.float32)
        n = len(pictures)
        assert classes.shape == scores.shape == (n, 5), answer
        expected = -np.sort(-probabilities, axis=1)[:, :5]
        rtol, atol = (1e-5, 1e-7) if self.tight else (2e-2, 1e-4)
        np.testing.assert_allclose(scores, expected, rtol=rtol, atol=atol)
        # Each answered class has the answered probability (robust to near ties, whose order
        # may differ between batch sizes on a GPU).
        picked = np.take_along_axis(probabilities, classes, axis=1)
        np.testing.assert_allclose(scores, picked, rtol=rtol, atol=atol)
        assert (np.diff(scores, axis=1) <= 0).all()
        if self.tight:
            assert classes.tolist() == np.argsort(-probabilities, axis=1)[:, :5].tolist()

    @property
    def _device(self) -> Any:
        return next(self.model.parameters()).device


@pytest.mark.anyio
async def test_concurrent_answers_match_the_pipeline_run_eagerly(hrx_backend: str) -> None:
    size = 64 if hrx_backend == "sim" else 224
    async with serving(hrx_backend, size) as (example, _app, client):
        reference = Reference(example, hrx_backend, size)
        rng = np.random.default_rng(6)
        shapes = [(48, 64), (96, 80), (64, 64), (5, 7)]
        checked: list[int] = []

        async def one(i: int) -> None:
            h, w = shapes[i % len(shapes)]
            n = 3 if i % 7 == 3 else 1
            pictures = rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8)
            reply = await client.post("/v1/classify", **raw(pictures if n > 1 else pictures[0]))
            assert reply.status_code == 200, reply.text
            assert reply.json()["model"] == "resnet18"
            reference.check(pictures, reply.json())
            checked.append(i)

        async with anyio.create_task_group() as group:
            for i in range(14):
                group.start_soon(one, i)
        assert sorted(checked) == list(range(14))
        stats = (await client.get("/v1/classifier/stats")).json()
        assert stats["pictures"] == 12 * 1 + 2 * 3
        # two slots for 14 concurrent requests: pictures of one size share submissions
        assert stats["batches"] < stats["pictures"]
        assert stats["slots_built"] <= 2
        assert (await client.get("/healthz")).status_code == 200


@pytest.mark.anyio
async def test_graphs_for_an_expected_picture_size_are_prepared_at_start_up(
    hrx_backend: str,
) -> None:
    size = 64 if hrx_backend == "sim" else 224
    async with serving(hrx_backend, size, pictures=((48, 64),)) as (example, _app, client):
        stats = (await client.get("/v1/classifier/stats")).json()
        # every slot, every batch size (1, 2, 4), before any request
        assert stats["slots_built"] == 2
        assert stats["steps_prepared"] == 2 * 3
        assert stats["batches"] == 0
        reference = Reference(example, hrx_backend, size)
        rng = np.random.default_rng(8)
        for n in (1, 3):
            pictures = rng.integers(0, 256, (n, 48, 64, 3), dtype=np.uint8)
            reply = await client.post("/v1/classify", **raw(pictures if n > 1 else pictures[0]))
            assert reply.status_code == 200, reply.text
            reference.check(pictures, reply.json())
        stats = (await client.get("/v1/classifier/stats")).json()
        assert stats["steps_prepared"] == 2 * 3  # those requests found their graphs
        assert stats["pictures"] == 4
        # another size gets its graph on first use
        other = rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)
        assert (await client.post("/v1/classify", **raw(other))).status_code == 200
        stats = (await client.get("/v1/classifier/stats")).json()
        assert stats["steps_prepared"] == 2 * 3 + 1


@pytest.mark.anyio
async def test_png_and_jpeg_requests_match_raw_pixels(hrx_backend: str) -> None:
    pytest.importorskip("PIL")
    size = 64 if hrx_backend == "sim" else 224
    async with serving(hrx_backend, size) as (example, _app, client):
        reference = Reference(example, hrx_backend, size)
        rng = np.random.default_rng(7)
        picture = rng.integers(0, 256, (40, 56, 3), dtype=np.uint8)
        for fmt, kind in (("PNG", "image/png"), ("JPEG", "image/jpeg")):
            data = encoded(picture, fmt)
            reply = await client.post("/v1/classify", content=data, headers={"content-type": kind})
            assert reply.status_code == 200, reply.text
            reference.check(decoded(data), reply.json())
        png = (
            await client.post(
                "/v1/classify",
                content=encoded(picture, "PNG"),
                headers={"content-type": "image/png"},
            )
        ).json()
        direct = (await client.post("/v1/classify", **raw(picture))).json()
        # A lossless file is its pixels: the same answer, up to the device's rounding.
        assert png["classes"] == direct["classes"]
        np.testing.assert_allclose(png["scores"], direct["scores"], rtol=1e-5)


@pytest.mark.anyio
async def test_bad_requests_are_refused_with_a_reason_and_change_nothing(
    hrx_backend: str,
) -> None:
    async with serving(hrx_backend, 32, batch=2, max_side=16) as (example, app, client):
        pixels = np.zeros((8, 8, 3), np.uint8).tobytes()
        cases: list[tuple[int, str, bytes, dict[str, str]]] = [
            (422, "header is missing", pixels, {"content-type": OCTETS}),
            (422, "X-Image-Shape must be", pixels, {"x-image-shape": "8,8"}),
            (422, "X-Image-Shape must be", pixels, {"x-image-shape": "8;8;3"}),
            (422, "RGB", pixels, {"x-image-shape": "8,6,4"}),
            (422, "192 bytes do not hold 1x8x9x3", pixels, {"x-image-shape": "8,9,3"}),
            (422, "191 bytes do not hold", pixels[:-1], {"x-image-shape": "8,8,3"}),
            (422, "at most 2 pictures", pixels * 3, {"x-image-shape": "3,8,8,3"}),
            (422, "must be u8", pixels, {"x-image-shape": "8,8,3", "x-image-dtype": "f32"}),
            (413, "at most 16x16", b"\0" * 17 * 3, {"x-image-shape": "1,17,3"}),
            (413, "too large", b"\0" * (2 * 16 * 16 * 3 + 1), {"x-image-shape": "8,8,3"}),
            (415, "not 'text/plain'", pixels, {"content-type": "text/plain"}),
            (400, "not a readable PNG", pixels, {"content-type": "image/png"}),
        ]
        runtime = app.state.service.runtime
        before = runtime.statistics()
        for status, reason, body, headers in cases:
            reply = await client.post(
                "/v1/classify", content=body, headers={"content-type": OCTETS, **headers}
            )
            assert reply.status_code == status, (reason, reply.text)
            assert reason in reply.json()["detail"], (reason, reply.text)
        assert runtime.statistics().submissions == before.submissions
        good = np.full((1, 8, 8, 3), 128, np.uint8)
        reply = await client.post("/v1/classify", **raw(good))
        assert reply.status_code == 200, reply.text
        Reference(example, hrx_backend, 32).check(good, reply.json())


@pytest.mark.anyio
async def test_a_failing_model_run_fails_its_requests_only(
    hrx_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serving(hrx_backend, 32, batch=2, slots=1) as (example, app, _client):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://classifier") as client:
            picture = np.full((12, 12, 3), 77, np.uint8)
            assert (await client.post("/v1/classify", **raw(picture))).status_code == 200
            top5 = example.top5

            def broken(model: Any, x: Any) -> Any:
                raise RuntimeError("the model failed")

            monkeypatch.setattr(example, "top5", broken)
            # A picture of another size takes a graph of its own. On a GPU the model is
            # captured when that graph is prepared, so the failure comes then; on sim the
            # model runs at each replay, and the run fails.
            other = np.full((13, 13, 3), 77, np.uint8)
            assert (await client.post("/v1/classify", **raw(other))).status_code == 500
            monkeypatch.setattr(example, "top5", top5)
            # On sim the one slot's answer buffer was poisoned by the failed run; the next
            # run of the model rewrites all of it, so its answers come through. On a GPU the
            # graph that failed to prepare was not kept, and is prepared again.
            reply = await client.post("/v1/classify", **raw(other))
            assert reply.status_code == 200, reply.text
            Reference(example, hrx_backend, 32).check(other[None], reply.json())
            reply = await client.post("/v1/classify", **raw(picture))
            assert reply.status_code == 200, reply.text
            Reference(example, hrx_backend, 32).check(picture[None], reply.json())
