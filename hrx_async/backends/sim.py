"""The embedded sim backend: numpy storage and one worker thread per lane.

Runs anywhere. Every placement is host memory, but the rules of real devices
still hold (the runtime refuses to map GPU-local memory, NPU kernels bind only
their NPU's memory). GPU kernels are host callables (`KernelSource(host=fn)`,
see `hrx_async._core.kernels` for the calling convention); sim NPUs run host
callables as NPU programs for the target "sim-npu". numpy releases the GIL in
its copies and arithmetic, so lanes overlap for real.
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._core.contract import KernelContract
from .._core.kernels import KernelSource
from .._core.lane import Lane
from .._core.memory import Placement
from .._core.ops import Op
from ..errors import ContractError, Unsupported
from .base import HostArray, QueueKey
from .numpy_ops import ByteArray, StepProgram, compile_region
from .worker import WorkerQueue

SIM_TARGET = "sim"
SIM_NPU_TARGET = "sim-npu"
MAX_NPU_COLUMNS = 8
# Storage is aligned like device allocations so alignment checks mean the same everywhere.
_STORAGE_ALIGNMENT = 256


def check_npu_program(
    source: KernelSource, name: str, columns: int, contract: KernelContract, target: str
) -> None:
    """The original's load-time checks for an NPU program."""
    if not isinstance(columns, int) or not 1 <= columns <= MAX_NPU_COLUMNS:
        raise ContractError(
            f"NPU program {name!r} needs 1..{MAX_NPU_COLUMNS} columns, got {columns!r}"
        )
    if contract.constants:
        raise ContractError(
            f"NPU program {name!r} takes no scalar constants, got {len(contract.constants)} bytes"
        )
    if source.binary and target not in source.binary:
        raise ContractError(
            f"NPU program {name!r} has artifacts for {sorted(source.binary)}, "
            f"not for this device's target {target!r}"
        )


class SimBackend:
    """numpy + worker threads. Serves the GPU lanes, the NPU lanes, or both."""

    name = "sim"
    target = SIM_TARGET
    poll_budget_us = 0.0

    def __init__(self, npus: int = 1, host_array: HostArray | None = None, gpus: int = 1) -> None:
        self._npus = npus
        self.gpus = gpus
        """How many simulated GPUs: each has its own upload, compute and download lanes."""
        self._queues: dict[QueueKey, WorkerQueue] = {}
        self._host_array: HostArray = host_array or self.host_array
        self.native_graphs_prepared = 0
        self.copy_streams_created = 0

    # -- memory ----------------------------------------------------------------

    def allocate(self, nbytes: int, placement: Placement) -> ByteArray:
        raw = np.zeros(nbytes + _STORAGE_ALIGNMENT, dtype=np.uint8)
        start = -raw.ctypes.data % _STORAGE_ALIGNMENT
        return raw[start : start + nbytes]

    def free(self, storage: Any) -> None:
        """numpy memory goes back when the last array over it is gone."""

    def host_array(self, storage: Any, offset: int, nbytes: int) -> ByteArray:
        array: ByteArray = storage[offset : offset + nbytes]
        return array

    # -- execution -------------------------------------------------------------

    def queue(self, key: QueueKey) -> WorkerQueue:
        worker = self._queues.get(key)
        if worker is None:
            lane, device = key
            worker = WorkerQueue(f"hrx-sim-{lane.label}-{device}")
            self._queues[key] = worker
        return worker

    def prepare_region(self, lane: Lane, ops: Sequence[Op], gpu: int = 0) -> StepProgram:
        """Every simulated GPU's memory is host memory: `gpu` changes nothing here."""
        return compile_region(ops, self._host_array)

    # -- kernels ---------------------------------------------------------------

    def load_gpu_kernel(
        self,
        source: KernelSource,
        name: str,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        contract: KernelContract,
        defines: dict[str, str],
    ) -> Any:
        if source.host is None:
            raise Unsupported(
                f"the sim backend runs host kernels; kernel {name!r} has no KernelSource(host=...)"
            )
        return source.host

    def npu_count(self) -> int:
        return self._npus

    def serve_npus(self, npus: int) -> None:
        """Serve `npus` NPUs too (a runtime whose GPU backend is this one sets how many)."""
        self._npus = npus

    def npu_target(self, npu: int) -> str:
        return SIM_NPU_TARGET

    def load_npu_kernel(
        self, npu: int, source: KernelSource, name: str, columns: int, contract: KernelContract
    ) -> Any:
        check_npu_program(source, name, columns, contract, SIM_NPU_TARGET)
        if source.host is None:
            raise Unsupported(f"the sim NPU runs host callables; {name!r} has no host=...")
        return source.host

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "target": self.target,
            "gpus": self.gpus,
            "npus": [SIM_NPU_TARGET] * self._npus,
            "numpy": np.__version__,
            "machine": platform.machine(),
        }

    def close(self) -> None:
        for worker in self._queues.values():
            worker.close()
        self._queues.clear()
