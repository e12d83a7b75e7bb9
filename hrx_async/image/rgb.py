"""RGB operations of a detection-and-alignment service, returning leased results:
letterbox resize, affine crops (+ packed), similarity fitting, RGB views, composite.

    ops = RgbOps(rt)
    region = letterbox(480, 640, 640, 640)                      # (l, t, w, h): the fit
    canvas = await ops.resize_rgb(frame, RgbResize(640, 640, region))
    fwd, inv, status = await ops.similarity_2d(landmarks, TEMPLATE)   # per face
    crops = await ops.affine_rgb(frame, inv, 112, 112)          # crop pixel -> frame

u8 images are NHWC RGB tensors (`layout="nhwc"`, three channels). Each call checks its
input first (`ContractError`, nothing changed), takes the plan of its key (kernel, and
three slots of outputs and prepared graph: `hrx_async.models.results`) from a bounded
cache, submits the slot's graph and returns `Result` tensors without waiting. A fourth
live result of a plan is `Busy`. Matrices and records are tensors read when the work
runs (a similarity's output can feed the affine directly, ordered by its bytes). The
rules are in `rgb_kernels` (C++ and its numpy twin, the same bits).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._core.contract import Access, Binding, KernelContract
from .._core.kernels import GpuKernel, KernelSource
from .._core.memory import GPU_LOCAL, HOST_VISIBLE, Placement, View
from .._core.validate import shown
from ..errors import ContractError
from ..models import DType, Layout, Tensor, TensorDesc
from ..models.fragment import ModelFragment
from ..models.results import Result, ResultOps, ResultPlan, SlotGraph
from ..runtime import Runtime
from . import args as image_args
from . import rgb_fragments
from .rgb_kernels import F32_MAX, KERNELS, MAX_SIDE, SOURCE, fit, precision

BLOCK = 256
AFFINE_MODES = {"black_ties_even": 0, "replicate_half_up": 1}
MAX_DIM = 1 << 24
MAX_TEMPLATE = 64


@dataclass(frozen=True, slots=True)
class RgbResize:
    """A canvas of `height` x `width` and the `region` (left, top, width, height) of it
    the image is resized into; the rest is black."""

    height: int
    width: int
    region: tuple[int, int, int, int]


def _int(value: object, what: str, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise ContractError(f"{what} must be an integer >= {low}, got {shown(value)}")
    return int(value)


def letterbox(
    src_h: int, src_w: int, height: int, width: int, centered: bool = False
) -> tuple[int, int, int, int]:
    """The region (left, top, width, height) of a `height` x `width` canvas an image of
    `src_h` x `src_w` fills keeping its aspect: the width fills when width·src_h ≤
    height·src_w (the other side floor-divided), padding right and bottom, or around it
    with the odd pixel right or bottom when `centered`."""
    sh, sw = _int(src_h, "source height", 1), _int(src_w, "source width", 1)
    h, w = _int(height, "canvas height", 1), _int(width, "canvas width", 1)
    if w * sh <= h * sw:
        rw, rh = w, sh * w // sw
    else:
        rw, rh = sw * h // sh, h
    if rw == 0 or rh == 0:
        raise ContractError(f"{sh}x{sw} letterboxed into {h}x{w} leaves a side of zero pixels")
    if not centered:
        return (0, 0, rw, rh)
    return ((w - rw) // 2, (h - rh) // 2, rw, rh)


def fit_similarity_2d(points: Any, template: Any) -> np.ndarray[Any, np.dtype[np.float64]]:
    """The 2x3 similarity (rotation, uniform scale, translation) mapping `points` [P, 2]
    onto `template` [P, 2] by centred least squares: a = Σ(xu + yv)/Σ(x² + y²),
    b = Σ(xv − yu)/Σ(x² + y²) → [[a, −b, qx − a·px + b·py], [b, a, qy − b·px − a·py]].
    At least two points, equal counts, all finite; an unusable fit is a `ContractError`."""
    p, q = _points(points, "points"), _points(template, "template")
    if p.shape != q.shape:
        raise ContractError(f"points {p.shape} and template {q.shape} differ in count")
    both, _ = fit(p, q)
    from .ops import invert_affine

    matrix: np.ndarray[Any, np.dtype[np.float64]] = both[0]
    invert_affine(matrix)  # the checks: finite, invertible
    return matrix


def _points(values: Any, what: str) -> np.ndarray[Any, np.dtype[np.float64]]:
    array = np.asarray(values)
    if array.dtype.kind not in "iuf" or array.ndim != 2 or array.shape[1] != 2:
        raise ContractError(f"{what} must be [P, 2] real numbers, got {shown(values)}")
    if array.shape[0] < 2 or not np.isfinite(array).all():
        raise ContractError(f"{what} needs at least 2 points, all finite")
    return array.astype(np.float64)


class RgbOps(ResultOps):
    """resize_rgb, affine_rgb (+ packed) and similarity_2d of one runtime; each plan has
    three result slots, at most `capacity` plans. For one event loop thread."""

    def __init__(self, runtime: Runtime, capacity: int = 64) -> None:
        super().__init__(runtime, capacity, "rgb plans")

    async def resize_rgb(self, src: Tensor, resize: RgbResize) -> Result:
        """`src` (u8 NHWC RGB) resized into `resize.region` of a black u8 NHWC canvas by
        the integer two-pass bilinear of `rgb_kernels`."""
        n, sh, sw = self._rgb(src, "resize_rgb source")
        if not isinstance(resize, RgbResize):
            raise ContractError(f"resize_rgb takes an RgbResize, got {shown(resize)}")
        h = _int(resize.height, "canvas height", 1)
        w = _int(resize.width, "canvas width", 1)
        if not isinstance(resize.region, Sequence) or len(resize.region) != 4:
            raise ContractError(f"a region is (left, top, width, height), got {resize.region!r}")
        left, top, rw, rh = (_int(v, "a region value") for v in resize.region)
        if rw < 1 or rh < 1 or left + rw > w or top + rh > h or h > MAX_DIM or w > MAX_DIM:
            raise ContractError(f"region {resize.region} must be non-empty and fit {h}x{w}")
        out = TensorDesc(DType.U8, (n, h, w, 3), layout=Layout.NHWC)
        if n * h * w * 3 > image_args.MAX_ELEMENTS:
            raise ContractError(f"a canvas of {out} is too large")
        s = src.desc.strides
        constants = image_args.pack(
            total=n * h * w * 3,
            n=n,
            sh=sh,
            sw=sw,
            dh=h,
            dw=w,
            ss=(s[0], s[3], s[1], s[2]),
            region=(left, top, rw, rh),
            bits=(precision(rh, sh), precision(rw, sw)),
        )
        key = ("resize_rgb", _key(src), h, w, (left, top, rw, rh))
        return await self._single(key, "hrx_resize_rgb", [src], out, constants)

    async def affine_rgb(
        self,
        src: Tensor,
        matrices: Tensor,
        height: int,
        width: int,
        mode: str = "black_ties_even",
    ) -> Result:
        """Crops [crops, height, width, 3] (u8 NHWC) from `src` (u8 NHWC RGB, batch 1):
        crop i samples `src` bilinearly at matrices[i] · (x, y, 1), `matrices` a f32
        [crops, 2, 3] tensor mapping crop pixels to source positions."""
        n, sh, sw = self._rgb(src, "affine_rgb source")
        if n != 1:
            raise ContractError(f"affine_rgb crops from one image (batch 1), got batch {n}")
        crops = self._matrices(matrices)
        h, w, number = self._crop(height, width, mode, crops)
        s = src.desc.strides
        constants = image_args.pack(
            total=crops * h * w * 3,
            n=crops,
            sh=sh,
            sw=sw,
            dh=h,
            dw=w,
            ss=(s[0], s[3], s[1], s[2]),
            mode=number,
        )
        out = TensorDesc(DType.U8, (crops, h, w, 3), layout=Layout.NHWC)
        key = ("affine_rgb", _key(src), _key(matrices), h, w, number)
        return await self._single(key, "hrx_affine_rgb", [src, matrices], out, constants)

    async def affine_rgb_packed(
        self,
        image: Tensor,
        records: Tensor,
        matrices: Tensor,
        height: int,
        width: int,
        mode: str = "black_ties_even",
    ) -> Result:
        """`affine_rgb` over sources packed in one u8 [bytes] `image`: crop i's source is
        the height x width x 3 image at records[i] = (offset, width, height) (u32
        [crops, 3]); an invalid record (see `rgb_kernels`) gives a black crop."""
        self._input(image, "packed image")
        d = image.desc
        if d.dtype is not DType.U8 or d.rank != 1 or not d.contiguous or d.empty:
            raise ContractError(f"the packed image is a non-empty contiguous u8 [bytes], got {d}")
        self._input(records, "packed records")
        r = records.desc
        crops = self._matrices(matrices)
        if r.dtype is not DType.U32 or r.shape != (crops, 3) or not r.contiguous:
            raise ContractError(f"records must be a contiguous u32 [{crops}, 3], got {r}")
        h, w, number = self._crop(height, width, mode, crops)
        if d.shape[0] >= 2**32:
            raise ContractError(f"the packed image {d} is over 2**32 - 1 bytes")
        constants = image_args.pack(
            total=crops * h * w * 3, n=crops, dh=h, dw=w, mode=number, k=d.shape[0]
        )
        out = TensorDesc(DType.U8, (crops, h, w, 3), layout=Layout.NHWC)
        key = ("affine_rgb_packed", _key(image), _key(records), _key(matrices), h, w, number)
        inputs = [image, records, matrices]
        return await self._single(key, "hrx_affine_rgb_packed", inputs, out, constants)

    async def similarity_2d(self, points: Tensor, template: Any) -> tuple[Result, ...]:
        """Per face of f32 `points` [B, P, 2] (any strides: a view of detection rows
        does), the similarity onto `template` [P, 2] (P in 2..64): forward (points →
        template) and inverse [B, 2, 3] f32, and status i32 [B] (host-visible): 0, or 1
        with NaN matrices when the face's fit is unusable."""
        self._input(points, "similarity points")
        d = _similarity_points(points.desc)
        tpl = _template(template, d.shape[1])
        faces, count = d.shape[0], d.shape[1]
        constants = image_args.pack(total=faces, n=faces, dh=count, ss=d.strides)
        key = ("similarity_2d", _key(points), tpl.tobytes())
        mats = faces * 24
        view = points.data

        def load() -> ResultPlan[SlotGraph]:
            sizes = [
                (view.nbytes, Access.READ),
                (count * 8, Access.READ),
                (mats, Access.WRITE),
                (mats, Access.WRITE),
                (faces * 4, Access.WRITE),
            ]
            kernel = self._kernel("hrx_similarity_2d", sizes, constants, faces)

            def build(index: int) -> SlotGraph:
                rt = self.runtime
                stored = rt.allocate(count * 8, HOST_VISIBLE, "similarity-template")
                fwd = rt.allocate(2 * mats, GPU_LOCAL, "similarity-matrices")
                status = rt.allocate(faces * 4, HOST_VISIBLE, "similarity-status")
                g = rt.graph("similarity_2d")
                g.gpu(
                    kernel,
                    [view, stored.view(), fwd.view(0, mats), fwd.view(mats, mats), status.view()],
                )
                return SlotGraph(
                    [stored, fwd, status],
                    g.prepare(),
                    template=stored.view(),
                    fwd=fwd.view(0, mats),
                    inv=fwd.view(mats, mats),
                    status=status.view(),
                )

            return ResultPlan(build, SlotGraph.free, label="similarity_2d")

        async def fill(slot: SlotGraph) -> None:
            async with slot.views["template"].map_write() as memory:
                np.frombuffer(memory, np.float32)[:] = tpl.reshape(-1)

        m = TensorDesc(DType.F32, (faces, 2, 3))
        return await self.plans.run(
            key,
            load,
            fill,
            lambda s: [
                (m, s.views["fwd"]),
                (m, s.views["inv"]),
                (TensorDesc(DType.I32, (faces,)), s.views["status"]),
            ],
        )

    async def encode_rgb(self, src: Tensor, factor: int = 1, encoding: str = "unit") -> Result:
        """RGB views of `src` (contiguous u8 NHWC RGB [B, H, W, 3], `factor` dividing H
        and W): f32 NCHW [B·f², 3, H/f, W/f], view b·f² + dy·f + dx holding pixels
        (y·f + dy, x·f + dx); "unit" b/255 or "symmetric" b/127.5 − 1."""
        n, h, w = self._rgb(src, "encode_rgb source")
        if not src.desc.contiguous:
            raise ContractError(
                f"encode_rgb takes a contiguous image, got strides {src.desc.strides}"
            )
        f, mode = self._factor(factor, encoding)
        if h % f or w % f:
            raise ContractError(f"factor {f} does not divide the image's {h}x{w}")
        out = TensorDesc(DType.F32, (n * f * f, 3, h // f, w // f), layout=Layout.NCHW)
        total = out.numel
        constants = image_args.pack(
            total=total, n=n, sh=h, sw=w, dh=h // f, dw=w // f, k=f, mode=mode
        )
        key = ("encode_rgb", _key(src), f, mode)
        return await self._single(key, "hrx_rgb_encode", [src], out, constants)

    async def decode_rgb(self, views: Tensor, factor: int = 1, encoding: str = "unit") -> Result:
        """The inverse of `encode_rgb`: f32 NCHW views [B·f², 3, h, w] (contiguous, batch
        a multiple of f²) → f32 NHWC [B, h·f, w·f, 3]; "unit" v·255 (unclipped),
        "symmetric" rint((clamp(v, ±1) + 1)·127.5)."""
        self._input(views, "decode_rgb views")
        d = views.desc
        f, mode = self._factor(factor, encoding)
        if d.dtype is not DType.F32 or d.layout is not Layout.NCHW or d.shape[1] != 3:
            raise ContractError(
                f"decode_rgb takes f32 NCHW views of 3 channels, got {d} {d.layout.value}"
            )
        if d.empty or not d.contiguous or d.shape[0] % (f * f):
            raise ContractError(
                f"decode_rgb views {d} must be contiguous, non-empty, batch a multiple of {f * f}"
            )
        v, _, h, w = d.shape
        n = v // (f * f)
        out = TensorDesc(DType.F32, (n, h * f, w * f, 3), layout=Layout.NHWC)
        constants = image_args.pack(
            total=out.numel, n=n, sh=h, sw=w, dh=h * f, dw=w * f, k=f, mode=mode
        )
        key = ("decode_rgb", _key(views), f, mode)
        return await self._single(key, "hrx_rgb_decode", [views], out, constants)

    async def composite_rgb(
        self,
        frame: Tensor,
        crop: Tensor,
        mask: Tensor,
        matrix: Tensor,
        region: Sequence[int],
        blend: float = 1.0,
        mode: str = "truncate",
    ) -> Result:
        """A copy of `frame` (u8 NHWC RGB, batch 1) with the pixels of `region` (left,
        top, right, bottom; exclusive) composited from `crop` (f32 NHWC RGB, batch 1)
        through `mask` (f32 [ch, cw]) at `matrix` (f32 [1, 2, 3], frame → crop):
        "truncate" or "quantized" with `blend` in [0, 1] (see `rgb_kernels`)."""
        _, fh, fw = self._rgb_any(frame, "composite frame", DType.U8)
        ch, cw = self._crop_image(crop, mask)
        self._input(matrix, "composite matrix")
        if (
            matrix.desc.dtype is not DType.F32
            or matrix.desc.shape != (1, 2, 3)
            or not matrix.desc.contiguous
        ):
            raise ContractError(
                f"the composite matrix is a contiguous f32 [1, 2, 3], got {matrix.desc}"
            )
        if not isinstance(region, Sequence) or len(region) != 4:
            raise ContractError(f"a region is (left, top, right, bottom), got {shown(region)}")
        left, top, right, bottom = (_int(v, "a region value") for v in region)
        if left > right or top > bottom or right > fw or bottom > fh:
            raise ContractError(f"region {tuple(region)} must be ordered and inside {fh}x{fw}")
        if (
            isinstance(blend, bool)
            or not isinstance(blend, int | float | np.number)
            or not 0 <= blend <= 1
        ):
            raise ContractError(f"blend must be a number in [0, 1], got {shown(blend)}")
        modes = {"truncate": 0, "quantized": 1}
        if not isinstance(mode, str) or mode not in modes:
            raise ContractError(f"mode must be one of {sorted(modes)}, got {shown(mode)}")
        params = np.array([left, top, right, bottom, blend], np.float32)
        total = fh * fw * 3
        constants = image_args.pack(total=total, n=1, sh=ch, sw=cw, dh=fh, dw=fw, mode=modes[mode])
        inputs = [frame.data, crop.data, mask.data, matrix.data]
        entry = "hrx_composite_rgb"

        def load() -> ResultPlan[SlotGraph]:
            sizes = [(v.nbytes, Access.READ) for v in inputs]
            kernel = self._kernel(
                entry, [*sizes, (20, Access.READ), (total, Access.WRITE)], constants, total
            )

            def build(index: int) -> SlotGraph:
                rt = self.runtime
                prm = rt.allocate(20, HOST_VISIBLE, "composite-params")
                out = rt.allocate(total, GPU_LOCAL, entry)
                g = rt.graph(entry)
                g.gpu(kernel, [*inputs, prm.view(), out.view()])
                return SlotGraph([prm, out], g.prepare(), params=prm.view(), out=out.view())

            return ResultPlan(build, SlotGraph.free, label=entry)

        async def fill(slot: SlotGraph) -> None:
            async with slot.views["params"].map_write() as memory:
                np.frombuffer(memory, np.float32)[:] = params

        out = TensorDesc(DType.U8, (1, fh, fw, 3), layout=Layout.NHWC)
        key = (entry, *(_key(t) for t in (frame, crop, mask, matrix)), modes[mode])
        (result,) = await self.plans.run(key, load, fill, lambda s: [(out, s.views["out"])])
        return result

    # -- fragment forms (`rgb_fragments`): the same kernels as model fragments ----------

    def encode_rgb_fragment(
        self, desc: TensorDesc, factor: int = 1, encoding: str = "unit",
        placement: Placement = GPU_LOCAL,
    ) -> ModelFragment:  # fmt: skip
        """`encode_rgb` of an image described by `desc`, as a fragment."""
        return rgb_fragments.encode(self, desc, factor, encoding, placement)

    def decode_rgb_fragment(
        self, desc: TensorDesc, factor: int = 1, encoding: str = "unit",
        placement: Placement = GPU_LOCAL,
    ) -> ModelFragment:  # fmt: skip
        """`decode_rgb` of views described by `desc`, as a fragment."""
        return rgb_fragments.decode(self, desc, factor, encoding, placement)

    def affine_rgb_fragment(
        self, desc: TensorDesc, crops: int, height: int, width: int,
        mode: str = "black_ties_even", placement: Placement = GPU_LOCAL,
    ) -> ModelFragment:  # fmt: skip
        """`affine_rgb` as a fragment: inputs the image and f32 matrices [crops, 2, 3]."""
        return rgb_fragments.affine(self, desc, crops, height, width, mode, placement)

    def affine_rgb_packed_fragment(
        self, nbytes: int, crops: int, height: int, width: int,
        mode: str = "black_ties_even", placement: Placement = GPU_LOCAL,
    ) -> ModelFragment:  # fmt: skip
        """`affine_rgb_packed` as a fragment: inputs u8 [nbytes], u32 records [crops, 3]
        and f32 matrices [crops, 2, 3]."""
        return rgb_fragments.affine_packed(self, nbytes, crops, height, width, mode, placement)

    async def similarity_2d_fragment(
        self, desc: TensorDesc, template: Any, placement: Placement = GPU_LOCAL
    ) -> ModelFragment:
        """`similarity_2d` of points described by `desc` (any strides), as a fragment
        whose template is a weight (uploaded now)."""
        if not isinstance(desc, TensorDesc):
            raise ContractError(f"similarity points are a TensorDesc, got {shown(desc)}")
        d = _similarity_points(desc)
        tpl = _template(template, d.shape[1])
        return await rgb_fragments.similarity(self, d, tpl, placement)

    def composite_rgb_fragment(
        self, frame: TensorDesc, crop: TensorDesc, mode: str = "truncate",
        placement: Placement = GPU_LOCAL,
    ) -> ModelFragment:  # fmt: skip
        """`composite_rgb` as a fragment: inputs frame, crop, mask [ch, cw], matrix
        [1, 2, 3] and f32 [5] (left, top, right, bottom, blend)."""
        return rgb_fragments.composite(self, frame, crop, mode, placement)

    # -- shared steps ----------------------------------------------------------------

    @staticmethod
    def _factor(factor: object, encoding: object) -> tuple[int, int]:
        f = _int(factor, "the view factor", 1)
        if f > 1 << 12:
            raise ContractError(f"the view factor {f} is too large")
        encodings = {"unit": 0, "symmetric": 1}
        if not isinstance(encoding, str) or encoding not in encodings:
            raise ContractError(
                f"encoding must be one of {sorted(encodings)}, got {shown(encoding)}"
            )
        return f, encodings[encoding]

    def _rgb_any(self, tensor: object, what: str, dtype: DType) -> tuple[int, int, int]:
        t = self._input(tensor, what)
        d = t.desc
        if (
            d.dtype is not dtype
            or d.layout is not Layout.NHWC
            or d.shape[3] != 3
            or d.shape[0] != 1
        ):
            raise ContractError(
                f"{what} must be a {dtype.value} NHWC RGB tensor of batch 1, got {d}"
            )
        if d.empty or not d.contiguous or max(d.shape) > MAX_DIM:
            raise ContractError(f"{what} {d} must be non-empty, contiguous, sides at most 2**24")
        return d.shape[0], d.shape[1], d.shape[2]

    def _crop_image(self, crop: object, mask: object) -> tuple[int, int]:
        _, ch, cw = self._rgb_any(crop, "composite crop", DType.F32)
        m = self._input(mask, "composite mask").desc
        if m.dtype is not DType.F32 or m.shape != (ch, cw) or not m.contiguous:
            raise ContractError(f"the composite mask is a contiguous f32 [{ch}, {cw}], got {m}")
        return ch, cw

    def _input(self, tensor: object, what: str) -> Tensor:
        checked = self._check_input(tensor, what)
        image_args.check_extent(checked, what)
        return checked

    def _rgb(self, tensor: object, what: str) -> tuple[int, int, int]:
        t = self._input(tensor, what)
        d = t.desc
        if d.dtype is not DType.U8 or d.layout is not Layout.NHWC or d.shape[3] != 3:
            raise ContractError(f"{what} must be a u8 NHWC RGB tensor, got {d} {d.layout.value}")
        n, h, w, _ = d.shape
        if d.empty or h > MAX_DIM or w > MAX_DIM:
            raise ContractError(f"{what} {d} must be non-empty, sides at most 2**24")
        return n, h, w

    def _matrices(self, matrices: object) -> int:
        t = self._input(matrices, "matrices")
        d = t.desc
        if d.dtype is not DType.F32 or d.rank != 3 or d.shape[1:] != (2, 3) or d.empty:
            raise ContractError(f"matrices are a non-empty f32 [crops, 2, 3], got {d}")
        if not d.contiguous:
            raise ContractError(f"matrices {d} must be contiguous")
        crops: int = d.shape[0]
        return crops

    @staticmethod
    def _crop(height: object, width: object, mode: object, crops: int) -> tuple[int, int, int]:
        h, w = _int(height, "crop height", 1), _int(width, "crop width", 1)
        if h > MAX_SIDE or w > MAX_SIDE or crops * h * w * 3 > image_args.MAX_ELEMENTS:
            raise ContractError(f"{crops} crops of {h}x{w} are too large")
        if not isinstance(mode, str) or mode not in AFFINE_MODES:
            raise ContractError(f"mode must be one of {sorted(AFFINE_MODES)}, got {shown(mode)}")
        return h, w, AFFINE_MODES[mode]

    def _kernel(
        self, entry: str, sizes: list[tuple[int, Access]], constants: bytes, total: int
    ) -> GpuKernel:
        contract = KernelContract([Binding(n, access, 1) for n, access in sizes], constants)
        kernel = self.runtime.load_gpu_kernel(
            KernelSource(cxx=SOURCE, host=KERNELS[entry]),
            entry,
            (max(1, -(-total // BLOCK)), 1, 1),
            (BLOCK, 1, 1),
            contract,
        )
        self.plans.kernels_loaded += 1
        return kernel

    async def _single(
        self, key: Any, entry: str, inputs: list[Tensor], out: TensorDesc, constants: bytes
    ) -> Result:
        views: list[View] = [t.data for t in inputs]
        total = math.prod(out.shape)

        def load() -> ResultPlan[SlotGraph]:
            sizes = [(v.nbytes, Access.READ) for v in views] + [(out.nbytes, Access.WRITE)]
            kernel = self._kernel(entry, sizes, constants, total)

            def build(index: int) -> SlotGraph:
                buffer = self.runtime.allocate(out.nbytes, GPU_LOCAL, entry)
                g = self.runtime.graph(entry)
                g.gpu(kernel, [*views, buffer.view()])
                return SlotGraph([buffer], g.prepare(), out=buffer.view())

            return ResultPlan(build, SlotGraph.free, label=entry)

        (result,) = await self.plans.run(key, load, None, lambda s: [(out, s.views["out"])])
        return result

    def __repr__(self) -> str:
        s = self.stats()
        return f"<RgbOps plans {s.entries}/{s.capacity} hits={s.hits} misses={s.misses}>"


def _similarity_points(d: TensorDesc) -> TensorDesc:
    if d.dtype is not DType.F32 or d.rank != 3 or d.shape[2] != 2 or d.empty:
        raise ContractError(f"similarity points are a non-empty f32 [B, P, 2], got {d}")
    return d


def _template(template: Any, count: int) -> np.ndarray[Any, np.dtype[np.float32]]:
    tpl = _points(template, "template").astype(np.float32)
    if tpl.shape[0] != count or not 2 <= count <= MAX_TEMPLATE:
        raise ContractError(
            f"the template has {tpl.shape[0]} points; the input {count}; both 2..64"
        )
    if not np.isfinite(tpl).all():
        raise ContractError("the template is not finite as float32")
    return tpl


def _key(tensor: Tensor) -> tuple[Any, ...]:
    d, view = tensor.desc, tensor.data
    return (d.dtype.value, d.layout.value, d.shape, d.strides, view.buffer, view.offset)


__all__ = ["AFFINE_MODES", "F32_MAX", "RgbOps", "RgbResize", "fit_similarity_2d", "letterbox"]
