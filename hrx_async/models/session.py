"""A model session: buffers, kernels and keyed graphs of one workload, then frozen.

    session = ModelSession(ctx)
    w = await session.weight(weights)              # immutable, uploaded once
    x, y = session.allocate(256), session.allocate_shared(256)
    k = session.load_kernel(KernelSource(cxx=..., host=...), "mlp", grid, block, contract)
    session.record("step", [Fill(y, 0), Dispatch(k, [w.read(), x.read(), y.write()])])
    await session.upload(x, data); session.replay("step")
    timings = await session.benchmark("step", 100)  # graph replay vs direct, seconds per run
    (out,) = await session.read_many([y])          # one wait for every region
    definition = await session.freeze(ctx)         # -> ModelDefinition (fragments, slots)

Why: building a model is a phase of its own: allocate, upload weights, load kernels, try
command lists and read results back. The session owns all of it. `record(key, commands)`
checks the commands (a non-empty list, a new key, no empty fill, regions and kernels of
this session) and prepares them as one graph; the graph orders them by byte range, so
commands touching disjoint bytes do not wait on each other and later replays are
ordered after earlier ones only where their bytes meet. Kernels are loaded through the
runtime's `load_gpu_kernel` from a `KernelSource`; the session compiles nothing itself.

`freeze(ctx)` drains the session, drops its graphs, keeps its weights (they belong to
the definition now: shared by every plan and slot made from it, counted once in
`weight_bytes()`) and frees every other buffer, keeping its size and placement only.
The session refuses everything afterwards, and also after any of its work failed on the
device: a session whose memory holds a failed result is not built on further.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._core.contract import KernelContract
from .._core.kernels import GpuKernel, KernelSource
from .._core.memory import GPU_LOCAL, HOST_VISIBLE, Placement, View
from .._runtime.completion import Completion
from .._runtime.prepared import PreparedGraph
from ..errors import ContractError
from ..runtime import Runtime
from . import _check
from .context import ModelContext
from .region import Arena, Command, Region, check_commands, record_commands, regions_of

if TYPE_CHECKING:
    from .fragment import ModelDefinition


def as_bytes(data: Any, what: str) -> memoryview:
    try:
        return memoryview(data).cast("B")
    except TypeError:
        raise ContractError(f"{what} must be bytes-like, got {_check.shown(data)}") from None


async def write_view(runtime: Runtime, view: View, raw: memoryview) -> None:
    """Write `raw` into `view`: in place when host-mappable, else through fresh staging."""
    if view.buffer.placement.host_mappable:
        async with view.map_write() as memory:
            memory[:] = raw
        return
    stage = runtime.allocate(view.nbytes, HOST_VISIBLE, "session-upload-staging")
    try:
        async with stage.map_write() as memory:
            memory[:] = raw
        graph = runtime.graph("session-upload")
        graph.copy(view, stage.view())
        await graph.prepare().submit()
    finally:
        stage.free()


@dataclass(frozen=True, slots=True)
class SessionTimings:
    """Mean seconds per run: `graph` (replays of the recorded graph), `direct` (the same
    commands each submitted alone), and per command (`profile_commands` only)."""

    runs: int
    graph: float
    direct: float
    commands: tuple[float, ...]


class ModelSession:
    """Buffers, kernels and keyed prepared graphs over one model context's runtime."""

    def __init__(self, context: ModelContext | Runtime, label: str = "session") -> None:
        if isinstance(context, Runtime):
            context = ModelContext(context)
        if not isinstance(context, ModelContext):
            raise ContractError(
                f"a ModelSession opens in a ModelContext or a Runtime, got {_check.shown(context)}"
            )
        if not isinstance(label, str):
            raise ContractError(f"a session label is text, got {_check.shown(label)}")
        self.context = context
        self.runtime = context.runtime
        self.label = label
        self._arena = Arena(self.runtime, label)
        self._graphs: dict[Hashable, PreparedGraph] = {}
        self._commands: dict[Hashable, tuple[Command, ...]] = {}
        self._pending: list[Completion] = []
        self._refused: str | None = None

    # -- state -----------------------------------------------------------------------

    def _usable(self) -> None:
        """Refuse everything once frozen or once any of the session's work failed."""
        if self._refused is None:
            still: list[Completion] = []
            for completion in self._pending:
                if not completion.done():
                    still.append(completion)
                elif completion.exception() is not None:
                    self._refused = f"its work failed ({completion.exception()})"
            self._pending = still
        if self._refused is not None:
            raise ContractError(f"session {self.label!r} refuses new work: {self._refused}")

    def _track(self, completion: Completion) -> Completion:
        self._pending.append(completion)
        return completion

    @property
    def keys(self) -> tuple[Hashable, ...]:
        """The keys recorded so far, in recording order."""
        return tuple(self._graphs)

    # -- storage ---------------------------------------------------------------------

    def allocate(self, nbytes: int, placement: Placement = GPU_LOCAL, label: str = "") -> Region:
        """Zeroed device memory (or `placement`'s) of `nbytes`, as a region of this session."""
        self._usable()
        buffer = self.runtime.allocate(nbytes, placement, label or f"{self.label}-buffer")
        return self._arena.add(buffer, weight=False)

    def allocate_shared(self, nbytes: int, label: str = "") -> Region:
        """Host-visible memory: written and read in place, no staging."""
        return self.allocate(nbytes, HOST_VISIBLE, label)

    async def weight(self, data: Any, label: str = "") -> Region:
        """Immutable device memory holding `data` (bytes-like, at least one byte): no fill,
        write or upload may touch it afterwards."""
        self._usable()
        raw = as_bytes(data, "weight data")
        if raw.nbytes == 0:
            raise ContractError("a weight holds at least one byte")
        buffer = self.runtime.allocate(raw.nbytes, GPU_LOCAL, label or f"{self.label}-weight")
        try:
            await write_view(self.runtime, buffer.view(), raw)
        except BaseException:
            buffer.free()
            raise
        return self._arena.add(buffer, weight=True)

    def load_kernel(
        self,
        source: KernelSource,
        name: str,
        grid: Iterable[int],
        block: Iterable[int],
        contract: KernelContract,
        defines: Mapping[str, str | int] | None = None,
    ) -> GpuKernel:
        """Load a kernel for this session through the runtime's `load_gpu_kernel`."""
        self._usable()
        kernel = self.runtime.load_gpu_kernel(source, name, grid, block, contract, defines)
        self._arena.kernels[id(kernel)] = kernel
        return kernel

    def _view(self, region: Region) -> View:
        buffer = region.record.buffer
        assert buffer is not None
        return buffer.view(region.offset, region.nbytes)

    # -- graphs ----------------------------------------------------------------------

    def record(self, key: Hashable, commands: Sequence[Command]) -> None:
        """Check `commands` and prepare them as the graph replayed under `key`."""
        self._usable()
        key = _check.key(key, "graph key")
        if key in self._graphs:
            raise ContractError(f"session {self.label!r} already has a graph {key!r}")
        items = check_commands(self._arena, commands, f"record({key!r})")
        for command in items:
            for region, writes in regions_of(command):
                if writes and region.weight:
                    raise ContractError(
                        f"record({key!r}) writes weight {region}: weights are immutable"
                    )
        graph = self.runtime.graph(f"{self.label}-{key}")
        record_commands(graph, items, self._view)
        self._graphs[key] = graph.prepare()
        self._commands[key] = items

    def replay(self, key: Hashable) -> Completion:
        """Submit the graph recorded under `key`; await the completion for its end."""
        self._usable()
        graph = self._graphs.get(key)
        if graph is None:
            raise ContractError(f"session {self.label!r} has no graph {key!r}; record it first")
        return self._track(graph.submit())

    def _recorded(self, key: Hashable) -> tuple[PreparedGraph, tuple[Command, ...]]:
        self._usable()
        graph = self._graphs.get(key)
        if graph is None:
            raise ContractError(f"session {self.label!r} has no graph {key!r}; record it first")
        return graph, self._commands[key]

    def _singles(self, commands: tuple[Command, ...]) -> list[PreparedGraph]:
        """Each command prepared alone: the direct way of running them."""
        singles = []
        for index, command in enumerate(commands):
            graph = self.runtime.graph(f"{self.label}-command-{index}")
            record_commands(graph, [command], self._view)
            singles.append(graph.prepare())
        return singles

    async def benchmark(self, key: Hashable, runs: int) -> SessionTimings:
        """Mean seconds per run of graph `key` (`runs` >= 10 replays, after one warm-up)
        and of its commands run directly (each its own submission, in order, one wait
        per run): what recording the commands as one graph saves."""
        graph, commands = self._recorded(key)
        runs = _check.integer(runs, "benchmark runs", 10)
        singles = self._singles(commands)
        await self._track(graph.submit())
        start = time.perf_counter()
        for _ in range(runs):
            await self._track(graph.submit())
        replay = (time.perf_counter() - start) / runs
        start = time.perf_counter()
        for _ in range(runs):
            last = [self._track(single.submit()) for single in singles][-1]
            await last
        direct = (time.perf_counter() - start) / runs
        return SessionTimings(runs, replay, direct, ())

    async def profile_commands(self, key: Hashable, runs: int = 10) -> SessionTimings:
        """Mean seconds of each command of graph `key` run alone (`runs` >= 1 each,
        waited for one by one), in command order, as `SessionTimings.commands`."""
        _, commands = self._recorded(key)
        runs = _check.integer(runs, "profile runs", 1)
        each = []
        for single in self._singles(commands):
            start = time.perf_counter()
            for _ in range(runs):
                await self._track(single.submit())
            each.append((time.perf_counter() - start) / runs)
        return SessionTimings(runs, sum(each), sum(each), tuple(each))

    async def upload(self, region: Region, data: Any) -> None:
        """Write `data` (exactly `region.nbytes` bytes) into a non-weight region."""
        self._usable()
        region = self._arena.check_region(region, "upload()")
        raw = as_bytes(data, "upload data")
        if region.weight:
            raise ContractError(f"upload() into weight {region}: weights are immutable")
        if raw.nbytes != region.nbytes or region.nbytes == 0:
            raise ContractError(f"{region} holds {region.nbytes} bytes; got {raw.nbytes}")
        await write_view(self.runtime, self._view(region), raw)

    async def read_many(self, regions: Sequence[Region]) -> list[bytes]:
        """The bytes of every region, after the work writing them, with one wait: device
        regions are copied into one staging buffer by one graph."""
        self._usable()
        if isinstance(regions, Region) or not isinstance(regions, Sequence):
            raise ContractError(f"read_many() takes a list of Regions, got {_check.shown(regions)}")
        items = [
            self._arena.check_region(r, f"read_many() region {i}") for i, r in enumerate(regions)
        ]
        device = [r for r in items if r.nbytes and not r.placement.host_mappable]
        total = sum(r.nbytes for r in device)
        stage = self.runtime.allocate(total, HOST_VISIBLE, "read-many") if total else None
        try:
            at: dict[int, int] = {}
            if stage is not None:
                graph = self.runtime.graph(f"{self.label}-read-many")
                offset = 0
                for index, region in enumerate(items):
                    if region.nbytes and not region.placement.host_mappable:
                        graph.copy(stage.view(offset, region.nbytes), self._view(region))
                        at[index] = offset
                        offset += region.nbytes
                await self._track(graph.prepare().submit())
                del graph
            out: list[bytes] = []
            for index, region in enumerate(items):
                if region.nbytes == 0:
                    out.append(b"")
                elif index in at:
                    assert stage is not None
                    async with stage.view(at[index], region.nbytes).map_read() as memory:
                        out.append(bytes(memory))
                else:
                    async with self._view(region).map_read() as memory:
                        out.append(bytes(memory))
            return out
        finally:
            if stage is not None:
                stage.free()

    # -- freezing --------------------------------------------------------------------

    async def freeze(self, context: ModelContext) -> ModelDefinition:
        """Drain, drop the graphs, hand the weights and kernels to a `ModelDefinition` in
        `context` (the session's device), keep the size and placement of everything else."""
        from .fragment import ModelDefinition

        self._usable()
        if not isinstance(context, ModelContext):
            raise ContractError(f"freeze() takes a ModelContext, got {_check.shown(context)}")
        if context.runtime is not self.runtime:
            raise ContractError(
                f"freeze(): the context's device ({context.runtime.domain.label}) is not the "
                f"session's ({self.runtime.domain.label})"
            )
        for completion in list(self._pending):
            await completion
        self._usable()
        self._refused = "it was frozen into a model definition"
        self._graphs.clear()
        self._commands.clear()
        for allocation in self._arena.allocations:
            if not allocation.weight and allocation.buffer is not None:
                allocation.buffer.free()
                allocation.buffer = None
        return ModelDefinition(context, self._arena)

    def __repr__(self) -> str:
        state = "" if self._refused is None else " refused"
        return f"<ModelSession {self.label!r} graphs={len(self._graphs)}{state}>"


__all__ = ["ModelSession", "SessionTimings"]
