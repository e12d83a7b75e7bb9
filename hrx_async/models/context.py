"""The model layer's context and a slot's I/O: what prepared models, chains and fragments
share.

A `ModelContext` ties tensors to one runtime: it makes them, checks that a tensor is its
own, and moves data in and out (host-mappable tensors in place, device-only ones through
a staging buffer and a copy graph). A `SlotIO` is what a model's factory builds for one
slot: named input and output tensors and the prepared graph between them
(`PreparedModel`, inference.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np

from .._core.memory import GPU_LOCAL, HOST_VISIBLE, Buffer, Placement, View
from .._runtime.completion import Completion
from .._runtime.prepared import PreparedGraph
from ..errors import ContractError
from ..runtime import Runtime
from . import _check
from .device import DeviceTensor, producers, trailing_check
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

    def validate_device(self, tensor: object, what: str = "a tensor") -> DeviceTensor:
        """`tensor` when it is a DeviceTensor of this context (its view in this runtime's
        memory, its producer this runtime's or done), else `ContractError`."""
        if not isinstance(tensor, DeviceTensor):
            raise ContractError(f"{what} must be a DeviceTensor, got {_check.shown(tensor)}")
        view, producer = tensor.view, tensor.producer
        if (view is not None and not self.runtime.owns(view)) or (
            producer is not None and not producer.done() and not self.runtime.owns(producer)
        ):
            raise ContractError(
                f"{what} {tensor} belongs to another model context (this context's runtime "
                f"is {self.runtime.domain.label})"
            )
        if view is not None:
            view.buffer.check_alive()
        return tensor

    def validate(self, tensor: object, what: str = "a tensor") -> Tensor:
        """`tensor` when it is a live Tensor of this context, else `ContractError`."""
        if isinstance(tensor, DeviceTensor):
            self.validate_device(tensor, what)
            return tensor  # type: ignore[return-value]
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
        """`Runtime.allocate` on this context's runtime; raises what it raises."""
        return self.runtime.allocate(nbytes, placement, label)

    def tensor(self, desc: TensorDesc, placement: Placement, label: str = "") -> Tensor:
        """A new tensor in its own zeroed buffer (one byte for an empty tensor)."""
        if not isinstance(desc, TensorDesc):
            raise ContractError(f"tensor() takes a TensorDesc, got {_check.shown(desc)}")
        buffer = self.allocate(max(desc.nbytes, 1), placement, label)
        return Tensor(desc, buffer.view())

    # -- device tensors --------------------------------------------------------------

    def allocate_with(
        self, desc: TensorDesc, placement: Placement, label: str = ""
    ) -> DeviceTensor:
        """A zeroed device tensor in its own buffer; an empty one allocates nothing."""
        if not isinstance(desc, TensorDesc):
            raise ContractError(f"allocate_with() takes a TensorDesc, got {_check.shown(desc)}")
        if desc.empty:
            return DeviceTensor(desc, None)
        return DeviceTensor(desc, self.allocate(desc.nbytes, placement, label).view())

    def device_tensor(
        self, desc: TensorDesc, view: View | None, producer: Completion | None = None
    ) -> DeviceTensor:
        """`desc` over `view` (this runtime's, long enough, aligned) written by `producer`
        (this runtime's, or done). `tensor(desc, view, producer)` in the original."""
        return self.validate_device(DeviceTensor(desc, view, producer), "the tensor")

    async def upload_tensor(
        self, desc: TensorDesc, data: Any, placement: Placement = GPU_LOCAL
    ) -> DeviceTensor:
        """A new tensor holding `data` (bytes-like, exactly `desc.nbytes`), written through
        fresh staging; its producer is the upload. On failure nothing stays allocated."""
        if not isinstance(desc, TensorDesc):
            raise ContractError(f"upload_tensor() takes a TensorDesc, got {_check.shown(desc)}")
        raw = memoryview(data).cast("B") if not isinstance(data, memoryview) else data.cast("B")
        if raw.nbytes != desc.nbytes:
            raise ContractError(f"{desc} holds {desc.nbytes} bytes; got {raw.nbytes}")
        dst = self.allocate_with(desc, placement, "upload")
        if dst.view is None:
            return dst
        try:
            if placement.host_mappable:
                async with dst.view.map_write() as memory:
                    memory[:] = raw
                return dst
            stage = self.allocate(desc.nbytes, HOST_VISIBLE, "upload-staging")
            async with stage.map_write() as memory:
                memory[:] = raw
            graph = self.runtime.graph("tensor-upload")
            graph.copy(dst.view, stage.view())
            return dst.with_producer(graph.prepare().submit())
        except BaseException:
            dst.view.buffer.free()
            raise

    def copy_into(self, dst: DeviceTensor, offset: int, src: DeviceTensor) -> DeviceTensor:
        """Copy `src` into `dst` at byte `offset`, after both producers: `dst` with the
        copy as its producer (src's lease is held until the copy finishes)."""
        dst = self.validate_device(dst, "the copy's destination")
        src = self.validate_device(src, "the copy's source")
        offset = _check.integer(offset, "a copy offset (bytes)", 0)
        if offset + src.nbytes > dst.nbytes:
            raise ContractError(
                f"{src.desc} at byte {offset} ends past the destination's {dst.nbytes} bytes"
            )
        if src.desc.dtype is not dst.desc.dtype:
            raise ContractError(f"cannot copy {src.desc} into {dst.desc}: the dtypes differ")
        if not (src.desc.contiguous and dst.desc.contiguous):
            raise ContractError("copy_into() needs contiguous source and destination")
        if offset % dst.desc.dtype.itemsize:
            raise ContractError(f"offset {offset} is not aligned to {dst.desc.dtype.value}")
        if src.view is None or dst.view is None:
            return dst.with_producer(dst.producer if not src.after() else src.producer)
        target, source = dst.binding(), src.binding()
        assert target is not None and source is not None
        graph = self.runtime.graph("tensor-copy-into")
        graph.copy(target.slice(offset, src.nbytes), source)
        done = graph.prepare().submit(producers((dst, src)))
        return dst.with_producer(done)

    def concatenate(self, tensors: Any, placement: Placement | None = None) -> DeviceTensor:
        """A new tensor of `tensors` joined along axis 0 (each checked against the first:
        dtype, layout, rank, trailing dimensions, contiguity), after every producer."""
        items = list(tensors) if not isinstance(tensors, DeviceTensor) else None
        if not items:
            raise ContractError("concatenate() takes a non-empty list of DeviceTensors")
        checked = [self.validate_device(t, f"concatenate input {i}") for i, t in enumerate(items)]
        first = checked[0]
        if first.desc.rank == 0:
            raise ContractError("concatenate() cannot join scalars (rank 0) along axis 0")
        if not first.desc.contiguous:
            raise ContractError(f"concatenate input 0 ({first.desc}) is not contiguous")
        for index, other in enumerate(checked[1:], 1):
            trailing_check(first, other, index)
        rows = sum(t.desc.shape[0] for t in checked)
        desc = TensorDesc(first.desc.dtype, (rows, *first.desc.shape[1:]), None, first.desc.layout)
        where = placement or (first.view.buffer.placement if first.view else GPU_LOCAL)
        out = self.allocate_with(desc, where, "concatenate")
        after = producers(checked)
        if out.view is None:
            return out.with_producer(after[0] if after else None)
        graph = self.runtime.graph("tensor-concatenate")
        at = 0
        for tensor in checked:
            source = tensor.binding()
            if source is not None:
                graph.copy(out.view.slice(at, tensor.nbytes), source)
                at += tensor.nbytes
        return out.with_producer(graph.prepare().submit(after))

    async def _read_device(self, tensor: DeviceTensor) -> bytes:
        tensor = self.validate_device(tensor)
        for producer in tensor.after():
            await producer
        view = tensor.view
        if view is None:
            return b""
        if view.buffer.placement.host_mappable:
            async with view.map_read() as memory:
                return bytes(memory)
        stage = self.allocate(view.nbytes, HOST_VISIBLE, "download-staging")
        try:
            graph = self.runtime.graph("tensor-download")
            graph.copy(stage.view(), view)
            await graph.prepare().submit()
            async with stage.map_read() as memory:
                return bytes(memory)
        finally:
            del graph
            stage.free()

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

    @overload
    async def download(
        self, tensor: Tensor, staging: Buffer | None = None
    ) -> np.ndarray[Any, Any]: ...

    @overload
    async def download(self, tensor: DeviceTensor, staging: None = None) -> bytes: ...

    async def download(self, tensor: Tensor | DeviceTensor, staging: Buffer | None = None) -> Any:
        """A numpy copy of `tensor` (through `staging` when it is device-only); for a
        `DeviceTensor`, its bytes (stride gaps included) once its producer is done."""
        if isinstance(tensor, DeviceTensor):
            return await self._read_device(tensor)
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
        """Copy `src` into `dst` and wait for it (one small graph); `ContractError` when their
        dtype or size differs."""
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
    copies: dict[str, dict[Any, Any]] = field(default_factory=dict)
    """Prepared copies of device tensors into each input, by source bytes (`chain`)."""


__all__ = ["ModelContext", "SlotIO"]
