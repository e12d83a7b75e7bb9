"""BlockingRuntime where threads meet: calls that would deadlock refuse at once, a closed
facade refuses everything, and conflicting mappings of threads wait for each other."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import hrx_async as hrx
from hrx_async import blocking
from hrx_async.blocking import BlockingPreparedGraph, BlockingRuntime

LOOPS = ["asyncio", "trio"]
SETTLE_S = 30
"""Generous: work that settles at all settles far sooner."""


def _prepared(graph: hrx.Graph) -> BlockingPreparedGraph:
    prepared = graph.prepare()
    assert isinstance(prepared, BlockingPreparedGraph)
    return prepared


def _fill_step(brt: BlockingRuntime, buffer: hrx.Buffer) -> BlockingPreparedGraph:
    graph = brt.graph("fill")
    graph.fill(buffer.view(), 7)
    return _prepared(graph)


def _settled(brt: BlockingRuntime, completion: hrx.Completion) -> bool:
    """Whether `completion` finishes; if it never does the runtime is stuck for good, so
    it is abandoned (its threads are daemons) and the test fails instead of hanging."""
    if completion.wait(SETTLE_S):
        return True
    blocking._open_runtimes.discard(brt)
    return False


@pytest.mark.parametrize("loop", LOOPS)
def test_waiting_for_a_completion_on_the_loop_refuses(loop: str) -> None:
    with BlockingRuntime(backend="sim", async_backend=loop) as brt:
        buffer = brt.allocate(64, hrx.HOST_VISIBLE)
        step = _fill_step(brt, buffer)

        async def on_loop() -> list[str]:
            completion = step.submit()
            refused = []
            for name, call in (
                ("wait(1)", lambda: completion.wait(1)),
                ("wait()", completion.wait),
                ("submit_nowait().wait()", lambda: step.submit_nowait().wait()),
            ):
                with pytest.raises(hrx.ContractError, match="cannot run on the runtime's loop"):
                    call()
                refused.append(name)
            await completion
            return refused

        future = brt.portal.start_task_soon(on_loop)
        assert future.result(SETTLE_S) == ["wait(1)", "wait()", "submit_nowait().wait()"]
        # The loop is still free: other threads' calls and waits go on.
        step.run()
        completion = step.submit()
        assert completion.wait(SETTLE_S)
        assert isinstance(completion, hrx.Completion)
        assert brt.statistics().completions == 4
        assert brt.read(buffer) == bytes([7]) * 64


def _blocking_calls(
    brt: BlockingRuntime, target: hrx.Buffer, other: BlockingPreparedGraph
) -> dict[str, Callable[[], object]]:
    """Calls a host function or kernel might make that block on its own runtime."""
    return {
        "read": lambda: brt.read(target),
        "write": lambda: brt.write(target, bytes(target.nbytes)),
        "map_read": lambda: brt.map_read(target).__enter__(),
        "run": other.run,
        "wait": lambda: other.submit().wait(),
        "drain": brt.drain,
        "close": brt.close,
    }


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("call", ["read", "write", "map_read", "run", "wait", "drain", "close"])
def test_blocking_in_a_host_function_refuses(loop: str, call: str) -> None:
    brt = BlockingRuntime(backend="sim", async_backend=loop)
    target = brt.allocate(64, hrx.HOST_VISIBLE, "target")
    other = _fill_step(brt, brt.allocate(64, hrx.HOST_VISIBLE, "other"))
    outcome: list[object] = []

    def host_function(array: np.ndarray[Any, Any]) -> None:
        array[:] = 1
        try:
            outcome.append(_blocking_calls(brt, target, other)[call]())
        except hrx.ContractError as exc:
            outcome.append(exc)
        # Calls that do not block still work from here.
        outcome.append(brt.statistics().submissions)

    graph = brt.graph("host")
    graph.host(host_function, [(target.view(), hrx.Access.WRITE)])
    completion = _prepared(graph).submit()
    assert _settled(brt, completion)
    completion.result()
    refusal, submissions = outcome
    assert isinstance(refusal, hrx.ContractError)
    assert "cannot run in a host function or kernel of this runtime" in str(refusal)
    assert submissions == (2 if call == "wait" else 1)  # submitting does not block
    assert brt.read(target) == bytes([1]) * 64
    brt.close()


@pytest.mark.parametrize("loop", LOOPS)
def test_blocking_in_sim_gpu_and_npu_kernels_refuses(loop: str) -> None:
    brt = BlockingRuntime(backend="sim", async_backend=loop)
    device = brt.allocate(64, hrx.GPU_LOCAL)
    npu_memory = brt.allocate(64, hrx.npu_local(0))
    refusals: list[str] = []

    def kernel(arrays: list[np.ndarray[Any, Any]], constants: bytes) -> None:
        try:
            brt.drain()
        except hrx.ContractError as exc:
            refusals.append(str(exc))

    contract = hrx.KernelContract([hrx.Binding(64, hrx.Access.WRITE)])
    source = hrx.KernelSource(host=kernel)
    graph = brt.graph("kernels")
    graph.gpu(brt.load_gpu_kernel(source, "gpu", (1,), (1,), contract), [device.view()])
    graph.npu(brt.npu(0).load_artifact(source, "npu", 1, contract), [npu_memory.view()])
    completion = _prepared(graph).submit()
    assert _settled(brt, completion)
    assert len(refusals) == 2
    assert all("kernel of this runtime" in message for message in refusals)
    brt.close()


@pytest.mark.parametrize("loop", LOOPS)
def test_a_closed_facade_refuses_every_call(loop: str) -> None:
    brt = BlockingRuntime(backend="sim", async_backend=loop)
    host = brt.allocate(64, hrx.HOST_VISIBLE)
    step = _fill_step(brt, host)
    step.run()
    brt.close()
    calls: dict[str, Callable[[], object]] = {
        "statistics": brt.statistics,
        "allocate": lambda: brt.allocate(8, hrx.HOST_VISIBLE),
        "submit": step.submit,
        "run": step.run,
        "read": lambda: brt.read(host),
        "write": lambda: brt.write(host, bytes(64)),
        "map_write": lambda: brt.map_write(host).__enter__(),
        "drain": brt.drain,
        "portal": lambda: brt.portal,
    }

    def refused(outcomes: dict[str, object]) -> None:
        for name, call in calls.items():
            try:
                outcomes[name] = call()
            except hrx.RuntimeClosed:
                outcomes[name] = "closed"
            except Exception as exc:
                outcomes[name] = exc
        brt.close()  # idempotent, from any thread

    outcomes: dict[str, object] = {}
    refused(outcomes)
    assert outcomes == dict.fromkeys(calls, "closed")
    # Threads reuse the idents of dead ones: one with the loop thread's is no loop thread.
    dead = brt._thread.ident
    for _ in range(100):
        matched: list[bool] = []
        outcomes = {}

        def probe(matched: list[bool] = matched, outcomes: dict[str, object] = outcomes) -> None:
            matched.append(threading.get_ident() == dead)
            if matched[0]:
                refused(outcomes)

        thread = threading.Thread(target=probe)
        thread.start()
        thread.join(SETTLE_S)
        if matched[0]:
            break
    else:
        pytest.skip("no new thread reused the loop thread's ident here")
    assert outcomes == dict.fromkeys(calls, "closed")


@pytest.mark.parametrize("loop", LOOPS)
def test_a_mapping_waits_for_another_threads_conflicting_mapping(loop: str) -> None:
    with BlockingRuntime(backend="sim", async_backend=loop) as brt:
        host = brt.allocate(64, hrx.HOST_VISIBLE)
        mapped, release = threading.Event(), threading.Event()
        outcome: list[object] = []

        def reader() -> None:
            with brt.map_read(host.view(0, 32)) as memory:
                mapped.set()
                release.wait(SETTLE_S)
                outcome.append(bytes(memory))

        def writer() -> None:
            try:
                brt.write(host, bytes([5]) * 64)
                outcome.append("written")
            except hrx.HrxError as exc:
                outcome.append(exc)

        holding = threading.Thread(target=reader)
        holding.start()
        assert mapped.wait(SETTLE_S)
        waiting = threading.Thread(target=writer)
        waiting.start()
        _until(lambda: waiting in brt._waiting or not waiting.is_alive())
        assert outcome == []  # the writer neither wrote nor gave up
        release.set()
        holding.join(SETTLE_S)
        waiting.join(SETTLE_S)
        assert outcome == [bytes(32), "written"]
        assert brt.read(host) == bytes([5]) * 64
        # Within one thread a conflict still is Busy at once: waiting would never end.
        with brt.map_read(host), pytest.raises(hrx.Busy):
            brt.write(host, bytes(64))


@pytest.mark.parametrize("loop", LOOPS)
def test_threads_waiting_for_each_others_mappings_get_busy(loop: str) -> None:
    with BlockingRuntime(backend="sim", async_backend=loop) as brt:
        x = brt.allocate(64, hrx.HOST_VISIBLE, "x")
        y = brt.allocate(64, hrx.HOST_VISIBLE, "y")
        holds_x, done = threading.Event(), threading.Event()
        outcome: list[object] = []

        def first() -> None:
            with brt.map_write(x):
                holds_x.set()
                outcome.append(brt.read(y))  # waits for the main thread's mapping of y
            done.set()

        with brt.map_write(y):
            thread = threading.Thread(target=first)
            thread.start()
            assert holds_x.wait(SETTLE_S)
            _until(lambda: thread in brt._waiting)
            with pytest.raises(hrx.Busy, match="waits for one of this thread's"):
                brt.read(x)
        assert done.wait(SETTLE_S)
        thread.join(SETTLE_S)
        assert outcome == [bytes(64)]


def _until(condition: Callable[[], bool]) -> None:
    """Poll a condition another thread makes true (bounded, so a bug fails, never hangs)."""
    deadline = time.monotonic() + SETTLE_S
    while not condition():
        assert time.monotonic() < deadline, "the other thread never got there"
        time.sleep(0.001)
