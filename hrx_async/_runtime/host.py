"""The host lane: host functions recorded with `Graph.host`.

Plain functions run on one worker thread, in order; `async def` functions are
awaited on the event loop by the lane task itself. Either way each host
function is a region of its own and sees its views as uint8 numpy arrays.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio

from .._core.contract import Access
from .._core.lane import Lane
from .._core.ops import HostCall, Op
from ..backends.base import HostArray, QueueKey
from ..backends.numpy_ops import ByteArray, StepProgram, compile_region, view_array
from ..backends.worker import WorkerQueue
from .region import RUNNING_HOST_REGION, RegionRun


class AsyncHostProgram:
    """An `async def` host function with its arrays bound once."""

    __slots__ = ("arrays", "fn", "native_graph")

    def __init__(self, fn: Callable[..., Awaitable[Any]], arrays: list[ByteArray]) -> None:
        self.fn = fn
        self.arrays = arrays
        self.native_graph = False

    async def run(self) -> None:
        await self.fn(*self.arrays)

    async def run_region(
        self, run: RegionRun, finish: Callable[[RegionRun, BaseException | None], None]
    ) -> None:
        """Run as the task of region `run`, then `finish` it with the outcome."""
        owner = run.submission.scheduler
        owner.host_regions += 1
        token = RUNNING_HOST_REGION.set(run)
        try:
            with anyio.CancelScope(shield=True):
                await self.run()
        except BaseException as exc:
            # Every exception settles the region, BaseExceptions included: an escaping one
            # would end this task with the region, its submission and its awaiters pending.
            finish(run, exc)
        else:
            finish(run, None)
        finally:
            RUNNING_HOST_REGION.reset(token)
            owner.host_regions -= 1


class HostExecutor:
    """Provides the host lane's queue and programs."""

    name = "host"

    def __init__(self, host_array: HostArray) -> None:
        self._host_array = host_array
        self._worker: WorkerQueue | None = None

    def queue(self, key: QueueKey) -> WorkerQueue:
        if self._worker is None:
            self._worker = WorkerQueue("hrx-host")
        return self._worker

    def prepare_region(self, lane: Lane, ops: Sequence[Op]) -> StepProgram | AsyncHostProgram:
        from ..backends.numpy_ops import is_async_host_call

        if len(ops) == 1 and is_async_host_call(ops[0]):
            op = ops[0]
            assert isinstance(op, HostCall)
            arrays = [
                view_array(self._host_array, view, access is not Access.READ)
                for view, access in zip(op.views, op.accesses, strict=True)
            ]
            return AsyncHostProgram(op.fn, arrays)
        return compile_region(ops, self._host_array)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
            self._worker = None
