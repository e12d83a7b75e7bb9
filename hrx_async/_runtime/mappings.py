"""Host mappings: the live `map_read`/`map_write` mappings of one runtime.

`HostMappings` is the session's book of them: per buffer the tokens of the live
mappings (and of the allocations `hrx_async._runtime.interop.gpu_access` reserves, which
count as mappings), the host arrays mappings handed out, and the closing rules.
A submit touching mapped bytes is `Busy`; closing waits for `async with`
mappings other tasks hold, then invalidates whatever is still held.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from .._core.counters import AdmissionMarks
from .._core.graph import GraphPlan
from .._core.intervals import tracked_range
from .._core.memory import Domain, HostMapping, View, view_of
from ..errors import Busy, PoisonedError, RuntimeClosed, Unsupported
from .region import RegionRun

if TYPE_CHECKING:
    from ..backends.base import Backend
    from .scheduler import Scheduler


class MappingToken:
    """A live host mapping as the tracker and the conflict check see it.

    `memory` is the memoryview handed out (None until the bytes are mapped); `task` is the
    task holding an `async with` mapping, None for the `*_nowait` forms (and for the
    `gpu_access` blocks of `hrx_async._runtime.interop`, which subclass this).
    """

    __slots__ = ("end", "mapped", "memory", "start", "task", "view", "write")

    def __init__(self, view: View, write: bool, task: object = None) -> None:
        self.view = view
        self.write = write
        self.task = task
        self.memory: memoryview | None = None
        self.mapped = False
        """The bytes were handed out: a whole write mapping then counts as an overwrite."""
        self.start, self.end = tracked_range(view)

    def conflict(self, label: str, start: int, end: int) -> str:
        """Why a submit touching [start, end) of buffer `label` is refused while this is held."""
        return (
            f"{label}[{start}:{end}] is host-mapped for {'writing' if self.write else 'reading'}; "
            "release the mapping before submitting work on those bytes"
        )


class MappingOwner(Protocol):
    """What host mappings need from the session they belong to (`session.Session`)."""

    @property
    def domain(self) -> Domain: ...

    @property
    def scheduler(self) -> Scheduler | None: ...

    def scheduler_or_raise(self) -> Scheduler: ...

    def backend_or_raise(self) -> Backend: ...


class HostMappings:
    """The live host mappings of one runtime.

    `count` is how many mappings are live (read it; the methods keep it). `closing`, once
    the runtime sets it, refuses new mappings.
    """

    def __init__(self, owner: MappingOwner, marks: AdmissionMarks) -> None:
        self._owner = owner
        self._tokens: dict[int, list[MappingToken]] = {}
        self._marks = marks
        """Where the live count is kept (`marks.mappings`): admission reads it there."""
        self._ended: anyio.Event | None = None
        """Set when a mapping ends while closing waits for mappings to end."""
        self._exports: dict[int, list[weakref.ref[Any]]] = {}
        """Per buffer, the host arrays behind the memoryviews mappings handed out."""
        self.closing = False
        self._task_getter: Callable[[], object] | None = None

    @property
    def count(self) -> int:
        """How many mappings are live."""
        return self._marks.mappings

    # -- the book ----------------------------------------------------------------

    def holds(self, ident: int) -> bool:
        """Whether buffer `ident` has a live mapping (or a `gpu_access` reservation)."""
        return bool(self._tokens.get(ident))

    def check_conflicts(self, plan: GraphPlan) -> None:
        """`Busy` when `plan` writes mapped bytes or reads bytes mapped for writing."""
        if not self.count:
            return
        for intervals, writes in ((plan.writes, True), (plan.reads, False)):
            for interval in intervals:
                for token in self._tokens.get(interval.buffer.ident, ()):
                    if (
                        (writes or token.write)
                        and token.start < interval.end
                        and interval.start < token.end
                    ):
                        raise Busy(
                            token.conflict(interval.buffer.label, interval.start, interval.end)
                        )

    def add(self, token: MappingToken) -> None:
        """Book `token` as live; its owner records it with the tracker."""
        self._tokens.setdefault(token.view.buffer.ident, []).append(token)
        self._marks.mappings += 1

    def drop(self, token: MappingToken) -> bool:
        """Unbook `token`; False when it was not live (ended already, or closing dropped it).
        The tracker is left to the caller."""
        ident = token.view.buffer.ident
        tokens = self._tokens.get(ident)
        if tokens is None or token not in tokens:
            return False
        tokens.remove(token)
        if not tokens:
            del self._tokens[ident]
        self._marks.mappings -= 1
        return True

    # -- one mapping -------------------------------------------------------------

    def begin(self, view: View, write: bool, wait: bool) -> tuple[MappingToken, list[RegionRun]]:
        """Check and book a mapping of `view`; returns its token and the submitted work it
        must wait for first (none unless `wait`: pending work is `Busy` otherwise)."""
        scheduler = self._owner.scheduler_or_raise()
        if self.closing:
            raise RuntimeClosed("the runtime is closing; it maps no more memory")
        view = view_of(view, self._owner.domain, "a mapped view")
        buffer = view.buffer
        if not buffer.placement.host_mappable:
            raise Unsupported(
                f"{buffer.label} is {buffer.placement} memory, which cannot be host-mapped; "
                "copy it to HOST_VISIBLE memory"
            )
        token = MappingToken(view, write, self._current_task() if wait else None)
        whole = view.offset == 0 and view.nbytes == buffer.nbytes
        if buffer.poison is not None and not (write and whole):
            cause = scheduler.poison_book.overlaps(buffer, token.start, token.end)
            if cause is not None:
                raise PoisonedError(buffer.label, cause)
        for other in self._tokens.get(buffer.ident, ()):
            if (write or other.write) and other.start < token.end and token.start < other.end:
                raise Busy(f"{buffer.label} already has a conflicting host mapping")
        tracker = scheduler.tracker
        pending = [
            dep
            for dep in tracker.dependencies(buffer.ident, token.start, token.end, write)
            if isinstance(dep, RegionRun) and not dep.finished
        ]
        if pending and not wait:
            raise Busy(f"{view} has pending conflicting work; use the waiting map form")
        tracker.record(buffer.ident, token.start, token.end, write, token)
        self.add(token)
        return token, pending

    def forget(self, token: MappingToken) -> bool:
        """Drop a mapping's token; False when it had already ended or closing dropped it."""
        token.memory = None
        if not self.drop(token):
            return False
        scheduler = self._owner.scheduler
        if scheduler is not None:
            scheduler.tracker.forget(token)
        return True

    def end(self, token: MappingToken) -> None:
        """End a mapping: forget it, clear poison a whole write overwrote, wake closing."""
        if not self.forget(token):
            return  # ending it again, or after closing invalidated it, changes nothing
        buffer = token.view.buffer
        whole = token.view.offset == 0 and token.view.nbytes == buffer.nbytes
        scheduler = self._owner.scheduler
        if token.mapped and token.write and whole and scheduler is not None:
            # A whole write mapping that was handed out overwrote every byte; one that
            # never got its memory (cancelled or refused while waiting) clears nothing.
            scheduler.poison_book.clear(buffer)
        ended = self._ended
        if ended is not None and token.task is not None:
            # Only `async with` mappings end here on the loop thread; closing waits on them.
            self._ended = None
            ended.set()

    def _memory(self, view: View, write: bool) -> memoryview:
        backend = self._owner.backend_or_raise()
        # A fresh array per mapping: while a weak reference to it is alive, something
        # derived from the memoryview still reaches the storage (see free_storage).
        array = backend.host_array(view.buffer.storage, view.offset, view.nbytes).view()
        refs = self._exports.get(view.buffer.ident)
        if refs is None:
            refs = self._exports[view.buffer.ident] = []
        elif len(refs) >= 8:  # mostly dead references of mappings that ended
            refs[:] = [ref for ref in refs if ref() is not None]
        refs.append(weakref.ref(array))
        memory = array.data
        return memory if write else memory.toreadonly()

    @asynccontextmanager
    async def map(self, view: View, write: bool, wait: bool) -> AsyncIterator[memoryview]:
        """`View.map_read()` / `map_write()`: waits for conflicting work when `wait`."""
        token, pending = self.begin(view, write, wait)
        try:
            for dep in pending:
                await dep.wait_finished()
            if view.buffer.poison is not None and not write:
                cause = self._owner.scheduler_or_raise().poison_book.overlaps(
                    view.buffer, token.start, token.end
                )
                if cause is not None:
                    raise PoisonedError(view.buffer.label, cause)
            memory = token.memory = self._memory(view, write)
            token.mapped = True
            try:
                yield memory
            finally:
                memory.release()
        finally:
            self.end(token)

    def map_nowait(self, view: View, write: bool) -> HostMapping:
        """`View.map_read_nowait()` / `map_write_nowait()`: `Busy` on pending work."""
        token, _ = self.begin(view, write, wait=False)
        try:
            memory = token.memory = self._memory(token.view, write)
            token.mapped = True
        except BaseException:
            self.forget(token)  # nothing was mapped: no mapping to end
            raise
        return HostMapping(token.view, memory, write, lambda: self.end(token))

    # -- closing -----------------------------------------------------------------

    async def wait_for_other_tasks(self) -> bool:
        """False at once when no other task holds a mapping closing waits for; otherwise
        wait until one such mapping ends and return True. A `gpu_access` block ends
        without telling: then this only waits a moment before returning True."""
        held = self._held_elsewhere(self._current_task())
        if held is None:
            return False
        ended = self._ended = anyio.Event()
        if held:
            await ended.wait()
        else:
            with anyio.move_on_after(0.005):
                await ended.wait()
        return True

    def _held_elsewhere(self, me: object) -> bool | None:
        """None when no other task holds a mapping closing waits for; True when one does
        and will say when it ends; False when only a `gpu_access` block (which does not)
        is held."""
        found: bool | None = None
        for tokens in self._tokens.values():
            for token in tokens:
                if token.task is not None:
                    if token.task is not me:
                        return True
                elif type(token) is not MappingToken:
                    found = False
        return found

    def invalidate(self) -> None:
        """Release every memoryview live mappings handed out and forget the mappings, so
        ending them later changes nothing."""
        for tokens in self._tokens.values():
            for token in tokens:
                memory = token.memory
                if memory is not None:
                    # BufferError: something holds a raw buffer export of the memoryview;
                    # the storage under it then stays allocated (see free_storage).
                    with contextlib.suppress(BufferError):
                        memory.release()
        self._tokens.clear()
        self._marks.mappings = 0

    def _current_task(self) -> object:
        """The running task (asyncio or trio), found cheaply: `async with` mappings note
        theirs so that closing never waits on the closing task itself."""
        getter = self._task_getter
        if getter is None:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                import trio.lowlevel

                getter = trio.lowlevel.current_task
            else:
                getter = asyncio.current_task
            self._task_getter = getter
        return getter()

    # -- storage -------------------------------------------------------------------

    def exported(self, ident: int) -> list[Any]:
        """Forget buffer `ident`'s exports; returns the host arrays among them that
        something (a slice of a memoryview, a numpy array over it) still reaches."""
        refs = self._exports.pop(ident, ())
        return [array for array in (ref() for ref in refs) if array is not None]

    def free_storage(self, ident: int, storage: Any, free: Callable[[Any], None] | None) -> None:
        """Forget buffer `ident`'s exports and free its `storage` with `free` (None: the
        backend is gone, nothing to free): now, or once every host array still exported
        over it has been collected, so that nothing can write into freed storage."""
        exported = self.exported(ident)
        if free is not None:
            if exported:
                _DeferredFree(free, storage, exported)
            else:
                free(storage)


class _DeferredFree:
    """Frees native storage once every given host array over it has been collected."""

    __slots__ = ("_free", "_left", "_lock", "_storage")

    def __init__(self, free: Callable[[Any], None], storage: Any, arrays: list[Any]) -> None:
        self._free: Callable[[Any], None] | None = free
        self._storage = storage
        self._left = len(arrays)
        self._lock = threading.Lock()
        for array in arrays:
            weakref.finalize(array, self._gone)

    def _gone(self) -> None:
        # The last array may go on any thread; the lock makes exactly one call free.
        with self._lock:
            self._left -= 1
            free, storage = (self._free, self._storage) if self._left == 0 else (None, None)
            if free is not None:
                self._free = self._storage = None
        if free is not None:
            free(storage)


__all__ = ["HostMappings", "MappingOwner", "MappingToken"]
