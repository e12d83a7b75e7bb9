"""The Ray Serve integration's parts that need no Ray: they run in the default test run.

The app factory and `ReplicaApp` (the ASGI app a replica builds for itself), driven
through uvicorn's lifespan runner as Ray Serve drives them, and httpx for a request;
`RuntimeReplica.check_health` against a real runtime, before, during and after its
life and after a sticky device error; the error naming the `ray` extra when Ray is
missing; and the example's command line. `tests/serve/test_ray_serve.py` runs it all on Ray.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from uvicorn.config import Config  # noqa: E402
from uvicorn.lifespan.on import LifespanOn  # noqa: E402

import hrx_async as hrx  # noqa: E402
from hrx_async.serve.factory import (  # noqa: E402
    ReplicaApp,
    load_factory,
    resolve_factory,
    service_of,
)
from hrx_async.serve.ray import RuntimeReplica  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "service.py"
RAY_EXAMPLE = ROOT / "examples" / "ray_service.py"
SPEC = f"{EXAMPLE}:create_app"
OPTIONS = {"backend": "sim", "slots": 1, "batch": 2}


@asynccontextmanager
async def lifespan(app: ReplicaApp) -> AsyncIterator[None]:
    """The app's ASGI lifespan, run the way Ray Serve's ingress wrapper runs it."""
    runner = LifespanOn(Config(app, lifespan="on", log_config=None))
    await runner.startup()
    assert not runner.should_exit, "the app's lifespan startup failed"
    try:
        yield
    finally:
        await runner.shutdown()


# -- naming the factory ---------------------------------------------------------------------


def test_a_factory_file_becomes_an_absolute_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    assert resolve_factory("examples/service.py:create_app") == SPEC
    assert resolve_factory("hrx_async.serve.factory:service_of") == (
        "hrx_async.serve.factory:service_of"
    )
    assert resolve_factory(service_of) is service_of


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("examples/service.py", "an app factory is 'module:function'"),
        (":create_app", "an app factory is 'module:function'"),
        ("examples/absent.py:create_app", "no file"),
        ("hrx_async.no_such_module:create_app", "no module named"),
    ],
)
def test_a_wrong_factory_name_is_refused_where_it_is_given(spec: str, message: str) -> None:
    with pytest.raises(hrx.ContractError, match=message):
        resolve_factory(spec)


def test_a_factory_file_is_loaded_once_per_process() -> None:
    create_app = load_factory(SPEC)
    assert create_app.__name__ == "create_app"
    assert load_factory(SPEC).__module__ == create_app.__module__
    assert sys.modules[create_app.__module__].__file__ == str(EXAMPLE)
    with pytest.raises(hrx.ContractError, match="has no 'create_apps'"):
        load_factory(f"{EXAMPLE}:create_apps")
    with pytest.raises(hrx.ContractError, match="is not callable"):
        load_factory(f"{EXAMPLE}:MAX_VALUES")


# -- the replica's app ------------------------------------------------------------------------


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # Ray Serve replicas run asyncio
@pytest.mark.anyio
async def test_the_replica_app_builds_itself_serves_and_drains(
    anyio_backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="hrx_test.replica")
    travelled = pickle.loads(pickle.dumps(ReplicaApp(SPEC, OPTIONS, "hrx_test.replica")))
    assert not travelled.built and travelled.options == OPTIONS
    with pytest.raises(hrx.ContractError, match="not come"):
        _ = travelled.app

    async with lifespan(travelled):
        assert travelled.built
        service = travelled.service
        assert service.health().ok and service.runtime.backend_name == "sim"
        # A built app pickles as its factory again: a copy builds a runtime of its own.
        assert not pickle.loads(pickle.dumps(travelled)).built
        transport = httpx.ASGITransport(app=travelled)
        async with httpx.AsyncClient(transport=transport, base_url="http://replica") as client:
            values = np.linspace(-3, 5, 1500, dtype=np.float32)
            response = await client.post("/v1/transform", json={"values": values.tolist()})
            assert response.status_code == 200
            example = sys.modules[load_factory(SPEC).__module__]
            expected = example.transform_reference(values)
            assert np.array_equal(np.asarray(response.json()["values"], np.float32), expected)
    report = service.shutdown_report
    assert report is not None and report.drained and report.statistics.submissions >= 1
    logged = [r.getMessage() for r in caplog.records if r.name == "hrx_test.replica"]
    assert logged == [f"hrx runtime closed: {report.summary()}"]
    assert logged[0].startswith("hrx runtime closed: drained=True submissions=")


def test_an_app_that_keeps_no_runtime_service_is_refused() -> None:
    from fastapi import FastAPI

    def bare_app() -> Any:
        return FastAPI()

    with pytest.raises(hrx.ContractError, match=r"app\.state\.service"):
        ReplicaApp(bare_app).build()
    with pytest.raises(hrx.ContractError, match=r"app\.state\.service"):
        service_of(object())


def test_exception_handlers_given_before_the_build_reach_the_app() -> None:
    async def handler(request: Any, exc: Exception) -> Any:
        raise AssertionError("not called here")

    app = ReplicaApp(SPEC, OPTIONS)
    app.add_exception_handler(LookupError, handler)
    built = app.build()
    assert built.exception_handlers[LookupError] is handler
    app.add_exception_handler(KeyError, handler)
    assert built.exception_handlers[KeyError] is handler


# -- health checks ------------------------------------------------------------------------------


def replica_on(app: ReplicaApp) -> RuntimeReplica:
    """A replica as Ray Serve's ingress wrapper makes it: the wrapper provides `app`."""
    replica = RuntimeReplica(metrics_period_s=0)  # no metrics: they need Ray
    replica.app = app  # type: ignore[attr-defined]
    return replica


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_check_health_follows_the_runtime(anyio_backend: str) -> None:
    app = ReplicaApp(SPEC, OPTIONS)
    replica = replica_on(app)
    with pytest.raises(hrx.RuntimeClosed, match="not built"):
        await replica.check_health()
    async with lifespan(app):
        await replica.check_health()
        rt = app.service.runtime

        def sticky_failure(arrays: list[Any], constants: bytes) -> None:
            raise hrx.DeviceLost("forced: the device fell off the bus")

        scratch = rt.allocate(64, hrx.GPU_LOCAL)
        contract = hrx.KernelContract([hrx.Binding(64, hrx.Access.WRITE)])
        kernel = rt.load_gpu_kernel(
            hrx.KernelSource(host=sticky_failure), "sticky", (1,), (1,), contract
        )
        graph = rt.graph("doomed")
        graph.gpu(kernel, [scratch.view()])
        with pytest.raises(hrx.DeviceLost):
            await graph.prepare().submit()
        with pytest.raises(hrx.DeviceLost, match="device_lost"):
            await replica.check_health()
    with pytest.raises(hrx.RuntimeClosed, match="closed"):
        await replica.check_health()


def test_a_replica_outside_serve_ingress_says_how_to_build_it() -> None:
    replica = RuntimeReplica(metrics_period_s=0)
    with pytest.raises(hrx.ContractError, match="runtime_deployment"):
        asyncio.run(replica.check_health())
    with pytest.raises(hrx.ContractError, match="metrics_period_s"):
        RuntimeReplica(metrics_period_s=-1)


# -- without Ray --------------------------------------------------------------------------------


def run_python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    )


def test_importing_hrx_async_serve_does_not_import_ray() -> None:
    code = (
        "import sys, hrx_async, hrx_async.serve, hrx_async.serve.ray\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'ray'))\n"
    )
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_deployment_without_ray_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "from hrx_async.serve.ray import runtime_deployment\n"
        "try:\n"
        f"    runtime_deployment({SPEC!r}, backend='sim')\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("BackendUnavailable ")
    assert 'pip install "hrx-async[ray]"' in done.stdout


def test_the_example_without_ray_exits_1_naming_the_extra() -> None:
    code = (
        "import sys, runpy; sys.modules['ray'] = None; sys.argv[0] = 'ray_service.py'\n"
        f"runpy.run_path({str(RAY_EXAMPLE)!r}, run_name='__main__')\n"
    )
    done = run_python(code, "--backend", "sim")
    assert done.returncode == 1, done.stderr
    assert 'pip install "hrx-async[ray]"' in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--replicas", "0"], "--replicas must be >= 1"),
        (["--gpus-per-replica", "-1"], "--gpus-per-replica must be >= 0"),
        (["--port", "0"], "--port must be in 1..65535"),
        (["--backend", "tpu"], "invalid choice"),
    ],
)
def test_the_example_refuses_a_wrong_command_line(argv: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, str(RAY_EXAMPLE), *argv], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 64, done.stderr
    assert message in done.stderr
