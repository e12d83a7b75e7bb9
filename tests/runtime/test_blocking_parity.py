"""`BlockingRuntime` keeps `Runtime`'s signatures, and `BlockingPreparedGraph` those of
`PreparedGraph`: the same names take the same parameters, in the same order, with the same
defaults, so code moves between the two by dropping the `await`s.

A public member of `Runtime` that the blocking facade leaves out is named here with the
reason; a new one fails until it is added to the facade or here.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

import hrx_async as hrx

LEFT_OUT = {
    "gpu_access": "an async context manager over the loop's streams; loop-side code uses "
    "brt.runtime.gpu_access (the module docstring says so)",
    "same_domain": "compares two Runtimes; a BlockingRuntime's is brt.runtime",
}


def _public(cls: type) -> dict[str, Any]:
    return {name: value for name, value in inspect.getmembers(cls) if not name.startswith("_")}


def _parameters(member: Any) -> list[tuple[str, Any, Any]]:
    signature = inspect.signature(member)
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


def _paired(left: type, right: type) -> list[str]:
    ours, theirs = _public(left), _public(right)
    return sorted(name for name in ours if name in theirs and callable(ours[name]))


@pytest.mark.parametrize("name", _paired(hrx.Runtime, hrx.BlockingRuntime))
def test_blocking_runtime_methods_take_the_runtimes_parameters(name: str) -> None:
    runtime = getattr(hrx.Runtime, name)
    blocking = getattr(hrx.BlockingRuntime, name)
    assert _parameters(blocking) == _parameters(runtime), (
        f"BlockingRuntime.{name}{inspect.signature(blocking)} differs from "
        f"Runtime.{name}{inspect.signature(runtime)}"
    )


@pytest.mark.parametrize("name", _paired(hrx.PreparedGraph, hrx.BlockingPreparedGraph))
def test_blocking_prepared_graph_methods_take_the_prepared_graphs_parameters(name: str) -> None:
    assert _parameters(getattr(hrx.BlockingPreparedGraph, name)) == _parameters(
        getattr(hrx.PreparedGraph, name)
    )


def test_properties_stay_properties() -> None:
    for name in _public(hrx.Runtime):
        blocking = inspect.getattr_static(hrx.BlockingRuntime, name, None)
        if isinstance(inspect.getattr_static(hrx.Runtime, name), property) and blocking:
            assert isinstance(blocking, property), name
    assert "healthy" in _public(hrx.BlockingRuntime)


def test_every_runtime_member_is_on_the_facade_or_left_out_with_a_reason() -> None:
    runtime = {
        name
        for name, value in _public(hrx.Runtime).items()
        if callable(value) or isinstance(inspect.getattr_static(hrx.Runtime, name), property)
    }
    missing = runtime - set(_public(hrx.BlockingRuntime)) - set(LEFT_OUT)
    assert not missing, f"Runtime members the BlockingRuntime lacks: {sorted(missing)}"
    stale = set(LEFT_OUT) - runtime
    assert not stale, f"LEFT_OUT names what Runtime no longer has: {sorted(stale)}"
    assert not set(LEFT_OUT) & set(_public(hrx.BlockingRuntime)), "left out yet present"


def test_the_check_sees_a_difference() -> None:
    class Changed:
        def gpu(self, index: int = 0) -> None: ...

    assert _parameters(Changed.gpu) != _parameters(hrx.Runtime.gpu)
