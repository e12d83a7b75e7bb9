"""External work as a region of a graph (`Graph.external`), on sim: ordered by byte range
like any kernel, its failures and refusals those of any region. The stream backends' side
(the lane's raw stream, DLPack tensors) is in tests/backends/test_cuda_stream_logic.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import hrx_async as hrx
from tests.helpers import read_bytes, write_bytes

pytestmark = pytest.mark.anyio
R, W = hrx.Access.READ, hrx.Access.WRITE


async def test_external_work_runs_in_byte_range_order_with_arrays_on_sim() -> None:
    async with hrx.Runtime(backend="sim", npu=None) as rt:
        host_in = rt.allocate(64, hrx.HOST_VISIBLE)
        host_out = rt.allocate(64, hrx.HOST_VISIBLE)
        x = rt.allocate(64, hrx.GPU_LOCAL)
        y = rt.allocate(64, hrx.GPU_LOCAL)
        seen: list[Any] = []

        def triple(stream: Any, tensors: list[np.ndarray[Any, Any]]) -> None:
            source, target = tensors
            seen.append((stream, source.flags.writeable, target.flags.writeable))
            target[:] = source * 3

        graph = rt.graph("upload-external-download")
        graph.copy(x.view(), host_in.view())
        index = graph.external(triple, [(x.view(), R), (y.view(), W)])
        graph.copy(host_out.view(), y.view())
        prepared = graph.prepare()
        assert [region.lane for region in prepared.regions][index] is hrx.Lane.COMPUTE
        for value in (1, 5):
            await write_bytes(host_in, bytes([value]) * 64)
            await prepared.submit()
            assert await read_bytes(rt, host_out) == bytes([value * 3]) * 64
        assert seen == [(None, False, True)] * 2


async def test_a_failing_external_function_fails_its_region_and_poisons_what_it_writes() -> None:
    async with hrx.Runtime(backend="sim", npu=None) as rt:
        y = rt.allocate(64, hrx.GPU_LOCAL)
        out = rt.allocate(64, hrx.HOST_VISIBLE)

        def broken(stream: Any, tensors: list[Any]) -> None:
            raise RuntimeError("the library failed")

        graph = rt.graph("broken")
        graph.external(broken, [(y.view(), W)])
        with pytest.raises(hrx.ExecutionError, match="broken") as caught:
            await graph.prepare().submit()
        assert "the library failed" in str(caught.value.__cause__ or caught.value)
        read = rt.graph("read")
        read.copy(out.view(), y.view())
        with pytest.raises(hrx.PoisonedError):
            read.prepare().submit()


async def test_external_work_that_returns_an_awaitable_fails() -> None:
    async def later() -> None:
        pass

    async with hrx.Runtime(backend="sim", npu=None) as rt:
        y = rt.allocate(16, hrx.GPU_LOCAL)
        graph = rt.graph("awaits")
        graph.external(lambda stream, tensors: later(), [(y.view(), W)])
        with pytest.raises(hrx.ExecutionError) as caught:
            await graph.prepare().submit()
        assert "awaitable" in str(caught.value.__cause__)


async def test_bad_external_calls_are_refused_and_record_nothing() -> None:
    async def coroutine_function(stream: Any, tensors: list[Any]) -> None:
        pass

    def fine(stream: Any, tensors: list[Any]) -> None:
        pass

    async with hrx.Runtime(backend="sim") as rt, hrx.Runtime(backend="sim", npu=None) as other:
        x = rt.allocate(64, hrx.GPU_LOCAL)
        npu_only = rt.allocate(64, hrx.npu_local(0))
        foreign = other.allocate(64, hrx.GPU_LOCAL)
        graph = rt.graph("refusals")
        cases: list[tuple[Any, Any, str]] = [
            ("not callable", [(x.view(), W)], "callable"),
            (coroutine_function, [(x.view(), W)], "async def"),
            (fine, [x.view()], r"\(view, Access\) pairs"),
            (fine, [(npu_only.view(), W)], "not visible to the GPU"),
            (fine, [(x.view(0, 32), W), (x.view(16, 32), R)], "overlap"),
            (fine, [(foreign.view(), W)], "another runtime"),
            (fine, 5, "iterable"),
        ]
        for fn, accesses, message in cases:
            with pytest.raises(hrx.ContractError, match=message):
                graph.external(fn, accesses)
        assert len(graph) == 0


async def test_single_launch_refuses_external_work() -> None:
    async with hrx.Runtime(backend="sim", npu=None) as rt:
        x = rt.allocate(64, hrx.GPU_LOCAL)
        graph = rt.graph("one-launch")
        graph.fill(x.view(), 1)
        graph.external(lambda stream, tensors: None, [(x.view(), W)])
        with pytest.raises(hrx.ContractError, match="external"):
            graph.prepare(single_launch=True)
        await graph.prepare().submit()


async def test_sim_runs_the_external_function_and_never_calls_a_prepare_hook() -> None:
    """`sim` has no stream for a prepare hook to build on: it runs `fn` on every replay."""
    async with hrx.Runtime(backend="sim", npu=None) as rt:
        y = rt.allocate(16, hrx.GPU_LOCAL)
        calls: list[str] = []

        def fill(stream: Any, tensors: list[np.ndarray[Any, Any]]) -> None:
            calls.append("fn")
            tensors[0][:] = 4

        def hook(stream: Any, tensors: list[Any]) -> Any:
            calls.append("prepare")
            return fill

        graph = rt.graph("hooked")
        graph.external(fill, [(y.view(), W)], prepare=hook)
        prepared = graph.prepare()
        await prepared.submit()
        await prepared.submit()
        assert calls == ["fn", "fn"]
        assert await read_bytes(rt, y) == bytes([4]) * 16


async def test_a_bad_prepare_hook_is_refused_and_records_nothing() -> None:
    async def coroutine_function(stream: Any, tensors: list[Any]) -> None:
        pass

    def fine(stream: Any, tensors: list[Any]) -> None:
        pass

    async with hrx.Runtime(backend="sim", npu=None) as rt:
        x = rt.allocate(64, hrx.GPU_LOCAL)
        graph = rt.graph("refusals")
        for hook, message in [("not callable", "callable"), (coroutine_function, "async def")]:
            with pytest.raises(hrx.ContractError, match=rf"prepare=\.\.\..*{message}"):
                graph.external(fine, [(x.view(), W)], prepare=hook)
        assert len(graph) == 0
