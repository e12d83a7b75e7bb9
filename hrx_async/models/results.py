"""Results that lease their memory from a plan: three live results per plan, then `Busy`.

An operation that returns new tensors (rather than writing into the caller's) would
otherwise allocate on every call. Instead each plan owns `SLOTS` sets of resources
(output buffers, host-visible input staging, the prepared graph over them), built the
first time a slot is taken and reused after. A call takes a free slot, writes its
inputs, submits its graph and returns `Result` tensors over the slot's outputs.

The slot stays taken while any `Result` of it is alive: the result itself, its
`clone()`s and its `view()`s all hold one shared `Lease`, and the slot is free again
when the last of them is gone (Python frees it the moment its last reference goes;
`release()` says so explicitly for every tensor of the lease at once). With every slot
taken, the next call raises `Busy` and changes nothing.

A result may be read while its work is still running: downloads, copies and kernels
that read its bytes are ordered after the write, byte range by byte range. A slot taken
again while its last submission runs is safe for the same reason (the new work waits
for the old on the bytes they share).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from .._core.memory import Buffer, View
from .._core.validate import shown
from .._runtime.completion import Completion
from .._runtime.prepared import PreparedGraph
from ..errors import Busy, ContractError
from ..runtime import Runtime
from .device import DeviceTensor
from .plan_cache import PlanCache, PlanCacheStats
from .tensor import Tensor, TensorDesc

SLOTS = 3
"""Live results per plan: the original's slot count."""

T = TypeVar("T")


class Lease:
    """One taken slot; freed when the last tensor holding it is gone, or by `release()`."""

    __slots__ = ("__weakref__", "_finalizer", "index")

    def __init__(self, plan: ResultPlan[Any], index: int) -> None:
        self.index = index
        self._finalizer = weakref.finalize(self, plan._free, index)

    @property
    def alive(self) -> bool:
        return self._finalizer.alive

    def release(self) -> None:
        """Give the slot back now (idempotent); the tensors of this lease must no longer be
        used: their bytes belong to the next result."""
        self._finalizer()


class Result(Tensor):
    """A tensor over a plan slot's output, holding that slot's `Lease`; `completion` is
    the submission that writes it."""

    __slots__ = ("completion", "lease")

    def __init__(self, desc: TensorDesc, view: View, lease: Lease, completion: Completion) -> None:
        super().__init__(desc, view)
        self.lease = lease
        self.completion = completion

    def clone(self) -> Result:
        """Another handle on the same bytes, holding the same lease."""
        return Result(self.desc, self.view, self.lease, self.completion)

    def view_as(self, desc: TensorDesc, offset: int = 0) -> Result:
        """`desc` over this result's bytes from byte `offset`, holding the same lease."""
        if not isinstance(desc, TensorDesc):
            raise ContractError(f"view_as takes a TensorDesc, got {type(desc).__name__}")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ContractError(f"a view's byte offset is an integer >= 0, got {offset!r}")
        if offset + desc.nbytes > self.view.nbytes:
            raise ContractError(
                f"{desc} at byte {offset} needs {offset + desc.nbytes} bytes; {self} has "
                f"{self.view.nbytes}"
            )
        return Result(
            desc, self.view.slice(offset, desc.nbytes or None), self.lease, self.completion
        )

    def release(self) -> None:
        self.lease.release()

    def device(self) -> DeviceTensor:
        """This result as a `DeviceTensor` (producer: the submission writing it; lease:
        its slot's), to chain into `ModelContext.copy_into`, `concatenate`, a prepared
        model's `submit` or a fragment's `record`."""
        return DeviceTensor(self.desc, self.data, self.completion, self.lease)

    async def wait(self) -> None:
        """Until the work that writes this result has finished (raising its failure)."""
        await self.completion


class ResultPlan(Generic[T]):
    """`SLOTS` slots of resources from `build(index)`, handed out as leases.

    `idle` (no lease alive, no submission running) is what `PlanCache` reads before it
    evicts a plan; `close` frees what the slots built through `free`."""

    def __init__(
        self,
        build: Callable[[int], T],
        free: Callable[[T], None],
        slots: int = SLOTS,
        label: str = "results",
    ) -> None:
        self._build = build
        self._free_resources = free
        self.label = label
        self._resources: list[T | None] = [None] * slots
        self._taken = [False] * slots
        self._last: list[Completion | None] = [None] * slots
        self.closed = False

    @property
    def slots(self) -> int:
        return len(self._taken)

    @property
    def live(self) -> int:
        return sum(self._taken)

    @property
    def built(self) -> int:
        return sum(r is not None for r in self._resources)

    @property
    def idle(self) -> bool:
        return not any(self._taken) and all(c is None or c.done() for c in self._last)

    def take(self) -> tuple[Lease, T]:
        """A free slot's lease and resources (built on first use); `Busy` when every slot
        is leased. Nothing changes when it raises."""
        if self.closed:
            raise ContractError(f"the {self.label} plan was evicted or cleared")
        index = next((i for i, taken in enumerate(self._taken) if not taken), None)
        if index is None:
            raise Busy(
                f"all {self.slots} results of this {self.label} plan are alive; drop one "
                "(and its clones and views) first"
            )
        resources = self._resources[index]
        if resources is None:
            resources = self._resources[index] = self._build(index)
        self._taken[index] = True
        return Lease(self, index), resources

    def submitted(self, lease: Lease, completion: Completion) -> None:
        self._last[lease.index] = completion

    def outputs(
        self, lease: Lease, completion: Completion, items: Sequence[tuple[TensorDesc, View]]
    ) -> tuple[Result, ...]:
        """Results over `items` (descriptor, view), all holding `lease`."""
        self.submitted(lease, completion)
        return tuple(Result(desc, view, lease, completion) for desc, view in items)

    def _free(self, index: int) -> None:
        self._taken[index] = False

    def close(self) -> None:
        """Free every built slot (only when idle: what `PlanCache` evicts)."""
        self.closed = True
        for index, resources in enumerate(self._resources):
            if resources is not None:
                self._free_resources(resources)
                self._resources[index] = None

    def __repr__(self) -> str:
        return f"<ResultPlan {self.label} live {self.live}/{self.slots} built {self.built}>"


class SlotGraph:
    """One slot's resources: its buffers (freed with the plan), its prepared graph, and
    the views an operation writes its inputs into and reads its outputs from."""

    __slots__ = ("buffers", "graph", "views")

    def __init__(self, buffers: list[Buffer], graph: PreparedGraph, **views: View) -> None:
        self.buffers = buffers
        self.graph = graph
        self.views = views

    def free(self) -> None:
        for buffer in self.buffers:
            if not buffer.freed:
                buffer.free()


class ResultPlans:
    """A bounded `PlanCache` of `ResultPlan[SlotGraph]`s, one per operation key, and the
    count of kernels loaded for them."""

    def __init__(self, capacity: int, label: str) -> None:
        self.plans: PlanCache[ResultPlan[SlotGraph]] = PlanCache(
            capacity, release=ResultPlan.close, label=label
        )
        self.kernels_loaded = 0

    def stats(self) -> PlanCacheStats:
        return self.plans.stats()

    async def clear(self) -> None:
        await self.plans.clear()

    async def run(
        self,
        key: Any,
        load: Callable[[], ResultPlan[SlotGraph]],
        fill: Callable[[SlotGraph], Any] | None,
        outputs: Callable[[SlotGraph], Sequence[tuple[TensorDesc, View]]],
    ) -> tuple[Result, ...]:
        """Take a slot of `key`'s plan (loaded on a miss), let `fill` write its inputs
        (a coroutine function or None), submit its graph and return its outputs' results."""
        with await self.plans.get_or_prepare(key, load, wait=True) as plan:
            lease, slot = plan.take()
            try:
                if fill is not None:
                    await fill(slot)
                completion = slot.graph.submit()
            except BaseException:
                lease.release()
                raise
            return plan.outputs(lease, completion, outputs(slot))


class ResultOps:
    """What a family of operations over leased results shares (`TensorOps`, `RgbOps`): its
    runtime, a bounded cache of plans and the cache's counters."""

    def __init__(self, runtime: Runtime, capacity: int, label: str) -> None:
        if not isinstance(runtime, Runtime):
            raise ContractError(
                f"{type(self).__name__} takes a Runtime, got {type(runtime).__name__}"
            )
        self.runtime = runtime
        self.plans = ResultPlans(capacity, label)

    def stats(self) -> PlanCacheStats:
        """The plan cache's counters: capacity, entries, hits, misses, evictions."""
        return self.plans.stats()

    @property
    def kernels_loaded(self) -> int:
        """How many GPU kernels the plans loaded so far (each once per runtime)."""
        return self.plans.kernels_loaded

    async def clear(self) -> None:
        """Evict every idle plan and free its memory; plans still in use stay."""
        await self.plans.clear()

    def _check_input(self, tensor: object, what: str) -> Tensor:
        """`tensor` when an operation can read it: a Tensor of this runtime, alive, in
        GPU-visible memory, aligned to its element size; else `ContractError` naming `what`."""
        if not isinstance(tensor, Tensor):
            raise ContractError(f"{what} must be a Tensor, got {shown(tensor)}")
        view = tensor.view
        view.buffer.check_alive()
        if not self.runtime.owns(view):
            raise ContractError(f"{what} {tensor} belongs to another runtime")
        if not view.buffer.placement.gpu_bindable:
            raise ContractError(f"{what} {tensor} is in {view.buffer.placement} memory")
        if view.offset % tensor.desc.dtype.itemsize:
            raise ContractError(f"{what} {tensor} is not aligned to its element size")
        return tensor


__all__ = [
    "SLOTS",
    "Lease",
    "Result",
    "ResultOps",
    "ResultPlan",
    "ResultPlans",
    "SlotGraph",
]
