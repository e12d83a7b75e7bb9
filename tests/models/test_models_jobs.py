"""Jobs: capacity and Busy, coroutines and blocking callables, callbacks exactly once,
cancellation reported after the work returns, errors reported."""

from __future__ import annotations

import gc
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hrx_async as hrx
import hrx_async.models

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

    async with hrx.models.Jobs(workers=2, capacity=4) as jobs:
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

    async with hrx.models.Jobs(workers=1, capacity=2) as jobs:
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
            hrx.models.Jobs(workers, capacity)  # type: ignore[arg-type]
    with pytest.raises(hrx.RuntimeClosed):
        hrx.models.Jobs(1, 1).submit(print)
    async with hrx.models.Jobs(1, 1) as jobs:
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

    async with hrx.models.Jobs(1, 2) as jobs:
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


async def test_a_cancelled_owner_skips_the_jobs_that_have_not_started() -> None:
    ran: list[int] = []
    settled: list[hrx.models.Job] = []

    async def work(i: int) -> int:
        ran.append(i)
        if i == 0:
            owner.cancel()  # while the owner waits in `async with`'s exit
        await anyio.sleep(0.05)
        return i

    with anyio.fail_after(5), anyio.CancelScope() as owner:
        async with hrx.models.Jobs(1, 21) as jobs:
            submitted = [jobs.submit(work, i, callback=settled.append) for i in range(20)]
            submitted.append(jobs.submit(work(20)))  # an awaitable, queued too
    assert owner.cancelled_caught
    assert ran == [0] and submitted[0].result() == 0
    assert all(job.cancelled() for job in submitted[1:])
    assert sorted(job.ident for job in settled) == list(range(1, 21))
    assert (jobs.succeeded, jobs.cancelled, jobs.failed) == (1, 20, 0)


class Stop(BaseException):
    """Not an Exception: like SystemExit, it must reach the owner of the jobs."""


async def test_a_job_raising_a_base_exception_stops_the_jobs_and_reaches_the_owner() -> None:
    stop = Stop("stop")
    seen: list[BaseException | None] = []

    def stopping() -> None:
        raise stop

    with anyio.fail_after(5), pytest.raises(Stop) as raised:
        async with hrx.models.Jobs(1, 3) as jobs:
            first = jobs.submit(stopping, callback=lambda j: seen.append(j.exception()))
            queued = jobs.submit(time.sleep, 0)
            await anyio.sleep_forever()  # the block is cancelled, like a task group's
    assert raised.value is stop
    assert isinstance(first.exception(), hrx.Cancelled) and first.exception().__cause__ is stop
    assert seen == [first.exception()] and queued.cancelled()
    with pytest.raises(hrx.RuntimeClosed):
        jobs.submit(time.sleep, 0)


async def test_a_thread_job_raising_system_exit_reaches_only_the_owner(anyio_backend: str) -> None:
    script = textwrap.dedent(
        """
        import sys, anyio, hrx_async as hrx, hrx_async.models

        def leave():
            raise SystemExit(3)

        async def main():
            try:
                async with hrx.models.Jobs(1, 2) as jobs:
                    job = jobs.submit(leave)
                    await anyio.sleep_forever()
            except SystemExit as exc:
                print("owner", exc.code, type(job.exception()).__name__)

        anyio.run(main, backend=sys.argv[1])
        print("after run")
        """
    )
    with anyio.fail_after(60):
        done = await anyio.run_process([sys.executable, "-c", script, anyio_backend], check=False)
    assert (done.returncode, done.stdout.decode().split()) == (
        0,
        ["owner", "3", "Cancelled", "after", "run"],
    ), done.stderr.decode()


async def test_refused_and_skipped_coroutines_are_closed() -> None:
    async def work(x: int) -> int:
        return x

    def refused(submit: Callable[[], object]) -> bool:
        try:
            submit()
        except (hrx.Busy, hrx.ContractError, hrx.RuntimeClosed):
            return True
        return False

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gate = anyio.Event()
        async with hrx.models.Jobs(1, 2) as jobs:
            jobs.submit(gate.wait)
            assert refused(lambda: jobs.submit(work(1), 2))
            assert refused(lambda: jobs.submit(work(1), callback=7))  # type: ignore[arg-type]
            jobs.submit(work(2)).cancel()
            jobs.submit(work(3))
            assert refused(lambda: jobs.submit(work(4)))
            assert refused(lambda: jobs.submit(work, 4))
            gate.set()
        assert refused(lambda: jobs.submit(work(5)))
        assert refused(lambda: jobs.submit(work, 5))
        with anyio.CancelScope() as owner:
            async with hrx.models.Jobs(1, 2) as jobs:
                jobs.submit(anyio.sleep, 0.01)
                jobs.submit(work(6))
                owner.cancel()
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == []


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

    def on_done(job: hrx.models.Job) -> None:
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
    submitted: list[tuple[hrx.models.Job, str, bool]] = []
    async with hrx.models.Jobs(workers, max(workers, len(plan))) as jobs:
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
