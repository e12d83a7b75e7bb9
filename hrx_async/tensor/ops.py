"""Tensor operations that return leased results: row gather, finite check, bf16 linear.

    ops = TensorOps(rt, capacity=64)
    rows = await ops.gather_rows(table, [4, 0, 4])       # [3, cols], the rows' exact bytes
    flag = await ops.finite(x)                           # i32[1]: 0 iff every |x| <= FLT_MAX
    y1, y2 = await ops.linear_many(x, [w1, w2], "f32")   # bf16 x·wᵀ, f32 accumulation

Each call checks its input first (`ContractError`, nothing changed), then takes the plan
of its key from a bounded `PlanCache`: the kernel, and three slots of output memory and
prepared graph (`hrx_async.models.results`). It writes the call's host input (the row
ids) into the slot, submits the slot's graph and returns `Result` tensors over the slot's
outputs without waiting: downloads and later work are ordered after it byte range by byte
range. A fourth live result of one plan is `Busy` until a result and its clones and views
are gone. A plan binds its input tensors' bytes, so the key holds them: the same tensors
(or others at the same place) reuse it, other buffers make another plan.

Each operation also has a fragment form (`gather_rows_fragment`, `finite_fragment`,
`linear_fragment`): the same kernel as a `ModelFragment` (`models.op_fragment`), to
prepare as slots or record into a larger graph. The maths is in `tensor.kernels` (C++
and its numpy twin, bit for bit alike).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._core.contract import Access, Binding, KernelContract
from .._core.kernels import GpuKernel, KernelSource
from .._core.memory import GPU_LOCAL, HOST_VISIBLE, Buffer, Placement, View
from .._core.validate import shown
from .._runtime.prepared import PreparedGraph
from ..errors import ContractError
from ..models import DType, ModelContext, Tensor, TensorDesc
from ..models.fragment import ModelFragment
from ..models.op_fragment import OpFragmentBuilder
from ..models.region import Dispatch, Fill
from ..models.results import Lease, Result, ResultOps, ResultPlan, SlotGraph
from ..runtime import Runtime
from .kernels import KERNELS, LANES, SOURCE, pack

BLOCK = 256
MAX_ROW_BYTES = 2**31 - 1
MAX_WEIGHT_ELEMENTS = 2**30
LINEAR_DTYPES = {DType.F32: "f32", DType.BF16: "bf16"}


def _bucket(count: int) -> int:
    return 1 << max(0, (count - 1).bit_length())


class TensorOps(ResultOps):
    """`gather_rows`, `finite` and `linear`/`linear_many` of one runtime, each plan with
    three result slots, at most `capacity` plans (idle ones evicted least recently used
    first). For one event loop thread."""

    def __init__(self, runtime: Runtime, capacity: int = 64) -> None:
        super().__init__(runtime, capacity, "tensor plans")
        self._empty: tuple[ResultPlan[None], Buffer, PreparedGraph] | None = None

    # -- the operations --------------------------------------------------------------

    async def gather_rows(self, table: Tensor, ids: Sequence[int]) -> Result:
        """Rows `ids` of the rank-2 contiguous `table`, in order, duplicates kept: a
        [len(ids), cols] result of `table`'s dtype and exact bytes. No ids: an empty
        [0, cols] tensor in no memory of a plan."""
        self._check_input(table, "gather_rows source")
        desc = _gather_source(table.desc)
        rows, cols = desc.shape
        picked = _ids(ids, rows)
        out_desc = TensorDesc(desc.dtype, (len(picked), cols))
        if not picked or cols == 0:
            return self._empty_result(out_desc)
        bucket = _bucket(len(picked))
        row_bytes = cols * desc.dtype.itemsize
        total = bucket * row_bytes
        if total > MAX_ROW_BYTES:
            raise ContractError(f"{len(picked)} rows of {row_bytes} bytes are too many to gather")
        padded = np.full(bucket, picked[0], np.int32)
        padded[: len(picked)] = picked
        constants = pack(total, row_bytes, rows)
        source = table.data

        def load() -> ResultPlan[SlotGraph]:
            kernel = self._kernel(
                "hrx_gather_rows",
                [
                    (source.nbytes, Access.READ, 1),
                    (bucket * 4, Access.READ, 4),
                    (total, Access.WRITE, 1),
                ],
                constants,
                -(-total // BLOCK),
                BLOCK,
            )

            def build(index: int) -> SlotGraph:
                rt = self.runtime
                ids_buffer = rt.allocate(bucket * 4, HOST_VISIBLE, "gather-rows-ids")
                out = rt.allocate(total, GPU_LOCAL, "gather-rows-out")
                g = rt.graph("gather-rows")
                g.gpu(kernel, [source, ids_buffer.view(), out.view()])
                return SlotGraph(
                    [ids_buffer, out], g.prepare(), ids=ids_buffer.view(), out=out.view()
                )

            return ResultPlan(build, SlotGraph.free, label="gather_rows")

        async def fill(slot: SlotGraph) -> None:
            async with slot.views["ids"].map_write() as memory:
                np.frombuffer(memory, np.int32)[:] = padded

        key = ("gather_rows", _key(table), bucket)
        (result,) = await self.plans.run(
            key, load, fill, lambda s: [(out_desc, s.views["out"].slice(0, out_desc.nbytes))]
        )
        return result

    async def finite(self, x: Tensor) -> Result:
        """i32[1]: 0 when every value of the non-empty contiguous f32 `x` has |v| <= FLT_MAX
        (so -0 and FLT_MAX give 0), 1 when one is NaN or infinite. The result is
        host-visible: reading it is one 4-byte read."""
        self._check_input(x, "finite input")
        count = _finite_input(x.desc).numel
        constants = pack(count)
        source = x.data

        def load() -> ResultPlan[SlotGraph]:
            kernel = self._kernel(
                "hrx_finite",
                [(source.nbytes, Access.READ, 4), (4, Access.READ_WRITE, 4)],
                constants,
                -(-count // BLOCK),
                BLOCK,
            )

            def build(index: int) -> SlotGraph:
                flag = self.runtime.allocate(4, HOST_VISIBLE, "finite-flag")
                g = self.runtime.graph("finite")
                g.fill(flag.view(), 0)
                g.gpu(kernel, [source, flag.view()])
                return SlotGraph([flag], g.prepare(), out=flag.view())

            return ResultPlan(build, SlotGraph.free, label="finite")

        key = ("finite", _key(x))
        out = TensorDesc(DType.I32, (1,))
        (result,) = await self.plans.run(key, load, None, lambda s: [(out, s.views["out"])])
        return result

    async def linear(self, x: Tensor, weight: Tensor, dtype: DType | str = DType.F32) -> Result:
        """`linear_many(x, [weight], dtype)`'s one result."""
        (result,) = await self.linear_many(x, [weight], dtype)
        return result

    async def linear_many(
        self, x: Tensor, weights: Sequence[Tensor], dtype: DType | str = DType.F32
    ) -> tuple[Result, ...]:
        """y_i[0, n] = Σ_k x[0, k]·w_i[n, k] for bf16 `x` [1, K] (K > 0, a multiple of 128)
        and one to three bf16 `weights` [N_i, K], accumulated in f32 and stored as `dtype`
        (f32 or bf16): one dispatch, results [1, N_i] sharing one lease."""
        self._check_input(x, "linear input")
        if isinstance(weights, Tensor) or not isinstance(weights, Sequence):
            raise ContractError(f"linear_many takes a list of 1 to 3 weights, got {shown(weights)}")
        for i, w in enumerate(weights):
            self._check_input(w, f"weight {i}")
        out_dtype, k, ns = _linear_shapes(x.desc, [w.desc for w in weights], dtype)
        total = sum(ns)
        size = out_dtype.itemsize
        entry = f"hrx_linear{len(ns)}_{LINEAR_DTYPES[out_dtype]}"
        constants = pack(k, *ns)
        inputs = [x.data, *(w.data for w in weights)]

        def load() -> ResultPlan[SlotGraph]:
            bindings = [(v.nbytes, Access.READ, 2) for v in inputs]
            bindings.append((total * size, Access.WRITE, size))
            kernel = self._kernel(entry, bindings, constants, total, LANES)

            def build(index: int) -> SlotGraph:
                out = self.runtime.allocate(total * size, GPU_LOCAL, "linear-out")
                g = self.runtime.graph("linear")
                g.gpu(kernel, [*inputs, out.view()])
                return SlotGraph([out], g.prepare(), out=out.view())

            return ResultPlan(build, SlotGraph.free, label="linear")

        def outputs(slot: SlotGraph) -> list[tuple[TensorDesc, View]]:
            items, start = [], 0
            for n in ns:
                items.append(
                    (TensorDesc(out_dtype, (1, n)), slot.views["out"].slice(start, n * size))
                )
                start += n * size
            return items

        key = ("linear", out_dtype.value, _key(x), *(_key(w) for w in weights))
        return await self.plans.run(key, load, None, outputs)

    # -- fragment forms: the same kernels as model fragments (`models.op_fragment`) ------

    def gather_rows_fragment(
        self, desc: TensorDesc, rows: int, placement: Placement = GPU_LOCAL
    ) -> ModelFragment:
        """`gather_rows` as a fragment: inputs the source (`desc`, rank 2, contiguous, not
        empty) and i32 ids [rows] (rows >= 1), in `placement` when prepared as slots;
        output [rows, cols], host-visible. An id out of range selects row 0: ids are data
        here, never seen by the host."""
        desc = _gather_source(_desc(desc, "gather_rows_fragment source"))
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise ContractError(f"gather_rows_fragment gathers rows >= 1, got {shown(rows)}")
        if desc.empty:
            raise ContractError(f"gather_rows_fragment needs a non-empty source, got {desc}")
        count, cols = desc.shape
        row_bytes = cols * desc.dtype.itemsize
        total = rows * row_bytes
        if total > MAX_ROW_BYTES:
            raise ContractError(f"{rows} rows of {row_bytes} bytes are too many to gather")
        b = OpFragmentBuilder(ModelContext(self.runtime), "gather_rows")
        src, ids = b.region(desc.nbytes, placement), b.region(rows * 4, placement)
        out = b.region(total, HOST_VISIBLE)
        kernel = self._kernel(
            "hrx_gather_rows",
            [(desc.nbytes, Access.READ, 1), (rows * 4, Access.READ, 4), (total, Access.WRITE, 1)],
            pack(total, row_bytes, count),
            -(-total // BLOCK),
            BLOCK,
        )
        k = b.adopt(kernel)
        return b.fragment(
            [Dispatch(k, [src.read(), ids.read(), out.write()])],
            [(src, desc), (ids, TensorDesc(DType.I32, (rows,)))],
            [(out, TensorDesc(desc.dtype, (rows, cols)))],
        )

    def finite_fragment(self, desc: TensorDesc, placement: Placement = GPU_LOCAL) -> ModelFragment:
        """`finite` as a fragment: input `desc` (non-empty contiguous f32, in `placement`
        when prepared), output the host-visible i32 [1] flag, zeroed by the fragment."""
        desc = _finite_input(_desc(desc, "finite_fragment input"))
        count = desc.numel
        b = OpFragmentBuilder(ModelContext(self.runtime), "finite")
        x, flag = b.region(desc.nbytes, placement), b.region(4, HOST_VISIBLE)
        kernel = self._kernel(
            "hrx_finite",
            [(desc.nbytes, Access.READ, 4), (4, Access.READ_WRITE, 4)],
            pack(count),
            -(-count // BLOCK),
            BLOCK,
        )
        k = b.adopt(kernel)
        return b.fragment(
            [Fill(flag, 0), Dispatch(k, [x.read(), flag.read_write()])],
            [(x, desc)],
            [(flag, TensorDesc(DType.I32, (1,)))],
        )

    def linear_fragment(
        self,
        x: TensorDesc,
        weights: Sequence[TensorDesc],
        dtype: DType | str = DType.F32,
        placement: Placement = GPU_LOCAL,
    ) -> ModelFragment:
        """`linear_many` as a fragment: inputs x and each weight (descriptions, as
        `linear_many` checks them), outputs y_i [1, N_i] laid end to end in one
        allocation; one dispatch. IO in `placement` when prepared as slots."""
        x = _desc(x, "linear_fragment input")
        if isinstance(weights, TensorDesc) or not isinstance(weights, Sequence):
            raise ContractError(
                f"linear_fragment takes a list of 1 to 3 weight descriptions, got {shown(weights)}"
            )
        descs = [_desc(w, f"weight {i}") for i, w in enumerate(weights)]
        out_dtype, k, ns = _linear_shapes(x, descs, dtype)
        size = out_dtype.itemsize
        entry = f"hrx_linear{len(ns)}_{LINEAR_DTYPES[out_dtype]}"
        b = OpFragmentBuilder(ModelContext(self.runtime), "linear")
        ins = [b.region(d.nbytes, placement) for d in (x, *descs)]
        out = b.region(sum(ns) * size, placement)
        bindings = [(d.nbytes, Access.READ, 2) for d in (x, *descs)]
        bindings.append((sum(ns) * size, Access.WRITE, size))
        k_ = b.adopt(self._kernel(entry, bindings, pack(k, *ns), sum(ns), LANES))
        outs, start = [], 0
        for n in ns:
            outs.append((out.slice(start, n * size), TensorDesc(out_dtype, (1, n))))
            start += n * size
        return b.fragment(
            [Dispatch(k_, [*(r.read() for r in ins), out.write()])],
            list(zip(ins, (x, *descs), strict=True)),
            outs,
        )

    # -- shared steps ----------------------------------------------------------------

    def _empty_result(self, desc: TensorDesc) -> Result:
        """An empty result: one byte shared by all of them, a lease of no slot (empty
        results are not bounded), and a submission of nothing."""
        if self._empty is None:
            rt = self.runtime
            buffer = rt.allocate(1, GPU_LOCAL, "empty-result")
            recorder = rt.graph("empty-result")
            recorder.fill(buffer.view(), 0)  # a graph needs a node; this byte is never read
            graph = recorder.prepare()
            plan: ResultPlan[None] = ResultPlan(lambda i: None, lambda r: None, 1, "empty")
            self._empty = (plan, buffer, graph)
        plan, buffer, graph = self._empty
        return Result(desc, buffer.view(), Lease(plan, 0), graph.submit())

    def _kernel(
        self,
        entry: str,
        bindings: list[tuple[int, Access, int]],
        constants: bytes,
        grid: int,
        block: int,
    ) -> GpuKernel:
        contract = KernelContract(
            [Binding(max(n, 1), access, align) for n, access, align in bindings], constants
        )
        kernel = self.runtime.load_gpu_kernel(
            KernelSource(cxx=SOURCE, host=KERNELS[entry]),
            entry,
            (max(1, grid), 1, 1),
            (block, 1, 1),
            contract,
        )
        self.plans.kernels_loaded += 1
        return kernel

    def __repr__(self) -> str:
        s = self.stats()
        return f"<TensorOps plans {s.entries}/{s.capacity} hits={s.hits} misses={s.misses}>"


def _desc(desc: object, what: str) -> TensorDesc:
    if not isinstance(desc, TensorDesc):
        raise ContractError(f"{what} is a TensorDesc, got {shown(desc)}")
    return desc


def _gather_source(desc: TensorDesc) -> TensorDesc:
    if desc.rank != 2 or not desc.contiguous:
        raise ContractError(f"gather_rows takes a contiguous rank-2 tensor, got {desc}")
    if desc.nbytes > MAX_ROW_BYTES:
        raise ContractError(f"gather_rows source {desc} is over {MAX_ROW_BYTES} bytes")
    return desc


def _finite_input(desc: TensorDesc) -> TensorDesc:
    if desc.dtype is not DType.F32 or not desc.contiguous or desc.empty:
        raise ContractError(f"finite takes a non-empty contiguous f32 tensor, got {desc}")
    return desc


def _linear_shapes(
    xd: TensorDesc, weights: Sequence[TensorDesc], dtype: DType | str
) -> tuple[DType, int, list[int]]:
    """The output dtype, K and each weight's N, or why `linear_many` refuses them."""
    out_dtype = DType.of(dtype)
    if out_dtype not in LINEAR_DTYPES:
        raise ContractError(f"linear outputs f32 or bf16, got {out_dtype.value}")
    if xd.dtype is not DType.BF16 or not xd.contiguous or xd.rank != 2 or xd.shape[0] != 1:
        raise ContractError(f"linear takes a contiguous bf16 [1, K] input, got {xd}")
    k = xd.shape[1]
    if k == 0 or k % LANES:
        raise ContractError(f"linear needs K > 0 and a multiple of {LANES}, got K = {k}")
    if not 1 <= len(weights) <= 3:
        raise ContractError(f"linear_many takes 1 to 3 weights, got {len(weights)}")
    ns = []
    for i, wd in enumerate(weights):
        if wd.dtype is not DType.BF16 or not wd.contiguous or wd.rank != 2:
            raise ContractError(f"weight {i} must be a contiguous bf16 [N, K], got {wd}")
        if wd.shape[1] != k or wd.shape[0] == 0 or wd.numel > MAX_WEIGHT_ELEMENTS:
            raise ContractError(
                f"weight {i} {wd} must be [N, {k}] with N > 0 and at most "
                f"{MAX_WEIGHT_ELEMENTS} elements"
            )
        ns.append(wd.shape[0])
    return out_dtype, k, ns


def _key(tensor: Tensor) -> tuple[Any, ...]:
    """A tensor's descriptor and the bytes a plan binds (the buffer itself, by identity)."""
    d, view = tensor.desc, tensor.data
    return (d.dtype.value, d.shape, d.strides, view.buffer, view.offset, view.nbytes)


def _ids(ids: object, rows: int) -> list[int]:
    if isinstance(ids, str | bytes) or not isinstance(ids, Sequence | np.ndarray):
        raise ContractError(f"row ids are a sequence of integers, got {shown(ids)}")
    picked = []
    for i, value in enumerate(list(ids)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise ContractError(f"row id {i} must be an integer, got {shown(value)}")
        if not 0 <= int(value) < rows:
            raise ContractError(f"row id {i} is {int(value)}; the source has rows 0..{rows - 1}")
        picked.append(int(value))
    return picked


__all__ = ["TensorOps"]
