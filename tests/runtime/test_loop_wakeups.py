"""How a task parked on a completion is woken on trio: it reads the runtime's wake-up socket
itself (while no other task does), so a fence that finishes on a worker thread resumes it in
the loop pass that hears of it, without trio's entry-queue task in between. Every way a
completion can finish must still wake it: a post from a worker thread, a cancel on the loop,
the work of another submission; and a leader that is cancelled hands the socket back.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import anyio
import numpy as np
import pytest
import trio

import hrx_async as hrx
from hrx_async._runtime.notify import LoopNotifier

pytestmark = pytest.mark.anyio


class TaskSteps(trio.abc.Instrument):
    """Counts the steps of trio's entry-queue task (what runs `run_sync_soon` calls)."""

    def __init__(self) -> None:
        self.entry_queue_steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if "run_sync_soon" in task.name:
            self.entry_queue_steps += 1


def _fill(rt: hrx.Runtime) -> hrx.PreparedGraph:
    graph = rt.graph("fill")
    graph.fill(rt.allocate(4096, hrx.GPU_LOCAL).view(), 7)
    return graph.prepare()


def _blocked_host_graph(rt: hrx.Runtime, gate: threading.Event) -> hrx.PreparedGraph:
    """A graph whose one host function runs until `gate` is set."""
    graph = rt.graph("blocked")

    def wait_for_gate(array: np.ndarray) -> None:
        gate.wait(timeout=30)

    graph.host(wait_for_gate, [(rt.allocate(64, hrx.HOST_VISIBLE).view(), hrx.Access.WRITE)])
    return graph.prepare()


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_worker_fences_wake_the_awaiting_task_without_trios_entry_queue(
    anyio_backend: str,
) -> None:
    async with hrx.Runtime(backend="sim") as rt:
        prepared = _fill(rt)
        await prepared.submit()
        steps = TaskSteps()
        trio.lowlevel.add_instrument(steps)
        try:
            for _ in range(50):
                await prepared.submit()
        finally:
            trio.lowlevel.remove_instrument(steps)
    # Each of the 50 fills finished on a sim worker thread. Through `run_sync_soon` each
    # would have stepped the entry-queue task at least once.
    assert steps.entry_queue_steps < 5


async def test_every_awaiting_task_is_woken_when_many_await_at_once(anyio_backend: str) -> None:
    async with hrx.Runtime(backend="sim") as rt:
        graphs = [_fill(rt) for _ in range(8)]
        finished: list[int] = []

        async def replay(index: int) -> None:
            for _ in range(20):
                await graphs[index].submit()
            finished.append(index)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tasks:
                for index in range(len(graphs)):
                    tasks.start_soon(replay, index)
        assert sorted(finished) == list(range(len(graphs)))


async def test_a_cancel_on_the_loop_wakes_the_task_awaiting_it(anyio_backend: str) -> None:
    # max_submissions=1: the second submission waits for admission behind the blocked one,
    # so its cancel resolves it on the loop, with no post from any thread.
    gate = threading.Event()
    async with hrx.Runtime(backend="sim", max_submissions=1) as rt:
        blocked = _blocked_host_graph(rt, gate).submit()
        waiting = _fill(rt).submit()
        outcome: list[Any] = []

        async def await_waiting() -> None:
            try:
                await waiting
            except hrx.Cancelled as exc:
                outcome.append(exc)

        try:
            with anyio.fail_after(10):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(await_waiting)
                    await anyio.sleep(0.05)  # parked on it by now
                    assert waiting.cancel()
            assert len(outcome) == 1
            assert not blocked.done()  # woken by the cancel, not by the other's end
        finally:
            gate.set()
        await blocked


async def test_a_cancelled_waiter_leaves_the_wake_ups_to_the_next(anyio_backend: str) -> None:
    gate = threading.Event()
    async with hrx.Runtime(backend="sim") as rt:
        blocked = _blocked_host_graph(rt, gate).submit()
        with anyio.move_on_after(0.05) as scope:
            await blocked  # parks (on trio: reads the wake-up socket) until cancelled
        assert scope.cancelled_caught and not blocked.done()
        gate.set()
        with anyio.fail_after(10):
            await blocked
            for _ in range(20):  # and later fences still reach the loop
                await _fill(rt).submit()


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_the_runtime_closes_its_wake_up_socket(anyio_backend: str) -> None:
    async with hrx.Runtime(backend="sim") as rt:
        prepared = _fill(rt)
        for _ in range(5):
            await prepared.submit()
        wake_fd = rt._scheduler_or_raise().notifier.wake_fd
        os.fstat(wake_fd)  # open while the runtime is
    with pytest.raises(OSError):
        os.fstat(wake_fd)


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_task_awaiting_across_the_runtimes_exit_is_woken_normally(
    anyio_backend: str,
) -> None:
    gate = threading.Event()
    woken: list[bool] = []
    async with anyio.create_task_group() as tasks, hrx.Runtime(backend="sim") as rt:
        blocked = _blocked_host_graph(rt, gate).submit()

        async def await_blocked() -> None:
            await blocked
            woken.append(True)

        tasks.start_soon(await_blocked)
        await anyio.sleep(0.05)  # that task waits on the wake-up socket now
        wake_fd = rt._scheduler_or_raise().notifier.wake_fd
        gate.set()
        # The runtime's exit drained the work; the task's wait must end normally, not fail
        # on a socket closed under it.
    assert woken == [True]
    with pytest.raises(OSError):
        os.fstat(wake_fd)


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_posts_reach_the_leader_through_the_socket_and_others_through_trio(
    anyio_backend: str,
) -> None:
    notifier = LoopNotifier()
    ran: list[str] = []
    try:
        assert notifier.lead()
        assert not notifier.lead()  # one task at a time
        poster = threading.Thread(target=notifier.post, args=(ran.append, "to the leader"))
        poster.start()
        with anyio.fail_after(5):
            await trio.lowlevel.wait_readable(notifier.wake_fd)
        poster.join()
        assert ran == []  # posted calls run on the loop thread, in `woken`
        notifier.woken()
        assert ran == ["to the leader"]
        notifier.post(ran.append, "left for the next")
        notifier.step_down()  # what went to the socket runs as the leader leaves
        assert ran == ["to the leader", "left for the next"]
        notifier.post(ran.append, "through trio")
        with anyio.fail_after(5):
            while len(ran) < 3:
                await trio.lowlevel.checkpoint()
        assert ran[2] == "through trio"
    finally:
        notifier.close()


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_closing_while_a_task_leads_keeps_the_socket_until_it_steps_down(
    anyio_backend: str,
) -> None:
    notifier = LoopNotifier()
    assert notifier.lead()
    wake_fd = notifier.wake_fd
    notifier.close()
    os.fstat(wake_fd)  # still open: a task waits on it, and closing would fail its wait
    notifier.step_down()
    with pytest.raises(OSError):
        os.fstat(wake_fd)
