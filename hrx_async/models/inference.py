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

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..completion import Completion
from ..errors import ContractError
from ..memory import HOST_VISIBLE, Buffer, Placement
from ..prepared import PreparedGraph
from ..runtime import Runtime
from ..slots import Slot, SlotPool
from . import _check
from .tensor import Tensor, TensorDesc


class ModelContext:
    """Allocation, tensors and transfers over one runtime."""

    def __init__(self, runtime: Runtime) -> None:
        if not isinstance(runtime, Runtime):
            raise ContractError(f"a ModelContext needs a Runtime, got {_check.shown(runtime)}")
        self.runtime = runtime

    def owns(self, tensor: object) -> bool:
        """Whether `tensor` is a Tensor of this context (in a buffer of its runtime)."""
        return isinstance(tensor, Tensor) and self.runtime.owns(tensor.view)

    def validate(self, tensor: object, what: str = "a tensor") -> Tensor:
        """`tensor` when it is a live Tensor of this context, else `ContractError`."""
        if not isinstance(tensor, Tensor):
            raise ContractError(f"{what} must be a Tensor, got {_check.shown(tensor)}")
        if not self.runtime.owns(tensor.view):
            raise ContractError(
                f"{what} {tensor} belongs to another model context (its runtime is "
                f"{tensor.view.buffer.domain.label}, this context's is "
                f"{self.runtime.domain.label})"
            )
        tensor.view.buffer.check_alive()
        return tensor

    def _staging(self, tensor: Tensor, staging: object, label: str) -> tuple[Buffer, bool]:
        """The host-visible buffer to stage `tensor` through, and whether it is a
        temporary one of ours (when `staging` is None)."""
        if staging is None:
            return self.allocate(tensor.nbytes, HOST_VISIBLE, label), True
        if not isinstance(staging, Buffer) or not self.runtime.owns(staging):
            raise ContractError(
                f"staging must be a Buffer of this context's runtime, got {_check.shown(staging)}"
            )
        staging.check_alive()
        if not staging.placement.host_mappable or staging.nbytes < tensor.nbytes:
            raise ContractError(
                f"staging for {tensor.desc} must be host-mappable and hold {tensor.nbytes} "
                f"bytes; {staging.label} is {staging.placement} with {staging.nbytes}"
            )
        return staging, False

    def allocate(self, nbytes: int, placement: Placement, label: str = "") -> Buffer:
        return self.runtime.allocate(nbytes, placement, label)

    def tensor(self, desc: TensorDesc, placement: Placement, label: str = "") -> Tensor:
        """A new tensor in its own zeroed buffer (one byte for an empty tensor)."""
        if not isinstance(desc, TensorDesc):
            raise ContractError(f"tensor() takes a TensorDesc, got {_check.shown(desc)}")
        buffer = self.allocate(max(desc.nbytes, 1), placement, label)
        return Tensor(desc, buffer.view())

    async def upload(self, tensor: Tensor, array: Any, staging: Buffer | None = None) -> None:
        """Write `array` into `tensor`: in place when host-mappable, else through `staging`
        (a host-visible buffer of at least `tensor.nbytes`; a temporary one when None)."""
        tensor = self.validate(tensor)
        array = tensor.check_array(array)
        if tensor.desc.empty:
            return
        if tensor.view.buffer.placement.host_mappable:
            await tensor.write(array)
            return
        stage, own = self._staging(tensor, staging, "upload-staging")
        try:
            staged = Tensor(tensor.desc, stage.view(0, tensor.nbytes))
            await staged.write(array)
            await self.copy(tensor, staged)
        finally:
            if own:
                stage.free()

    async def download(self, tensor: Tensor, staging: Buffer | None = None) -> np.ndarray[Any, Any]:
        """A numpy copy of `tensor` (through `staging` when it is device-only)."""
        tensor = self.validate(tensor)
        if tensor.desc.empty or tensor.view.buffer.placement.host_mappable:
            return await tensor.read()
        stage, own = self._staging(tensor, staging, "download-staging")
        try:
            staged = Tensor(tensor.desc, stage.view(0, tensor.nbytes))
            await self.copy(staged, tensor)
            return await staged.read()
        finally:
            if own:
                stage.free()

    def copy_graph(self, dst: Tensor, src: Tensor) -> PreparedGraph:
        """A prepared copy of `src`'s bytes into `dst` (same dtype and extent)."""
        dst = self.validate(dst, "the copy's destination")
        src = self.validate(src, "the copy's source")
        if dst.desc.dtype is not src.desc.dtype or dst.nbytes != src.nbytes or src.desc.empty:
            raise ContractError(f"cannot copy {src.desc} into {dst.desc}: dtype or size differs")
        graph = self.runtime.graph("tensor-copy")
        graph.copy(dst.data, src.data)
        return graph.prepare()

    async def copy(self, dst: Tensor, src: Tensor) -> None:
        await self.copy_graph(dst, src).submit()


@dataclass
class SlotIO:
    """What a factory returns for one slot: named inputs and outputs and the prepared
    graph that reads the inputs and writes the outputs; `extra` is the factory's own."""

    inputs: dict[str, Tensor]
    outputs: dict[str, Tensor]
    graph: PreparedGraph
    extra: Any = None
    staging: dict[str, tuple[Tensor, PreparedGraph]] = field(default_factory=dict)


class ModelSlot:
    """One held slot of a prepared model: its tensors, `write`, `run`, `read`."""

    def __init__(self, model: PreparedModel, slot: Slot[SlotIO]) -> None:
        self.model = model
        self._slot = slot

    @property
    def index(self) -> int:
        return self._slot.index

    @property
    def io(self) -> SlotIO:
        return self._slot.resources

    @property
    def inputs(self) -> dict[str, Tensor]:
        return self.io.inputs

    @property
    def outputs(self) -> dict[str, Tensor]:
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
        await self.submit()


class PreparedModel:
    """`slots` (>= 1) copies of a model's I/O and graph; see the module docstring."""

    def __init__(
        self,
        context: ModelContext,
        slots: int,
        factory: Callable[[ModelContext, int], SlotIO],
        label: str = "model",
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
        self._factory = factory
        self._owners: dict[int, int] = {}  # buffer ident -> slot index, for writable I/O
        self._io_descs: tuple[int, dict[str, TensorDesc], dict[str, TensorDesc]] | None = None
        """(slot index, input descs, output descs) of the first slot built: every slot's."""
        self.pool: SlotPool[SlotIO] = SlotPool(context.runtime, slots, self._build, label)

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
        return self.pool.size

    @property
    def idle(self) -> bool:
        """No slot held and no run on the device (a plan cache evicts only idle models)."""
        return self.pool.idle

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


__all__ = ["ModelContext", "ModelSlot", "PreparedModel", "SlotIO"]
