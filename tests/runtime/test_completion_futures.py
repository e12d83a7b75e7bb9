"""Completions with asyncio's own tools (`add_done_callback`, `as_future()`, `asyncio.wait`,
`asyncio.as_completed`) and what `cancel()` returns, on the sim backend."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import anyio
import numpy as np
import pytest

import hrx_async as hrx

pytestmark = pytest.mark.anyio


def gated(rt: hrx.Runtime, label: str, gate: threading.Event) -> tuple[hrx.Buffer, Any]:
    """A graph whose host function waits for `gate`, then writes 9s."""
    buffer = rt.allocate(16, hrx.HOST_VISIBLE)

    def hold(array: np.ndarray) -> None:
        assert gate.wait(10)
        array[:] = 9

    g = rt.graph(label)
    g.host(hold, [(buffer.view(), hrx.Access.WRITE)])
    return buffer, g.prepare()


def filled(rt: hrx.Runtime, label: str) -> tuple[hrx.Buffer, Any]:
    buffer = rt.allocate(16, hrx.HOST_VISIBLE)
    g = rt.graph(label)
    g.fill(buffer.view(), 4)
    return buffer, g.prepare()


async def contents(buffer: hrx.Buffer) -> bytes:
    async with buffer.map_read() as memory:
        return bytes(memory)


async def test_add_done_callback_runs_on_the_loop_once_done(anyio_backend: str) -> None:
    loop_thread = threading.get_ident()
    calls: list[tuple[hrx.Completion, int]] = []

    def record(completion: hrx.Completion) -> None:
        calls.append((completion, threading.get_ident()))

    async with hrx.Runtime(backend="sim") as rt:
        gate = threading.Event()
        _, step = gated(rt, "held", gate)
        c = step.submit()
        c.add_done_callback(record)
        await anyio.sleep(0.01)
        assert calls == [] and not c.done()
        gate.set()
        with anyio.fail_after(10):
            await c
        assert calls == [(c, loop_thread)]
        c.add_done_callback(record)  # already done: at once
        assert calls == [(c, loop_thread)] * 2


async def test_a_raising_done_callback_is_logged_and_harms_nothing(
    anyio_backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(completion: hrx.Completion) -> None:
        raise RuntimeError("callback bug")

    seen: list[bool] = []
    async with hrx.Runtime(backend="sim") as rt:
        buffer, step = filled(rt, "fill")
        with caplog.at_level(logging.ERROR, logger="hrx_async"):
            c = step.submit()
            c.add_done_callback(broken)
            c.add_done_callback(lambda done: seen.append(done.done()))
            with anyio.fail_after(10):
                await c
        assert seen == [True]
        assert "callback bug" in caplog.text
        with anyio.fail_after(10):
            await step.submit()  # the runtime goes on
        assert await contents(buffer) == bytes([4]) * 16


async def test_add_done_callback_is_refused_off_the_loop_thread(anyio_backend: str) -> None:
    async with hrx.Runtime(backend="sim") as rt:
        _, step = filled(rt, "fill")
        c = step.submit()
        with pytest.raises(hrx.ContractError, match="thread"):
            await anyio.to_thread.run_sync(c.add_done_callback, print)
        with pytest.raises(hrx.ContractError, match="callable"):
            c.add_done_callback(42)  # type: ignore[arg-type]
        await c


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_as_future_works_with_asyncio_wait_and_never_cancels_work(
    anyio_backend: str,
) -> None:
    async with hrx.Runtime(backend="sim") as rt:
        gate = threading.Event()
        slow_buffer, slow_step = gated(rt, "slow", gate)
        quick_buffer, quick_step = filled(rt, "quick")
        slow, quick = slow_step.submit(), quick_step.submit()
        slow_future, quick_future = slow.as_future(), quick.as_future()
        done, pending = await asyncio.wait(
            [slow_future, quick_future], timeout=10, return_when=asyncio.FIRST_COMPLETED
        )
        assert done == {quick_future} and pending == {slow_future}
        assert quick_future.result() is None
        # Cancelling the future (as wait_for does on timeout) leaves the work running.
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(slow_future, 0.01)
        assert slow_future.cancelled() and not slow.done()
        gate.set()
        with anyio.fail_after(10):
            await slow
        assert await contents(slow_buffer) == bytes([9]) * 16
        assert await contents(quick_buffer) == bytes([4]) * 16


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_as_future_with_as_completed_and_a_failure(anyio_backend: str) -> None:
    def fail(arrays: list[np.ndarray], constants: bytes) -> None:
        raise RuntimeError("kernel failed")

    async with hrx.Runtime(backend="sim") as rt:
        gate = threading.Event()
        _, slow_step = gated(rt, "slow", gate)  # on the host lane
        kernel = rt.load_gpu_kernel(
            hrx.KernelSource(host=fail),
            "fail",
            grid=(1,),
            block=(1,),
            contract=hrx.KernelContract([hrx.Binding(16, hrx.Access.WRITE)]),
        )
        g = rt.graph("failing")
        g.gpu(kernel, [rt.allocate(16, hrx.GPU_LOCAL).view()])  # on the compute lane
        slow, failing = slow_step.submit(), g.prepare().submit()
        order: list[str] = []
        for next_done in asyncio.as_completed([slow.as_future(), failing.as_future()], timeout=10):
            try:
                await next_done
                order.append("slow")
            except hrx.ExecutionError as exc:
                order.append("failing")
                assert "kernel failed" in repr(exc.__cause__)
                gate.set()
        assert order == ["failing", "slow"]
        assert slow.done() and failing.done()


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_as_future_on_trio_says_to_use_a_nursery(anyio_backend: str) -> None:
    async with hrx.Runtime(backend="sim") as rt:
        _, step = filled(rt, "fill")
        c = step.submit()
        with pytest.raises(hrx.Unsupported, match="nursery"):
            c.as_future()
        await c


async def test_cancel_says_whether_it_skipped_anything(anyio_backend: str) -> None:
    async with hrx.Runtime(backend="sim") as rt:
        gate = threading.Event()
        buffer, held = gated(rt, "held", gate)
        g = rt.graph("after-held")
        g.fill(buffer.view(), 1)  # waits for the host function: queued on its lane
        first, second = held.submit(), g.prepare().submit()
        results: list[bool] = [second.cancel(), second.cancel()]
        gate.set()
        with anyio.fail_after(10):
            await first
            with pytest.raises(hrx.Cancelled):
                await second
        assert results == [True, False]
        assert not first.cancel() and not second.cancel()  # done
        assert await contents(buffer) == bytes([9]) * 16
