"""Buffer lifetime around the runtime: closing while finalizers run, and nothing the
runtime keeps after work settles holding a user's buffer."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import numpy as np
import pytest

import hrx_async as hrx
from hrx_async.backends.sim import SimBackend

pytestmark = pytest.mark.anyio


@pytest.fixture
def eager_gc() -> Iterator[None]:
    """A low collection threshold, so the cyclic collector runs inside the close."""
    old = gc.get_threshold()
    gc.set_threshold(1000)
    try:
        yield
    finally:
        gc.set_threshold(*old)


def _refuses_everything(rt: hrx.Runtime) -> None:
    for call in (
        lambda: rt.allocate(16, hrx.HOST_VISIBLE),
        rt.graph,
        rt.gpu,
        rt.npu,
        lambda: rt.start_trace(8),
    ):
        with pytest.raises(hrx.RuntimeClosed):
            call()


async def test_close_survives_the_collector_freeing_buffers(eager_gc: None) -> None:
    rt = hrx.Runtime(backend="sim", memory_budget=1 << 30)
    async with rt:
        kept = [rt.allocate(16, hrx.HOST_VISIBLE) for _ in range(20_000)]
        for _ in range(50):
            cycle: list[Any] = [rt.allocate(16, hrx.HOST_VISIBLE)]
            cycle.append(cycle)  # only the collector can free this one
        del cycle
    _refuses_everything(rt)
    assert rt.statistics().live_bytes == 0
    assert rt.memory_budget is not None and rt.memory_budget.reserved_bytes == 0
    assert all(buffer.freed for buffer in kept)


async def test_a_close_that_fails_part_way_still_closes(monkeypatch: pytest.MonkeyPatch) -> None:
    real_close = SimBackend.close

    def failing_close(self: SimBackend) -> None:
        real_close(self)
        raise hrx.BackendError("sim", "close", "device error", "the device did not answer")

    monkeypatch.setattr(SimBackend, "close", failing_close)
    rt = hrx.Runtime(backend="sim")
    with pytest.raises(hrx.BackendError, match="did not answer"):
        async with rt:
            buffer = rt.allocate(64, hrx.HOST_VISIBLE)
            graph = rt.graph("host")
            graph.host(lambda array: None, [(buffer.view(), hrx.Access.WRITE)])
            await graph.prepare().submit()
    _refuses_everything(rt)
    assert buffer.freed and rt.statistics().live_bytes == 0
    # The host lane's worker closed too, though closing the backend raised.
    assert not [t for t in threading.enumerate() if t.name.startswith("hrx-")]


def _record(
    kind: str, rt: hrx.Runtime, graph: hrx.Graph, device: hrx.Buffer, host: hrx.Buffer
) -> None:
    if kind == "copy":
        graph.fill(device.view(), 1)
        graph.copy(host.view(), device.view())
    elif kind == "host":
        graph.copy(device.view(), host.view())
        graph.host(lambda array: None, [(host.view(), hrx.Access.WRITE)])
    elif kind == "failing kernel":

        def explode(arrays: list[np.ndarray[Any, Any]], constants: bytes) -> None:
            raise ValueError("kernel exploded")

        contract = hrx.KernelContract([hrx.Binding(64, hrx.Access.WRITE)])
        source = hrx.KernelSource(host=explode)
        graph.gpu(rt.load_gpu_kernel(source, "explode", (1,), (1,), contract), [device.view()])
        graph.copy(host.view(), device.view())


async def _collected(rt: hrx.Runtime) -> None:
    """Collect until no buffer is live, for at most a second. A sim worker thread finishes
    a region's fence while it still holds the region for a moment (until its call that woke
    the loop returns): the loop may see the completion, and the test drop its handles,
    within that moment."""
    for _ in range(100):
        gc.collect()
        if rt.statistics().live_bytes == 0:
            return
        await anyio.sleep(0.01)


@pytest.mark.parametrize("kind", ["copy", "host", "failing kernel"])
async def test_buffers_go_once_the_last_handle_is_gone(
    hrx_backend: str, anyio_backend: str, kind: str
) -> None:
    if kind == "failing kernel" and hrx_backend != "sim":
        pytest.skip("host kernels run on the sim backend only")
    async with hrx.Runtime(backend=hrx_backend, memory_budget=1 << 20) as rt:
        budget = rt.memory_budget
        assert budget is not None
        device = rt.allocate(64, hrx.GPU_LOCAL)
        host = rt.allocate(64, hrx.HOST_VISIBLE)
        graph = rt.graph(kind)
        _record(kind, rt, graph, device, host)
        completion = graph.prepare().submit()
        try:
            await completion
        except hrx.ExecutionError:
            assert kind == "failing kernel"
        del graph, device, host, completion
        await _collected(rt)
        assert rt.statistics().live_bytes == 0
        assert budget.reserved_bytes == 0


async def test_a_kept_error_does_not_keep_the_failed_regions_buffers(anyio_backend: str) -> None:
    # The error's traceback passes through the runtime's frames, which held the region's
    # program and views: a service that keeps the error (a log, a list of failures) must
    # not keep the region's device memory with it.
    async with hrx.Runtime(backend="sim") as rt:
        device = rt.allocate(64, hrx.GPU_LOCAL)
        graph = rt.graph("kept error")
        _record("failing kernel", rt, graph, device, rt.allocate(64, hrx.HOST_VISIBLE))
        kept: list[BaseException] = []
        try:
            await graph.prepare().submit()
        except hrx.ExecutionError as exc:
            kept.append(exc)
        assert len(kept) == 1 and isinstance(kept[0].__cause__, ValueError)
        del graph, device
        await _collected(rt)
        assert rt.statistics().live_bytes == 0
        assert "kernel exploded" in str(kept[0].__cause__)
