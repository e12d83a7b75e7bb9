"""Regions of a model session's memory and the commands recorded over them.

    a = session.allocate(4096)                    # a Region: allocation 0, bytes [0, 4096)
    cmds = [Fill(a.slice(40, 8), 7), Dispatch(kernel, [a.slice(0, 64).read(), b.write()])]

Why a region and not a view: a session's commands outlive the session's own buffers. When
the session is frozen into a `ModelDefinition`, every allocation but the weights becomes a
size and a placement, and each slot or graph that uses the definition gets memory of its
own. A `Region` therefore names an allocation of an arena (the table a session and its
definition share) and a byte range of it; `slice(offset, n)` is relative and checked. Views
are made from regions only when commands are recorded into a graph, against whatever
buffers stand for the allocations there.

A `Fill` sets a region's bytes; a `Dispatch` runs a loaded GPU kernel on one region per
contract binding, each with the access the contract declares (`read()`, `write()`,
`read_write()`). Its grid and constants are the kernel's (fixed by `load_gpu_kernel`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._core.contract import Access
from .._core.graph import Graph
from .._core.kernels import GpuKernel
from .._core.memory import Buffer, Placement, View
from ..errors import ContractError
from ..runtime import Runtime
from . import _check


@dataclass(eq=False)
class Allocation:
    """One allocation of an arena: its size and placement, whether it is an immutable
    weight, and the buffer standing for it while the session is open (weights: always)."""

    index: int
    nbytes: int
    placement: Placement
    weight: bool
    buffer: Buffer | None


@dataclass(eq=False)
class Arena:
    """The allocations and kernels a session and the definition frozen from it share."""

    runtime: Runtime
    label: str
    allocations: list[Allocation] = field(default_factory=list)
    kernels: dict[int, GpuKernel] = field(default_factory=dict)

    def add(self, buffer: Buffer, weight: bool) -> Region:
        index = len(self.allocations)
        self.allocations.append(Allocation(index, buffer.nbytes, buffer.placement, weight, buffer))
        return Region(self, index, 0, buffer.nbytes)

    def declare(self, nbytes: int, placement: Placement) -> Region:
        """A non-weight allocation known only by its size and placement, as a frozen
        definition keeps it: memory comes when a slot or graph uses it."""
        index = len(self.allocations)
        self.allocations.append(Allocation(index, nbytes, placement, False, None))
        return Region(self, index, 0, nbytes)

    def check_region(self, region: object, what: str) -> Region:
        if not isinstance(region, Region):
            raise ContractError(f"{what} must be a Region, got {_check.shown(region)}")
        if region.arena is not self:
            raise ContractError(
                f"{what} {region} is a region of another session ({region.arena.label!r}, "
                f"not {self.label!r})"
            )
        return region

    def check_kernel(self, kernel: GpuKernel, what: str) -> None:
        if self.kernels.get(id(kernel)) is not kernel:
            raise ContractError(
                f"{what}: kernel {kernel.name!r} was not loaded by this session or its "
                f"definition ({self.label!r}); load it with load_kernel()"
            )


class Region:
    """Bytes [offset, offset + nbytes) of one arena allocation (nbytes may be 0)."""

    __slots__ = ("allocation", "arena", "nbytes", "offset")

    def __init__(self, arena: Arena, allocation: int, offset: int, nbytes: int) -> None:
        self.arena = arena
        self.allocation = allocation
        self.offset = offset
        self.nbytes = nbytes

    @property
    def end(self) -> int:
        """One past the region's last byte within its allocation: `offset + nbytes`."""
        return self.offset + self.nbytes

    @property
    def record(self) -> Allocation:
        """The planned allocation the region lies in."""
        return self.arena.allocations[self.allocation]

    @property
    def weight(self) -> bool:
        """Whether the region lies in a weight allocation (bound to a definition's weights)."""
        return self.record.weight

    @property
    def placement(self) -> Placement:
        """Where the region's allocation lives (`Placement`)."""
        return self.record.placement

    def slice(self, offset: int, nbytes: int) -> Region:
        """`nbytes` at `offset`, relative to this region; it must end within it."""
        offset = _check.integer(offset, "a region offset (bytes)", 0)
        nbytes = _check.integer(nbytes, "a region length (bytes)", 0)
        if offset + nbytes > self.nbytes:
            raise ContractError(
                f"slice({offset}, {nbytes}) ends at {offset + nbytes}, past this "
                f"{self.nbytes}-byte region"
            )
        return Region(self.arena, self.allocation, self.offset + offset, nbytes)

    def read(self) -> RegionBinding:
        """This region bound for reading (a `RegionBinding` for a dispatch)."""
        return RegionBinding(self, Access.READ)

    def write(self) -> RegionBinding:
        """This region bound for writing (a `RegionBinding` for a dispatch)."""
        return RegionBinding(self, Access.WRITE)

    def read_write(self) -> RegionBinding:
        """This region bound for reading and writing (a `RegionBinding` for a dispatch)."""
        return RegionBinding(self, Access.READ_WRITE)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Region) and (
            other.arena is self.arena
            and (other.allocation, other.offset, other.nbytes)
            == (self.allocation, self.offset, self.nbytes)
        )

    def __hash__(self) -> int:
        return hash((id(self.arena), self.allocation, self.offset, self.nbytes))

    def __repr__(self) -> str:
        kind = " weight" if self.weight else ""
        return f"<Region {self.arena.label}#{self.allocation}[{self.offset}:{self.end}]{kind}>"


@dataclass(frozen=True, slots=True)
class RegionBinding:
    """A region and how a dispatch uses it."""

    region: Region
    access: Access


@dataclass(frozen=True, slots=True)
class Fill:
    """Set every byte of `region` to `value` (0..255)."""

    region: Region
    value: int


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Run `kernel` on one region binding per contract binding."""

    kernel: GpuKernel
    bindings: tuple[RegionBinding, ...]

    def __init__(self, kernel: GpuKernel, bindings: Sequence[RegionBinding]) -> None:
        if not isinstance(kernel, GpuKernel):
            raise ContractError(
                f"a Dispatch runs a kernel from load_kernel(), got {_check.shown(kernel)}"
            )
        if isinstance(bindings, str | bytes) or not isinstance(bindings, Sequence):
            raise ContractError(
                f"Dispatch bindings are a list of region.read()/write()/read_write(), got "
                f"{_check.shown(bindings)}"
            )
        object.__setattr__(self, "kernel", kernel)
        object.__setattr__(self, "bindings", tuple(bindings))


Command = Fill | Dispatch


def regions_of(command: Command) -> list[tuple[Region, bool]]:
    """Every region `command` touches, with whether it writes it."""
    if isinstance(command, Fill):
        return [(command.region, True)]
    return [(b.region, b.access.writes) for b in command.bindings]


def check_commands(arena: Arena, commands: object, what: str) -> tuple[Command, ...]:
    """`commands` as a tuple, each checked against `arena`: a non-empty list of fills and
    dispatches over its regions and kernels, fills non-empty, each dispatch binding one
    non-empty region per contract binding with the contract's access."""
    if isinstance(commands, str | bytes) or not isinstance(commands, Sequence):
        raise ContractError(f"{what} takes a list of Fill/Dispatch, got {_check.shown(commands)}")
    items = tuple(commands)
    if not items:
        raise ContractError(f"{what} needs at least one command")
    for index, command in enumerate(items):
        where = f"{what} command {index}"
        if isinstance(command, Fill):
            arena.check_region(command.region, f"{where} (fill)")
            value = command.value
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255:
                raise ContractError(f"{where}: a fill value is a byte 0..255, got {value!r}")
            if command.region.nbytes == 0:
                raise ContractError(f"{where}: an empty fill ({command.region}) writes nothing")
        elif isinstance(command, Dispatch):
            kernel = command.kernel
            arena.check_kernel(kernel, where)
            contract = kernel.contract.bindings
            if len(command.bindings) != len(contract):
                raise ContractError(
                    f"{where}: kernel {kernel.name!r} takes {len(contract)} bindings, got "
                    f"{len(command.bindings)}"
                )
            for slot, (bound, declared) in enumerate(zip(command.bindings, contract, strict=True)):
                if not isinstance(bound, RegionBinding):
                    raise ContractError(
                        f"{where} binding {slot} must be region.read()/write()/read_write(), "
                        f"got {_check.shown(bound)}"
                    )
                arena.check_region(bound.region, f"{where} binding {slot}")
                if bound.access is not declared.access:
                    raise ContractError(
                        f"{where} binding {slot}: kernel {kernel.name!r} declares "
                        f"{declared.access.value}, the dispatch {bound.access.value}"
                    )
                if bound.region.nbytes == 0:
                    raise ContractError(f"{where} binding {slot} is an empty region")
        else:
            raise ContractError(f"{where} is not a Fill or Dispatch: {_check.shown(command)}")
    return items


def record_commands(
    graph: Graph[Any], commands: Sequence[Command], view_for: Callable[[Region], View]
) -> None:
    """Record checked `commands` into `graph`, each region as the view `view_for` gives;
    the graph orders them by byte range (its access tracker)."""
    for command in commands:
        if isinstance(command, Fill):
            graph.fill(view_for(command.region), command.value)
        else:
            graph.gpu(command.kernel, [view_for(b.region) for b in command.bindings])


__all__ = ["Arena", "Command", "Dispatch", "Fill", "Region", "RegionBinding"]
