"""Shared fixtures.

Every `@pytest.mark.anyio` test runs once on asyncio and once on trio. Tests
that take the `hrx_backend` fixture run on every GPU backend usable here: sim
always, cuda and hip where a device answers (or the list in HRX_TEST_BACKENDS).
"""

from __future__ import annotations

import functools
import os

import pytest


@pytest.fixture(params=[pytest.param("asyncio"), pytest.param("trio")])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    backend: str = request.param
    return backend


@functools.cache
def usable_backends() -> tuple[str, ...]:
    listed = os.environ.get("HRX_TEST_BACKENDS")
    if listed:
        return tuple(name.strip() for name in listed.split(",") if name.strip())
    from hrx_async.backends import probe

    found = ["sim"]
    for name in ("cuda", "hip"):
        try:
            if probe(name).get("available"):
                found.append(name)
        except Exception:  # a broken driver means the backend is not usable
            pass
    return tuple(found)


def _backend_param(name: str) -> object:
    marks = [getattr(pytest.mark, name)] if name != "sim" else []
    return pytest.param(name, marks=marks, id=name)


@pytest.fixture(params=[_backend_param(name) for name in ("sim", "cuda", "hip")])
def hrx_backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if name not in usable_backends():
        pytest.skip(f"backend {name!r} is not usable on this machine")
    return name
