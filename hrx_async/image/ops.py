"""Image operations recorded into graphs as GPU work over tensors, with bounded plans.

    ops = ImageOps(rt, capacity=64)
    g = rt.graph("preprocess")
    await ops.resize(g, raw, small, mode="bilinear")         # u8 NHWC -> u8 NHWC
    await ops.normalize(g, small, x, mean, std)              # u8 NHWC -> f32 NCHW
    await ops.patchify(g, x, patches, 16)                    # f32 NCHW -> [B, cells, C*16*16]
    step = g.prepare()                                       # replay with step.submit()

Each call checks its tensors and parameters first (bad input raises `ContractError`
and changes nothing: no node, no plan, no counter), then takes the plan of its key
(operation, entry point, every tensor's dtype, shape and strides, and the parameters)
from a bounded `PlanCache`, loading the kernel only on a miss, and records one `gpu`
node. The node reads and writes exactly the tensors' bytes, so it is ordered with
everything else in the graph and across submissions byte range by byte range.

Images are rank-4 tensors declared `layout="nchw"` or `layout="nhwc"` (any strides);
the maths and the conventions are in `cxx` (device) and `host` (sim).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._core.contract import Access, Binding, KernelContract
from .._core.graph import Graph
from .._core.kernels import GpuKernel, KernelSource
from .._core.validate import shown
from ..errors import ContractError
from ..models import DType, PlanCache, Tensor
from ..runtime import Runtime
from . import args as image_args
from .args import MAX_CHANNELS, Image, check_extent, image_of
from .cxx import SOURCE
from .host import KERNELS

BLOCK = 256
RESIZE_MODES = {"nearest": 0, "bilinear": 1}
BORDERS = {"constant": 0, "replicate": 1}
IMAGE_DTYPES = (DType.U8, DType.F32)
PATCH_DTYPES = {DType.U8: 1, DType.F16: 2, DType.BF16: 2, DType.F32: 4}
F32_MAX = float(np.finfo(np.float32).max)
MIN_DET = 1e-20
"""A determinant at or below this is singular (`invert_affine`, the original's bound)."""


@dataclass(frozen=True, slots=True)
class ImageStats:
    """The plan cache's counters plus `kernels_loaded` (plans prepared since creation)."""

    capacity: int
    entries: int
    hits: int
    misses: int
    evictions: int
    kernels_loaded: int

    def to_dict(self) -> dict[str, int]:
        """The counters as a plain dict (JSON-serializable)."""
        return dataclasses.asdict(self)


def _key(tensor: Tensor) -> tuple[Any, ...]:
    d = tensor.desc
    return (d.dtype.value, d.layout.value, d.shape, d.strides)


def _suffix(dtype: DType) -> str:
    return "u8" if dtype is DType.U8 else "f32"


def _finite(value: object, what: str) -> float:
    """`value` as the float32 the kernels read; a real number that stays finite there (1e39
    is finite as a Python float, infinite as a float32)."""
    if not isinstance(value, int | float | np.integer | np.floating) or isinstance(value, bool):
        raise ContractError(f"{what} must be a real number, got {shown(value)}")
    with np.errstate(over="ignore"):
        try:
            number = float(np.float32(value))
        except OverflowError:  # an int beyond float64
            number = math.inf
    if not math.isfinite(number):
        raise ContractError(
            f"{what} must be finite as a float32 (|x| <= {F32_MAX:.6g}), got {shown(value)}"
        )
    return number


def _choice(value: object, choices: dict[str, int], what: str) -> int:
    # A str first: `in` on a dict would raise TypeError for an unhashable value.
    if not isinstance(value, str) or value not in choices:
        raise ContractError(f"{what} must be one of {sorted(choices)}, got {shown(value)}")
    return choices[value]


def _dtype(tensor: Tensor, allowed: Sequence[DType], what: str) -> DType:
    dtype: DType = tensor.desc.dtype
    if dtype not in allowed:
        names = ", ".join(d.value for d in allowed)
        raise ContractError(f"{what} has dtype {dtype.value}; this operation takes {names}")
    return dtype


class ImageOps:
    """The five image operations of one runtime, with one bounded plan cache (`capacity`
    plans, least recently used idle ones evicted). For one event loop thread."""

    def __init__(self, runtime: Runtime, capacity: int = 64) -> None:
        if not isinstance(runtime, Runtime):
            raise ContractError(f"ImageOps takes a Runtime, got {type(runtime).__name__}")
        self.runtime = runtime
        self.plans: PlanCache[GpuKernel] = PlanCache(capacity, label="image plans")
        self.kernels_loaded = 0

    def stats(self) -> ImageStats:
        """The plan cache's counters (capacity, entries, hits, misses, evictions) and how many
        kernels were loaded."""
        s = self.plans.stats()
        return ImageStats(s.capacity, s.entries, s.hits, s.misses, s.evictions, self.kernels_loaded)

    async def clear(self) -> None:
        """Drop every cached plan (graphs already recorded keep their kernels)."""
        await self.plans.clear()

    # -- the operations --------------------------------------------------------------

    async def resize(
        self, graph: Graph[Any], src: Tensor, dst: Tensor, mode: str = "bilinear"
    ) -> int:
        """`dst` = `src` resized to `dst`'s height and width ("bilinear" or "nearest");
        same dtype (u8 or f32), batch and channels; layouts may differ."""
        self._check_graph(graph)
        s, d = image_of(src, "resize source"), image_of(dst, "resize destination")
        dtype = _dtype(src, IMAGE_DTYPES, "resize source")
        self._same_images(src, dst, s, d, "resize")
        number = _choice(mode, RESIZE_MODES, "resize mode")
        self._check_views(graph, [src], dst)
        constants = image_args.pack(
            sy=1.0 / (d.h / s.h),
            sx=1.0 / (d.w / s.w),
            **self._geometry(s, d),
            mode=number,
        )
        key = ("resize", mode, _key(src), _key(dst))
        return await self._record(graph, f"hrx_resize_{_suffix(dtype)}", key, [src], dst, constants)

    async def affine(
        self,
        graph: Graph[Any],
        src: Tensor,
        dst: Tensor,
        matrix: Any,
        border: str = "constant",
        border_value: float = 0.0,
        src_to_dst: bool = False,
    ) -> int:
        """`dst` sampled bilinearly from `src` through a 2x3 `matrix` that maps destination
        pixels to source positions (cv2.warpAffine with WARP_INVERSE_MAP); with
        `src_to_dst=True` the matrix maps source to destination and is inverted here (in
        double precision, like cv2.warpAffine without the flag). Outside the source:
        `border` "constant" (`border_value`) or "replicate" (the nearest edge pixel)."""
        self._check_graph(graph)
        s, d = image_of(src, "affine source"), image_of(dst, "affine destination")
        dtype = _dtype(src, IMAGE_DTYPES, "affine source")
        self._same_images(src, dst, s, d, "affine")
        if not isinstance(src_to_dst, bool):
            raise ContractError(f"src_to_dst must be a bool, got {src_to_dst!r}")
        m = _matrix(matrix, src_to_dst)
        # After the inversion: a near-singular matrix inverts to entries beyond float32.
        m32 = tuple(_finite(v, "an affine matrix entry (as the kernel reads it)") for v in m)
        number = _choice(border, BORDERS, "border")
        fill32 = _finite(border_value, "border_value")
        self._check_views(graph, [src], dst)
        constants = image_args.pack(m=m32, fill=fill32, mode=number, **self._geometry(s, d))
        key = ("affine", border, fill32, m32, _key(src), _key(dst))
        return await self._record(graph, f"hrx_affine_{_suffix(dtype)}", key, [src], dst, constants)

    async def normalize(
        self,
        graph: Graph[Any],
        src: Tensor,
        dst: Tensor,
        mean: Sequence[float],
        std: Sequence[float],
        scale: float | None = None,
    ) -> int:
        """`dst` (f32) = (`src` · scale − mean[c]) / std[c] per channel; `src` u8 or f32,
        `scale` 1/255 for u8 and 1 for f32 by default. Shapes equal as images; the layouts
        may differ (u8 NHWC → f32 NCHW is the usual one)."""
        self._check_graph(graph)
        s, d = image_of(src, "normalize source"), image_of(dst, "normalize destination")
        dtype = _dtype(src, IMAGE_DTYPES, "normalize source")
        _dtype(dst, (DType.F32,), "normalize destination")
        if s.dims != d.dims:
            raise ContractError(
                f"normalize source {src.desc} and destination {dst.desc} differ as images "
                f"(n, c, h, w): {s.dims} and {d.dims}"
            )
        if s.c > MAX_CHANNELS:
            raise ContractError(f"normalize takes at most {MAX_CHANNELS} channels, got {s.c}")
        means = _per_channel(mean, s.c, "mean")
        stds = _per_channel(std, s.c, "std")
        if any(v == 0 for v in stds):
            raise ContractError(f"std must have no zero, got {list(stds)}")
        default = 1.0 / 255.0 if dtype is DType.U8 else 1.0
        factor = _finite(default if scale is None else scale, "scale")
        self._check_views(graph, [src], dst)
        constants = image_args.pack(scale=factor, mean=means, stdv=stds, **self._geometry(s, d))
        key = ("normalize", factor, means, stds, _key(src), _key(dst))
        entry = f"hrx_normalize_{_suffix(dtype)}"
        return await self._record(graph, entry, key, [src], dst, constants)

    async def composite(self, graph: Graph[Any], fg: Tensor, bg: Tensor, dst: Tensor) -> int:
        """Straight-alpha "over": `fg`'s last channel is its alpha (0..255 for u8, 0..1 for
        f32). With an opaque `bg` of C channels `fg` has C + 1 and `dst` = fg·a + bg·(1 − a);
        with a `bg` whose last channel is alpha, `fg` has as many channels as `bg` and
        out_a = a + b_a(1 − a), out = (fg·a + bg·b_a(1 − a)) / out_a (0 where out_a is 0).
        `dst` has `bg`'s shape; one dtype (u8 or f32) for all three."""
        self._check_graph(graph)
        f = image_of(fg, "composite foreground")
        b = image_of(bg, "composite background")
        d = image_of(dst, "composite destination")
        dtype = _dtype(fg, IMAGE_DTYPES, "composite foreground")
        for tensor, what in ((bg, "background"), (dst, "destination")):
            if tensor.desc.dtype is not dtype:
                raise ContractError(
                    f"composite {what} is {tensor.desc.dtype.value}, the foreground "
                    f"{dtype.value}: one dtype for all three"
                )
        if b.dims != d.dims or (f.n, f.h, f.w) != (b.n, b.h, b.w):
            raise ContractError(
                "composite shapes do not match: foreground (n, c, h, w) "
                f"{f.dims}, background {b.dims}, destination {d.dims}"
            )
        if f.c not in (b.c, b.c + 1) or f.c < 2:
            raise ContractError(
                f"composite foreground has {f.c} channels; with a {b.c}-channel background "
                f"it needs {b.c + 1} (opaque background) or {b.c} (background with alpha), "
                "alpha last"
            )
        self._check_views(graph, [fg, bg], dst)
        scale = 1.0 / 255.0 if dtype is DType.U8 else 1.0
        constants = image_args.pack(
            scale=scale,
            mode=1 if f.c == b.c else 0,
            k=f.c - 1,
            ss=f.strides,
            bs=b.strides,
            **self._geometry(b, d, src_strides=False),
        )
        key = ("composite", _key(fg), _key(bg), _key(dst))
        entry = f"hrx_composite_{_suffix(dtype)}"
        return await self._record(graph, entry, key, [fg, bg], dst, constants)

    async def patchify(self, graph: Graph[Any], src: Tensor, dst: Tensor, patch: int) -> int:
        """Cut `src` (n, c, h, w) into `patch` x `patch` cells: `dst` is a row-major
        [n, cells, c·patch·patch] (or [n·cells, c·patch·patch]) tensor of `src`'s dtype, cells
        in row order, features ordered (channel, row, column). `patch` divides h and w."""
        self._check_graph(graph)
        s = image_of(src, "patchify source")
        dtype = _dtype(src, tuple(PATCH_DTYPES), "patchify source")
        if not isinstance(dst, Tensor):
            raise ContractError(f"patchify destination must be a Tensor, got {dst!r}")
        if isinstance(patch, bool) or not isinstance(patch, int | np.integer) or patch < 1:
            raise ContractError(f"patch must be an integer >= 1, got {patch!r}")
        k = int(patch)
        if s.h % k or s.w % k:
            raise ContractError(
                f"patch {k} does not divide the source's height {s.h} and width {s.w}"
            )
        cells, features = (s.h // k) * (s.w // k), s.c * k * k
        allowed = ((s.n, cells, features), (s.n * cells, features))
        if dst.desc.dtype is not dtype or dst.desc.shape not in allowed:
            raise ContractError(
                f"patchify destination must be {dtype.value}{list(allowed[0])} or "
                f"{dtype.value}{list(allowed[1])}, got {dst.desc}"
            )
        if not dst.desc.contiguous:
            raise ContractError(f"patchify destination {dst.desc} must be row-major")
        check_extent(dst, "patchify destination")
        self._check_views(graph, [src], dst)
        constants = image_args.pack(
            total=s.n * cells * features, n=s.n, c=s.c, sh=s.h, sw=s.w, ss=s.strides, k=k
        )
        key = ("patchify", k, _key(src), _key(dst))
        entry = f"hrx_patchify_b{PATCH_DTYPES[dtype]}"
        return await self._record(graph, entry, key, [src], dst, constants)

    # -- shared steps ----------------------------------------------------------------

    def _check_graph(self, graph: object) -> None:
        if not isinstance(graph, Graph):
            raise ContractError(f"image operations record into a Graph, got {graph!r}")
        if graph.domain is not self.runtime.domain:
            raise ContractError("this graph belongs to another runtime than these ImageOps")

    @staticmethod
    def _same_images(src: Tensor, dst: Tensor, s: Image, d: Image, what: str) -> None:
        if dst.desc.dtype is not src.desc.dtype:
            raise ContractError(
                f"{what} destination is {dst.desc.dtype.value}, the source "
                f"{src.desc.dtype.value}: they must match"
            )
        if (s.n, s.c) != (d.n, d.c):
            raise ContractError(
                f"{what} keeps batch and channels: source {src.desc} has (n, c) {(s.n, s.c)}, "
                f"destination {dst.desc} has {(d.n, d.c)}"
            )

    @staticmethod
    def _geometry(s: Image, d: Image, src_strides: bool = True) -> dict[str, Any]:
        values: dict[str, Any] = {
            "total": d.n * d.c * d.h * d.w,
            "n": d.n,
            "c": d.c,
            "sh": s.h,
            "sw": s.w,
            "dh": d.h,
            "dw": d.w,
            "ds": d.strides,
        }
        if src_strides:
            values["ss"] = s.strides
        return values

    def _check_views(self, graph: Graph[Any], inputs: Sequence[Tensor], dst: Tensor) -> None:
        """What `graph.gpu` would refuse, checked before any plan is made."""
        domain = self.runtime.domain
        for tensor in (*inputs, dst):
            view = tensor.data
            view.buffer.check_alive()
            if view.buffer.domain is not domain:
                raise ContractError(f"{tensor} belongs to another runtime")
            if not view.buffer.placement.gpu_bindable:
                raise ContractError(
                    f"{tensor} is in {view.buffer.placement} memory, which GPU kernels cannot bind"
                )
            size = tensor.desc.dtype.itemsize
            if view.offset % size:
                raise ContractError(f"{tensor} starts at offset {view.offset}, not {size}-aligned")
        out = dst.data
        for tensor in inputs:
            if tensor.data.overlaps(out):
                raise ContractError(f"the destination {dst} overlaps the input {tensor}")

    async def _record(
        self,
        graph: Graph[Any],
        entry: str,
        key: Hashable,
        inputs: Sequence[Tensor],
        dst: Tensor,
        constants: bytes,
    ) -> int:
        tensors = [*inputs, dst]
        total = image_args.unpack(constants).total

        def load() -> GpuKernel:
            bindings = [
                Binding(
                    t.nbytes,
                    Access.WRITE if t is dst else Access.READ,
                    t.desc.dtype.itemsize,
                    f"{t.desc} {t.desc.layout.value}",
                )
                for t in tensors
            ]
            kernel = self.runtime.load_gpu_kernel(
                KernelSource(cxx=SOURCE, host=KERNELS[entry]),
                entry,
                (max(1, -(-total // BLOCK)), 1, 1),
                (BLOCK, 1, 1),
                KernelContract(bindings, constants),
            )
            self.kernels_loaded += 1
            return kernel

        with await self.plans.get_or_prepare((entry, key), load, wait=True) as kernel:
            return graph.gpu(kernel, [t.data for t in tensors])

    def __repr__(self) -> str:
        s = self.stats()
        return f"<ImageOps plans {s.entries}/{s.capacity} hits={s.hits} misses={s.misses}>"


def _per_channel(values: object, channels: int, what: str) -> tuple[float, ...]:
    if isinstance(values, np.ndarray) and values.ndim == 0:
        values = values[()]  # one number, which list() could not iterate
    if isinstance(values, int | float | np.number) and not isinstance(values, bool):
        items: list[object] = [values] * channels
    elif isinstance(values, Sequence | np.ndarray) and not isinstance(
        values, str | bytes | bytearray
    ):
        items = list(values)
    else:
        raise ContractError(f"{what} must be a number or {channels} numbers, got {values!r}")
    if len(items) != channels:
        raise ContractError(f"{what} needs {channels} values (one per channel), got {len(items)}")
    return tuple(_finite(v, f"{what}[{i}]") for i, v in enumerate(items))


def _matrix(matrix: Any, src_to_dst: object) -> tuple[float, ...]:
    try:
        raw = np.asarray(matrix)
    except (TypeError, ValueError):
        raw = np.asarray(None)
    # Not through float64 directly: that would read strings ("1") and bools as numbers.
    if raw.dtype.kind not in "iuf":
        raise ContractError(f"an affine matrix is 2x3 real numbers, got {shown(matrix)}")
    m = raw.astype(np.float64)
    if m.shape != (2, 3) or not np.isfinite(m).all():
        raise ContractError(f"an affine matrix is 2x3 finite numbers, got shape {m.shape}")
    if src_to_dst is True:
        det = m[0, 0] * m[1, 1] - m[0, 1] * m[1, 0]
        if not abs(det) > MIN_DET:
            raise ContractError(
                f"the affine matrix is singular (|det| = {abs(det):.3g} <= {MIN_DET}): it "
                "cannot be inverted"
            )
        linear = np.array([[m[1, 1], -m[0, 1]], [-m[1, 0], m[0, 0]]]) / det
        with np.errstate(over="ignore", invalid="ignore"):
            m = np.hstack([linear, -(linear @ m[:, 2:])])
        if not np.isfinite(m).all():
            raise ContractError("the affine matrix's inverse is not finite")
    return tuple(float(v) for v in m.reshape(-1))


def invert_affine(matrix: Any) -> np.ndarray[Any, np.dtype[np.float64]]:
    """The inverse of a 2x3 affine matrix (as cv2.invertAffineTransform computes it)."""
    return np.asarray(_matrix(matrix, True), np.float64).reshape(2, 3)


__all__ = ["BLOCK", "BORDERS", "RESIZE_MODES", "ImageOps", "ImageStats", "invert_affine"]
