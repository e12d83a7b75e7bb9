"""Model definitions and fragments: a frozen session's commands as slots or as part of a
larger graph.

    definition = await session.freeze(ctx)
    frag = definition.fragment(cmds, inputs=[(x, desc_in)], outputs=[(y, desc_out)])
    model = frag.prepare(4)                        # a PreparedModel with 4 slots
    g = ctx.runtime.graph("pipeline")
    (h,) = pre.record(g, [image])                  # fragments appended to the caller's graph
    (logits,) = frag.reuse_private_scratch().record(g, [h])

Why: a service composes models. A `ModelFragment` is a definition's commands with
declared inputs and outputs, each a `(Region, TensorDesc)`; it is checked once when made
(no empty IO, no IO larger than its region, no IO on weights, no fill or write of a
weight, only this definition's regions and kernels). Each allocation the fragment uses
that is not a weight is scratch, needed up to its *extent*: the largest end of the
regions and IO that use it.

`prepare(n)` gives every slot its own scratch, each allocation at exactly its extent and
placement; the slot's inputs and outputs are slices of that scratch, so IO may overlap
or be in place and nothing is copied behind the caller's back. Weights are the
definition's buffers, bound by every slot and plan and counted once (`weight_bytes()`).

`record(graph, inputs)` appends the commands to the caller's graph and returns the
outputs as device tensors. An input binds its allocation where the given tensor lies,
with no copy: the allocation's base is the tensor's offset minus the input region's.
Refused, with nothing appended (every view is made, and the commands recorded into a
probe graph, before the caller's graph is touched): a graph of another runtime, a wrong
input count or description, inputs of one allocation at different bases, an input
overlapping another input's allocation or a weight ("undeclared alias"), and a region
of a bound allocation outside the bytes the inputs give. Inputs' producers need no wait
here: each is this runtime's submitted work, and the runtime orders the graph's later
submission after earlier writers of the same bytes. An input's lease is held by the
graph (its views keep it) and by the outputs on its allocation.

Other allocations get new memory at their extent, except private scratch (no IO at all)
of a fragment made with `reuse_private_scratch()`: that comes from a pool per graph, the
smallest free entry of the same placement that is big enough (`ScratchPlanner`), free
once the fragment that last used it is recorded. A reused entry holds the earlier
fragment's bytes, so such a fragment must write every scratch byte before reading it;
the graph's byte-range ordering runs the earlier fragment's accesses first. IO and
weights are never pooled, and slots, having a graph each, never share.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .._core.graph import Graph
from .._core.memory import Buffer, Placement, View
from ..errors import ContractError
from . import _check
from .context import ModelContext, SlotIO
from .device import DeviceTensor, LeasedView
from .inference import PreparedModel
from .region import Arena, Command, Fill, Region, check_commands, record_commands, regions_of
from .scratch import ScratchPlanner
from .tensor import Tensor, TensorDesc

IO = tuple[tuple[Region, TensorDesc], ...]


class _ViewFor(Protocol):
    def __call__(self, region: Region, nbytes: int | None = None) -> View: ...


class ModelDefinition:
    """A frozen session: its weights (adopted, shared), kernels and allocation sizes."""

    def __init__(self, context: ModelContext, arena: Arena) -> None:
        self.context = context
        self._arena = arena
        self.label = arena.label

    def weight_bytes(self) -> int:
        """Bytes of weights, counted once however many plans and slots bind them."""
        return sum(a.nbytes for a in self._arena.allocations if a.weight)

    def fragment(
        self,
        commands: Sequence[Command],
        inputs: Sequence[tuple[Region, TensorDesc]],
        outputs: Sequence[tuple[Region, TensorDesc]],
    ) -> ModelFragment:
        """`commands` with declared IO, checked (see the module docstring)."""
        arena = self._arena
        items = check_commands(arena, commands, "fragment()")
        for command in items:
            for region, writes in regions_of(command):
                if writes and region.weight:
                    kind = "fill" if isinstance(command, Fill) else "write"
                    raise ContractError(f"fragment(): a {kind} of weight {region}")
        ins = _io(arena, inputs, "input")
        outs = _io(arena, outputs, "output")
        extents: dict[int, int] = {}
        used = [r for c in items for r, _ in regions_of(c)] + [r for r, _ in ins + outs]
        for region in used:
            if not region.weight and region.end:
                extents[region.allocation] = max(extents.get(region.allocation, 0), region.end)
        return ModelFragment(self, items, ins, outs, extents)

    def prepare(
        self,
        commands: Sequence[Command],
        inputs: Sequence[tuple[Region, TensorDesc]],
        outputs: Sequence[tuple[Region, TensorDesc]],
        slots: int,
        label: str = "fragment",
    ) -> PreparedModel:
        """`fragment(commands, inputs, outputs).prepare(slots)`."""
        return self.fragment(commands, inputs, outputs).prepare(slots, label)

    def weight_view(self, region: Region) -> View:
        """The view of the weight `region` in this definition's weight buffer (a region the
        definition was given weights for)."""
        buffer = region.record.buffer
        assert buffer is not None and region.weight
        return buffer.view(region.offset, region.nbytes)

    def __repr__(self) -> str:
        return f"<ModelDefinition {self.label!r} weights={self.weight_bytes()} B>"


def _io(arena: Arena, pairs: object, kind: str) -> IO:
    if isinstance(pairs, str | bytes) or not isinstance(pairs, Sequence):
        raise ContractError(f"fragment {kind}s are a list of (Region, TensorDesc)")
    out: list[tuple[Region, TensorDesc]] = []
    for index, pair in enumerate(pairs):
        what = f"fragment {kind} {index}"
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[1], TensorDesc)):
            raise ContractError(f"{what} must be (Region, TensorDesc), got {_check.shown(pair)}")
        region = arena.check_region(pair[0], what)
        desc = pair[1]
        if region.weight:
            raise ContractError(f"{what} is on weight {region}: weights are not model IO")
        if desc.empty:
            raise ContractError(f"{what} has an empty description {desc}")
        if desc.nbytes > region.nbytes:
            raise ContractError(
                f"{what}: {desc} needs {desc.nbytes} bytes, its region {region} has {region.nbytes}"
            )
        if region.offset % desc.dtype.itemsize:
            raise ContractError(
                f"{what}: {region} starts at byte {region.offset}, not aligned to "
                f"{desc.dtype.value}"
            )
        out.append((region, desc))
    return tuple(out)


@dataclass(eq=False)
class _Pool:
    """One graph's private scratch: the requests made so far (a request per allocation
    per recorded fragment, live for that fragment's step) and the buffers planned."""

    requests: list[tuple[int, int, Placement]] = field(default_factory=list)
    buffers: list[Buffer] = field(default_factory=list)
    steps: int = 0


_POOLS: weakref.WeakKeyDictionary[Graph[Any], _Pool] = weakref.WeakKeyDictionary()


@dataclass(eq=False)
class _Bound:
    buffer: Buffer
    base: int
    spans: list[tuple[int, int]]
    leases: list[object]

    @property
    def lease(self) -> object:
        held = [lease for lease in self.leases if lease is not None]
        return None if not held else held[0] if len(held) == 1 else tuple(held)


@dataclass(frozen=True, eq=False)
class ModelFragment:
    """A definition's commands with their IO and per-allocation extents."""

    definition: ModelDefinition
    commands: tuple[Command, ...]
    inputs: IO
    outputs: IO
    extents: dict[int, int]
    reuse: bool = False

    def reuse_private_scratch(self) -> ModelFragment:
        """This fragment, taking private scratch from each graph's pool when recorded."""
        return ModelFragment(
            self.definition, self.commands, self.inputs, self.outputs, self.extents, True
        )

    @property
    def scratch(self) -> tuple[int, ...]:
        """The non-weight allocations used (extent > 0), in allocation order."""
        return tuple(sorted(self.extents))

    @property
    def private(self) -> tuple[int, ...]:
        """Scratch allocations no input or output is on."""
        io = {region.allocation for region, _ in self.inputs + self.outputs}
        return tuple(a for a in self.scratch if a not in io)

    def _placement(self, allocation: int) -> Placement:
        return self.definition._arena.allocations[allocation].placement

    def _views(self, buffers: dict[int, Buffer], bound: dict[int, _Bound]) -> _ViewFor:
        definition = self.definition

        def view_for(region: Region, nbytes: int | None = None) -> View:
            n = region.nbytes if nbytes is None else nbytes
            if region.weight:
                return definition.weight_view(region)
            held = bound.get(region.allocation)
            if held is None:
                return buffers[region.allocation].view(region.offset, n)
            view = held.buffer.view(held.base + region.offset, n)
            lease = held.lease
            return view if lease is None else LeasedView.of(view, lease)

        return view_for

    # -- slots -----------------------------------------------------------------------

    def prepare(self, slots: int, label: str = "fragment") -> PreparedModel:
        """A `PreparedModel` of `slots` slots, built now: each slot's scratch at exactly
        its extents, its IO tensors slices of that scratch."""
        fragment = self

        def build(ctx: ModelContext, index: int) -> SlotIO:
            buffers = {
                a: ctx.allocate(extent, fragment._placement(a), f"{label}{index}-scratch{a}")
                for a, extent in fragment.extents.items()
            }
            view_for = fragment._views(buffers, {})
            graph = ctx.runtime.graph(f"{label}-{index}")
            record_commands(graph, fragment.commands, view_for)
            ins, outs = (
                {
                    f"{kind}{i}": Tensor(desc, view_for(region, desc.nbytes))
                    for i, (region, desc) in enumerate(pairs)
                }
                for kind, pairs in (("input", fragment.inputs), ("output", fragment.outputs))
            )
            return SlotIO(ins, outs, graph.prepare())

        return PreparedModel(self.definition.context, slots, build, label, eager=True)

    # -- composition -----------------------------------------------------------------

    def record(self, graph: Graph[Any], inputs: Sequence[DeviceTensor]) -> list[DeviceTensor]:
        """Append the commands to `graph`, binding `inputs` in place; the outputs."""
        ctx = self.definition.context
        if not isinstance(graph, Graph):
            raise ContractError(f"record() takes a Graph, got {_check.shown(graph)}")
        if graph.domain is not ctx.runtime.domain:
            raise ContractError(
                f"record(): graph {graph.label!r} belongs to another runtime, not this "
                f"definition's ({ctx.runtime.domain.label})"
            )
        if isinstance(inputs, DeviceTensor) or not isinstance(inputs, Sequence):
            raise ContractError(
                f"record() takes a list of DeviceTensors, got {_check.shown(inputs)}"
            )
        if len(inputs) != len(self.inputs):
            raise ContractError(
                f"fragment of {self.definition.label!r} takes {len(self.inputs)} inputs, "
                f"got {len(inputs)}"
            )
        tensors = [ctx.validate_device(t, f"fragment input {i}") for i, t in enumerate(inputs)]
        bound = self._bind(tensors)
        self._check_bound(bound)
        pool = _POOLS.get(graph) if self.reuse else None
        buffers, planned = self._allocate(ctx, bound, pool)
        view_for = self._views(buffers, bound)
        probe: Graph[Any] = Graph(graph.domain, graph.label)
        record_commands(probe, self.commands, view_for)
        outputs = []
        for region, desc in self.outputs:
            held = bound.get(region.allocation)
            view = view_for(region, desc.nbytes)
            outputs.append(DeviceTensor(desc, view, None, None if held is None else held.lease))
        record_commands(graph, self.commands, view_for)
        if planned is not None:
            _POOLS[graph] = planned
        return outputs

    def _bind(self, tensors: list[DeviceTensor]) -> dict[int, _Bound]:
        bound: dict[int, _Bound] = {}
        first: dict[int, int] = {}
        for index, ((region, desc), tensor) in enumerate(zip(self.inputs, tensors, strict=True)):
            if tensor.desc != desc:
                raise ContractError(f"fragment input {index} is {desc}, got {tensor.desc}")
            view = tensor.view
            assert view is not None  # declared descriptions are never empty
            base = view.offset - region.offset
            held = bound.get(region.allocation)
            if held is None:
                bound[region.allocation] = _Bound(
                    view.buffer, base, [(view.offset, view.end)], [tensor.lease]
                )
                first[region.allocation] = index
            elif held.buffer is not view.buffer or held.base != base:
                raise ContractError(
                    f"fragment inputs {first[region.allocation]} and {index} are on one "
                    f"allocation but bound at different bases: pass views of one tensor "
                    "whose offsets differ as the regions' do"
                )
            else:
                held.spans.append((view.offset, view.end))
                held.leases.append(tensor.lease)
        weights = {
            a.buffer.ident
            for a in self.definition._arena.allocations
            if a.weight and a.buffer is not None
        }
        views = [
            (region.allocation, t.view) for (region, _), t in zip(self.inputs, tensors, strict=True)
        ]
        for i, (alloc, view) in enumerate(views):
            assert view is not None
            if view.buffer.ident in weights:
                raise ContractError(
                    f"fragment input {i} ({view}) overlaps a weight: an undeclared alias"
                )
            for j, (other_alloc, other) in enumerate(views[:i]):
                assert other is not None
                if other_alloc != alloc and view.overlaps(other):
                    raise ContractError(
                        f"fragment inputs {j} and {i} are on different allocations but "
                        f"overlap ({other}, {view}): an undeclared alias"
                    )
        return bound

    def _check_bound(self, bound: dict[int, _Bound]) -> None:
        used = [r for c in self.commands for r, _ in regions_of(c)]
        used += [r.slice(0, d.nbytes) for r, d in self.outputs]
        for region in used:
            held = bound.get(region.allocation)
            if held is None:
                continue
            start = held.base + region.offset
            end = start + region.nbytes
            if not any(lo <= start and end <= hi for lo, hi in _merged(held.spans)):
                raise ContractError(
                    f"fragment {region} falls outside the bound input bytes "
                    f"{_merged(held.spans)} of {held.buffer.label} (bytes {start}..{end})"
                )

    def _allocate(
        self, ctx: ModelContext, bound: dict[int, _Bound], pool: _Pool | None
    ) -> tuple[dict[int, Buffer], _Pool | None]:
        """Buffers for every unbound scratch allocation, and the graph's pool as it will
        be once this fragment is recorded (None when this fragment does not pool)."""
        buffers: dict[int, Buffer] = {}
        pooled = self.private if self.reuse else ()
        planned: _Pool | None = None
        if self.reuse:
            old = pool or _Pool()
            planner = ScratchPlanner()
            for nbytes, step, placement in old.requests:
                planner.add(nbytes, step, step, placement)
            fresh = [(a, self.extents[a], self._placement(a)) for a in pooled]
            ids = [planner.add(n, old.steps, old.steps, p) for _, n, p in fresh]
            plan = planner.plan()
            planned = _Pool(
                old.requests + [(n, old.steps, p) for _, n, p in fresh],
                list(old.buffers),
                old.steps + 1,
            )
            for (allocation, _, _), request in zip(fresh, ids, strict=True):
                j = plan.slot[request]
                while j >= len(planned.buffers):
                    k = len(planned.buffers)
                    planned.buffers.append(
                        ctx.allocate(plan.sizes[k], plan.placements[k], "private-scratch")
                    )
                buffers[allocation] = planned.buffers[j]
        for allocation, extent in self.extents.items():
            if allocation not in bound and allocation not in buffers:
                buffers[allocation] = ctx.allocate(
                    extent, self._placement(allocation), f"{self.definition.label}-scratch"
                )
        return buffers, planned

    def __repr__(self) -> str:
        return (
            f"<ModelFragment {self.definition.label!r} inputs={len(self.inputs)} "
            f"outputs={len(self.outputs)} scratch={self.scratch}>"
        )


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


__all__ = ["ModelDefinition", "ModelFragment"]
