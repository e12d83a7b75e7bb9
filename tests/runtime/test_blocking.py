"""BlockingRuntime: the runtime from synchronous code and many threads at once."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np
import pytest

import hrx_async as hrx
from hrx_async.blocking import BlockingPreparedGraph, BlockingRuntime

LOOPS = ["asyncio", "trio"]


def hrx_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("hrx-")]


def affine_kernel(arrays: list[np.ndarray[Any, Any]], constants: bytes) -> None:
    arrays[1].view(np.int32)[:] = arrays[0].view(np.int32) * 3 + 7


def build_affine(brt: BlockingRuntime, n: int) -> tuple[hrx.Buffer, BlockingPreparedGraph]:
    host = brt.allocate(n * 4, hrx.HOST_VISIBLE, "host")
    x = brt.allocate(n * 4, hrx.GPU_LOCAL, "x")
    y = brt.allocate(n * 4, hrx.GPU_LOCAL, "y")
    kernel = brt.load_gpu_kernel(
        hrx.KernelSource(host=affine_kernel),
        "affine",
        (n // 256,),
        (256,),
        hrx.KernelContract(
            [hrx.Binding(n * 4, hrx.Access.READ), hrx.Binding(n * 4, hrx.Access.WRITE)]
        ),
    )
    graph = brt.graph("affine")
    graph.copy(x.view(), host.view())
    graph.gpu(kernel, [x.view(), y.view()])
    graph.copy(host.view(), y.view())
    prepared = graph.prepare()
    assert isinstance(prepared, BlockingPreparedGraph)
    return host, prepared


@pytest.mark.parametrize("loop", LOOPS)
def test_round_trip_from_synchronous_code(loop: str) -> None:
    n = 1024
    with BlockingRuntime(backend="sim", async_backend=loop) as brt:
        host, step = build_affine(brt, n)
        brt.write(host, np.arange(n, dtype=np.int32).tobytes())
        step.run()
        out = np.frombuffer(brt.read(host), np.int32)
        np.testing.assert_array_equal(out, np.arange(n) * 3 + 7)
        completion = step.submit()
        assert completion.wait(10)
        completion.result()
        with brt.map_read(host.view(0, 16)) as memory:
            assert np.frombuffer(memory, np.int32).tolist() == [28, 37, 46, 55]  # twice
        stats = brt.statistics()
        assert stats.submissions == stats.completions == 2
        assert brt.healthy and brt.backend_name == "sim"
    assert brt.closed
    assert hrx_threads() == []


@pytest.mark.parametrize("loop", LOOPS)
def test_eight_threads_and_the_loop_interleave_in_admission_order(loop: str) -> None:
    """Every submission increments one shared counter after a pause, so two that overlap
    lose an update. Each thread's graph and the loop's graph log the value they saw."""
    threads, per_thread, loop_submissions = 8, 20, 40
    log: list[tuple[str, int]] = []

    def counting(tag: str) -> Callable[[list[np.ndarray[Any, Any]], bytes], None]:
        def kernel(arrays: list[np.ndarray[Any, Any]], constants: bytes) -> None:
            counter = arrays[0].view(np.int64)
            seen = int(counter[0])
            time.sleep(0.0001)
            counter[0] = seen + 1
            log.append((tag, seen))

        return kernel

    contract = hrx.KernelContract([hrx.Binding(8, hrx.Access.READ_WRITE)])
    with BlockingRuntime(backend="sim", async_backend=loop) as brt:
        counter = brt.allocate(8, hrx.HOST_VISIBLE, "counter")
        steps: list[BlockingPreparedGraph] = []
        for t in range(threads):
            kernel = brt.load_gpu_kernel(
                hrx.KernelSource(host=counting(f"t{t}")), f"count{t}", (1,), (1,), contract
            )
            graph = brt.graph(f"thread{t}")
            graph.gpu(kernel, [counter.view()])
            steps.append(graph.prepare())  # type: ignore[arg-type]

        def host_increment(counter_bytes: np.ndarray[Any, Any]) -> None:
            counting("loop")([counter_bytes], b"")

        loop_graph = brt.graph("loop")
        loop_graph.host(host_increment, [(counter.view(), hrx.Access.READ_WRITE)])
        loop_step = loop_graph.prepare()

        async def loop_side() -> None:
            # Runs on the runtime's own loop: plain awaits, no portal.
            pending = []
            for index in range(loop_submissions):
                pending.append(loop_step.submit())
                if index % 4 == 3:
                    await pending[-1]
                await anyio.sleep(0)
            for completion in pending:
                await completion

        errors: list[BaseException] = []
        start = threading.Barrier(threads + 1)

        def worker(t: int) -> None:
            try:
                start.wait()
                completions = []
                for index in range(per_thread):
                    if index % 3 == 0:
                        steps[t].run()
                    else:
                        completions.append(steps[t].submit())
                for completion in completions:
                    assert completion.wait(30)
                    completion.result()
            except BaseException as exc:
                errors.append(exc)

        pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
        for thread in pool:
            thread.start()
        loop_future = brt.portal.start_task_soon(loop_side)
        start.wait()
        for thread in pool:
            thread.join(60)
        loop_future.result(60)
        brt.drain()
        assert errors == []
        total = threads * per_thread + loop_submissions
        assert np.frombuffer(brt.read(counter), np.int64)[0] == total
        stats = brt.statistics()
        assert stats.submissions == stats.completions == total
    # No two submissions overlapped: the values seen are 0..total-1 in execution order.
    assert [seen for _, seen in log] == list(range(total))
    # Each submitter's own submissions ran in the order it made them.
    for tag in [f"t{t}" for t in range(threads)] + ["loop"]:
        mine = [seen for who, seen in log if who == tag]
        assert mine == sorted(mine) and len(mine) == (
            loop_submissions if tag == "loop" else per_thread
        )
    assert len({who for who, _ in log}) == threads + 1
    assert hrx_threads() == []


def test_failures_and_closed_runtime_raise_clearly() -> None:
    def broken(arrays: list[np.ndarray[Any, Any]], constants: bytes) -> None:
        raise ValueError("kernel exploded")

    brt = BlockingRuntime(backend="sim")
    scratch = brt.allocate(64, hrx.GPU_LOCAL)
    kernel = brt.load_gpu_kernel(
        hrx.KernelSource(host=broken),
        "broken",
        (1,),
        (1,),
        hrx.KernelContract([hrx.Binding(64, hrx.Access.WRITE)]),
    )
    graph = brt.graph("broken")
    graph.gpu(kernel, [scratch.view()])
    step = graph.prepare()
    with pytest.raises(hrx.ExecutionError, match="region 0") as info:
        step.run()  # type: ignore[attr-defined]
    assert isinstance(info.value.__cause__, ValueError)
    with pytest.raises(hrx.ContractError, match="write\\(\\) needs 64 bytes"):
        brt.write(brt.allocate(64, hrx.HOST_VISIBLE), b"short")
    with pytest.raises(hrx.Unsupported):
        brt.read(scratch)
    brt.close()
    brt.close()  # idempotent
    for call in (lambda: brt.allocate(8, hrx.HOST_VISIBLE), step.submit, brt.statistics):
        with pytest.raises(hrx.RuntimeClosed):
            call()
    with pytest.raises(hrx.RuntimeClosed):
        _ = brt.portal
    assert hrx_threads() == []


def test_blocking_calls_refuse_on_the_loop_thread() -> None:
    with BlockingRuntime(backend="sim") as brt:
        host, step = build_affine(brt, 256)

        async def on_loop() -> list[str]:
            refused = []
            for name, call in (
                ("run", step.run),
                ("read", lambda: brt.read(host)),
                ("drain", brt.drain),
                ("close", brt.close),
            ):
                try:
                    call()
                except hrx.ContractError as exc:
                    assert "cannot run on the runtime's loop" in str(exc)
                    refused.append(name)
            # Non-blocking calls run directly on the loop thread.
            await step.submit()
            return refused

        assert brt.portal.call(on_loop) == ["run", "read", "drain", "close"]
        assert brt.statistics().completions == 1


@pytest.mark.parametrize("backend", ["cuda", "hip"])
def test_open_failure_raises_in_the_caller_and_leaves_no_thread(backend: str) -> None:
    from conftest import usable_backends

    if backend in usable_backends():
        pytest.skip(f"{backend} is usable here, so opening it does not fail")
    with pytest.raises(hrx.BackendUnavailable):
        BlockingRuntime(backend=backend)
    assert hrx_threads() == []


def test_bad_loop_name_is_refused() -> None:
    with pytest.raises(hrx.ContractError, match="asyncio, trio"):
        BlockingRuntime(backend="sim", async_backend="curio")
    assert hrx_threads() == []


def test_runtime_left_open_is_drained_at_interpreter_exit(tmp_path: Any) -> None:
    marker = tmp_path / "finished.txt"
    script = textwrap.dedent(
        f"""
        import time
        import hrx_async as hrx

        brt = hrx.BlockingRuntime(backend="sim")
        counter = brt.allocate(8, hrx.HOST_VISIBLE)

        def slow(array):
            time.sleep(0.3)
            with open({str(marker)!r}, "w") as out:
                out.write("done")

        graph = brt.graph("slow")
        graph.host(slow, [(counter.view(), hrx.Access.READ_WRITE)])
        graph.prepare().submit()
        print("leaving without close()")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "leaving without close()" in result.stdout
    assert result.stderr == ""
    assert marker.read_text() == "done"
