"""Typed, shaped views for the adapters that hand external work another library's arrays
(`hrx_async.torch`, `hrx_async.cupy`): the checks made when such a region is recorded.

An adapter declares each access as `(view, dtype)` or `(view, dtype, shape)`; here the
declaration is checked against the view without the library (a function the adapter
passes turns what was given as a dtype into the library's dtype and its item size), so a
wrong size, a misaligned offset or memory the library cannot reach is refused before
anything is recorded.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import ContractError
from . import validate as _validate
from .contract import Access
from .graph import Graph
from .memory import View

DtypeOf = Callable[[object], tuple[Any, int] | None]
"""What an adapter passes to `typed_views`: its dtype for what was given, and the item size."""

MAX_ALIGNMENT = 16
"""The most alignment an element needs (a 16-byte complex number); what a view's offset
must be a multiple of, at most (allocations themselves are aligned further)."""


@dataclass(frozen=True, slots=True)
class TypedView:
    """One access of a typed region: a view seen as `shape` elements of `dtype` (the
    library's own dtype object) of `itemsize` bytes each."""

    view: View
    access: Access
    dtype: Any
    shape: tuple[int, ...]
    itemsize: int

    @property
    def count(self) -> int:
        """How many elements."""
        return math.prod(self.shape)


def check_region_call(who: str, graph: object, fn: object, library: str) -> None:
    """What every library region (`hrx_async.torch`, `hrx_async.cupy`) checks first: that it
    records into a `Graph` and that `fn` is a plain function (the work it enqueues is
    `library`'s), else `ContractError`."""
    if not isinstance(graph, Graph):
        raise ContractError(
            f"{who} records into a Graph (rt.graph()), got {_validate.shown(graph)}"
        )
    if not callable(fn) or inspect.iscoroutinefunction(fn):
        raise ContractError(
            f"{who} takes a plain function that enqueues {library} work and returns, got "
            f"{_validate.shown(fn)}"
        )


def typed_views(
    who: str,
    groups: Iterable[tuple[Access, Any]],
    dtype_of: DtypeOf,
) -> tuple[TypedView, ...]:
    """Each declaration of `groups` ((access, declarations) pairs, in the order the work
    receives them) as a `TypedView`. `dtype_of(given)` is the library's dtype for what was
    given and its item size, or None for what is not a dtype. `who` names the caller in
    messages."""
    found: list[TypedView] = []
    for access, declarations in groups:
        name = _GROUP_NAMES[access]
        for declaration in _validate.items(declarations, f"{who} {name}"):
            found.append(_typed_view(who, name, access, declaration, dtype_of))
    if not found:
        raise ContractError(f"{who} needs at least one of reads, updates or writes")
    return tuple(found)


_GROUP_NAMES = {Access.READ: "reads", Access.READ_WRITE: "updates", Access.WRITE: "writes"}


def _typed_view(
    who: str,
    name: str,
    access: Access,
    declaration: object,
    dtype_of: DtypeOf,
) -> TypedView:
    if not (isinstance(declaration, tuple) and len(declaration) in (2, 3)):
        raise ContractError(
            f"{who} {name} are (view, dtype) or (view, dtype, shape) tuples, got "
            f"{_validate.shown(declaration)}"
        )
    view, given = declaration[0], declaration[1]
    if not isinstance(view, View):
        raise ContractError(f"{who} {name}: {_validate.shown(view)} is not a View")
    if view.buffer.placement.host_mappable:
        raise ContractError(
            f"{who} works on GPU_LOCAL memory; {view} is {view.buffer.placement} memory, "
            "which other libraries see as host memory (PyTorch would compute on it at once, "
            "outside the stream's order): copy it to GPU_LOCAL memory first (g.copy)"
        )
    known = dtype_of(given)
    if known is None or known[1] <= 0:
        raise ContractError(f"{who} {name}: {_validate.shown(given)} is not a dtype it knows")
    dtype, itemsize = known
    if len(declaration) == 2:
        if view.nbytes % itemsize:
            raise ContractError(
                f"{who} {name}: {view} is {view.nbytes} bytes, not a whole number of {dtype} "
                f"elements ({itemsize} bytes each); give a shape"
            )
        shape: tuple[int, ...] = (view.nbytes // itemsize,)
    else:
        shape = _shape(who, name, declaration[2])
    needed = itemsize * math.prod(shape)
    if needed != view.nbytes:
        raise ContractError(
            f"{who} {name}: {view} is {view.nbytes} bytes, but {dtype} of shape {shape} is "
            f"{needed} bytes"
        )
    alignment = min(itemsize & -itemsize, MAX_ALIGNMENT)
    if view.offset % alignment:
        raise ContractError(
            f"{who} {name}: {view} starts at byte {view.offset}, not a multiple of {alignment} "
            f"as {dtype} elements must"
        )
    return TypedView(view, access, dtype, shape, itemsize)


def _shape(who: str, name: str, shape: object) -> tuple[int, ...]:
    """A shape in its canonical form: an int (one dimension) or an ordered collection of
    integers >= 0 (numpy integers too, not bools)."""
    shown = _validate.shown(shape)
    problem = f"{who} {name}: a shape is an int or a tuple of ints >= 0, got {shown}"
    single = _validate.as_integer(shape)
    if single is not None:
        dims: tuple[object, ...] = (single,)
    elif isinstance(shape, tuple | list):
        dims = tuple(shape)
    else:
        raise ContractError(problem)
    found = [_validate.as_integer(d) for d in dims]
    if any(d is None or d < 0 for d in found):
        raise ContractError(problem)
    return tuple(d for d in found if d is not None)


__all__ = ["MAX_ALIGNMENT", "DtypeOf", "TypedView", "typed_views"]
