"""Cancelling what waits inside the runtime raises the cancellation and nothing else.

A cancellation reaches a waiting coroutine as an exception thrown into it. Compiled code
(the build the README installs) must not pass it on with the three-argument `throw()`,
which Python 3.12 deprecates: under `-W error`, as many test suites run, the cancelled
task would fail with a DeprecationWarning instead of being cancelled. Checked on both
builds and both loops; on an interpreter older than 3.12 nothing warns either way.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

import hrx_async as hrx

pytestmark = pytest.mark.anyio


@pytest.fixture
def deprecations() -> Iterator[list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DeprecationWarning)
        yield caught


def slow_graph(rt: hrx.Runtime, release: threading.Event) -> hrx.PreparedGraph:
    """A host function that runs until `release` is set, then a fill that follows it."""
    host = rt.allocate(64, hrx.HOST_VISIBLE)
    device = rt.allocate(64, hrx.GPU_LOCAL)
    graph = rt.graph("slow")
    graph.host(lambda array: release.wait(10), [(host.view(), hrx.Access.WRITE)])
    graph.copy(device.view(), host.view())
    graph.fill(device.view(), 3)
    return graph.prepare()


def thrown(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "throw()" in str(w.message)]


async def test_a_task_awaiting_a_completion_is_cancelled_without_a_warning(
    anyio_backend: str, deprecations: list[warnings.WarningMessage]
) -> None:
    release = threading.Event()
    async with hrx.Runtime(backend="sim", npu=None) as rt:
        prepared = slow_graph(rt, release)
        completion = prepared.submit()
        with anyio.move_on_after(0.05) as scope:
            await completion
        assert scope.cancelled_caught and not completion.done()
        with anyio.move_on_after(0.05) as scope:
            await completion.wait_done()
        assert scope.cancelled_caught
        release.set()
        await completion
    assert thrown(deprecations) == []


async def test_leaving_by_an_exception_cancels_the_lanes_without_a_warning(
    anyio_backend: str, deprecations: list[warnings.WarningMessage]
) -> None:
    """Lane tasks wait for what regions follow (here a fill behind a host function through
    a copy); leaving the runtime by an exception cancels those waits."""
    release = threading.Event()
    with pytest.raises(RuntimeError, match="leave"):
        async with hrx.Runtime(backend="sim", npu=None) as rt:
            prepared = slow_graph(rt, release)
            completions = [prepared.submit() for _ in range(3)]
            await anyio.sleep(0.02)
            threading.Timer(0.05, release.set).start()
            raise RuntimeError("leave")
    assert all(c.done() for c in completions)
    assert thrown(deprecations) == []


async def test_a_runtime_left_under_a_cancelled_scope_drains_without_a_warning(
    anyio_backend: str, deprecations: list[warnings.WarningMessage]
) -> None:
    """The drain on leaving is shielded: the scope's deadline passes during it, the work
    still finishes, and nothing warns on the way."""
    release = threading.Event()
    rt = hrx.Runtime(backend="sim", npu=None)
    leaving: Any = None
    started = time.monotonic()
    with anyio.move_on_after(0.05):
        async with rt:
            prepared = slow_graph(rt, release)
            leaving = prepared.submit()
            threading.Timer(0.3, release.set).start()
    assert time.monotonic() - started >= 0.25  # it waited for the work
    assert leaving is not None and leaving.done() and leaving.exception() is None
    assert thrown(deprecations) == []
