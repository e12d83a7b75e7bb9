"""Image operations as graph work: plan reuse, the cache bound, typed errors that change
nothing, byte-range ordering with other work, and the kernel source's portability rules.
On asyncio and trio."""

from __future__ import annotations

import re
import shutil
import subprocess
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hrx_async as hrx
import hrx_async.models
from hrx_async.image import ImageOps
from hrx_async.image import args as image_args
from hrx_async.image.cxx import SOURCE
from hrx_async.image.host import KERNELS

pytestmark = pytest.mark.anyio


def nchw(
    ctx: hrx.models.ModelContext, dtype: str, shape: tuple[int, ...], layout: str = "nchw"
) -> Any:
    return ctx.tensor(hrx.models.TensorDesc(dtype, shape, layout=layout), hrx.GPU_LOCAL)


async def test_a_replay_for_a_seen_shape_prepares_nothing() -> None:
    async with hrx.Runtime(backend="sim") as rt:
        ctx = hrx.models.ModelContext(rt)
        ops = ImageOps(rt, capacity=8)
        raw = nchw(ctx, "u8", (2, 48, 64, 3), "nhwc")
        small = nchw(ctx, "u8", (2, 3, 32, 32))
        x = nchw(ctx, "f32", (2, 3, 32, 32))
        patches = ctx.tensor(hrx.models.TensorDesc("f32", (2, 16, 192)), hrx.GPU_LOCAL)

        async def record() -> hrx.PreparedGraph:
            g = rt.graph("preprocess")
            await ops.resize(g, raw, small)
            await ops.normalize(g, small, x, [0.5, 0.4, 0.3], [0.2, 0.2, 0.2])
            await ops.patchify(g, x, patches, 8)
            return g.prepare()

        step = await record()
        first = ops.stats()
        assert (first.misses, first.hits, first.kernels_loaded, first.entries) == (3, 0, 3, 3)
        await ctx.upload(raw, np.full((2, 48, 64, 3), 200, np.uint8))
        before = rt.statistics()
        for _ in range(3):
            await step.submit()
        after = rt.statistics()
        assert after.native_graphs_prepared == before.native_graphs_prepared
        assert after.allocations == before.allocations
        assert ops.stats() == first  # replays touch no plan

        again = await record()  # a new graph of seen shapes: every plan is a hit
        second = ops.stats()
        assert (second.misses, second.hits, second.kernels_loaded) == (3, 3, 3)
        await again.submit()
        out = await ctx.download(patches)
        want = (200 / 255 - np.array([0.5, 0.4, 0.3], np.float32)) / np.float32(0.2)
        np.testing.assert_allclose(out.reshape(2, 16, 3, 64).mean(axis=(0, 1, 3)), want, rtol=1e-5)
        assert second.to_dict()["kernels_loaded"] == 3


async def test_the_plan_cache_is_bounded_and_keyed_by_shape_dtype_and_parameters() -> None:
    async with hrx.Runtime(backend="sim") as rt:
        ctx = hrx.models.ModelContext(rt)
        ops = ImageOps(rt, capacity=2)
        src = nchw(ctx, "f32", (1, 3, 16, 16))
        a, b = nchw(ctx, "f32", (1, 3, 8, 8)), nchw(ctx, "f32", (1, 3, 4, 4))
        g = rt.graph("plans")
        await ops.resize(g, src, a)
        await ops.resize(g, src, a, mode="nearest")  # another parameter: another plan
        await ops.resize(g, src, b)  # another shape: evicts the least recently used
        s = ops.stats()
        assert (s.entries, s.misses, s.evictions, s.capacity) == (2, 3, 1, 2)
        await ops.resize(g, src, b)
        assert ops.stats().hits == 1
        await ops.clear()
        assert ops.stats().entries == 0
        await g.prepare().submit()
        assert "plans" in repr(ops)


def bad_calls(
    ctx: hrx.models.ModelContext, other: hrx.models.ModelContext
) -> list[tuple[str, Any]]:
    """(what, call(ops, graph)) for input each operation must refuse."""
    img = nchw(ctx, "f32", (1, 3, 8, 8))
    u8 = nchw(ctx, "u8", (1, 3, 8, 8))
    out = nchw(ctx, "f32", (1, 3, 4, 4))
    general = ctx.tensor(hrx.models.TensorDesc("f32", (1, 3, 8, 8)), hrx.GPU_LOCAL)
    rank2 = ctx.tensor(hrx.models.TensorDesc("f32", (8, 8), layout="rows"), hrx.GPU_LOCAL)
    empty = ctx.tensor(hrx.models.TensorDesc("f32", (1, 3, 0, 8), layout="nchw"), hrx.GPU_LOCAL)
    i32 = nchw(ctx, "i32", (1, 3, 8, 8))
    rgba = nchw(ctx, "f32", (1, 4, 8, 8))
    two = nchw(ctx, "f32", (1, 2, 8, 8))
    rgba_small = nchw(ctx, "f32", (1, 4, 4, 4))
    foreign = nchw(other, "f32", (1, 3, 4, 4))
    npu_only = ctx.tensor(
        hrx.models.TensorDesc("f32", (1, 3, 4, 4), layout="nchw"), hrx.npu_local(0)
    )
    patches = ctx.tensor(hrx.models.TensorDesc("f32", (1, 4, 48)), hrx.GPU_LOCAL)
    m = [[1, 0, 0], [0, 1, 0]]
    return [
        ("patch not dividing", lambda o, g: o.patchify(g, img, patches, 3)),
        ("patch zero", lambda o, g: o.patchify(g, img, patches, 0)),
        ("patch shape", lambda o, g: o.patchify(g, img, out, 4)),
        ("general layout", lambda o, g: o.resize(g, general, out)),
        ("rank 2", lambda o, g: o.resize(g, rank2, out)),
        ("zero size", lambda o, g: o.resize(g, empty, out)),
        ("wrong dtype", lambda o, g: o.resize(g, i32, out)),
        ("dtype mismatch", lambda o, g: o.resize(g, u8, out)),
        ("channels differ", lambda o, g: o.resize(g, rgba, out)),
        ("resize mode", lambda o, g: o.resize(g, img, out, mode="cubic")),
        ("normalize shape", lambda o, g: o.normalize(g, img, out, 0.5, 0.5)),
        ("normalize dst u8", lambda o, g: o.normalize(g, img, u8, 0.5, 0.5)),
        ("normalize std 0", lambda o, g: o.normalize(g, u8, img, 0.5, [1, 0, 1])),
        ("normalize mean count", lambda o, g: o.normalize(g, u8, img, [0.5, 0.5], 1)),
        ("normalize nan", lambda o, g: o.normalize(g, u8, img, float("nan"), 1)),
        ("matrix shape", lambda o, g: o.affine(g, img, out, [[1, 0], [0, 1]])),
        ("matrix singular", lambda o, g: o.affine(g, img, out, [[0, 0, 0]] * 2, src_to_dst=True)),
        ("border", lambda o, g: o.affine(g, img, out, m, border="wrap")),
        ("border value", lambda o, g: o.affine(g, img, out, m, border_value=float("inf"))),
        ("composite shapes", lambda o, g: o.composite(g, rgba_small, img, img)),
        (
            "composite channels",
            lambda o, g: o.composite(g, two, rgba, nchw(ctx, "f32", (1, 4, 8, 8))),
        ),
        ("composite dtype", lambda o, g: o.composite(g, rgba, img, u8)),
        ("not a tensor", lambda o, g: o.resize(g, np.zeros((1, 3, 8, 8)), out)),
        ("other runtime", lambda o, g: o.resize(g, img, foreign)),
        ("npu-local", lambda o, g: o.resize(g, img, npu_only)),
        ("aliasing", lambda o, g: o.normalize(g, img, img, 0.5, 0.5)),
        ("not a graph", lambda o, g: o.resize(None, img, out)),
    ]


async def test_bad_input_raises_a_contract_error_and_changes_nothing() -> None:
    async with hrx.Runtime(backend="sim") as rt, hrx.Runtime(backend="sim") as rt2:
        ctx, other = hrx.models.ModelContext(rt), hrx.models.ModelContext(rt2)
        ops = ImageOps(rt)
        g = rt.graph("bad")
        before = (ops.stats(), len(g), rt.statistics().native_graphs_prepared)
        for what, call in bad_calls(ctx, other):
            with pytest.raises(hrx.ContractError):
                await call(ops, g)
                pytest.fail(f"{what}: accepted")
            assert (ops.stats(), len(g), rt.statistics().native_graphs_prepared) == before, what
        with pytest.raises(hrx.ContractError):
            await ops.resize(
                rt2.graph("foreign"), nchw(ctx, "f32", (1, 1, 2, 2)), nchw(ctx, "f32", (1, 1, 1, 1))
            )
        with pytest.raises(hrx.ContractError):
            ImageOps(rt, capacity=0)
        with pytest.raises(hrx.ContractError):
            ImageOps("runtime")  # type: ignore[arg-type]
        assert ops.stats() == before[0]


UNFIT: dict[str, Any] = {
    "resize mode in a list": lambda o, g, t: o.resize(g, t["img"], t["out"], mode=["nearest"]),
    "resize mode a number": lambda o, g, t: o.resize(g, t["img"], t["out"], mode=0),
    "border in a list": lambda o, g, t: o.affine(g, t["img"], t["out"], t["m"], ["constant"]),
    "border a dict": lambda o, g, t: o.affine(g, t["img"], t["out"], t["m"], {}),
    "border value beyond float32": lambda o, g, t: o.affine(
        g, t["img"], t["out"], t["m"], border_value=1e39
    ),
    "matrix beyond float32": lambda o, g, t: o.affine(
        g, t["img"], t["out"], [[1e39, 0, 0], [0, 1, 0]]
    ),
    "matrix inverting beyond float32": lambda o, g, t: o.affine(
        g, t["img"], t["out"], [[1e-40, 0, 0], [0, 1, 0]], src_to_dst=True
    ),
    "matrix of strings": lambda o, g, t: o.affine(
        g, t["img"], t["out"], [["1", "0", "0"], ["0", "1", "0"]]
    ),
    "matrix of bools": lambda o, g, t: o.affine(
        g, t["img"], t["out"], [[True, False, False], [False, True, False]]
    ),
    "scale beyond float32": lambda o, g, t: o.normalize(g, t["u8"], t["img"], 0.5, 0.5, 1e39),
    "scale beyond float64": lambda o, g, t: o.normalize(g, t["u8"], t["img"], 0.5, 0.5, 10**400),
    "scale complex": lambda o, g, t: o.normalize(
        g, t["u8"], t["img"], 0.5, 0.5, np.complex128(1 + 1j)
    ),
    "mean beyond float32": lambda o, g, t: o.normalize(g, t["u8"], t["img"], 1e39, 0.5),
    "std beyond float32": lambda o, g, t: o.normalize(g, t["u8"], t["img"], 0.5, [1, 1e39, 1]),
    "mean a 0-d array of text": lambda o, g, t: o.normalize(
        g, t["u8"], t["img"], np.array("0.5"), 0.5
    ),
}


@pytest.mark.parametrize("case", UNFIT)
async def test_parameters_the_kernels_cannot_take_are_refused(case: str) -> None:
    """Each is a `ContractError` that changes nothing, not a TypeError, a warning or a
    kernel reading inf or NaN."""
    async with hrx.Runtime(backend="sim") as rt:
        ctx = hrx.models.ModelContext(rt)
        ops = ImageOps(rt)
        tensors = {
            "img": nchw(ctx, "f32", (1, 3, 8, 8)),
            "u8": nchw(ctx, "u8", (1, 3, 8, 8)),
            "out": nchw(ctx, "f32", (1, 3, 4, 4)),
            "m": [[1, 0, 0], [0, 1, 0]],
        }
        g = rt.graph("unfit")
        before = (ops.stats(), len(g), rt.statistics().native_graphs_prepared)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(hrx.ContractError):
                await UNFIT[case](ops, g, tensors)
        assert (ops.stats(), len(g), rt.statistics().native_graphs_prepared) == before
        # Fitting values record.
        await ops.normalize(g, tensors["u8"], tensors["img"], 0.5, [0.5] * 3, 1 / 255)
        await ops.affine(g, tensors["img"], tensors["out"], tensors["m"], "replicate", 3.4e38)
        await ops.resize(g, tensors["img"], tensors["out"], "nearest")
        assert len(g) == 3


async def test_a_zero_dimensional_array_is_one_number() -> None:
    async with hrx.Runtime(backend="sim") as rt:
        ctx = hrx.models.ModelContext(rt)
        ops = ImageOps(rt)
        src, dst = nchw(ctx, "u8", (1, 3, 4, 4)), nchw(ctx, "f32", (1, 3, 4, 4))
        g = rt.graph("0-d")
        await ops.normalize(g, src, dst, np.array(0.25), np.array(0.5, np.float32))
        await ctx.upload(src, np.full((1, 3, 4, 4), 255, np.uint8))
        await g.prepare().submit()
        np.testing.assert_allclose(await ctx.download(dst), np.full((1, 3, 4, 4), 1.5))


async def test_image_work_orders_with_other_work_by_byte_range() -> None:
    """A fill of the source, the resize reading it and a copy of its output run in order,
    across lanes and submissions; a resize of disjoint bytes depends on neither."""
    async with hrx.Runtime(backend="sim") as rt:
        ctx = hrx.models.ModelContext(rt)
        ops = ImageOps(rt)
        buffer = rt.allocate(2 * 3 * 8 * 8, hrx.GPU_LOCAL)
        first = hrx.models.Tensor(
            hrx.models.TensorDesc("u8", (1, 3, 8, 8), layout="nchw"), buffer.view(0, 192)
        )
        second = hrx.models.Tensor(
            hrx.models.TensorDesc("u8", (1, 3, 8, 8), layout="nchw"), buffer.view(192, 192)
        )
        out = nchw(ctx, "u8", (1, 3, 4, 4))
        host = rt.allocate(out.nbytes, hrx.HOST_VISIBLE)
        g = rt.graph("ordered")
        g.fill(first.data, 90)
        await ops.resize(g, first, out)
        g.copy(host.view(), out.data)
        step = g.prepare()
        assert step.edges  # upload/compute/download regions depend on each other
        for value in (90, 90):
            await step.submit()
            async with host.map_read() as memory:
                assert set(bytes(memory)) == {value}
        g2 = rt.graph("disjoint")
        await ops.resize(g2, second, nchw(ctx, "u8", (1, 3, 2, 2)))
        reads = [r for r in g2.prepare().reads if r.buffer is buffer]
        assert reads and all(r.start >= 192 for r in reads)  # only the second image's bytes


def test_each_entry_point_has_a_host_twin_and_one_struct() -> None:
    entries = set(re.findall(r"hrx_(\w+?)_##NAME", SOURCE))
    names = {f"hrx_{e}_{t}" for e in entries for t in ("u8", "f32")}
    names |= set(re.findall(r'extern "C" __global__ void (hrx_patchify_b\d)', SOURCE))
    assert names == set(KERNELS)
    assert image_args.NBYTES % 8 == 0
    assert len(image_args.pack(total=1)) == image_args.NBYTES
    assert image_args.unpack(image_args.pack(ss=(1, 2, 3, 4), fill=1.5)).ss == (1, 2, 3, 4)


def test_the_kernel_source_is_portable_cxx() -> None:
    """No CUDA-only intrinsics or headers: what hipRTC compiles too."""
    assert "#include" not in SOURCE
    assert not re.search(r"\b__(?!global__|device__)[a-z_]+\w*\s*\(", SOURCE)
    assert "asm" not in SOURCE and "__shfl" not in SOURCE


def test_the_kernel_source_compiles_as_cxx(tmp_path: Path) -> None:
    compiler = shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no C++ compiler here")
    prelude = (
        "#include <math.h>\n#define __global__\n#define __device__\n"
        "struct D3 { unsigned x, y, z; }; static D3 blockIdx, blockDim, threadIdx;\n"
    )
    path = tmp_path / "image.cpp"
    path.write_text(prelude + SOURCE)
    result = subprocess.run(
        [compiler, "-std=c++17", "-Wall", "-Werror", "-fsyntax-only", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
