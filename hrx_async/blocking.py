"""BlockingRuntime: the runtime for synchronous code and for other threads.

Scripts, notebooks, sync web endpoints and worker threads cannot `await`. A
`BlockingRuntime` runs a `Runtime` on an event loop in a background thread
(asyncio by default, or trio) and reaches it through anyio's blocking portal:

    with hrx.BlockingRuntime(backend="sim") as brt:
        host = brt.allocate(n * 4, hrx.HOST_VISIBLE)
        ...
        step = g.prepare()          # g = brt.graph(): prepared on the loop thread
        brt.write(host.view(), data)
        step.run()                  # submit, block until done, raise its error
        c = step.submit(); c.wait() # or keep the Completion and wait later
        out = brt.read(host.view())

Every method may be called from any thread. The blocking ones (`run`, a
completion's `wait`, `read`, `write`, the mappings, `drain`, `call_async`,
`close`) raise `ContractError` on the loop's own thread, where they would stall
the loop, and in the runtime's worker threads (host functions, sim kernels),
where they could wait for the very region that runs them; the rest run directly
on the loop thread. Graph recording is pure and runs in the calling thread;
preparing, submitting, mapping and counting hop to the loop thread. A mapping
that conflicts with one another thread holds through this facade waits for it
to end, as an `async with` mapping never sees another task's brief one.
`close()` (or leaving the `with` block) drains pending work and stops the
thread; runtimes still open at interpreter exit are closed the same way, and
afterwards every call raises `RuntimeClosed`.

Loop-side code (tasks started with `brt.portal.start_task_soon`) uses
`brt.runtime` directly, and its submissions interleave with the threads' in
admission order.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
from types import TracebackType
from typing import Any, Generic, TypeVar

import anyio
from anyio.from_thread import BlockingPortal

from ._core.contract import KernelContract
from ._core.graph import Graph, GraphPlan
from ._core.intervals import tracked_range
from ._core.kernels import GpuKernel, KernelSource, NpuKernel
from ._core.memory import GPU_LOCAL, Buffer, MemoryBudget, Placement, View
from ._core.stats import Statistics
from ._core.trace import ExecutionTrace
from ._runtime.completion import Completion
from ._runtime.native import NativeSession
from ._runtime.prepared import PreparedGraph
from .backends.worker import worker_origin
from .errors import Busy, ContractError, RuntimeClosed
from .runtime import GpuDevice, NpuDevice, Runtime

R = TypeVar("R")
T = TypeVar("T")

_ASYNC_BACKENDS = ("asyncio", "trio")


def _refuse_impossible_wait(completion: Completion) -> None:
    """A `BlockingRuntime` completion's `wait()` refuses where it could never return (on the
    loop that resolves it, or in a host function of its runtime)."""
    thread = _LoopThread.behind_current()
    if thread is not None and thread.scheduler is completion.owner:
        thread.blocking._refuse_blocking("wait()", "await the completion")


class BlockingPreparedGraph(PreparedGraph):
    """A prepared graph of a `BlockingRuntime`: `submit()` works from any thread."""

    __slots__ = ("blocking",)

    def __init__(self, blocking: BlockingRuntime, prepared: PreparedGraph) -> None:
        super().__init__(
            prepared.runtime, prepared.session, prepared.plan, prepared.programs, prepared.providers
        )
        self.blocking = blocking

    def submit(self, after: Iterable[Completion] = ()) -> Completion:
        """Admit one replay (in call order across all threads) and return its completion.

        Wait for it with `completion.wait(timeout)` from a thread, or `await` it on the loop.
        """
        return _blocking_completion(self.blocking.call(PreparedGraph.submit, self, tuple(after)))

    def submit_nowait(self, after: Iterable[Completion] = ()) -> Completion:
        completion = self.blocking.call(PreparedGraph.submit_nowait, self, tuple(after))
        return _blocking_completion(completion)

    def run(self, after: Iterable[Completion] = ()) -> None:
        """Submit, block this thread until the replay finishes, and raise its error if it failed."""
        self.blocking._refuse_blocking("run()", "await prepared.submit()")
        completion = self.submit(after)
        completion.wait()
        completion.result()


class _BlockingNpu:
    """An NPU of a `BlockingRuntime`; `load_artifact` runs on the loop thread."""

    def __init__(self, blocking: BlockingRuntime, device: NpuDevice) -> None:
        self._blocking = blocking
        self.device = device
        self.index = device.index
        self.target = device.target

    def load_artifact(
        self, source: KernelSource, name: str, columns: int, contract: KernelContract
    ) -> NpuKernel:
        return self._blocking.call(self.device.load_artifact, source, name, columns, contract)

    def __repr__(self) -> str:
        return f"<BlockingNpu {self.index} {self.target}>"


class BlockingNativeSession(Generic[T]):
    """A `NativeSession` whose `run` blocks the calling thread (`BlockingRuntime`)."""

    def __init__(self, blocking: BlockingRuntime, session: NativeSession[T]) -> None:
        self._blocking = blocking
        self.session = session

    @property
    def state(self) -> T:
        """The state stages run on; `DeviceLost` once the session is quarantined."""
        return self.session.state

    @property
    def quarantined(self) -> bool:
        """A fence failed: the session refuses every stage from now on."""
        return self.session.quarantined

    def run(self, stage: Callable[[T], R]) -> R:
        """`NativeSession.run`, waited for on this thread. From inside a stage of the same
        runtime (its worker thread), `Busy` at once: it would wait for itself."""
        if self.session.in_own_stage():
            raise Busy(
                f"recursive native session run on the runtime of {self.session.label!r}: a "
                "stage cannot wait for a stage of its own runtime"
            )
        result: R = self._blocking.call_async(self.session.run, stage)
        return result


class BlockingRuntime:
    """A `Runtime` on a background event loop, usable from synchronous code and any thread.

    `async_backend` picks the loop ("asyncio" or "trio"); every other argument is the
    `Runtime`'s. Opening happens in the constructor and raises what `Runtime` raises.
    """

    def __init__(
        self,
        backend: str = "auto",
        *,
        async_backend: str = "asyncio",
        **runtime_options: Any,
    ) -> None:
        if async_backend not in _ASYNC_BACKENDS:
            raise ContractError(
                f"async_backend must be one of {', '.join(_ASYNC_BACKENDS)}, got {async_backend!r}"
            )
        self.runtime = Runtime(backend, **runtime_options)
        self.async_backend = async_backend
        self._portal: BlockingPortal | None = None
        self._stop: anyio.Event | None = None
        self._error: BaseException | None = None
        # In-flight hops to the loop; close() lets them finish before the loop stops.
        self._state = threading.Condition()
        self._hops = 0
        self._closing = False
        self._closed = False
        self._mapped: list[_Held] = []
        """Mappings threads hold through this facade; conflicting ones wait (self._state)."""
        self._waiting: dict[threading.Thread, list[_Held]] = {}
        """Per waiting thread, the mappings it waits for: a wait that closes a cycle is Busy."""
        ready: Future[None] = Future()
        # Compared by identity: a later thread may reuse a dead one's ident, never its object.
        self._thread = _LoopThread(self, ready)
        self._thread.start()
        try:
            ready.result()
        except BaseException:
            self._thread.join()
            raise
        _open_runtimes.add(self)
        _register_atexit()

    # -- the loop thread -------------------------------------------------------------

    def _thread_main(self, ready: Future[None]) -> None:
        try:
            anyio.run(self._serve, ready, backend=self.async_backend)
        except BaseException as exc:
            error = _unwrap(exc)
            if ready.done():
                self._error = error
            else:
                ready.set_exception(error)

    async def _serve(self, ready: Future[None]) -> None:
        async with BlockingPortal() as portal, self.runtime:
            self._portal = portal
            self._stop = anyio.Event()
            self._thread.scheduler = self.runtime._scheduler
            ready.set_result(None)
            await self._stop.wait()

    # -- hopping to the loop ---------------------------------------------------------

    @property
    def portal(self) -> BlockingPortal:
        """The portal to the runtime's loop (start loop-side tasks with `start_task_soon`)."""
        if self._portal is None or self._closed:
            raise RuntimeClosed("this BlockingRuntime is closed")
        return self._portal

    @property
    def closed(self) -> bool:
        """True once `close()` ran (or the `with` block ended)."""
        return self._closed

    def on_loop_thread(self) -> bool:
        """Whether the calling thread is the runtime's loop thread (where blocking calls are
        refused)."""
        return threading.current_thread() is self._thread

    @contextmanager
    def _hop(self) -> Iterator[BlockingPortal]:
        with self._state:
            self._check_open()
            self._hops += 1
        try:
            assert self._portal is not None
            yield self._portal
        finally:
            with self._state:
                self._hops -= 1
                if not self._hops:
                    self._state.notify_all()

    def call(self, fn: Callable[..., R], *args: Any) -> R:
        """Run the synchronous `fn(*args)` on the loop thread and return its result."""
        if self.on_loop_thread():
            return fn(*args)
        with self._hop() as portal:
            # Boxed: the portal would await an awaitable result (a Completion) itself.
            boxed: tuple[R] = portal.call(_boxed, fn, args)
            return boxed[0]

    def call_async(self, fn: Callable[..., Awaitable[R]], *args: Any) -> R:
        """Run `await fn(*args)` on the loop thread, blocking this thread until it returns."""
        self._refuse_blocking("call_async()", "await the coroutine")
        with self._hop() as portal:
            return portal.call(fn, *args)

    def _refuse_blocking(self, what: str, instead: str) -> None:
        """Raise where blocking on this runtime could never end: on its loop, and in the
        worker threads its loop made, whose code runs while the loop waits for it."""
        if threading.current_thread() is self._thread:
            raise ContractError(f"{what} blocks, so it cannot run on the runtime's loop; {instead}")
        if worker_origin() is self._thread:
            raise ContractError(
                f"{what} blocks, so it cannot run in a host function or kernel of this "
                "runtime, where it could wait for the region running it; use the arrays "
                "the region is given"
            )

    def _check_open(self) -> None:
        if self._closing:
            raise RuntimeClosed("this BlockingRuntime is closed; create a new one")

    # -- the Runtime's API, from any thread --------------------------------------------

    @property
    def healthy(self) -> bool:
        """`Runtime.healthy`: False once a sticky device error made the runtime `DeviceLost`."""
        return self.runtime.healthy

    @property
    def backend_name(self) -> str:
        """`Runtime.backend_name`, read on the loop thread."""
        return self.call(lambda: self.runtime.backend_name)

    @property
    def memory_budget(self) -> MemoryBudget | None:
        """`Runtime.memory_budget`: the budget allocations are charged to, or None."""
        return self.runtime.memory_budget

    def gpu(self, number: int = 0) -> GpuDevice:
        """`Runtime.gpu(number)`, run on the loop thread; raises what it raises."""
        return self.call(self.runtime.gpu, number)

    def gpus(self) -> tuple[GpuDevice, ...]:
        """`Runtime.gpus()`: every GPU of this runtime, in device order."""
        return self.call(self.runtime.gpus)

    def native_session(
        self, state: T, fence: Callable[[T], Any], gpu: int = 0, label: str = "native-session"
    ) -> BlockingNativeSession[T]:
        """`Runtime.native_session`, whose `run(stage)` blocks this thread instead."""
        session = self.call(self.runtime.native_session, state, fence, gpu, label)
        return BlockingNativeSession(self, session)

    def owns(self, view: View | Buffer) -> bool:
        """`Runtime.owns(view)`: whether the view or buffer belongs to this runtime."""
        return self.runtime.owns(view)

    def adopt_gpu_buffer(
        self, obj: Any, placement: Placement = GPU_LOCAL, label: str = ""
    ) -> Buffer:
        """`Runtime.adopt_gpu_buffer` on the loop thread: a zero-copy buffer over another
        library's GPU array."""
        return self.call(self.runtime.adopt_gpu_buffer, obj, placement, label)

    def npu(self, index: int = 0) -> _BlockingNpu:
        """NPU `index`, whose `load_artifact` runs on the loop thread; raises what `Runtime.npu`
        raises."""
        return _BlockingNpu(self, self.call(self.runtime.npu, index))

    def allocate(self, nbytes: int, placement: Placement, label: str = "") -> Buffer:
        """`Runtime.allocate` on the loop thread: `nbytes` of zeroed memory at `placement`.

        Raises what it raises (`ContractError`, `BudgetExceeded`, `RuntimeClosed`)."""
        return self.call(self.runtime.allocate, nbytes, placement, label)

    def free(self, buffer: Buffer) -> None:
        """`buffer.free()` on the loop thread (`Busy` while work or a mapping uses it)."""
        self.call(buffer.free)

    def load_gpu_kernel(
        self,
        source: KernelSource,
        name: str,
        grid: Iterable[int],
        block: Iterable[int],
        contract: KernelContract,
        defines: Mapping[str, str | int] | None = None,
        shared_bytes: int = 0,
    ) -> GpuKernel:
        """`Runtime.load_gpu_kernel` on the loop thread: compiles or loads the kernel and checks
        it against `contract`; raises what it raises (`ContractError`, `CompileError`)."""
        return self.call(
            self.runtime.load_gpu_kernel,
            source,
            name,
            tuple(grid),
            tuple(block),
            contract,
            defines,
            shared_bytes,
        )

    def graph(self, label: str = "graph") -> Graph[PreparedGraph]:
        """A graph to record in this thread; its `prepare()` returns a `BlockingPreparedGraph`."""
        checked = self.call(self.runtime.graph, label)
        return Graph(checked.domain, label, self._prepare)

    def _prepare(self, plan: GraphPlan) -> PreparedGraph:
        return BlockingPreparedGraph(self, self.call(self.runtime._prepare, plan))

    def statistics(self) -> Statistics:
        """`Runtime.statistics()`: a frozen snapshot of the counters."""
        return self.call(self.runtime.statistics)

    def start_trace(self, capacity: int = 65536) -> None:
        """`Runtime.start_trace(capacity)`: record region events into a ring buffer of `capacity`.

        `ContractError` for a capacity below 1, `Busy` while a trace already runs."""
        self.call(self.runtime.start_trace, capacity)

    def finish_trace(self) -> ExecutionTrace | None:
        """`Runtime.finish_trace()`: the `ExecutionTrace` recorded since `start_trace`, or None
        when none runs."""
        return self.call(self.runtime.finish_trace)

    def drain(self) -> None:
        """Block until every submission made so far has finished."""
        self.call_async(self.runtime.drain)

    # -- host memory -------------------------------------------------------------------

    def map_read(self, view: View | Buffer) -> AbstractContextManager[memoryview]:
        """`with brt.map_read(view) as mem:` waits for conflicting work (and for conflicting
        mappings other threads hold through this facade), then maps read-only."""
        return self._map(view, write=False)

    def map_write(self, view: View | Buffer) -> AbstractContextManager[memoryview]:
        """`with brt.map_write(view) as mem:` waits like `map_read`, then maps writable."""
        return self._map(view, write=True)

    @contextmanager
    def _map(self, view: View | Buffer, write: bool) -> Iterator[memoryview]:
        self._refuse_blocking("map_read()/map_write()", "use `async with view.map_read()`")
        self._check_open()  # before the view: closing freed its buffer
        target = view.view() if isinstance(view, Buffer) else view
        if not isinstance(target, View):
            raise ContractError(f"map_read()/map_write() take a View or Buffer, got {view!r}")
        held = _Held(target, write)
        self._reserve(held)
        try:
            # The hop lasts as long as the mapping, so close() waits for its release.
            with (
                self._hop() as portal,
                portal.wrap_async_context_manager(_mapping(target, write)) as memory,
            ):
                yield memory
        finally:
            with self._state:
                self._mapped.remove(held)
                self._state.notify_all()

    def _reserve(self, held: _Held) -> None:
        """Book `held`, first waiting for conflicting mappings of other threads to end.

        A thread's mapping spans several hops, so other threads see it while an `async
        with` mapping without awaits is never seen by another task; waiting keeps the
        facade as free of `Busy` as its async counterpart. A conflict with the caller's
        own mapping, or a wait that would close a cycle of waiting threads, is `Busy`.
        """
        with self._state:
            while True:
                self._check_open()
                blockers = [other for other in self._mapped if held.conflicts(other)]
                if not blockers:
                    break
                if self._waits_on(blockers, held.thread):
                    raise Busy(
                        f"{held.label} conflicts with a mapping held by a thread that "
                        "waits for one of this thread's"
                    )
                self._waiting[held.thread] = blockers
                try:
                    self._state.wait()
                finally:
                    del self._waiting[held.thread]
            self._mapped.append(held)

    def _waits_on(self, blockers: list[_Held], thread: threading.Thread) -> bool:
        """Whether a holder of `blockers` waits, directly or not, for a mapping of `thread`."""
        seen: set[threading.Thread] = set()
        pending = [other.thread for other in blockers]
        while pending:
            holder = pending.pop()
            if holder is thread:
                return True
            if holder not in seen:
                seen.add(holder)
                pending.extend(other.thread for other in self._waiting.get(holder, ()))
        return False

    def read(self, view: View | Buffer) -> bytes:
        """A copy of the bytes of `view`, after conflicting work has finished."""
        with self.map_read(view) as memory:
            return bytes(memory)

    def write(self, view: View | Buffer, data: bytes | bytearray | memoryview) -> None:
        """Overwrite `view` with `data` (exactly its length), after conflicting work."""
        self._refuse_blocking("write()", "use `async with view.map_write()`")
        self._check_open()  # before the view: closing freed its buffer
        source = memoryview(data).cast("B")
        target = view.view() if isinstance(view, Buffer) else view
        if not isinstance(target, View) or source.nbytes != target.nbytes:
            raise ContractError(
                f"write() needs {getattr(target, 'nbytes', '?')} bytes for {view!r}, "
                f"got {source.nbytes}"
            )
        with self.map_write(target) as memory:
            memory[:] = source

    # -- lifetime ----------------------------------------------------------------------

    def close(self) -> None:
        """Drain pending work, close the runtime and stop the loop thread. Idempotent.

        Waits for other threads' calls in progress and for live host mappings to be
        released. Raises what closing the runtime raised, if anything.
        """
        self._refuse_blocking("close()", "close it from another thread")
        with self._state:
            if self._closing:
                already = True
            else:
                already = False
                self._closing = True
                while self._hops:
                    self._state.wait()
        if not already and self._thread.is_alive():
            assert self._portal is not None and self._stop is not None
            # RuntimeError: the loop already ended on its own.
            with contextlib.suppress(RuntimeError):
                self._portal.call(self._stop.set)
        self._thread.join()
        self._closed = True
        _open_runtimes.discard(self)
        error, self._error = self._error, None
        if error is not None:
            raise error

    def __enter__(self) -> BlockingRuntime:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<BlockingRuntime {self.async_backend} {state}>"


class _LoopThread(threading.Thread):
    """The thread a `BlockingRuntime`'s loop runs on."""

    def __init__(self, blocking: BlockingRuntime, ready: Future[None]) -> None:
        super().__init__(name="hrx-blocking-loop", daemon=True)
        self.blocking = blocking
        self.ready = ready
        self.scheduler: object = None
        """The runtime's scheduler, which owns the completions this loop resolves."""

    def run(self) -> None:
        self.blocking._thread_main(self.ready)

    @staticmethod
    def behind_current() -> _LoopThread | None:
        """The loop thread the calling thread is, or made the worker the calling thread is."""
        thread: object = threading.current_thread()
        if not isinstance(thread, _LoopThread):
            thread = worker_origin()
        return thread if isinstance(thread, _LoopThread) else None


class _Held:
    """A mapping a thread holds (or is about to) through the facade."""

    __slots__ = ("end", "ident", "label", "start", "thread", "write")

    def __init__(self, view: View, write: bool) -> None:
        self.thread = threading.current_thread()
        self.ident = view.buffer.ident
        self.label = view.buffer.label
        self.start, self.end = tracked_range(view)
        self.write = write

    def conflicts(self, other: _Held) -> bool:
        """Another thread's mapping of overlapping bytes, one of the two writing."""
        return (
            other.thread is not self.thread
            and other.ident == self.ident
            and (self.write or other.write)
            and other.start < self.end
            and self.start < other.end
        )


def _blocking_completion(completion: Completion) -> Completion:
    # The scheduler makes plain completions; the facade only adds a check to `wait()`.
    completion.wait_check = _refuse_impossible_wait
    return completion


@asynccontextmanager
async def _mapping(view: View, write: bool) -> AsyncIterator[memoryview]:
    mapping = view.map_write() if write else view.map_read()
    async with mapping as memory:
        yield memory


def _boxed(fn: Callable[..., R], args: tuple[Any, ...]) -> tuple[R]:
    return (fn(*args),)


def _unwrap(error: BaseException) -> BaseException:
    """A task group's wrapping of a single error is noise for the caller; give the error."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


_open_runtimes: set[BlockingRuntime] = set()
_atexit_registered = False
_atexit_lock = threading.Lock()


def _register_atexit() -> None:
    global _atexit_registered
    with _atexit_lock:
        if not _atexit_registered:
            atexit.register(_close_open_runtimes)
            _atexit_registered = True


def _close_open_runtimes() -> None:
    """At interpreter exit: drain and close what the program left open (daemon threads are
    still running when atexit handlers run)."""
    for blocking in list(_open_runtimes):
        try:
            blocking.close()
        except Exception as exc:  # exit must go on; say what was lost
            print(f"hrx_async: closing {blocking!r} at exit failed: {exc!r}")


__all__ = ["BlockingPreparedGraph", "BlockingRuntime"]
