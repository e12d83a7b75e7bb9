"""Jobs: capacity and Busy, coroutines and blocking callables, callbacks exactly once,
cancellation reported after the work returns, errors reported."""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hrx_async as hrx

pytestmark = pytest.mark.anyio


async def test_blocking_jobs_run_on_worker_threads_and_coroutines_on_the_loop() -> None:
    loop_thread = threading.get_ident()
    threads: dict[str, int] = {}

    def blocking(x: int) -> int:
        threads["blocking"] = threading.get_ident()
        time.sleep(0.005)
        return x * 2

    async def coroutine(x: int) -> int:
        threads["coroutine"] = threading.get_ident()
        await anyio.sleep(0)
        return x + 1

    async with hrx.Jobs(workers=2, capacity=4) as jobs:
        a = jobs.submit(blocking, 5)
        b = jobs.submit(coroutine, 5)
        assert await a == 10 and await b == 6
        assert threads["blocking"] != loop_thread and threads["coroutine"] == loop_thread
        assert await jobs.run(blocking, 1) == 2
    assert (jobs.submitted, jobs.succeeded, jobs.failed, jobs.cancelled) == (3, 3, 0, 0)


async def test_capacity_busy_and_errors() -> None:
    gate = anyio.Event()

    async def wait_gate() -> str:
        await gate.wait()
        return "ok"

    async with hrx.Jobs(workers=1, capacity=2) as jobs:
        first = jobs.submit(wait_gate)
        second = jobs.submit(wait_gate)
        with pytest.raises(hrx.Busy):
            jobs.submit(wait_gate)
        assert jobs.pending == 2 and jobs.submitted == 2
        with pytest.raises(hrx.Busy):
            first.result()
        gate.set()
        assert await first == "ok" and await second == "ok"

        def fails() -> None:
            raise KeyError("boom")

        failing = jobs.submit(fails)
        with pytest.raises(KeyError):
            await failing
        assert isinstance(failing.exception(), KeyError)
    assert jobs.failed == 1
    with pytest.raises(hrx.RuntimeClosed):
        jobs.submit(fails)


async def test_bad_input() -> None:
    for workers, capacity in ((0, 1), (2, 1), (True, 2), (1.0, 2), (1, "2")):
        with pytest.raises(hrx.ContractError):
            hrx.Jobs(workers, capacity)  # type: ignore[arg-type]
    with pytest.raises(hrx.RuntimeClosed):
        hrx.Jobs(1, 1).submit(print)
    async with hrx.Jobs(1, 1) as jobs:
        with pytest.raises(hrx.ContractError):
            jobs.submit(42)
        with pytest.raises(hrx.ContractError):
            jobs.submit(print, callback=7)  # type: ignore[arg-type]
        assert jobs.submitted == 0


async def test_a_running_job_cancelled_reports_after_its_work_returns() -> None:
    returned = threading.Event()
    release = threading.Event()
    seen: list[tuple[bool, Any]] = []

    def work() -> str:
        release.wait(5)
        returned.set()
        return "value"

    async with hrx.Jobs(1, 2) as jobs:
        job = jobs.submit(work, callback=lambda j: seen.append((returned.is_set(), j.exception())))
        queued = jobs.submit(work)
        await anyio.sleep(0.01)
        assert job.cancel() and queued.cancel()
        assert queued.cancelled() and not job.done()
        release.set()
        with pytest.raises(hrx.Cancelled):
            await job
    assert seen[0][0] is True and isinstance(seen[0][1], hrx.Cancelled)
    assert not job.cancel()


@settings(max_examples=30, deadline=None)
@given(
    plan=st.lists(
        st.tuples(st.sampled_from(["thread", "coro", "fail"]), st.integers(0, 3), st.booleans()),
        min_size=1,
        max_size=12,
    ),
    workers=st.integers(1, 3),
)
async def test_callback_exactly_once_under_random_cancellation(
    plan: list[tuple[str, int, bool]], workers: int
) -> None:
    calls: dict[int, int] = {}
    finished: set[int] = set()

    def on_done(job: hrx.Job) -> None:
        calls[job.ident] = calls.get(job.ident, 0) + 1

    def blocking(i: int, delay: int) -> int:
        time.sleep(delay / 1000)
        finished.add(i)
        return i

    async def coro(i: int, delay: int) -> int:
        await anyio.sleep(delay / 1000)
        finished.add(i)
        return i

    def fail(i: int, delay: int) -> int:
        finished.add(i)
        raise ValueError(i)

    kinds = {"thread": blocking, "coro": coro, "fail": fail}
    submitted: list[tuple[hrx.Job, str, bool]] = []
    async with hrx.Jobs(workers, max(workers, len(plan))) as jobs:
        for i, (kind, delay, cancel) in enumerate(plan):
            submitted.append((jobs.submit(kinds[kind], i, delay, callback=on_done), kind, cancel))
        for job, _, cancel in submitted:
            if cancel:
                await anyio.sleep(0.001)
                job.cancel()
    for index, (job, kind, cancel) in enumerate(submitted):
        assert calls[job.ident] == 1
        error = job.exception()
        if isinstance(error, hrx.Cancelled):
            assert cancel
            # a job that started ran to the end before reporting Cancelled
        elif kind == "fail":
            assert isinstance(error, ValueError) and index in finished
        else:
            assert error is None and job.result() == index and index in finished
    assert jobs.succeeded + jobs.failed + jobs.cancelled == len(plan)
