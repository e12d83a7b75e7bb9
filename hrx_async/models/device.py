"""Device tensors: a tensor that stays on the device between models, with its producer
and the slot lease that keeps its bytes from being reused.

    x = await ctx.upload_tensor(desc, raw_bytes)     # producer: the upload copy
    y = ctx.copy_into(y, 0, x)                        # ordered after both producers
    z = ctx.concatenate([x, y])                       # along axis 0
    data = await ctx.download(z)                      # bytes, stride gaps included

Why: passing one model's output to the next through the host costs two transfers and a
host wait per hop. A `DeviceTensor` carries what a consumer must order after (its
`producer` completion, None when nothing is pending) and what must stay reserved while
it is used (its `lease`: the slot of the run that wrote it). Every copy of the tensor,
every `view` of it and every graph holding its `binding()` keeps the lease, so the slot
is not reused while anything still refers to the bytes.

Rules (the original's): an empty tensor has no view (nothing is allocated); `view(offset,
desc)` must end within the tensor's bytes and its absolute offset must be aligned to the
dtype, keeps producer and lease, and an empty desc gives a view-less tensor. A tensor
belongs to a context when its view's buffer belongs to the context's runtime.
"""

from __future__ import annotations

from typing import Any

from .._core.memory import View
from .._runtime.completion import Completion
from ..errors import ContractError
from . import _check
from .tensor import TensorDesc


class LeasedView(View):
    """A view that also keeps a lease alive: a graph recording it holds the slot."""

    __slots__ = ("lease",)

    @classmethod
    def of(cls, view: View, lease: object) -> LeasedView:
        """A view over the same bytes as `view` that keeps `lease` alive as long as it lives."""
        binding = object.__new__(cls)
        object.__setattr__(binding, "buffer", view.buffer)
        object.__setattr__(binding, "offset", view.offset)
        object.__setattr__(binding, "nbytes", view.nbytes)
        object.__setattr__(binding, "lease", lease)
        return binding


class DeviceTensor:
    """A description, an optional view (None when empty), a producer completion (None:
    nothing pending) and an optional lease kept alive with it. Immutable: operations
    that order new work return a new tensor."""

    __slots__ = ("desc", "lease", "producer", "view")

    def __init__(
        self,
        desc: TensorDesc,
        view: View | None,
        producer: Completion | None = None,
        lease: object = None,
    ) -> None:
        if not isinstance(desc, TensorDesc):
            raise ContractError(f"a DeviceTensor takes a TensorDesc, got {_check.shown(desc)}")
        if producer is not None and not isinstance(producer, Completion):
            raise ContractError(
                f"a producer is a Completion (or None), got {_check.shown(producer)}"
            )
        if desc.empty:
            view = None
        elif not isinstance(view, View):
            raise ContractError(
                f"a non-empty DeviceTensor lives in a View, got {_check.shown(view)}"
            )
        else:
            view.buffer.check_alive()
            if desc.nbytes > view.nbytes:
                raise ContractError(f"{desc} needs {desc.nbytes} bytes; {view} has {view.nbytes}")
            if view.offset % desc.dtype.itemsize:
                raise ContractError(
                    f"{view} starts at byte {view.offset}, not aligned to {desc.dtype.value} "
                    f"({desc.dtype.itemsize} bytes)"
                )
            view = view.slice(0, desc.nbytes)
        self.desc = desc
        self.view = view
        self.producer = producer
        self.lease = lease

    dtype = property(lambda self: self.desc.dtype)
    """The element type (`desc.dtype`)."""
    shape = property(lambda self: self.desc.shape)
    """The shape, in elements (`desc.shape`)."""
    nbytes = property(lambda self: self.desc.nbytes)
    """The full extent in bytes (`desc.nbytes`)."""

    def binding(self) -> LeasedView | None:
        """The tensor's bytes as a view that retains the lease (None when empty)."""
        if self.view is None:
            return None
        return LeasedView.of(self.view, self.lease)

    def after(self) -> list[Completion]:
        """What work on it must be ordered after: its producer, unless already done."""
        producer = self.producer
        return [] if producer is None or producer.done() else [producer]

    def with_producer(self, producer: Completion | None) -> DeviceTensor:
        """The same tensor and lease, ordered after `producer` instead (None: after nothing)."""
        return DeviceTensor(self.desc, self.view, producer, self.lease)

    def view_as(self, offset: int, desc: TensorDesc) -> DeviceTensor:
        """`desc` at byte `offset` of this tensor, keeping producer and lease. `view` in
        the original (the name here is the tensor's `view` attribute)."""
        if not isinstance(desc, TensorDesc):
            raise ContractError(f"view_as() takes a TensorDesc, got {_check.shown(desc)}")
        offset = _check.integer(offset, "a view offset (bytes)", 0)
        if offset + desc.nbytes > self.desc.nbytes:
            raise ContractError(
                f"a view of {desc} at byte {offset} ends at {offset + desc.nbytes}, past this "
                f"tensor's {self.desc.nbytes} bytes"
            )
        if desc.empty:
            return DeviceTensor(desc, None, self.producer, self.lease)
        assert self.view is not None
        start = self.view.offset + offset
        if start % desc.dtype.itemsize:
            raise ContractError(
                f"a view of {desc} at absolute byte {start} is not aligned to "
                f"{desc.dtype.value} ({desc.dtype.itemsize} bytes)"
            )
        return DeviceTensor(desc, self.view.slice(offset, desc.nbytes), self.producer, self.lease)

    def __repr__(self) -> str:
        where = "empty" if self.view is None else repr(self.view)
        pending = "" if not self.after() else " pending"
        leased = "" if self.lease is None else " leased"
        return f"<DeviceTensor {self.desc} {where}{pending}{leased}>"


def trailing_check(first: DeviceTensor, other: DeviceTensor, index: int) -> None:
    """`other` (input `index`) concatenates with `first` along axis 0."""
    a, b = first.desc, other.desc
    if b.dtype is not a.dtype:
        raise ContractError(f"concatenate input {index} is {b.dtype.value}, not {a.dtype.value}")
    if b.layout is not a.layout:
        raise ContractError(
            f"concatenate input {index} has layout {b.layout.value}, not {a.layout.value}"
        )
    if b.rank != a.rank:
        raise ContractError(f"concatenate input {index} has rank {b.rank}, not {a.rank}")
    if b.shape[1:] != a.shape[1:]:
        raise ContractError(
            f"concatenate input {index} has trailing dimensions {list(b.shape[1:])}, not "
            f"{list(a.shape[1:])}"
        )
    if not b.empty and not b.contiguous:
        raise ContractError(f"concatenate input {index} ({b}) is not contiguous")


def producers(tensors: Any) -> list[Completion]:
    """Every pending producer of `tensors` (each once)."""
    found: dict[int, Completion] = {}
    for tensor in tensors:
        for completion in tensor.after():
            found[id(completion)] = completion
    return list(found.values())


__all__ = ["DeviceTensor", "LeasedView"]
