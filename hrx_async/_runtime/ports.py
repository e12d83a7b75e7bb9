"""The protocols through which a prepared graph reaches the session it submits to.

A prepared graph submits through its session's scheduler, and the scheduler admits
prepared graphs: typing one against the other directly would make the two modules import
each other. `PreparedGraph` is typed against these instead (`Session` satisfies
`Submitter`, `Scheduler` `Admission`, `HostMappings` `MappingBook`), so the imports run one
way: the scheduler knows prepared graphs, prepared graphs know only these protocols.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from .._core.counters import AdmissionMarks
from .._core.graph import GraphPlan
from .completion import Completion


class Admission(Protocol):
    """A scheduler, as a prepared graph submits to it."""

    def submit(self, prepared: Any, after: Iterable[Completion], nowait: bool) -> Completion: ...


class MappingBook(Protocol):
    """A session's live host mappings, as admission checks a replay against them."""

    @property
    def count(self) -> int: ...

    def check_conflicts(self, plan: GraphPlan) -> None: ...


class Submitter(Protocol):
    """What a prepared graph submits through: the opened session of its runtime."""

    @property
    def scheduler(self) -> Admission | None:
        """None once the runtime has closed."""
        ...

    @property
    def mappings(self) -> MappingBook: ...

    @property
    def marks(self) -> AdmissionMarks:
        """Buffers freed so far and host mappings live, which admission compares first."""
        ...

    def scheduler_or_raise(self) -> Admission: ...


__all__ = ["Admission", "MappingBook", "Submitter"]
