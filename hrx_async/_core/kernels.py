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

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ContractError
from . import validate as _validate
from .contract import KernelContract
from .memory import Domain

HostKernel = Callable[[list[np.ndarray[Any, np.dtype[np.uint8]]], bytes], None]


@dataclass(frozen=True)
class KernelSource:
    """The forms a kernel exists in; at least one is required."""

    cxx: str | None = None
    host: HostKernel | None = None
    binary: Mapping[str, str | Path] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.cxx is not None:
            _validate.text(self.cxx, "KernelSource.cxx (C++ source text)")
        if self.host is not None and not callable(self.host):
            raise ContractError(
                f"KernelSource.host must be callable, got {_validate.shown(self.host)}"
            )
        binary = self.binary
        if not isinstance(binary, Mapping):
            raise ContractError(
                "KernelSource.binary must be a mapping of target to file path, got "
                f"{_validate.shown(binary)}"
            )
        for target, path in binary.items():
            if not isinstance(target, str) or not target or not isinstance(path, str | os.PathLike):
                raise ContractError(
                    "KernelSource.binary maps target names (str) to file paths (str or Path), "
                    f"got {_validate.shown(target)}: {_validate.shown(path)}"
                )
        if self.cxx is None and self.host is None and not binary:
            raise ContractError("a KernelSource needs cxx source, a host callable or a binary")


def _check_loaded(kernel: GpuKernel | NpuKernel) -> None:
    _validate.text(kernel.name, "a kernel name", empty=False)
    _validate.instance(kernel.contract, KernelContract, "a kernel contract")
    _validate.instance(kernel.source, KernelSource, "a kernel source")
    _validate.text(kernel.target, "a kernel target")
    _validate.instance(kernel.domain, Domain, "a kernel's domain", "a runtime's domain")


@dataclass(frozen=True, eq=False)
class GpuKernel:
    """A kernel loaded for one runtime's GPU, with its launch shape and contract.

    Made by `Runtime.load_gpu_kernel`; a record made directly is checked the same way.
    """

    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    contract: KernelContract
    source: KernelSource
    target: str
    domain: Domain
    native: Any = None
    shared_bytes: int = 0

    def __post_init__(self) -> None:
        _check_loaded(self)
        object.__setattr__(self, "grid", _validate.dims("grid", self.grid))
        object.__setattr__(self, "block", _validate.dims("block", self.block))
        object.__setattr__(
            self,
            "shared_bytes",
            _validate.integer(self.shared_bytes, "shared_bytes", 0, _validate.MAX_DIM),
        )


@dataclass(frozen=True, eq=False)
class NpuKernel:
    """A program loaded on one NPU (`npu` is its index), with its column count and contract.

    Made by `NpuDevice.load_artifact`; a record made directly is checked the same way.
    """

    name: str
    npu: int
    columns: int
    contract: KernelContract
    source: KernelSource
    target: str
    domain: Domain
    native: Any = None

    def __post_init__(self) -> None:
        _check_loaded(self)
        object.__setattr__(self, "npu", _validate.integer(self.npu, "an NPU index", 0))
        object.__setattr__(self, "columns", _validate.integer(self.columns, "NPU columns", 1))
