"""The RGB operations' fragment forms (packed affine, affine, similarity, RGB views,
composite) as prepared models and as parts of a caller's graph, against the calls and
the original's scenarios; and the resize scenario's chaining through concatenate and
copy_into. On asyncio and trio, on every usable backend.

Tolerances are the calls' (tests/test_image_rgb.py): the fragments run the same kernels
with the same constants, so where a call's result is at hand they are compared bit for
bit; similarity within 1e-5·max(|e|, 1) of the host fit; unit views within 2e-5.
"""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest

import hrx_async as hrx
from hrx_async.image import RgbOps, RgbResize, fit_similarity_2d, invert_affine
from tests.image.test_image_rgb import TEMPLATE, composite_want

pytestmark = pytest.mark.anyio
MAX = 2**32 - 1
EYE = np.array([[1, 0, 0], [0, 1, 0]], np.float32)


def desc(array: Any, layout: str = "general") -> hrx.models.TensorDesc:
    return hrx.models.TensorDesc.of_array(np.asarray(array), layout)


async def device(
    ctx: hrx.models.ModelContext, array: Any, layout: str = "general"
) -> hrx.models.DeviceTensor:
    array = np.ascontiguousarray(array)
    return await ctx.upload_tensor(desc(array, layout), array.tobytes())


def writer(*arrays: Any) -> Any:
    def write(index: int, memory: memoryview) -> None:
        memory[:] = np.ascontiguousarray(arrays[index]).tobytes()

    return write


async def test_packed_affine_fragment_bounds_invalid_records_and_frees_a_failed_slot(
    hrx_backend: str,
) -> None:
    """affine.rs::packed_affine_reuses_geometry_and_bounds_invalid_records, packed affine
    being fragment-only there: bytes 0..47, 4 crops of 2x2 with identity maps; valid
    records give their bytes, invalid ones black; 3 runs alive, then Busy; a failing
    submit_host_with is the writer's error and leaves the plan idle."""
    data = np.arange(48, dtype=np.uint8)
    eye = np.tile(EYE, (4, 1, 1))
    good = np.array([[12, 3, 2], [0, 2, 2], [12, 3, 2], [30, 2, 3]], "u4")
    bad = np.array([[MAX, 2, 2], [0, 0, 1], [0, MAX, MAX], [47, 2, 2]], "u4")
    async with hrx.Runtime(backend=hrx_backend) as rt:
        ops = RgbOps(rt)
        model = ops.affine_rgb_packed_fragment(48, 4, 2, 2).prepare(3, "packed")
        first = await model.submit_host_with(writer(data, good, eye))
        (raw,) = await first.download()
        rows = [list(raw[i * 12 : (i + 1) * 12]) for i in range(4)]
        assert rows[0] == rows[2] == [*range(12, 18), *range(21, 27)]
        assert rows[1] == list(range(12))
        assert rows[3] == list(range(30, 42))
        second = await model.submit_host_with(writer(data, bad, eye))
        assert await second.download() == [bytes(48)]
        third = await model.submit_host_with(writer(data, good, eye))
        with pytest.raises(hrx.Busy):
            model.try_acquire()
        await third.wait()
        del first, second, third
        gc.collect()

        def failing(index: int, memory: memoryview) -> None:
            if index == 1:
                raise ValueError("no records for this frame")
            memory[:] = data.tobytes()

        with pytest.raises(ValueError, match="no records"):
            await model.submit_host_with(failing)
        assert model.is_idle()
        with model.try_acquire():
            pass
        for call in (
            lambda: ops.affine_rgb_packed_fragment(0, 4, 2, 2),
            lambda: ops.affine_rgb_packed_fragment(2**32, 4, 2, 2),
            lambda: ops.affine_rgb_packed_fragment(48, 0, 2, 2),
            lambda: ops.affine_rgb_packed_fragment(48, 4, 0, 2),
            lambda: ops.affine_rgb_packed_fragment(48, 4, 2, 40000),
            lambda: ops.affine_rgb_packed_fragment(48, 4, 2, 2, "cubic"),
        ):
            with pytest.raises(hrx.ContractError):
                call()


async def test_affine_fragment_in_a_graph_equals_the_call(hrx_backend: str) -> None:
    """affine_rgb_fragment recorded into a caller's graph binds the image and matrices
    in place and gives the call's bytes, in both modes."""
    rng = np.random.default_rng(5)
    img = rng.integers(0, 256, (1, 9, 11, 3), dtype=np.uint8)
    m = np.array([[[0.9, 0.2, 1.3], [-0.1, 1.1, 0.4]], [[1, 0, -2.5], [0, 1, 7.5]]], np.float32)
    async with hrx.Runtime(backend=hrx_backend) as rt:
        ctx = hrx.models.ModelContext(rt)
        ops = RgbOps(rt)
        src, mats = await device(ctx, img, "nhwc"), await device(ctx, m)
        for mode in ("black_ties_even", "replicate_half_up"):
            frag = ops.affine_rgb_fragment(src.desc, 2, 5, 6, mode)
            graph = rt.graph("affine")
            (crops,) = frag.record(graph, [src, mats])
            await graph.prepare().submit()
            plain = hrx.models.Tensor(src.desc, src.view)  # type: ignore[arg-type]
            call = await ops.affine_rgb(plain, hrx.models.Tensor(mats.desc, mats.view), 5, 6, mode)  # type: ignore[arg-type]
            assert await ctx.download(crops) == (await ctx.download(call)).tobytes()
        batch2 = hrx.models.TensorDesc("u8", (2, 9, 11, 3), layout="nhwc")
        for call_ in (
            lambda: ops.affine_rgb_fragment(batch2, 2, 5, 6),
            lambda: ops.affine_rgb_fragment(hrx.models.TensorDesc("u8", (1, 9, 11, 3)), 2, 5, 6),
            lambda: ops.affine_rgb_fragment(src.desc, 0, 5, 6),
        ):
            with pytest.raises(hrx.ContractError):
                call_()


async def test_similarity_fragment_checks_geometry_and_accepts_detection_row_views(
    hrx_backend: str,
) -> None:
    """similarity.rs::similarity_fitting_checks_geometry_and_accepts_detection_row_views
    through similarity_2d_fragment: the input a view at byte 20 of [6, 16] detection rows
    (strides [16, 2, 1]) bound in place; faces 0-2 status 0 within 1e-5·max(|e|, 1) of the
    host fit and its inverse; faces 3-5 status 1 and NaN. The template is one weight."""
    t = TEMPLATE
    faces = [
        t, np.stack([2 * t[:, 1] + 37, -2 * t[:, 0] + 91], 1), t * 0.001,
        np.zeros_like(t), np.full_like(t, np.nan), np.full_like(t, np.finfo(np.float32).max),
    ]  # fmt: skip
    rows = np.zeros((6, 16), np.float32)
    for i, f in enumerate(faces):
        rows[i, :5] = [i, i, 10, 10, 0.9]
        rows[i, 5:15] = f.reshape(-1)
    async with hrx.Runtime(backend=hrx_backend) as rt:
        ctx = hrx.models.ModelContext(rt)
        ops = RgbOps(rt)
        table = await device(ctx, rows)
        points = hrx.models.TensorDesc("f32", (6, 5, 2), strides=(16, 2, 1))
        frag = await ops.similarity_2d_fragment(points, TEMPLATE)
        assert frag.definition.weight_bytes() == TEMPLATE.nbytes
        graph = rt.graph("similarity")
        fwd, inv, status = frag.record(graph, [table.view_as(20, points)])
        assert status.view is not None and status.view.buffer.placement.host_mappable
        await graph.prepare().submit()
        f = np.frombuffer(await ctx.download(fwd), np.float32).reshape(6, 2, 3)
        i = np.frombuffer(await ctx.download(inv), np.float32).reshape(6, 2, 3)
        assert np.frombuffer(await ctx.download(status), np.int32).tolist() == [0, 0, 0, 1, 1, 1]
        for k in range(3):
            host = fit_similarity_2d(faces[k], TEMPLATE)
            for got, want in ((f[k], host), (i[k], invert_affine(host))):
                assert np.all(np.abs(got - want) <= 1e-5 * np.maximum(np.abs(want), 1))
        assert np.isnan(f[3:]).all() and np.isnan(i[3:]).all()
        wrong_desc = hrx.models.TensorDesc("f32", (6, 16))
        for args in (
            (points, TEMPLATE[:4]),
            (points, np.full((5, 2), np.nan)),
            (wrong_desc, TEMPLATE),
            ("points", TEMPLATE),
        ):
            with pytest.raises(hrx.ContractError):
                await ops.similarity_2d_fragment(*args)  # type: ignore[arg-type]


@pytest.mark.parametrize("encoding", ["unit", "symmetric"])
@pytest.mark.parametrize("factor", [1, 2, 3])
async def test_rgb_view_fragments_roundtrip_through_submit(
    hrx_backend: str, encoding: str, factor: int
) -> None:
    """views.rs::rgb_views_roundtrip_batches_and_reject_invalid_shapes with the decode
    fed by submit(views): [2, 6, 6, 3]; 4x the input bytes come back; symmetric exact,
    unit within 2e-5; every invalid shape the call refuses, refused here."""
    img = np.random.default_rng(factor).integers(0, 256, (2, 6, 6, 3), dtype=np.uint8)
    f = factor
    async with hrx.Runtime(backend=hrx_backend) as rt:
        ops = RgbOps(rt)
        image = desc(img, "nhwc")
        enc_frag = ops.encode_rgb_fragment(image, f, encoding, hrx.HOST_VISIBLE)
        enc = enc_frag.prepare(2, "enc")
        views_desc = enc_frag.outputs[0][1]
        assert views_desc.shape == (2 * f * f, 3, 6 // f, 6 // f)
        dec = ops.decode_rgb_fragment(views_desc, f, encoding).prepare(2, "dec")
        views = await enc.submit_host_with(writer(img))
        back = await dec.submit(views.outputs)
        del views
        (raw,) = await back.download()
        assert len(raw) == 4 * img.nbytes
        got = np.frombuffer(raw, np.float32).reshape(img.shape)
        if encoding == "symmetric":
            np.testing.assert_array_equal(got, img)
        else:
            np.testing.assert_allclose(got, img, rtol=0, atol=2e-5)
        u8 = hrx.models.TensorDesc
        for bad_desc, bad_f, bad_enc in (
            (image, 0, encoding), (image, 4, encoding), (image, 2**64 - 1, encoding),
            (image, 1, "signed"), (u8("u8", (0, 6, 6, 3), layout="nhwc"), 1, encoding),
            (u8("u8", (1, 6, 6, 4), layout="nhwc"), 1, encoding),
            (u8("f32", (1, 6, 6, 3), layout="nhwc"), 1, encoding),
            (u8("u8", (1, 6, 6, 3), strides=(216, 36, 3, 1), layout="nhwc"), 1, encoding),
        ):  # fmt: skip
            with pytest.raises(hrx.ContractError):
                ops.encode_rgb_fragment(bad_desc, bad_f, bad_enc)
        with pytest.raises(hrx.ContractError):
            ops.decode_rgb_fragment(u8("f32", (3, 3, 2, 2), layout="nchw"), 2, encoding)


async def test_composite_fragment_masks_regions_and_nonfinite_coordinates(
    hrx_backend: str,
) -> None:
    """composite.rs::composite_masks_regions_and_nonfinite_coordinates_preserve_contracts
    through composite_rgb_fragment: frame 21, crop 200.25, α in {−1, 0, .5, 1, 2}, blend
    in {0, .5, 1}, region [1, 0, 3, 1]: only bytes 3..9 change; tx in {NaN, inf, ±1e30}
    leaves the frame unchanged. The region is data here: the host checks of it are the
    call's (tested there); a reversed or outside region composites nothing."""
    frame = np.full((1, 1, 4, 3), 21, np.uint8)
    crop = np.full((1, 1, 4, 3), 200.25, np.float32)
    async with hrx.Runtime(backend=hrx_backend) as rt:
        ops = RgbOps(rt)
        models = {
            mode: ops.composite_rgb_fragment(
                desc(frame, "nhwc"), desc(crop, "nhwc"), mode, hrx.HOST_VISIBLE
            ).prepare(1, mode)
            for mode in ("truncate", "quantized")
        }

        async def run(mode: str, alpha: float, matrix: Any, params: Any) -> Any:
            mask = np.full((1, 4), alpha, np.float32)
            prm = np.asarray(params, np.float32)
            done = await models[mode].submit_host_with(writer(frame, crop, mask, matrix, prm))
            (raw,) = await done.download()
            return np.frombuffer(raw, np.uint8)

        for alpha in (-1.0, 0.0, 0.5, 1.0, 2.0):
            for blend in (0.0, 0.5, 1.0):
                for mode in ("truncate", "quantized"):
                    got = await run(mode, alpha, EYE[None], [1, 0, 3, 1, blend])
                    want = np.full(12, 21)
                    want[3:9] = composite_want(alpha, blend, mode)
                    np.testing.assert_array_equal(got, want, err_msg=f"{alpha} {blend} {mode}")
        for tx in (np.nan, np.inf, 1e30, -1e30):
            m = EYE[None].copy()
            m[0, 0, 2] = tx
            assert (await run("truncate", 1.0, m, [0, 0, 4, 1, 1]) == 21).all()
        for region in ([2, 0, 1, 1, 1], [0, 0, 9, 9, 1]):
            got = await run("truncate", 1.0, EYE[None], region)
            assert (got[:3] if region[0] == 2 else got).tolist() == (
                [21] * 3 if region[0] == 2 else [200] * 12
            )
        f32 = hrx.models.TensorDesc("f32", (1, 1, 4, 3), layout="nhwc")
        with pytest.raises(hrx.ContractError):
            ops.composite_rgb_fragment(f32, desc(crop, "nhwc"))
        with pytest.raises(hrx.ContractError):
            ops.composite_rgb_fragment(desc(frame, "nhwc"), desc(crop, "nhwc"), "over")


async def test_resize_padding_batch_copy_and_concatenation_preserve_owners(
    hrx_backend: str,
) -> None:
    """resize.rs::resize_padding_batch_copy_and_concatenation_preserve_owners: images of
    37 and 191, canvas 5x7, region [1, 1, 4, 3]; three runs in flight, then Busy;
    concatenate [image 1, empty, image 0] with the resize result dropped; copy_into at
    offset 1 is refused; x 1..5, y 1..4 filled in the order [191, 37]; a foreign input
    and concatenate([]) are refused."""
    async with hrx.Runtime(backend=hrx_backend) as rt:
        ctx = hrx.models.ModelContext(rt)
        ops = RgbOps(rt)
        images = np.stack([np.full((4, 6, 3), 37, np.uint8), np.full((4, 6, 3), 191, np.uint8)])
        src = ctx.tensor(desc(images, "nhwc"), hrx.GPU_LOCAL)
        await ctx.upload(src, images)
        spec = RgbResize(5, 7, (1, 1, 4, 3))
        runs = [await ops.resize_rgb(src, spec) for _ in range(3)]
        with pytest.raises(hrx.Busy):
            await ops.resize_rgb(src, spec)
        one = hrx.models.TensorDesc("u8", (1, 5, 7, 3), layout="nhwc")
        batch = runs[0].device()
        del runs
        empty = ctx.allocate_with(
            hrx.models.TensorDesc("u8", (0, 5, 7, 3), layout="nhwc"), hrx.GPU_LOCAL
        )
        joined = ctx.concatenate([batch.view_as(one.nbytes, one), empty, batch.view_as(0, one)])
        del batch
        gc.collect()
        assert joined.desc.shape == (2, 5, 7, 3) and joined.lease is None
        target = ctx.allocate_with(joined.desc, hrx.GPU_LOCAL)
        with pytest.raises(hrx.ContractError, match="ends past"):
            ctx.copy_into(target, 1, joined)
        target = ctx.copy_into(target, 0, joined)
        got = np.frombuffer(await ctx.download(target), np.uint8).reshape(2, 5, 7, 3)
        want = np.zeros((2, 5, 7, 3), np.uint8)
        want[0, 1:4, 1:5], want[1, 1:4, 1:5] = 191, 37
        np.testing.assert_array_equal(got, want)
        with pytest.raises(hrx.ContractError):
            await ops.resize_rgb(src, RgbResize(5, 7, (MAX, 0, 1, 1)))
        with pytest.raises(hrx.ContractError):
            ctx.concatenate([])
        async with hrx.Runtime(backend="sim") as other:
            foreign = await hrx.models.ModelContext(other).upload_tensor(one, bytes(one.nbytes))
            with pytest.raises(hrx.ContractError, match="another model context"):
                ctx.concatenate([joined, foreign])
