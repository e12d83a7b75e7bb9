"""Operations as numpy steps over host-mapped storage, built once per region.

Used by the sim backend for every operation and by the host lane for host
functions. Each step closes over pre-sliced arrays, so replay allocates nothing.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._core.contract import Access
from .._core.memory import View
from .._core.ops import Copy, External, Fill, HostCall, Launch, NpuLaunch, Op, enqueued_only
from ..errors import Unsupported
from .base import HostArray

Step = Callable[[], Any]
ByteArray = np.ndarray[Any, np.dtype[np.uint8]]


def view_array(host_array: HostArray, view: View, writable: bool = True) -> ByteArray:
    array = host_array(view.buffer.storage, view.offset, view.nbytes)
    if not writable:
        array = array.view()
        array.flags.writeable = False
    return array


def _fill_step(dst: ByteArray, value: int) -> Step:
    return lambda: dst.fill(value)


def _copy_step(dst: ByteArray, src: ByteArray) -> Step:
    return lambda: np.copyto(dst, src)


def _kernel_step(fn: Callable[..., Any], arrays: list[ByteArray], constants: bytes) -> Step:
    return lambda: fn(arrays, constants)


def _host_step(fn: Callable[..., Any], arrays: list[ByteArray]) -> Step:
    return lambda: fn(*arrays)


def _external_step(fn: Callable[..., Any], arrays: list[ByteArray]) -> Step:
    return lambda: enqueued_only(fn, fn(None, arrays))


def is_async_host_call(op: Op) -> bool:
    return isinstance(op, HostCall) and inspect.iscoroutinefunction(op.fn)


def compile_op(op: Op, host_array: HostArray) -> Step:
    """One op as a zero-argument callable over pre-sliced arrays."""
    if isinstance(op, Fill):
        return _fill_step(view_array(host_array, op.dst), op.value)
    if isinstance(op, Copy):
        return _copy_step(view_array(host_array, op.dst), view_array(host_array, op.src, False))
    if isinstance(op, Launch | NpuLaunch):
        fn = op.kernel.source.host
        if fn is None:
            raise Unsupported(f"kernel {op.kernel.name!r} has no host implementation to run here")
        bindings = op.kernel.contract.bindings
        arrays = [
            view_array(host_array, view, binding.access.writes)
            for view, binding in zip(op.views, bindings, strict=True)
        ]
        return _kernel_step(fn, arrays, op.kernel.contract.constants)
    arrays = [
        view_array(host_array, view, access is not Access.READ)
        for view, access in zip(op.views, op.accesses, strict=True)
    ]
    if isinstance(op, External):
        return _external_step(op.fn, arrays)
    assert isinstance(op, HostCall)
    return _host_step(op.fn, arrays)


class StepProgram:
    """A region as a list of numpy steps run in order on a worker thread."""

    __slots__ = ("native_graph", "steps")

    def __init__(self, steps: Sequence[Step]) -> None:
        self.steps = tuple(steps)
        self.native_graph = False

    def run(self) -> None:
        for step in self.steps:
            step()


def compile_region(ops: Sequence[Op], host_array: HostArray) -> StepProgram:
    return StepProgram([compile_op(op, host_array) for op in ops])
