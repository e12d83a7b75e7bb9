"""A pool of slots for request handlers: N prepared pipelines, each with its own buffers.

A service cannot prepare a graph per request (preparation allocates and builds
native programs), and it cannot share one set of buffers between concurrent
requests. A `SlotPool` keeps `size` independent copies ("slots") of whatever a
`build(runtime, index)` function returns (typically host staging buffers,
device buffers and a prepared graph over them), builds each one the first time
it is handed out, and reuses it from then on:

    pool = SlotPool(rt, 8, build_pipeline)
    async with pool.acquire() as slot:
        ...write slot.resources' staging...
        await slot.submit(slot.resources.step)
        ...read the results...

Guarantees:

* A slot is held by at most one holder at a time.
* A slot is never handed out while a submission made through it is still
  running: cancelling a holder that awaits its submission stops only the wait
  (device work is never cancelled), and the next holder receives the slot once
  that work has finished.
* Cancellation never leaks a slot: a waiter cancelled before, during or right
  after the hand-over passes the slot on; a holder cancelled at any point
  returns it.
* Waiters are served first come, first served; `acquire_nowait()` never jumps
  the queue and raises `Busy` instead of waiting.

A `Batcher` in front of a pool gathers requests that arrive while every slot is
busy into one submission, so the per-submission cost is paid once per batch
under load and a lone request still goes straight through.
"""

from __future__ import annotations

import collections
from collections.abc import Awaitable, Callable, Iterable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Generic, TypeVar

import anyio
import anyio.lowlevel

from .._runtime.completion import Completion
from ..errors import Busy, ContractError, RuntimeClosed

if TYPE_CHECKING:
    from .._runtime.prepared import PreparedGraph
    from ..runtime import Runtime

T = TypeVar("T")
In = TypeVar("In")
Out = TypeVar("Out")


class _SlotState(Generic[T]):
    """What one slot owns across holders: its resources and its unfinished submissions."""

    __slots__ = ("built", "index", "pending", "resources")

    def __init__(self, index: int) -> None:
        self.index = index
        self.built = False
        self.resources: T | None = None
        self.pending: list[Completion] = []

    @property
    def idle(self) -> bool:
        """No submission made through this slot is still running."""
        pending = self.pending
        if pending:
            pending[:] = [c for c in pending if not c.done()]
        return not pending

    async def wait_idle(self) -> None:
        while not self.idle:
            await self.pending[0].wait_done()


class _Waiter(Generic[T]):
    __slots__ = ("event", "state")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.state: _SlotState[T] | None = None


class Slot(Generic[T]):
    """A held slot: valid from `acquire()` until it is released.

    `resources` is what the pool's `build` returned for this slot. Submit its
    work with `slot.submit(...)` so the pool knows when the slot is idle again.
    """

    __slots__ = ("_pool", "_state")

    def __init__(self, pool: SlotPool[T], state: _SlotState[T]) -> None:
        self._pool = pool
        self._state: _SlotState[T] | None = state

    def _held(self) -> _SlotState[T]:
        state = self._state
        if state is None:
            raise RuntimeClosed("this slot was released; acquire a slot from the pool again")
        return state

    @property
    def index(self) -> int:
        """Which slot of the pool this is (0 to size - 1). `RuntimeClosed` once released."""
        return self._held().index

    @property
    def resources(self) -> T:
        """What the pool's `build(runtime, index)` returned for this slot. `RuntimeClosed` once
        released."""
        state = self._held()
        assert state.built
        return state.resources  # type: ignore[return-value]

    @property
    def released(self) -> bool:
        """True once the slot went back to the pool (the `async with` block ended)."""
        return self._state is None

    def submit(self, prepared: PreparedGraph, after: Iterable[Completion] = ()) -> Completion:
        """Submit `prepared` (as `prepared.submit(after)`), recorded as this slot's work."""
        state = self._held()
        completion = prepared.submit(after)
        state.pending.append(completion)
        return completion

    def submit_nowait(
        self, prepared: PreparedGraph, after: Iterable[Completion] = ()
    ) -> Completion:
        """Like `submit`, but `Busy` instead of queueing beyond the runtime's max_submissions."""
        state = self._held()
        completion = prepared.submit_nowait(after)
        state.pending.append(completion)
        return completion

    def release(self) -> None:
        """Give the slot back (idempotent). Unfinished submissions keep it from the next holder
        until they finish."""
        state, self._state = self._state, None
        if state is not None:
            self._pool._put(state)

    def __enter__(self) -> Slot[T]:
        self._held()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        state = self._state
        where = "released" if state is None else f"#{state.index}"
        return f"<Slot {self._pool.label} {where}>"


class _Acquire(Generic[T]):
    """`async with pool.acquire() as slot:`: waits for a slot, releases it on exit."""

    __slots__ = ("_pool", "_slot")

    def __init__(self, pool: SlotPool[T]) -> None:
        self._pool = pool
        self._slot: Slot[T] | None = None

    async def __aenter__(self) -> Slot[T]:
        if self._slot is not None:
            raise ContractError("this acquire() is already entered; call pool.acquire() again")
        self._slot = await self._pool._acquire()
        return self._slot

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        slot, self._slot = self._slot, None
        if slot is not None:
            slot.release()


class SlotPool(Generic[T]):
    """`size` slots over one runtime; `build(runtime, index)` makes a slot's resources on its
    first use. All methods are for the runtime's event loop thread."""

    def __init__(
        self,
        runtime: Runtime,
        size: int,
        build: Callable[[Runtime, int], T],
        label: str = "slots",
    ) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ContractError(f"a slot pool needs size >= 1 (an integer), got {size!r}")
        if not callable(build):
            raise ContractError(
                f"build must be a callable (runtime, index) -> resources, got {build!r}"
            )
        self.runtime = runtime
        self.size = size
        self.label = label
        self._build = build
        self._states = [_SlotState[T](index) for index in range(size)]
        self._free: collections.deque[_SlotState[T]] = collections.deque(self._states)
        self._waiters: collections.deque[_Waiter[T]] = collections.deque()

    # -- introspection ---------------------------------------------------------------

    @property
    def available(self) -> int:
        """Slots not held by anyone (some may still be finishing their last submission)."""
        return len(self._free)

    @property
    def waiting(self) -> int:
        """Tasks waiting in `acquire()` for a slot."""
        return len(self._waiters)

    @property
    def built(self) -> int:
        """Slots whose resources have been built so far."""
        return sum(state.built for state in self._states)

    @property
    def idle(self) -> bool:
        """Every slot is free and none has a running submission."""
        return len(self._free) == self.size and all(state.idle for state in self._states)

    # -- acquiring -------------------------------------------------------------------

    def acquire(self) -> _Acquire[T]:
        """`async with pool.acquire() as slot:` waits (first come, first served) for a free slot
        whose earlier work has finished, and releases it when the block exits."""
        return _Acquire(self)

    def acquire_nowait(self) -> Slot[T]:
        """A free idle slot now (use `with` or `release()`), or `Busy`; never waits."""
        if self._waiters:
            raise Busy(f"{len(self._waiters)} tasks are waiting for a slot of {self.label!r}")
        for position, state in enumerate(self._free):
            if state.idle:
                del self._free[position]
                try:
                    self._ensure_built(state)
                except BaseException:
                    self._free.insert(position, state)
                    raise
                return Slot(self, state)
        busy = self.size - len(self._free)
        raise Busy(
            f"no idle slot in {self.label!r}: {busy} of {self.size} held, "
            f"{len(self._free)} finishing earlier work; use `async with pool.acquire()` to wait"
        )

    async def _acquire(self) -> Slot[T]:
        state = self._take_free() if not self._waiters else None
        if state is None:
            waiter: _Waiter[T] = _Waiter()
            self._waiters.append(waiter)
            try:
                await waiter.event.wait()
            except BaseException:
                # Cancelled: either still queued, or the slot was handed over in the same
                # tick; in that case pass it on so it is not lost.
                if waiter.state is None:
                    self._waiters.remove(waiter)
                else:
                    self._put(waiter.state)
                raise
            state = waiter.state
            assert state is not None
        else:
            await _checkpoint_or_return(self, state)
        try:
            if not state.idle:
                await state.wait_idle()
            self._ensure_built(state)
        except BaseException:
            self._put(state)
            raise
        return Slot(self, state)

    def _take_free(self) -> _SlotState[T] | None:
        """An idle free slot if there is one, else a free one still finishing, else None."""
        free = self._free
        for position, state in enumerate(free):
            if state.idle:
                del free[position]
                return state
        return free.popleft() if free else None

    def _ensure_built(self, state: _SlotState[T]) -> None:
        if not state.built:
            state.resources = self._build(self.runtime, state.index)
            state.built = True

    def _put(self, state: _SlotState[T]) -> None:
        """Return a slot: straight to the longest waiter, else to the free list."""
        waiters = self._waiters
        if waiters:
            waiter = waiters.popleft()
            waiter.state = state
            waiter.event.set()
            return
        # Idle slots go to the front so the next taker finds one without waiting.
        if state.idle:
            self._free.appendleft(state)
        else:
            self._free.append(state)

    def __repr__(self) -> str:
        return (
            f"<SlotPool {self.label!r} size={self.size} free={len(self._free)} "
            f"waiting={len(self._waiters)}>"
        )


class _Batch(Generic[In, Out]):
    __slots__ = ("done", "error", "items", "results")

    def __init__(self) -> None:
        self.items: list[In] = []
        self.done = anyio.Event()
        self.results: Sequence[Out] = ()
        self.error: BaseException | None = None


class Batcher(Generic[T, In, Out]):
    """Gathers concurrent requests into batches that run on one slot of `pool`.

    `await batcher.submit(item)` joins the open batch, or opens one. The task that
    opened it (the leader) waits for a slot, closes the batch (at most `capacity`
    items; later arrivals open the next one) and calls `run(slot, items)`, which
    must return one result per item, in order. Every member gets its result, or the
    exception `run` raised. With a slot free at once, a request runs alone.

    The leader's wait for a slot and its run are shielded from cancellation: other
    requests depend on them. A member cancelled while waiting only stops waiting; its
    item is still computed. For the event loop thread only.
    """

    def __init__(
        self,
        pool: SlotPool[T],
        capacity: int,
        run: Callable[[Slot[T], list[In]], Awaitable[Sequence[Out]]],
    ) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ContractError(f"a batch capacity must be an integer >= 1, got {capacity!r}")
        if not callable(run):
            raise ContractError(f"run must be an async callable (slot, items), got {run!r}")
        self.pool = pool
        self.capacity = capacity
        self._run = run
        self._open: _Batch[In, Out] | None = None
        self.batches = 0
        """Batches run so far."""
        self.items = 0
        """Items run so far (items / batches is the mean batch size)."""

    async def submit(self, item: In) -> Out:
        """Run `item` in the next batch and return its result (`run`'s result at its index).

        A lone request runs at once; requests arriving while it waits for a slot join it, up to
        `capacity`. A failing `run`, or one returning the wrong number of results (`ContractError`),
        raises in every request of the batch. Cancelling one request does not cancel the batch."""
        batch = self._open
        leader = batch is None
        if batch is None:
            batch = self._open = _Batch()
        index = len(batch.items)
        batch.items.append(item)
        if len(batch.items) >= self.capacity:
            self._open = None
        if not leader:
            await batch.done.wait()
        else:
            with anyio.CancelScope(shield=True):
                await self._lead(batch)
        if batch.error is not None:
            raise batch.error
        return batch.results[index]

    async def _lead(self, batch: _Batch[In, Out]) -> None:
        try:
            async with self.pool.acquire() as slot:
                if self._open is batch:
                    self._open = None  # closed: later arrivals start the next batch
                items = batch.items
                results = await self._run(slot, items)
                if len(results) != len(items):
                    raise ContractError(
                        f"a batch run returned {len(results)} results for {len(items)} items"
                    )
                batch.results = results
                self.batches += 1
                self.items += len(items)
        except BaseException as exc:
            batch.error = exc
            raise
        finally:
            if self._open is batch:
                self._open = None
            batch.done.set()


async def _checkpoint_or_return(pool: SlotPool[T], state: _SlotState[T]) -> None:
    """Make `acquire()` a cancel point even when a slot is free, without losing the slot."""
    try:
        await anyio.lowlevel.checkpoint()
    except BaseException:
        pool._put(state)
        raise


__all__ = ["Batcher", "Slot", "SlotPool"]
