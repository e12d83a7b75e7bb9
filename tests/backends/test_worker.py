"""The worker queue behind the sim backend and the host lane: its programs' lifetime."""

from __future__ import annotations

import gc
import threading
import weakref

from hrx_async.backends.worker import ThreadFence, WorkerQueue
from hrx_async.errors import Cancelled, ContractError


class Program:
    native_graph = False

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.gate = gate

    def run(self) -> None:
        if self.gate is not None:
            self.gate.wait(10)


def test_a_program_is_let_go_before_its_fence_finishes() -> None:
    """Whoever awaits a fence may drop the last handle to what the program reads the moment
    the fence finishes (a buffer, through the program's views): the worker must hold
    nothing of it by then, or a collection in between finds the buffer still alive."""
    worker = WorkerQueue("hrx-test-worker")
    try:
        gate = threading.Event()
        worker.submit(Program(gate), (), None)  # holds the worker until the fence is watched
        program = Program()
        alive = weakref.ref(program)
        fence = worker.submit(program, (), None)
        del program
        seen: list[bool] = []
        called = threading.Event()

        def on_done(finished: ThreadFence) -> None:  # on the worker, inside `finish`
            gc.collect()
            seen.append(alive() is not None)
            called.set()

        fence.add_done_callback(on_done)
        gate.set()
        assert called.wait(10)
        assert seen == [False]
        assert fence.error() is None and not fence.skipped()
    finally:
        worker.close()


def test_a_refused_item_finishes_skipped_or_failed_without_running() -> None:
    worker = WorkerQueue("hrx-test-worker")
    try:
        ran: list[str] = []

        class Counting(Program):
            def run(self) -> None:
                ran.append("ran")

        cancelled = worker.submit(Counting(), (), lambda: Cancelled("cancelled"))
        refusal = ContractError("refused by its last check")
        refused = worker.submit(Counting(), (), lambda: refusal)
        assert cancelled.wait(10) and refused.wait(10)
        assert cancelled.skipped() and cancelled.error() is None
        assert refused.error() is refusal and not refused.skipped()
        assert ran == []
    finally:
        worker.close()
