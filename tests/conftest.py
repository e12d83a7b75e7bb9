"""Shared fixtures: every `@pytest.mark.anyio` test runs once on asyncio and once on trio."""

import pytest


@pytest.fixture(params=[pytest.param("asyncio"), pytest.param("trio")])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    backend: str = request.param
    return backend
