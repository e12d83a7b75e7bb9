"""The runtime inside a plain trio application: a nursery owns it, cancel scopes bound waits.

No anyio in the application code: the runtime is started with `nursery.start`, clients
use trio timeouts, and cancelling the nursery shuts the runtime down, draining work
already submitted, as the design promises for asyncio.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

import hrx_async as hrx
from hrx_async.serve.slots import SlotPool

trio = pytest.importorskip("trio")

N = 4096


def hrx_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("hrx-")]


async def own_runtime(shutdown: Any, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """The runtime's owner task: open, hand the runtime to the nursery, close on `shutdown`.

    A normal exit drains every submission; if the owner is cancelled instead, work not yet
    started is cancelled and running work drains.
    """
    async with hrx.Runtime(backend="sim") as rt:
        task_status.started(rt)
        await shutdown.wait()


class Pipeline:
    """host staging -> GPU (doubling, held back by `gate` when it is set) -> host staging."""

    def __init__(self, rt: hrx.Runtime, gate: threading.Event) -> None:
        def double(arrays: list[np.ndarray[Any, Any]], constants: bytes) -> None:
            gate.wait(10)
            arrays[1].view(np.float32)[:] = arrays[0].view(np.float32) * 2

        contract = hrx.KernelContract(
            [hrx.Binding(N * 4, hrx.Access.READ), hrx.Binding(N * 4, hrx.Access.WRITE)]
        )
        kernel = rt.load_gpu_kernel(
            hrx.KernelSource(host=double), "double", (16,), (256,), contract
        )
        self.staging = rt.allocate(N * 4, hrx.HOST_VISIBLE)
        x = rt.allocate(N * 4, hrx.GPU_LOCAL)
        y = rt.allocate(N * 4, hrx.GPU_LOCAL)
        graph = rt.graph("double")
        graph.copy(x.view(), self.staging.view())
        graph.gpu(kernel, [x.view(), y.view()])
        graph.copy(self.staging.view(), y.view())
        self.step = graph.prepare()


def test_nursery_owned_runtime_with_timeouts_and_shutdown() -> None:
    gate = threading.Event()
    outcome: dict[str, Any] = {}

    async def main() -> None:
        shutdown = trio.Event()
        async with trio.open_nursery() as nursery:
            rt: hrx.Runtime = await nursery.start(own_runtime, shutdown)
            pool = SlotPool(rt, 2, lambda rt, _i: Pipeline(rt, gate))

            async def request(value: float) -> float:
                async with pool.acquire() as slot:
                    with slot.resources.staging.map_write_nowait() as memory:
                        np.frombuffer(memory, np.float32)[:] = value
                    await slot.submit(slot.resources.step)
                    async with slot.resources.staging.view(0, 4).map_read() as memory:
                        return float(np.frombuffer(memory, np.float32)[0])

            # A client whose deadline passes while the device holds its work: the wait is
            # cancelled, the work is not.
            with trio.move_on_after(0.05) as deadline:
                await request(1.5)
            outcome["timed_out"] = deadline.cancelled_caught
            outcome["pending_after_timeout"] = rt.statistics().completions
            gate.set()

            # Normal clients, concurrently, each under its own deadline.
            results: dict[int, float] = {}

            async def client(i: int) -> None:
                with trio.fail_after(10):
                    results[i] = await request(float(i))

            async with trio.open_nursery() as clients:
                for i in range(8):
                    clients.start_soon(client, i)
            outcome["results"] = results

            # Submit without waiting, then shut the application down: the runtime owner's
            # `async with` drains the submission (held back a while longer) before closing.
            gate.clear()
            slot = pool.acquire_nowait()
            outcome["last"] = slot.submit(slot.resources.step)
            outcome["runtime"] = rt
            nursery.start_soon(release_later, gate)
            shutdown.set()

    trio.run(main)
    assert outcome["timed_out"] is True
    assert outcome["pending_after_timeout"] == 0
    assert outcome["results"] == {i: 2.0 * i for i in range(8)}
    last: hrx.Completion = outcome["last"]
    assert last.done() and last.exception() is None
    stats = outcome["runtime"].statistics()
    assert stats.submissions == stats.completions == 10
    with pytest.raises(hrx.RuntimeClosed):
        outcome["runtime"].graph()
    assert hrx_threads() == []


async def release_later(gate: threading.Event) -> None:
    await trio.sleep(0.05)
    gate.set()


def test_cancel_scope_around_submit_never_cancels_device_work() -> None:
    gate = threading.Event()

    async def main() -> tuple[bool, float]:
        async with trio.open_nursery() as nursery:
            rt: hrx.Runtime = await nursery.start(own_runtime, trio.Event())
            pipeline = Pipeline(rt, gate)
            async with pipeline.staging.map_write() as memory:
                np.frombuffer(memory, np.float32)[:] = 4.0
            completion = pipeline.step.submit()
            with trio.CancelScope() as scope:
                scope.cancel()
                await completion
            assert not completion.done()
            gate.set()
            with trio.fail_after(10):
                await completion
            async with pipeline.staging.view(0, 4).map_read() as memory:
                value = float(np.frombuffer(memory, np.float32)[0])
            nursery.cancel_scope.cancel()
        return scope.cancelled_caught, value

    cancelled, value = trio.run(main)
    assert cancelled and value == 8.0


def test_cancelling_the_nursery_closes_the_runtime_and_its_threads() -> None:
    gate = threading.Event()
    held: dict[str, Any] = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            rt: hrx.Runtime = await nursery.start(own_runtime, trio.Event())
            pipeline = Pipeline(rt, gate)
            held["completions"] = [pipeline.step.submit() for _ in range(3)]
            held["runtime"] = rt
            # Released from a thread: every task of the nursery is about to be cancelled.
            threading.Timer(0.05, gate.set).start()
            nursery.cancel_scope.cancel()

    trio.run(main)
    completions: list[hrx.Completion] = held["completions"]
    assert all(c.done() for c in completions)
    # Started regions finished; what had not started was cancelled, never left hanging.
    for completion in completions:
        assert completion.exception() is None or isinstance(completion.exception(), hrx.Cancelled)
    assert isinstance(completions[-1].exception(), hrx.Cancelled)
    stats = held["runtime"].statistics()
    assert stats.submissions == stats.completions == 3
    assert hrx_threads() == []
