"""Native sessions (`Runtime.native_session`): the original's four scenarios, on sim, under
asyncio and trio (its `native_session.rs` tests and `scheduler/tests.rs`'s
`native_waiter_runs_after_prior_submissions_before_later_compute`)."""

from __future__ import annotations

import gc
import threading
import weakref
from typing import Any

import anyio
import numpy as np
import pytest

import hrx_async as hrx

pytestmark = pytest.mark.anyio


class State:
    """A third-party model's private state (weak-referenceable, to see when it is dropped)."""

    def __init__(self) -> None:
        self.fenced = 0


def _fence(state: State) -> None:
    state.fenced += 1


async def test_borrowed_stages_drain_errors_and_panics_then_reuse() -> None:
    """`borrowed_stages_drain_errors_and_panics_then_reuse`: a stage that sets a borrowed
    variable to 42 and returns a client error gives that error back as its value; a raising
    stage raises; a stage returning 7 gives 7; the fence ran after each (3 times)."""
    async with hrx.Runtime(backend="sim", npu=None) as rt:
        state = State()
        session = rt.native_session(state, _fence)
        borrowed = {"value": 0}

        def client_error(s: State) -> Exception:
            borrowed["value"] = 42
            return ValueError("client error")

        def panics(s: State) -> None:
            raise RuntimeError("stage panicked")

        result = await session.run(client_error)
        assert isinstance(result, ValueError) and borrowed["value"] == 42
        with pytest.raises(RuntimeError, match="stage panicked"):
            await session.run(panics)
        assert await session.run(lambda s: 7) == 7
        assert state.fenced == 3
        assert not session.quarantined and session.state is state


@pytest.mark.parametrize("failure", ["error", "panic"])
async def test_uncertain_fences_keep_owners_and_reject_retry(failure: str) -> None:
    """`uncertain_fences_keep_owners_and_reject_retry`: the failing run raises; the next run
    is `DeviceLost` without calling its stage; the fence ran once; the state is never
    dropped, even after the session is; a new session on the same runtime works."""
    calls = {"fence": 0, "stage": 0}

    def failing_fence(state: State) -> None:
        calls["fence"] += 1
        raise (OSError("stream drain failed") if failure == "error" else RuntimeError("boom"))

    def stage(state: State) -> None:
        calls["stage"] += 1

    async with hrx.Runtime(backend="sim", npu=None) as rt:
        state = State()
        dropped = weakref.ref(state)
        session = rt.native_session(state, failing_fence)
        del state
        with pytest.raises(hrx.ExecutionError) as caught:
            await session.run(stage)
        assert isinstance(caught.value.__cause__, OSError | RuntimeError)
        with pytest.raises(hrx.DeviceLost, match="quarantined"):
            await session.run(stage)
        with pytest.raises(hrx.DeviceLost):
            session.state  # noqa: B018
        assert calls == {"fence": 1, "stage": 1}
        del session
        gc.collect()
        assert dropped() is not None  # kept on purpose: the device may still use it
        again = rt.native_session(State(), _fence)
        assert await again.run(lambda s: "fine") == "fine"
        assert rt.healthy


def test_recursive_admission_returns_busy_instead_of_deadlocking(anyio_backend: str) -> None:
    """`recursive_admission_returns_busy_instead_of_deadlocking`: `inner.run` inside
    `outer.run` (same runtime) gives `Busy` at once; afterwards `inner.run` works."""
    with hrx.BlockingRuntime(backend="sim", npu=None, async_backend=anyio_backend) as brt:
        outer = brt.native_session(State(), _fence)
        inner = brt.native_session(State(), _fence)

        def nested(state: State) -> BaseException | None:
            try:
                inner.run(lambda s: None)
            except hrx.Busy as exc:
                return exc
            return None

        result = outer.run(nested)
        assert isinstance(result, hrx.Busy) and "recursive" in str(result)
        assert inner.run(lambda s: 5) == 5


async def test_native_waiter_runs_after_prior_submissions_before_later_compute() -> None:
    """`native_waiter_runs_after_prior_submissions_before_later_compute`: with GPU submission
    A (writing X) blocked, a stage waits (two pending: A and the stage); B (writing an
    unrelated Y on the compute lane) is submitted after it; releasing A starts the stage with
    A complete and B not; releasing the stage lets B run. Order: A, stage, B."""
    order: list[str] = []
    release_a, release_stage = threading.Event(), threading.Event()
    stage_started = threading.Event()

    def kernel_a(arrays: list[np.ndarray[Any, Any]], constants: bytes) -> None:
        assert release_a.wait(10)
        arrays[0][:] = 1
        order.append("A")

    def kernel_b(arrays: list[np.ndarray[Any, Any]], constants: bytes) -> None:
        arrays[0][:] = 2
        order.append("B")

    async with hrx.Runtime(backend="sim", npu=None) as rt:
        x, y = rt.allocate(64, hrx.GPU_LOCAL), rt.allocate(64, hrx.GPU_LOCAL)
        contract = hrx.KernelContract([hrx.Binding(64, hrx.Access.WRITE)])
        graphs = []
        for name, fn, view in (("a", kernel_a, x), ("b", kernel_b, y)):
            kernel = rt.load_gpu_kernel(hrx.KernelSource(host=fn), name, (1,), (1,), contract)
            g = rt.graph(name)
            g.gpu(kernel, [view.view()])
            graphs.append(g.prepare())
        session = rt.native_session(State(), _fence)

        def stage(state: State) -> None:
            stage_started.set()
            order.append("stage")
            assert release_stage.wait(10)

        a = graphs[0].submit()
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(session.run, stage)
            with anyio.fail_after(10):
                while rt._scheduler_or_raise().live < 2:  # A and the waiting stage
                    await anyio.sleep(0.001)
            b = graphs[1].submit()
            await anyio.sleep(0.02)
            assert order == [] and not stage_started.is_set()
            release_a.set()
            await a
            with anyio.fail_after(10):
                while not stage_started.is_set():
                    await anyio.sleep(0.001)
            c = graphs[1].submit()  # compute work admitted while the stage holds the lane
            await anyio.sleep(0.02)
            assert not b.done() and not c.done() and order == ["A", "stage"]
            release_stage.set()
        await b
        await c
        assert order == ["A", "stage", "B", "B"]


async def test_a_full_runtime_refuses_a_stage_and_a_cancelled_waiter_skips_it() -> None:
    """Stages count against `max_submissions` (`Busy`, the stage not called); a waiter
    cancelled before its stage started skips it; a started stage always finishes."""
    release = threading.Event()

    def hold(arrays: list[np.ndarray[Any, Any]], constants: bytes) -> None:
        assert release.wait(10)

    async with hrx.Runtime(backend="sim", npu=None, max_submissions=2) as rt:
        x = rt.allocate(64, hrx.GPU_LOCAL)
        contract = hrx.KernelContract([hrx.Binding(64, hrx.Access.WRITE)])
        kernel = rt.load_gpu_kernel(hrx.KernelSource(host=hold), "hold", (1,), (1,), contract)
        g = rt.graph("blocked")
        g.gpu(kernel, [x.view()])
        blocked = g.prepare().submit()
        state = State()
        session = rt.native_session(state, _fence)
        ran: list[int] = []
        with anyio.move_on_after(0.05):
            await session.run(lambda s: ran.append(1))  # waits behind `blocked`: cancelled
        other = g.prepare().submit()
        with pytest.raises(hrx.Busy, match="capacity"):
            await session.run(lambda s: ran.append(2))
        release.set()
        await blocked
        await other
        assert ran == [] and state.fenced == 0
        assert await session.run(lambda s: ran.append(3)) is None
        assert ran == [3] and state.fenced == 1
