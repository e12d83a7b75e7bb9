"""A model context and prepared models with slots.

    ctx = ModelContext(rt)
    def build(ctx, index):                         # one slot's own I/O and prepared graph
        x = ctx.tensor(TensorDesc("f32", (8, 48)), hrx.GPU_LOCAL, "x")
        y = ctx.tensor(TensorDesc("f32", (8, 10)), hrx.GPU_LOCAL, "y")
        g = ctx.runtime.graph("mlp"); ...; return SlotIO({"x": x}, {"y": y}, g.prepare())
    model = PreparedModel(ctx, slots=4, factory=build)
    async with model.slot() as s:                  # waits for a free slot
        await s.write("x", images)
        await s.run()
        logits = await s.read("y")
    outputs = await model.infer({"x": images})    # the same in one call

A prepared model keeps `slots` independent copies of a model's I/O and prepared graph,
built by `factory(ctx, index)` on first use, through a `SlotPool` (so a slot is never
handed out while its last run is still on the device). When a slot is built, its
tensors and graph must be the context's, and its inputs and outputs must have the names
and descriptions of the first slot built; slots never share writable I/O (a buffer
another slot already uses). Otherwise that slot is refused (`ContractError`) and
nothing is kept.

A tensor belongs to a model context when its buffer belongs to the context's runtime;
transfers refuse any other (`ContractError`, "belongs to another model context").
I/O in host-mappable memory is written and read in place; device-only I/O goes through
a host staging buffer and a copy graph per tensor, made on first use and reused. The
non-waiting acquire `slot_nowait()` raises `Busy`. For the event loop thread only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import numpy as np

from .._core.memory import HOST_VISIBLE
from .._runtime.completion import Completion
from .._runtime.prepared import PreparedGraph
from ..errors import ContractError
from ..runtime import Runtime
from ..serve.slots import Slot, SlotPool
from . import _check, chain
from .chain import Inference, SlotLease
from .context import ModelContext, SlotIO
from .device import DeviceTensor
from .tensor import Tensor, TensorDesc


class ModelSlot:
    """One held slot of a prepared model: its tensors, `write`, `run`, `read`."""

    def __init__(self, model: PreparedModel, slot: Slot[SlotIO]) -> None:
        self.model = model
        self._slot = slot

    @property
    def index(self) -> int:
        """Which slot of the prepared model this is."""
        return self._slot.index

    @property
    def io(self) -> SlotIO:
        """The slot's inputs and outputs (`SlotIO`), built by the model's factory."""
        return self._slot.resources

    @property
    def inputs(self) -> dict[str, Tensor]:
        """The slot's input tensors, by name."""
        return self.io.inputs

    @property
    def outputs(self) -> dict[str, Tensor]:
        """The slot's output tensors, by name."""
        return self.io.outputs

    def _staging(self, name: str, tensor: Tensor, upload: bool) -> tuple[Tensor, PreparedGraph]:
        io = self.io
        key = ("in:" if upload else "out:") + name
        found = io.staging.get(key)
        if found is None:
            ctx = self.model.context
            buffer = ctx.allocate(tensor.nbytes, HOST_VISIBLE, f"staging-{key}")
            staged = Tensor(tensor.desc, buffer.view())
            graph = ctx.copy_graph(tensor, staged) if upload else ctx.copy_graph(staged, tensor)
            found = io.staging[key] = (staged, graph)
            self.model.staging_buffers += 1
        return found

    async def write(self, name: str, array: Any) -> None:
        """Write input `name` (dtype and shape must be the tensor's)."""
        tensor = self.inputs.get(name)
        if tensor is None:
            raise ContractError(f"no input {name!r}; inputs: {sorted(self.inputs)}")
        array = tensor.check_array(array)
        if tensor.view.buffer.placement.host_mappable or tensor.desc.empty:
            await tensor.write(array)
            return
        staged, graph = self._staging(name, tensor, upload=True)
        await staged.write(array)
        await self._slot.submit(graph)

    async def read(self, name: str) -> np.ndarray[Any, Any]:
        """Output `name` as a numpy array, once the slot's work on it finished (device memory goes
        through host staging, made on first use and reused).

        `ContractError` for a name that is not an output."""
        tensor = self.outputs.get(name)
        if tensor is None:
            raise ContractError(f"no output {name!r}; outputs: {sorted(self.outputs)}")
        if tensor.view.buffer.placement.host_mappable or tensor.desc.empty:
            return await tensor.read()
        staged, graph = self._staging(name, tensor, upload=False)
        await self._slot.submit(graph)
        return await staged.read()

    def submit(self) -> Completion:
        """Submit the slot's graph (recorded as the slot's work); await the completion."""
        return self._slot.submit(self.io.graph)

    async def run(self) -> None:
        """Submit the slot's graph and wait for it; raises its error."""
        await self.submit()


class PreparedModel:
    """`slots` (>= 1) copies of a model's I/O and graph; see the module docstring."""

    def __init__(
        self,
        context: ModelContext,
        slots: int,
        factory: Callable[[ModelContext, int], SlotIO],
        label: str = "model",
        eager: bool = False,
    ) -> None:
        if not isinstance(context, ModelContext):
            raise ContractError(
                f"a PreparedModel needs a ModelContext, got {_check.shown(context)}"
            )
        slots = _check.integer(slots, "slots", 1)
        _check.function(factory, "factory")
        self.context = context
        self.label = label
        self.staging_buffers = 0
        self.copy_graphs = 0
        self._factory = factory
        self._owners: dict[int, int] = {}  # buffer ident -> slot index, for writable I/O
        self._io_descs: tuple[int, dict[str, TensorDesc], dict[str, TensorDesc]] | None = None
        """(slot index, input descs, output descs) of the first slot built: every slot's."""
        self.pool: SlotPool[SlotIO] = SlotPool(context.runtime, slots, self._build, label)
        if eager:
            # Build (and check) every slot now: a refused slot fails the constructor.
            held = [self.pool.acquire_nowait() for _ in range(slots)]
            for slot in held:
                slot.release()

    def _build(self, runtime: Runtime, index: int) -> SlotIO:
        io = self._factory(self.context, index)
        if not isinstance(io, SlotIO) or not isinstance(io.graph, PreparedGraph):
            raise ContractError(
                f"a model factory returns SlotIO(inputs, outputs, graph), got {_check.shown(io)}"
            )
        if io.graph.runtime is not self.context.runtime:
            raise ContractError(
                f"slot {index}'s graph was prepared by another runtime than its model "
                f"context's ({self.context.runtime.domain.label})"
            )
        claimed: dict[int, int] = {}
        descs: list[dict[str, TensorDesc]] = []
        for kind, tensors in (("input", io.inputs), ("output", io.outputs)):
            if not isinstance(tensors, Mapping):
                raise ContractError(f"SlotIO {kind}s must map names to Tensors")
            descs.append({})
            for name, tensor in tensors.items():
                self.context.validate(tensor, f"slot {index}'s {kind} {name!r}")
                descs[-1][name] = tensor.desc
                ident = tensor.view.buffer.ident
                owner = self._owners.get(ident, index)
                if owner != index:
                    raise ContractError(
                        f"slot {index}'s {kind} {name!r} is in {tensor.view.buffer.label}, "
                        f"which slot {owner} already uses: slots never share writable I/O"
                    )
                claimed[ident] = index
        inputs, outputs = descs
        if self._io_descs is None:
            self._io_descs = (index, inputs, outputs)
        else:
            first, first_inputs, first_outputs = self._io_descs
            for kind, mine, theirs in (
                ("inputs", inputs, first_inputs),
                ("outputs", outputs, first_outputs),
            ):
                if mine != theirs:
                    raise ContractError(
                        f"slot {index}'s {kind} {_described(mine)} differ from slot {first}'s "
                        f"{_described(theirs)}: every slot has the same I/O"
                    )
        self._owners.update(claimed)
        return io

    @property
    def slots(self) -> int:
        """How many slots the model was prepared with."""
        return self.pool.size

    @property
    def idle(self) -> bool:
        """No slot held and no run on the device (a plan cache evicts only idle models)."""
        return self.pool.idle

    def is_idle(self) -> bool:
        """Nothing leased and nothing running: the plan cache's idle test."""
        return self.pool.idle

    def try_acquire(self) -> SlotLease:
        """A slot lease now, or `Busy` while every slot is leased or still running."""
        return SlotLease(self, self.pool.acquire_nowait())

    async def acquire(self) -> SlotLease:
        """A slot lease, waiting (first come, first served) for a free slot."""
        return SlotLease(self, await self.pool.acquire().__aenter__())

    async def submit(self, inputs: Sequence[DeviceTensor]) -> Inference:
        """Copy `inputs` into a slot's inputs after their producers and run it, without
        waiting for anything but a free slot (see `hrx_async.models.chain`)."""
        return chain.submit(await self.acquire(), inputs)

    async def submit_host_with(self, fn: Callable[[int, memoryview], object]) -> Inference:
        """Let `fn(i, memory)` write each input in place (or into reused staging), then run."""
        return await chain.submit_host_with(await self.acquire(), fn)

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[ModelSlot]:
        """`async with model.slot() as s:` waits (first come, first served) for a free slot."""
        async with self.pool.acquire() as slot:
            yield ModelSlot(self, slot)

    def slot_nowait(self) -> Slot[SlotIO]:
        """A free slot now (a `with` block; `ModelSlot(model, slot)` wraps it), or `Busy`."""
        return self.pool.acquire_nowait()

    async def infer(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray[Any, Any]]:
        """Write every input, run, and read every output, on one slot."""
        if not isinstance(inputs, Mapping):
            raise ContractError(
                f"infer() takes a mapping of input names to arrays, got {_check.shown(inputs)}"
            )
        async with self.slot() as s:
            missing = sorted(set(s.inputs) - set(inputs))
            if missing or set(inputs) - set(s.inputs):
                raise ContractError(
                    f"inputs must be exactly {sorted(s.inputs)}, got {sorted(inputs)}"
                )
            for name, array in inputs.items():
                s.inputs[name].check_array(array)
            for name, array in inputs.items():
                await s.write(name, array)
            await s.run()
            return {name: await s.read(name) for name in s.outputs}

    def __repr__(self) -> str:
        return f"<PreparedModel {self.label!r} slots={self.slots} built={self.pool.built}>"


def _described(descs: dict[str, TensorDesc]) -> str:
    shown = (
        f"{name}: {desc} strides {list(desc.strides)} {desc.layout.value}"
        for name, desc in sorted(descs.items(), key=lambda item: str(item[0]))
    )
    return "{" + ", ".join(shown) + "}"


__all__ = ["ModelSlot", "PreparedModel"]
