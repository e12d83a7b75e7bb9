"""Placements, buffers and views (the memory budget is `budget.py`'s, re-exported here).

Buffers are created by a runtime (`Runtime.allocate`); this module holds the
backend-neutral allocation record. Native storage is owned by the backend and
reached through `Buffer.storage`. A `View` is a byte range of one buffer and is
what every graph operation takes.
"""

from __future__ import annotations

import builtins
import enum
import itertools
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import ContractError, RuntimeClosed
from . import validate as _validate
from .budget import MemoryBudget as MemoryBudget
from .budget import Reservation as Reservation

if TYPE_CHECKING:
    from ..errors import HrxError


class PlacementKind(enum.Enum):
    GPU_LOCAL = "gpu_local"
    HOST_VISIBLE = "host_visible"
    NPU_LOCAL = "npu_local"
    SHARED = "shared"


@dataclass(frozen=True, slots=True)
class Placement:
    """Where bytes live: `GPU_LOCAL` (= `gpu_local(0)`), `gpu_local(i)`, `HOST_VISIBLE`,
    `npu_local(i)` or `shared(i)`.

    `gpu` numbers the runtime's GPUs (`Runtime(devices=[...])` in that order), so
    `GPU_LOCAL` is always the runtime's first GPU whatever its device ordinal.
    """

    kind: PlacementKind
    npu: int | None = None
    gpu: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.kind, PlacementKind):
            raise ContractError(
                f"a placement kind must be a PlacementKind, got {_validate.shown(self.kind)}"
            )
        if self.kind in (PlacementKind.NPU_LOCAL, PlacementKind.SHARED):
            object.__setattr__(self, "npu", _npu_index(self.npu))
        elif self.npu is not None:
            raise ContractError(
                f"{self.kind.value} memory belongs to no NPU; got npu={_validate.shown(self.npu)}"
            )
        if self.kind is PlacementKind.GPU_LOCAL:
            object.__setattr__(self, "gpu", _validate.integer(self.gpu, "a GPU number", 0))
        elif not (type(self.gpu) is int and self.gpu == 0):
            raise ContractError(
                f"{self.kind.value} memory belongs to no GPU; got gpu={_validate.shown(self.gpu)}"
            )

    @property
    def host_mappable(self) -> bool:
        """Device memory cannot be mapped; every other placement is host-mapped storage."""
        return self.kind is not PlacementKind.GPU_LOCAL

    @property
    def gpu_bindable(self) -> bool:
        """Whether GPU kernels may bind memory of this placement (everything but `npu_local`)."""
        return self.kind is not PlacementKind.NPU_LOCAL

    def npu_bindable(self, npu: int) -> bool:
        """Whether NPU `npu`'s kernels may bind memory of this placement: `npu_local(npu)` or
        `shared(npu)` only."""
        return self.kind in (PlacementKind.NPU_LOCAL, PlacementKind.SHARED) and self.npu == npu

    @property
    def host_side(self) -> bool:
        """A copy from host side to GPU side is an upload; the other way, a download."""
        return self.kind in (PlacementKind.HOST_VISIBLE, PlacementKind.NPU_LOCAL)

    @property
    def tracked_whole(self) -> bool:
        """Shared memory is one GPU allocation imported into the NPU: ordered as a whole."""
        return self.kind is PlacementKind.SHARED

    @property
    def gpu_device(self) -> int | None:
        """The GPU whose memory this is (None: host-mapped memory every GPU reaches)."""
        return self.gpu if self.kind is PlacementKind.GPU_LOCAL else None

    def __str__(self) -> str:
        if self.npu is not None:
            return f"{self.kind.value}({self.npu})"
        return f"{self.kind.value}({self.gpu})" if self.gpu else self.kind.value


GPU_LOCAL = Placement(PlacementKind.GPU_LOCAL)
HOST_VISIBLE = Placement(PlacementKind.HOST_VISIBLE)


def _npu_index(npu: object) -> int:
    return _validate.integer(npu, "an NPU index", 0)


def gpu_local(gpu: int = 0) -> Placement:
    """Device memory of the runtime's GPU number `gpu` (0: its first, i.e. `GPU_LOCAL`)."""
    return Placement(PlacementKind.GPU_LOCAL, gpu=gpu)


def npu_local(npu: int) -> Placement:
    """Host-mapped storage of NPU `npu`; NPU kernels of that NPU bind it, GPU kernels cannot."""
    return Placement(PlacementKind.NPU_LOCAL, npu)


def shared(npu: int) -> Placement:
    """One allocation both the GPU and NPU `npu` use without copies."""
    return Placement(PlacementKind.SHARED, npu)


_domain_ids = itertools.count(1)


class Domain:
    """An allocation and scheduling domain: one per runtime."""

    __slots__ = ("ident", "label")

    def __init__(self, label: str) -> None:
        self.label = _validate.text(label, "a domain label")
        self.ident = next(_domain_ids)

    def __repr__(self) -> str:
        return f"<Domain {self.ident} {self.label}>"

    def name_beside(self, other: Domain) -> str:
        """Its label, or, where `other` has the same one, its label and number (for a
        message naming both)."""
        return self.label if self.label != other.label else f"{self.label} #{self.ident}"


class BufferOwner(Protocol):
    """What a buffer needs from the runtime that made it."""

    domain: Domain

    def _release_buffer(self, buffer: Buffer) -> None: ...

    def _map(
        self, view: View, write: bool, wait: bool
    ) -> AbstractAsyncContextManager[memoryview]: ...

    def _map_nowait(self, view: View, write: bool) -> HostMapping: ...

    def _dlpack(
        self,
        view: View,
        stream: int | None,
        max_version: tuple[int, int] | None,
        dl_device: tuple[int, int] | None,
        copy: bool | None,
    ) -> Any: ...

    def _dlpack_device(self, view: View) -> tuple[int, int]: ...


_buffer_ids = itertools.count(1)


class Buffer:
    """Bytes with a placement, owned by one runtime. Starts zeroed.

    `free()` gives the memory back (also done when the buffer is garbage collected).
    The constructor checks its arguments but is the runtime's: use `Runtime.allocate`.
    """

    __slots__ = (
        "__weakref__",
        "_owner",
        "_released",
        "ident",
        "label",
        "nbytes",
        "placement",
        "poison",
        "storage",
    )

    def __init__(
        self, owner: BufferOwner, nbytes: int, placement: Placement, storage: Any, label: str = ""
    ) -> None:
        if not isinstance(getattr(owner, "domain", None), Domain):
            raise ContractError(
                f"a buffer's owner must be a runtime (with a Domain), got {_validate.shown(owner)}"
            )
        self._owner = owner
        self.nbytes = _validate.integer(nbytes, "a buffer size", 1)
        self.placement = _validate.instance(placement, Placement, "a buffer placement")
        _validate.text(label, "a buffer label")
        self.storage = storage
        self.ident = next(_buffer_ids)
        self.label = label or f"buffer#{self.ident}"
        self._released = False
        self.poison: HrxError | None = None

    @property
    def domain(self) -> Domain:
        """The allocation domain of the runtime that owns this buffer (what `Runtime.owns`
        compares)."""
        return self._owner.domain

    @property
    def freed(self) -> bool:
        """True once `free()` released the memory; every later use raises `ContractError`."""
        return self._released

    def check_alive(self) -> None:
        """Raise `ContractError` if this buffer was freed; otherwise do nothing."""
        if self._released:
            raise ContractError(f"{self.label} was freed; allocate a new buffer")

    def view(self, offset: int = 0, nbytes: int | None = None) -> View:
        """The bytes [offset, offset + nbytes) (to the end when nbytes is None)."""
        self.check_alive()
        whole = View._make(self, 0, self.nbytes)
        if type(offset) is int and offset == 0 and nbytes is None:
            return whole
        return whole.slice(offset, nbytes)

    def __getitem__(self, key: builtins.slice) -> View:
        return self.view()[key]

    def free(self) -> None:
        """Release the memory now. Raises `Busy` while submitted work or a mapping uses it."""
        if not self._released:
            self._owner._release_buffer(self)

    def _mark_released(self) -> None:
        self._released = True
        self.storage = None

    def map_read(self) -> AbstractAsyncContextManager[memoryview]:
        """`async with buf.map_read() as memory:` maps the whole buffer read-only: `View.map_read`
        of `view()`.

        Waits for conflicting submitted work; `Unsupported` for `GPU_LOCAL` memory."""
        return self.view().map_read()

    def map_write(self) -> AbstractAsyncContextManager[memoryview]:
        """`async with buf.map_write() as memory:` maps the whole buffer writable: `View.map_write`
        of `view()`.

        Waits for conflicting submitted work; the host becomes the bytes' last writer;
        `Unsupported` for `GPU_LOCAL` memory."""
        return self.view().map_write()

    def map_read_nowait(self) -> HostMapping:
        """Map the whole buffer read-only now (`with buf.map_read_nowait() as memory:`).

        `Busy` when conflicting work is pending; `Unsupported` for `GPU_LOCAL` memory."""
        return self.view().map_read_nowait()

    def map_write_nowait(self) -> HostMapping:
        """Map the whole buffer writable now (`with buf.map_write_nowait() as memory:`).

        `Busy` when conflicting work is pending or another mapping of these bytes is live;
        `Unsupported` for `GPU_LOCAL` memory."""
        return self.view().map_write_nowait()

    def __repr__(self) -> str:
        state = " freed" if self._released else ""
        return f"<Buffer {self.label} {self.nbytes} B {self.placement}{state}>"


@dataclass(frozen=True, slots=True)
class View:
    """The byte range [offset, offset + nbytes) of one buffer. Offsets are absolute.

    Made by `buffer.view()`, `buffer[a:b]` or slicing another view; made directly, the
    same rules hold: a live buffer, integer offset >= 0 and length >= 1, inside the buffer.
    """

    buffer: Buffer
    offset: int
    nbytes: int

    def __post_init__(self) -> None:
        buffer = self.buffer
        if not isinstance(buffer, Buffer):
            raise ContractError(
                f"a View is a byte range of a Buffer, got {_validate.shown(buffer)}"
            )
        buffer.check_alive()
        offset, nbytes = _validate.view_range(buffer.nbytes, self.offset, self.nbytes)
        if type(self.offset) is not int or type(self.nbytes) is not int:
            object.__setattr__(self, "offset", offset)
            object.__setattr__(self, "nbytes", nbytes)

    @classmethod
    def _make(cls, buffer: Buffer, offset: int, nbytes: int) -> View:
        """A view from values already checked against `buffer` (slicing's fast path)."""
        view = object.__new__(cls)
        object.__setattr__(view, "buffer", buffer)
        object.__setattr__(view, "offset", offset)
        object.__setattr__(view, "nbytes", nbytes)
        return view

    @property
    def end(self) -> int:
        """One past the view's last byte: `offset + nbytes`."""
        return self.offset + self.nbytes

    def slice(self, offset: int = 0, nbytes: int | None = None) -> View:
        """A sub-range, relative to this view; bounds-checked (integers, not bools)."""
        start = _validate.as_integer(offset)
        if start is None or start < 0 or start > self.nbytes:
            raise ContractError(
                f"slice offset must be an integer in 0..{self.nbytes} for a {self.nbytes}-byte "
                f"view, got {_validate.shown(offset)}"
            )
        length = self.nbytes - start if nbytes is None else _validate.as_integer(nbytes)
        if length is None or length < 1 or start + length > self.nbytes:
            shown = _validate.shown(length if nbytes is None else nbytes)
            raise ContractError(
                f"slice length must be an integer in 1..{self.nbytes - start} at offset {start} "
                f"of a {self.nbytes}-byte view, got {shown}"
            )
        return View._make(self.buffer, self.offset + start, length)

    def __getitem__(self, key: builtins.slice) -> View:
        if not isinstance(key, builtins.slice) or not (
            key.step is None or _validate.as_integer(key.step) == 1
        ):
            raise ContractError(
                f"views are sliced by contiguous byte ranges [a:b], got {_validate.shown(key)}"
            )
        # Negative bounds count from the end as in Python, but out-of-range bounds are not
        # clamped: a shorter view than asked for would only fail later, far from the cause.
        start = _slice_bound(key.start, 0, self.nbytes)
        stop = _slice_bound(key.stop, self.nbytes, self.nbytes)
        if start is None or stop is None or not 0 <= start < stop <= self.nbytes:
            raise ContractError(
                f"byte range [{key.start}:{key.stop}] is empty or outside this {self.nbytes}-byte "
                f"view; allowed: integers with 0 <= a < b <= {self.nbytes} (negative ones count "
                "from the end)"
            )
        return View._make(self.buffer, self.offset + start, stop - start)

    def overlaps(self, other: View) -> bool:
        """True when both views are of the same buffer and share at least one byte."""
        return self.buffer is other.buffer and self.offset < other.end and other.offset < self.end

    def map_read(self) -> AbstractAsyncContextManager[memoryview]:
        """Wait for conflicting work, then map the bytes read-only (many readers may coexist)."""
        return self.buffer._owner._map(self, write=False, wait=True)

    def map_write(self) -> AbstractAsyncContextManager[memoryview]:
        """Wait for conflicting work, then map the bytes writable; the host becomes their writer."""
        return self.buffer._owner._map(self, write=True, wait=True)

    def map_read_nowait(self) -> HostMapping:
        """Map read-only now, or raise `Busy` if conflicting work is pending (a context manager)."""
        return self.buffer._owner._map_nowait(self, write=False)

    def map_write_nowait(self) -> HostMapping:
        """Map writable now, or raise `Busy` if conflicting work is pending or a mapping of these
        bytes is live (a context manager; the host becomes their writer)."""
        return self.buffer._owner._map_nowait(self, write=True)

    def __dlpack__(
        self,
        stream: int | None = None,
        *,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """The bytes as a zero-copy DLPack uint8 tensor (`torch.from_dlpack(view)`, ...).

        Pending writes are ordered before the consumer's `stream`; the tensor keeps the
        buffer alive but must not outlive the runtime.
        """
        return self.buffer._owner._dlpack(self, stream, max_version, dl_device, copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.buffer._owner._dlpack_device(self)

    def __repr__(self) -> str:
        return f"<View {self.buffer.label}[{self.offset}:{self.end}]>"


def _slice_bound(bound: object, default: int, size: int) -> int | None:
    """A `[a:b]` bound as an offset (None when it is not an integer)."""
    if bound is None:
        return default
    number = _validate.as_integer(bound)
    if number is None:
        return None
    return number + size if number < 0 else number


class HostMapping:
    """A live host mapping; a synchronous context manager returned by the `*_nowait` forms.

    Closing the runtime while the mapping is held invalidates it: `memory` is released
    (using it raises `ValueError`), entering it raises `RuntimeClosed`, and `close()`
    stays harmless.
    """

    __slots__ = ("_release", "memory", "view", "write")

    def __init__(
        self, view: View, memory: memoryview, write: bool, release: Callable[[], None]
    ) -> None:
        if not (
            isinstance(view, View)
            and isinstance(memory, memoryview)
            and isinstance(write, bool)
            and callable(release)
        ):
            raise ContractError(
                "a HostMapping is made by map_read_nowait()/map_write_nowait(), got "
                f"{_validate.shown((view, memory, write, release))}"
            )
        self.view = view
        self.memory = memory
        self.write = write
        self._release: Callable[[], None] | None = release

    def close(self) -> None:
        """End the mapping: the `memoryview` is released and conflicting submits may run again.
        Idempotent; `with` calls it."""
        release, self._release = self._release, None
        if release is not None:
            self.memory.release()
            release()

    def __enter__(self) -> memoryview:
        if self._release is None:
            raise RuntimeClosed("this host mapping was already released")
        try:
            self.memory.nbytes  # noqa: B018 - raises once the memoryview is released
        except ValueError:
            raise RuntimeClosed(
                "this host mapping was invalidated: its runtime closed while it was held"
            ) from None
        return self.memory

    def __exit__(self, *exc: object) -> None:
        self.close()


def view_of(value: object, domain: Domain, what: str) -> View:
    """A view of a live buffer of `domain`, inside that buffer."""
    if not isinstance(value, View):
        raise ContractError(
            f"{what} must be a View (buffer.view() or buffer[a:b]), got {_validate.shown(value)}"
        )
    buffer = value.buffer
    if buffer.domain is not domain:
        theirs, ours = buffer.domain.name_beside(domain), domain.name_beside(buffer.domain)
        raise ContractError(
            f"{what} {value} belongs to another runtime ({theirs}); this one is {ours}"
        )
    buffer.check_alive()
    # Views check their range when made; this catches a buffer record changed since.
    if value.offset < 0 or value.nbytes < 1 or value.end > buffer.nbytes:
        raise ContractError(f"{what} {value} is outside its {buffer.nbytes}-byte buffer or empty")
    return value
