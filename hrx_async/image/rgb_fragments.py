"""The RGB operations' fragment forms: each operation's kernel as a `ModelFragment`.

    frag = ops.affine_rgb_packed_fragment(48, crops=4, height=2, width=2)
    model = frag.prepare(3)                       # a PreparedModel: submit, submit_host_with
    (crops,) = frag.record(graph, [image, records, matrices])   # or part of a larger graph

Why: a detection-and-alignment service runs these operations inside its own graphs
(`record(graph, inputs)` binds its tensors in place) or as prepared models it chains on
the device (`prepare(n)`), not only as calls returning leased results. Each fragment is
built by `models.op_fragment.OpFragmentBuilder` over the same kernel and constants as the
call, so both compute the same bits; what the call checks on tensors is checked here on
descriptions. Inputs are in `placement` when prepared as slots (host-visible inputs are
written in place by `submit_host_with`: no staging, no copy graph); a similarity's
status is host-visible, as the call's is. `resize_rgb` has no fragment form (its canvas
is black outside the region on every run, which a plan of its own keeps).

Values that the call takes on the host are tensors here, read when the work runs: a
composite's (left, top, right, bottom, blend) is an f32 [5] input, so the call's host
checks of it cannot apply; the device rules make any value safe (a region outside the
frame or reversed composites nothing, blend is clamped to [0, 1]). A similarity's
template is a weight of the fragment (uploaded once, shared by its slots and graphs).
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np

from .._core.contract import Access
from .._core.kernels import GpuKernel
from .._core.memory import GPU_LOCAL, HOST_VISIBLE, Placement
from .._core.validate import shown
from ..errors import ContractError
from ..models import DType, Layout, ModelContext, TensorDesc
from ..models.fragment import ModelFragment
from ..models.op_fragment import OpFragmentBuilder
from ..models.region import Dispatch
from ..runtime import Runtime
from . import args as image_args


class RgbOps(Protocol):
    """What the fragment forms use of `rgb.RgbOps` (whose methods call them): its runtime,
    its kernel loader and its argument checks, so the call and its fragment check alike."""

    @property
    def runtime(self) -> Runtime: ...

    def _kernel(
        self, entry: str, sizes: list[tuple[int, Access]], constants: bytes, total: int
    ) -> GpuKernel: ...

    @staticmethod
    def _factor(factor: object, encoding: object) -> tuple[int, int]: ...

    @staticmethod
    def _crop(height: object, width: object, mode: object, crops: int) -> tuple[int, int, int]: ...

R, W = Access.READ, Access.WRITE


def _desc(desc: object, what: str) -> TensorDesc:
    if not isinstance(desc, TensorDesc):
        raise ContractError(f"{what} is a TensorDesc, got {shown(desc)}")
    return desc


def rgb_image(desc: object, what: str, dtype: DType = DType.U8) -> tuple[int, int, int]:
    """(batch, height, width) of a non-empty NHWC RGB description of `dtype`."""
    d = _desc(desc, what)
    if d.dtype is not dtype or d.layout is not Layout.NHWC or d.rank != 4 or d.shape[3] != 3:
        raise ContractError(f"{what} must be a {dtype.value} NHWC RGB tensor, got {d}")
    n, h, w, _ = d.shape
    if d.empty or h > 1 << 24 or w > 1 << 24:
        raise ContractError(f"{what} {d} must be non-empty, sides at most 2**24")
    return n, h, w


def _single(
    ops: RgbOps,
    label: str,
    entry: str,
    inputs: list[TensorDesc],
    out: TensorDesc,
    constants: bytes,
    placement: Placement,
) -> ModelFragment:
    """One dispatch of `entry` reading `inputs` and writing `out`."""
    b = OpFragmentBuilder(ModelContext(ops.runtime), label)
    regions = [b.region(d.nbytes, placement) for d in inputs]
    target = b.region(out.nbytes, GPU_LOCAL)
    sizes = [(d.nbytes, R) for d in inputs] + [(out.nbytes, W)]
    k = b.adopt(ops._kernel(entry, sizes, constants, math.prod(out.shape)))
    return b.fragment(
        [Dispatch(k, [*(r.read() for r in regions), target.write()])],
        list(zip(regions, inputs, strict=True)),
        [(target, out)],
    )


def encode(
    ops: RgbOps, desc: object, factor: int, encoding: str, placement: Placement
) -> ModelFragment:
    n, h, w = rgb_image(desc, "encode_rgb_fragment source")
    assert isinstance(desc, TensorDesc)
    if not desc.contiguous:
        raise ContractError(f"encode_rgb takes a contiguous image, got strides {desc.strides}")
    f, mode = ops._factor(factor, encoding)
    if h % f or w % f:
        raise ContractError(f"factor {f} does not divide the image's {h}x{w}")
    out = TensorDesc(DType.F32, (n * f * f, 3, h // f, w // f), layout=Layout.NCHW)
    constants = image_args.pack(
        total=out.numel, n=n, sh=h, sw=w, dh=h // f, dw=w // f, k=f, mode=mode
    )
    return _single(ops, "encode_rgb", "hrx_rgb_encode", [desc], out, constants, placement)


def decode(
    ops: RgbOps, desc: object, factor: int, encoding: str, placement: Placement
) -> ModelFragment:
    d = _desc(desc, "decode_rgb_fragment views")
    f, mode = ops._factor(factor, encoding)
    if d.dtype is not DType.F32 or d.layout is not Layout.NCHW or d.rank != 4 or d.shape[1] != 3:
        raise ContractError(f"decode_rgb takes f32 NCHW views of 3 channels, got {d}")
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
    return _single(ops, "decode_rgb", "hrx_rgb_decode", [d], out, constants, placement)


def _matrices(crops: object) -> TensorDesc:
    if isinstance(crops, bool) or not isinstance(crops, int) or crops < 1:
        raise ContractError(f"a fragment makes crops >= 1, got {shown(crops)}")
    return TensorDesc(DType.F32, (crops, 2, 3))


def affine(
    ops: RgbOps,
    desc: object,
    crops: int,
    height: int,
    width: int,
    mode: str,
    placement: Placement,
) -> ModelFragment:
    n, sh, sw = rgb_image(desc, "affine_rgb_fragment source")
    assert isinstance(desc, TensorDesc)
    if n != 1:
        raise ContractError(f"affine_rgb crops from one image (batch 1), got batch {n}")
    m = _matrices(crops)
    h, w, number = ops._crop(height, width, mode, crops)
    s = desc.strides
    constants = image_args.pack(
        total=crops * h * w * 3, n=crops, sh=sh, sw=sw, dh=h, dw=w,
        ss=(s[0], s[3], s[1], s[2]), mode=number,
    )  # fmt: skip
    out = TensorDesc(DType.U8, (crops, h, w, 3), layout=Layout.NHWC)
    return _single(ops, "affine_rgb", "hrx_affine_rgb", [desc, m], out, constants, placement)


def affine_packed(
    ops: RgbOps,
    nbytes: int,
    crops: int,
    height: int,
    width: int,
    mode: str,
    placement: Placement,
) -> ModelFragment:
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or not 1 <= nbytes < 2**32:
        raise ContractError(f"the packed image holds 1 to 2**32 - 1 bytes, got {shown(nbytes)}")
    m = _matrices(crops)
    h, w, number = ops._crop(height, width, mode, crops)
    constants = image_args.pack(total=crops * h * w * 3, n=crops, dh=h, dw=w, mode=number, k=nbytes)
    inputs = [TensorDesc(DType.U8, (nbytes,)), TensorDesc(DType.U32, (crops, 3)), m]
    out = TensorDesc(DType.U8, (crops, h, w, 3), layout=Layout.NHWC)
    entry = "hrx_affine_rgb_packed"
    return _single(ops, "affine_rgb_packed", entry, inputs, out, constants, placement)


async def similarity(
    ops: RgbOps, desc: TensorDesc, template: np.ndarray[Any, Any], placement: Placement
) -> ModelFragment:
    """`template`: checked by the caller (float32 [P, 2], finite, P = the input's)."""
    faces, count = desc.shape[0], desc.shape[1]
    constants = image_args.pack(total=faces, n=faces, dh=count, ss=desc.strides)
    mats = faces * 24
    b = OpFragmentBuilder(ModelContext(ops.runtime), "similarity_2d")
    points = b.region(desc.nbytes, placement)
    tpl = await b.weight(np.ascontiguousarray(template, np.float32).tobytes(), "template")
    both = b.region(2 * mats, GPU_LOCAL)
    status = b.region(faces * 4, HOST_VISIBLE)
    sizes = [(desc.nbytes, R), (count * 8, R), (mats, W), (mats, W), (faces * 4, W)]
    k = b.adopt(ops._kernel("hrx_similarity_2d", sizes, constants, faces))
    fwd, inv = both.slice(0, mats), both.slice(mats, mats)
    m = TensorDesc(DType.F32, (faces, 2, 3))
    return b.fragment(
        [Dispatch(k, [points.read(), tpl.read(), fwd.write(), inv.write(), status.write()])],
        [(points, desc)],
        [(fwd, m), (inv, m), (status, TensorDesc(DType.I32, (faces,)))],
    )


def composite(
    ops: RgbOps, frame: object, crop: object, mode: str, placement: Placement
) -> ModelFragment:
    n, fh, fw = rgb_image(frame, "composite frame")
    cn, ch, cw = rgb_image(crop, "composite crop", DType.F32)
    assert isinstance(frame, TensorDesc) and isinstance(crop, TensorDesc)
    if n != 1 or cn != 1 or not frame.contiguous or not crop.contiguous:
        raise ContractError(
            f"composite takes a contiguous frame and crop of batch 1, got {frame} and {crop}"
        )
    modes = {"truncate": 0, "quantized": 1}
    if not isinstance(mode, str) or mode not in modes:
        raise ContractError(f"mode must be one of {sorted(modes)}, got {shown(mode)}")
    total = fh * fw * 3
    constants = image_args.pack(total=total, n=1, sh=ch, sw=cw, dh=fh, dw=fw, mode=modes[mode])
    inputs = [
        frame,
        crop,
        TensorDesc(DType.F32, (ch, cw)),
        TensorDesc(DType.F32, (1, 2, 3)),
        TensorDesc(DType.F32, (5,)),
    ]
    out = TensorDesc(DType.U8, (1, fh, fw, 3), layout=Layout.NHWC)
    return _single(ops, "composite_rgb", "hrx_composite_rgb", inputs, out, constants, placement)


__all__ = ["affine", "affine_packed", "composite", "decode", "encode", "similarity"]
