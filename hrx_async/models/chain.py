"""Prepared models that chain: device tensors in, device tensors out, no host wait.

    a = await pre.submit([x])                    # x: a DeviceTensor (an upload, an output)
    b = await model.submit(a.outputs)            # copies a's outputs in after a's run
    logits = await b.download()                  # the only host wait of the chain

Why: a service running preprocess -> model -> postprocess should not read every
intermediate back to the host. `submit(tensors)` orders a copy of each tensor into the
slot's fixed inputs after the tensor's producer, then the slot's graph after the copies,
and returns an `Inference` at once. Its `outputs` are device tensors whose producer is
the run and whose lease is the slot: the slot stays reserved while the inference, an
output, a view of one, a readback of one or a graph holding one's `binding()` is alive,
and goes back to the pool when the last of them is gone (its run still finishing first,
as for every slot). Dropping an inference never cancels it.

`submit_host_with(fn)` calls `fn(i, memory)` for each input in order with writable bytes
of it: the input itself when host-visible (no staging, no copy graph), else the slot's
staging buffer (made on first use, then reused); when `fn` raises, nothing runs and the
slot is given back (unwritten bytes keep their old values). For the event loop thread.

A copy reads an upstream output while later work may reuse that upstream slot: the
runtime orders every write after earlier reads of the same bytes, so the copy always
sees the values the upstream run wrote.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from .._core.memory import HOST_VISIBLE, View
from .._runtime.completion import Completion
from .._runtime.prepared import PreparedGraph
from ..errors import ContractError
from ..serve.slots import Slot
from . import _check
from .context import ModelContext, SlotIO
from .device import DeviceTensor
from .tensor import Tensor

COPY_GRAPHS_PER_INPUT = 4
"""Copy graphs kept per slot input, keyed by the source bytes (chains reuse few sources)."""


class LeasedModel(Protocol):
    """What a lease needs of the prepared model it holds a slot of (`PreparedModel`)."""

    label: str
    context: ModelContext
    copy_graphs: int
    """Copy graphs made so far for chained inputs (a statistic the model reports)."""
    staging_buffers: int
    """Host staging buffers made so far (a statistic the model reports)."""


class SlotLease:
    """One held slot of a prepared model; given back when the last reference to it goes
    (or at `release()` for a lease that was never submitted)."""

    __slots__ = ("__weakref__", "_slot", "model")

    def __init__(self, model: LeasedModel, slot: Slot[SlotIO]) -> None:
        self.model = model
        self._slot: Slot[SlotIO] | None = slot

    def _held(self) -> Slot[SlotIO]:
        slot = self._slot
        if slot is None:
            raise ContractError("this slot lease was released; acquire another")
        return slot

    @property
    def index(self) -> int:
        """Which slot of the prepared model this lease holds. `ContractError` once released."""
        return self._held().index

    @property
    def io(self) -> SlotIO:
        """The slot's inputs and outputs (`SlotIO`). `ContractError` once released."""
        return self._held().resources

    def release(self) -> None:
        """Give the slot back to its model (once its last submission finishes). Idempotent."""
        slot, self._slot = self._slot, None
        if slot is not None:
            slot.release()

    def __enter__(self) -> SlotLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()

    def __repr__(self) -> str:
        where = "released" if self._slot is None else f"slot {self._slot.index}"
        return f"<SlotLease {self.model.label!r} {where}>"


class Inference:
    """One submitted run: `outputs` (device tensors produced by the run, holding the slot),
    `completion`, `wait()`, `download()` (bytes of each output), `read_into(buffers)`."""

    __slots__ = ("completion", "inputs", "lease", "outputs")

    def __init__(
        self, lease: SlotLease, completion: Completion, inputs: Sequence[DeviceTensor]
    ) -> None:
        self.lease = lease
        self.completion = completion
        self.inputs = tuple(inputs)
        """Kept so the upstream slots stay reserved at least as long as this inference."""
        self.outputs = [
            DeviceTensor(t.desc, None if t.desc.empty else t.data, completion, lease)
            for t in lease.io.outputs.values()
        ]

    async def wait(self) -> None:
        """Wait until the run finished; raises its error (`ExecutionError`, `Cancelled`, ...)."""
        await self.completion

    async def download(self) -> list[bytes]:
        """Every output's bytes, once the run is done (one readback each)."""
        await self.completion
        ctx = self.lease.model.context
        return [await ctx.download(t) for t in self.outputs]

    async def read_into(self, buffers: Sequence[Any]) -> None:
        """Copy each output's bytes into the matching writable buffer (same length)."""
        if len(buffers) != len(self.outputs):
            raise ContractError(f"read_into() takes {len(self.outputs)} buffers")
        for index, (data, target) in enumerate(zip(await self.download(), buffers, strict=True)):
            memory = memoryview(target).cast("B")
            if memory.readonly or memory.nbytes != len(data):
                raise ContractError(
                    f"read_into() buffer {index} must be writable and hold {len(data)} bytes"
                )
            memory[:] = data

    def __repr__(self) -> str:
        state = "done" if self.completion.done() else "running"
        return f"<Inference {self.lease.model.label!r} {state}>"


def _copy_graph(lease: SlotLease, name: str, dst: Tensor, src: View) -> PreparedGraph:
    """The slot's prepared copy of `src` into input `name` (cached by source bytes)."""
    io = lease.io
    cache: dict[Any, tuple[View, PreparedGraph]] = io.copies.setdefault(name, {})
    key = (src.buffer.ident, src.offset, src.nbytes)
    found = cache.get(key)
    if found is not None and not found[0].buffer.freed:
        return found[1]
    for stale in [k for k, (view, _) in cache.items() if view.buffer.freed]:
        del cache[stale]
    while len(cache) >= COPY_GRAPHS_PER_INPUT:
        del cache[next(iter(cache))]
    plain = View._make(src.buffer, src.offset, src.nbytes)  # no lease: the cache pins none
    graph = lease.model.context.runtime.graph(f"{lease.model.label}-in-{name}")
    graph.copy(dst.data, plain)
    prepared = graph.prepare()
    cache[key] = (plain, prepared)
    lease.model.copy_graphs += 1
    return prepared


def submit(lease: SlotLease, inputs: Sequence[DeviceTensor]) -> Inference:
    """See the module docstring; checks every input before anything is submitted."""
    io = lease.io
    ctx = lease.model.context
    if isinstance(inputs, DeviceTensor) or not isinstance(inputs, Sequence):
        raise ContractError(f"submit() takes a list of DeviceTensors, got {_check.shown(inputs)}")
    names = list(io.inputs)
    if len(inputs) != len(names):
        raise ContractError(f"{lease.model.label!r} takes {len(names)} inputs, got {len(inputs)}")
    plan: list[tuple[str, Tensor, DeviceTensor]] = []
    for name, tensor in zip(names, inputs, strict=True):
        tensor = ctx.validate_device(tensor, f"input {name!r}")
        want = io.inputs[name]
        if tensor.desc != want.desc:
            raise ContractError(f"input {name!r} is {want.desc}, got {tensor.desc}")
        plan.append((name, want, tensor))
    slot = lease._held()
    after: list[Completion] = []
    for name, want, tensor in plan:
        view = tensor.view
        if view is None or (view.buffer is want.view.buffer and view.offset == want.view.offset):
            after.extend(tensor.after())  # empty, or already in place: no copy
            continue
        after.append(slot.submit(_copy_graph(lease, name, want, view), tensor.after()))
    run = slot.submit(io.graph, after)
    return Inference(lease, run, inputs)


async def submit_host_with(lease: SlotLease, fn: Callable[[int, memoryview], object]) -> Inference:
    """See the module docstring."""
    _check.function(fn, "fn")
    io = lease.io
    slot = lease._held()
    copies: list[PreparedGraph] = []
    try:
        for index, (name, tensor) in enumerate(io.inputs.items()):
            if tensor.desc.empty:
                fn(index, memoryview(bytearray()))
                continue
            if tensor.view.buffer.placement.host_mappable:
                async with tensor.data.map_write() as memory:
                    fn(index, memory)
                continue
            staged, graph = _staging(lease, name, tensor)
            async with staged.data.map_write() as memory:
                fn(index, memory)
            copies.append(graph)
    except BaseException:
        lease.release()
        raise
    for graph in copies:
        slot.submit(graph)
    return Inference(lease, slot.submit(io.graph), ())


def _staging(lease: SlotLease, name: str, tensor: Tensor) -> tuple[Tensor, PreparedGraph]:
    io = lease.io
    key = "in:" + name
    found = io.staging.get(key)
    if found is None:
        ctx = lease.model.context
        buffer = ctx.allocate(tensor.nbytes, HOST_VISIBLE, f"staging-{key}")
        staged = Tensor(tensor.desc, buffer.view())
        found = io.staging[key] = (staged, ctx.copy_graph(tensor, staged))
        lease.model.staging_buffers += 1
    return found


__all__ = ["Inference", "SlotLease"]
