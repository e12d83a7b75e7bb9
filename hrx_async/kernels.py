"""Kernel sources and loaded-kernel records (backend-neutral).

A `KernelSource` lists every form a kernel exists in; each backend picks the
one it can run: `cxx` (CUDA/HIP C++ compiled at load time), `binary`
(prebuilt code per target, e.g. {"sm_90": "k.cubin"}), or `host` (a Python
callable, what the sim backend runs).

Host kernel convention: `host(arrays, constants)` where `arrays` is a list of
one-dimensional `np.uint8` arrays, one per binding in contract order, each the
whole bound view (reinterpret with `.view(np.int32)` and the like), and
`constants` is the contract's constant bytes. Writes go into the arrays in place.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .contract import KernelContract
from .errors import ContractError

if TYPE_CHECKING:
    from .memory import Domain

HostKernel = Callable[[list[np.ndarray[Any, np.dtype[np.uint8]]], bytes], None]


@dataclass(frozen=True)
class KernelSource:
    """The forms a kernel exists in; at least one is required."""

    cxx: str | None = None
    host: HostKernel | None = None
    binary: Mapping[str, str | Path] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.cxx is None and self.host is None and not self.binary:
            raise ContractError("a KernelSource needs cxx source, a host callable or a binary")
        if self.host is not None and not callable(self.host):
            raise ContractError(f"KernelSource.host must be callable, got {self.host!r}")


@dataclass(frozen=True, eq=False)
class GpuKernel:
    """A kernel loaded for one runtime's GPU, with its launch shape and contract."""

    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    contract: KernelContract
    source: KernelSource
    target: str
    domain: Domain
    native: Any = None
    shared_bytes: int = 0


@dataclass(frozen=True, eq=False)
class NpuKernel:
    """A program loaded on one NPU (`npu` is its index), with its column count and contract."""

    name: str
    npu: int
    columns: int
    contract: KernelContract
    source: KernelSource
    target: str
    domain: Domain
    native: Any = None
