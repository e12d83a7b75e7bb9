"""The runtime layer against queues whose fences the test finishes by hand.

The GPU backend is the sim backend with its lane queues replaced by `HandQueue`s: a queue
keeps what the scheduler submits (the program, the fences it must wait for on the device,
the preflight) and runs nothing until the test finishes an item, so each test decides when
device work ends and watches what the scheduler, the completions and the poison book make
of it. The queue is the test double; the session, the scheduler and the completions are the
runtime's own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

import hrx_async as hrx
import hrx_async._runtime.session as session_module
from hrx_async._core.lane import Lane, QueueKey
from hrx_async.backends.sim import SimBackend
from hrx_async.backends.worker import ThreadFence

pytestmark = pytest.mark.anyio


@dataclasses.dataclass
class Item:
    program: Any
    waits: tuple[Any, ...]
    preflight: Any
    fence: ThreadFence
    checked: tuple[BaseException | None] | None = None
    """The preflight's answer, when the queue asked it at submit (as device streams do)."""

    def finish(self, error: BaseException | None = None, run: bool = True) -> None:
        """End the item as a device would: after its waits, asking its preflight first."""
        assert all(wait.query() for wait in self.waits), "finished before what it waits for"
        if self.checked is not None:
            (refusal,) = self.checked
        else:
            refusal = self.preflight() if self.preflight is not None else None
        if isinstance(refusal, hrx.Cancelled):
            self.fence.finish(skipped=True)
        elif refusal is not None:
            self.fence.finish(refusal)
        elif error is None and run:
            self.program.run()
            self.fence.finish()
        else:
            self.fence.finish(error)


class HandQueue:
    def __init__(self, key: QueueKey, check_at_submit: bool = False) -> None:
        self.key = key
        self.items: list[Item] = []
        self.check_at_submit = check_at_submit

    def submit(self, program: Any, waits: Sequence[Any], preflight: Any) -> ThreadFence:
        fence = ThreadFence()
        item = Item(program, tuple(waits), preflight, fence)
        if self.check_at_submit:
            item.checked = (preflight() if preflight is not None else None,)
        self.items.append(item)
        return fence

    def close(self) -> None:
        pass


class HandBackend(SimBackend):
    """The sim backend (memory, programs) whose lane queues the test drives."""

    def __init__(self, check_at_submit: bool = False) -> None:
        super().__init__(npus=0)
        self.hand: dict[QueueKey, HandQueue] = {}
        self.check_at_submit = check_at_submit

    def queue(self, key: QueueKey) -> Any:
        return self.hand.setdefault(key, HandQueue(key, self.check_at_submit))

    def items(self, lane: Lane) -> list[Item]:
        queue = self.hand.get((lane, 0))
        return queue.items if queue is not None else []


@asynccontextmanager
async def hand_runtime(
    monkeypatch: pytest.MonkeyPatch, max_submissions: int = 64, check_at_submit: bool = False
) -> AsyncIterator[tuple[hrx.Runtime, HandBackend]]:
    backend = HandBackend(check_at_submit)
    monkeypatch.setattr(session_module, "open_gpu_backend", lambda name, devices: (backend, []))
    async with hrx.Runtime(npu=None, max_submissions=max_submissions) as rt:
        yield rt, backend


async def settle() -> None:
    """Let the loop run what finishing a fence posted to it."""
    for _ in range(20):
        await anyio.sleep(0)


async def test_a_replay_is_done_when_its_fence_is(monkeypatch: pytest.MonkeyPatch) -> None:
    async with hand_runtime(monkeypatch) as (rt, backend):
        x = rt.allocate(64, hrx.GPU_LOCAL)
        g = rt.graph("fill")
        g.fill(x.view(), 7)
        step = g.prepare()
        c = step.submit()
        await settle()
        assert [len(backend.items(lane)) for lane in (Lane.UPLOAD, Lane.COMPUTE)] == [0, 1]
        assert not c.done()
        backend.items(Lane.COMPUTE)[0].finish()
        with anyio.fail_after(5):
            await c
        assert c.done() and c.exception() is None


async def test_work_on_the_same_bytes_waits_for_the_first_fence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with hand_runtime(monkeypatch) as (rt, backend):
        x = rt.allocate(64, hrx.GPU_LOCAL)
        host = rt.allocate(64, hrx.HOST_VISIBLE)
        fill = rt.graph("fill")
        fill.fill(x.view(), 3)
        download = rt.graph("download")
        download.copy(host.view(), x.view())
        first, second = fill.prepare().submit(), download.prepare().submit()
        await settle()
        (filled,) = backend.items(Lane.COMPUTE)
        queued = backend.items(Lane.DOWNLOAD)
        # Either the download is held back, or it is queued to wait for the fill's fence
        # on the device; never queued free to run first.
        assert queued == [] or [list(item.waits) for item in queued] == [[filled.fence]]
        filled.finish()
        await settle()
        (copied,) = backend.items(Lane.DOWNLOAD)
        assert not second.done()
        copied.finish()
        with anyio.fail_after(5):
            await first
            await second
        async with host.map_read() as memory:
            assert bytes(memory) == b"\x03" * 64


async def test_disjoint_bytes_do_not_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    async with hand_runtime(monkeypatch) as (rt, backend):
        x = rt.allocate(128, hrx.GPU_LOCAL)
        host = rt.allocate(128, hrx.HOST_VISIBLE)
        fill = rt.graph("fill")
        fill.fill(x.view(0, 64), 1)
        download = rt.graph("download")
        download.copy(host.view(64, 64), x.view(64, 64))
        first, second = fill.prepare().submit(), download.prepare().submit()
        await settle()
        (copied,) = backend.items(Lane.DOWNLOAD)
        assert copied.waits == ()
        copied.finish()
        with anyio.fail_after(5):
            await second
        assert not first.done()
        backend.items(Lane.COMPUTE)[0].finish()
        with anyio.fail_after(5):
            await first


async def test_a_failed_fence_fails_the_replay_and_poisons_its_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with hand_runtime(monkeypatch) as (rt, backend):
        x = rt.allocate(64, hrx.GPU_LOCAL)
        host = rt.allocate(64, hrx.HOST_VISIBLE)
        fill = rt.graph("fill")
        fill.fill(x.view(), 9)
        c = fill.prepare().submit()
        await settle()
        backend.items(Lane.COMPUTE)[0].finish(RuntimeError("the kernel faulted"))
        with anyio.fail_after(5), pytest.raises(hrx.ExecutionError) as raised:
            await c
        assert (raised.value.graph, raised.value.region) == ("fill", 0)
        assert str(raised.value.__cause__) == "the kernel faulted"
        assert x.poison is not None
        download = rt.graph("download")
        download.copy(host.view(), x.view())
        with pytest.raises(hrx.PoisonedError):
            await download.prepare().submit()


async def test_cancelling_before_the_device_starts_skips_the_region(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with hand_runtime(monkeypatch) as (rt, backend):
        x = rt.allocate(64, hrx.GPU_LOCAL)
        fill = rt.graph("fill")
        fill.fill(x.view(), 5)
        c = fill.prepare().submit()
        await settle()
        assert c.cancel()
        (item,) = backend.items(Lane.COMPUTE)
        item.finish()  # the preflight refuses it: nothing runs
        assert item.fence.skipped()
        with anyio.fail_after(5), pytest.raises(hrx.Cancelled):
            await c
        assert x.poison is None


async def test_admission_beyond_max_submissions_waits_for_a_fence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with hand_runtime(monkeypatch, max_submissions=1) as (rt, backend):
        x = rt.allocate(64, hrx.GPU_LOCAL)
        fill = rt.graph("fill")
        fill.fill(x.view(), 1)
        step = fill.prepare()
        first = step.submit()
        await settle()
        with pytest.raises(hrx.Busy):
            step.submit_nowait()
        backend.items(Lane.COMPUTE)[0].finish()
        with anyio.fail_after(5):
            await first
        second = step.submit_nowait()
        await settle()
        backend.items(Lane.COMPUTE)[1].finish()
        with anyio.fail_after(5):
            await second


async def test_leaving_the_runtime_waits_for_pending_fences(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    finished: list[str] = []
    async with anyio.create_task_group() as tg:
        async with hand_runtime(monkeypatch) as (rt, backend):
            x = rt.allocate(64, hrx.GPU_LOCAL)
            fill = rt.graph("fill")
            fill.fill(x.view(), 2)
            c = fill.prepare().submit()
            await settle()

            async def device() -> None:
                await anyio.sleep(0.05)
                finished.append("device")
                backend.items(Lane.COMPUTE)[0].finish()

            tg.start_soon(device)
        finished.append("closed")
    assert finished == ["device", "closed"] and c.done()


async def test_cancel_is_false_once_every_region_passed_its_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Queues that check at submit, as device streams do: a chain on one device is issued
    and checked at submit, so cancel() has nothing to skip, says so, and the work runs."""
    async with hand_runtime(monkeypatch, check_at_submit=True) as (rt, backend):
        x, host = rt.allocate(64, hrx.GPU_LOCAL), rt.allocate(64, hrx.HOST_VISIBLE)
        g = rt.graph("chain")
        g.fill(x.view(), 5)
        g.copy(host.view(), x.view())
        c = g.prepare().submit()
        items = backend.items(Lane.COMPUTE) + backend.items(Lane.DOWNLOAD)
        cancelled = c.cancel()
        for item in items:  # (before any assert: the runtime drains them on exit)
            item.finish()
        assert len(items) == 2 and all(item.checked == (None,) for item in items)
        assert not cancelled
        with anyio.fail_after(5):
            await c  # not Cancelled: nothing was skipped
        assert c.exception() is None
        async with host.map_read() as memory:
            assert bytes(memory) == bytes([5]) * 64


async def test_cancel_is_true_for_a_region_issued_but_not_yet_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with hand_runtime(monkeypatch) as (rt, backend):
        x = rt.allocate(64, hrx.GPU_LOCAL)
        fill = rt.graph("fill")
        fill.fill(x.view(), 5)
        c = fill.prepare().submit()
        first, second = c.cancel(), c.cancel()
        (item,) = backend.items(Lane.COMPUTE)
        item.finish()
        assert first
        assert not second  # the first call skipped it already
        assert item.fence.skipped()
        with anyio.fail_after(5), pytest.raises(hrx.Cancelled):
            await c
