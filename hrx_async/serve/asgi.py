"""An ASGI app's runtime: one per worker process, opened by the app's lifespan.

    service = RuntimeService(build_resources, backend="auto")
    app = FastAPI(lifespan=service.lifespan)
    service.add_routes(app)                     # /healthz, /stats, /metrics

    @app.post("/infer")
    async def infer(pools: Annotated[Pools, Depends(service.resources_dependency)]) -> ...:
        async with pools.acquire() as slot:
            await slot.submit(slot.resources.step)

At startup the lifespan opens a `Runtime` and calls `setup(runtime)` (plain or
`async`) to build the app's resources on it, such as slot pools. At shutdown
it drains pending work, closes the runtime and keeps a `ShutdownReport`.
`runtime_dependency` and `resources_dependency` take no arguments, so they are
FastAPI dependencies as they stand (and `async`, so no thread hop per request).
Health follows `Runtime.healthy`: after a sticky device error `/healthz`
answers 503, so a supervisor restarts the worker.

Nothing here imports FastAPI or Starlette until `add_routes` is called; both
come with the `serve` extra.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar, cast

from .._core.stats import Statistics
from ..errors import ContractError, DeviceLost, RuntimeClosed
from ..runtime import Runtime
from .metrics import PROMETHEUS_CONTENT_TYPE, prometheus_text

T = TypeVar("T")

logger = logging.getLogger("hrx_async.serve")

HealthState = Literal["starting", "running", "device_lost", "closed"]


@dataclass(frozen=True, slots=True)
class Health:
    """Whether the worker can serve: `ok` only while the runtime runs and its device is sound."""

    ok: bool
    state: HealthState
    backend: str | None = None

    def to_dict(self) -> dict[str, object]:
        """The `/healthz` body: `ok`, `state` and `backend`."""
        return {"ok": self.ok, "state": self.state, "backend": self.backend}


@dataclass(frozen=True, slots=True)
class ShutdownReport:
    """What closing the runtime left behind: final counters and any runtime threads alive."""

    statistics: Statistics
    leftover_threads: tuple[str, ...] = field(default=())

    @property
    def drained(self) -> bool:
        """Every submission finished and no runtime thread outlived the runtime."""
        stats = self.statistics
        return stats.submissions == stats.completions and not self.leftover_threads

    def summary(self) -> str:
        """A log line's worth: `drained=True submissions=9 completions=9 leftover_threads=none`."""
        stats = self.statistics
        threads = ",".join(self.leftover_threads) or "none"
        return (
            f"drained={self.drained} submissions={stats.submissions} "
            f"completions={stats.completions} leftover_threads={threads}"
        )


def runtime_threads() -> tuple[str, ...]:
    """Names of live threads the runtime started (lane workers and the like)."""
    return tuple(
        sorted(t.name for t in threading.enumerate() if t.name.startswith("hrx-") and t.is_alive())
    )


class RuntimeService(Generic[T]):
    """Owns an ASGI app's runtime: the lifespan opens and drains it, dependencies hand it out.

    `setup(runtime)` builds the app's resources once the runtime is open (it may be
    `async`); `runtime_options` go to `Runtime(...)`.
    """

    def __init__(
        self,
        setup: Callable[[Runtime], T | Awaitable[T]] | None = None,
        *,
        backend: str = "auto",
        **runtime_options: Any,
    ) -> None:
        if setup is not None and not callable(setup):
            raise ContractError(f"setup must be a callable (runtime) -> resources, got {setup!r}")
        self._setup = setup
        self._backend = backend
        self._options = runtime_options
        self._runtime: Runtime | None = None
        self._resources: T | None = None
        self._state: HealthState = "starting"
        self.shutdown_report: ShutdownReport | None = None

    # -- lifespan ----------------------------------------------------------------------

    @asynccontextmanager
    async def lifespan(self, app: object = None) -> AsyncIterator[None]:
        """The ASGI lifespan: `FastAPI(lifespan=service.lifespan)`, or enter it in your own."""
        if self._state != "starting":
            raise RuntimeClosed("this RuntimeService was already started; create one per app")
        async with Runtime(self._backend, **self._options) as runtime:
            self._runtime = runtime
            try:
                if self._setup is not None:
                    made = self._setup(runtime)
                    if inspect.isawaitable(made):
                        made = await made
                    self._resources = cast(T, made)
                self._state = "running"
                logger.info("hrx runtime open on backend %s", runtime.backend_name)
                yield
            finally:
                self._state = "closed"
                self._resources = None
        self._runtime = None
        report = ShutdownReport(runtime.statistics(), runtime_threads())
        self.shutdown_report = report
        logger.info("hrx runtime closed: %s", report.summary())

    # -- dependencies ------------------------------------------------------------------

    @property
    def runtime(self) -> Runtime:
        """The open runtime; `RuntimeClosed` outside the lifespan."""
        runtime = self._runtime
        if runtime is None or self._state != "running":
            raise RuntimeClosed(f"the service's runtime is {self._state}, not running")
        return runtime

    @property
    def resources(self) -> T:
        """What `setup` built; `RuntimeClosed` outside the lifespan."""
        self.runtime  # noqa: B018 (raises when not running)
        if self._setup is None:
            raise ContractError("this RuntimeService has no setup, so it has no resources")
        return cast(T, self._resources)

    # FastAPI runs plain-function dependencies in its thread pool, a thread hop per request;
    # `async def` ones run on the loop.

    async def runtime_dependency(self) -> Runtime:
        """`Depends(service.runtime_dependency)`: the runtime, for a request handler."""
        return self.runtime

    async def resources_dependency(self) -> T:
        """`Depends(service.resources_dependency)`: what `setup` built, for a request handler."""
        return self.resources

    # -- health and metrics ------------------------------------------------------------

    def health(self) -> Health:
        """The worker's health now: `ok` only while the runtime runs and its device is sound
        (state `starting`, `running`, `device_lost` or `closed`). Never raises."""
        runtime = self._runtime
        if runtime is None or self._state != "running":
            return Health(False, self._state)
        if not runtime.healthy:
            return Health(False, "device_lost", runtime.backend_name)
        return Health(True, "running", runtime.backend_name)

    def statistics(self) -> Statistics:
        """The runtime's counters (`Runtime.statistics()`); `RuntimeClosed` while it is not open."""
        return self.runtime.statistics()

    def add_routes(
        self,
        app: Any,
        *,
        health: str | None = "/healthz",
        stats: str | None = "/stats",
        metrics: str | None = "/metrics",
        unavailable_handlers: bool = True,
    ) -> None:
        """Add GET routes to a Starlette or FastAPI app (None leaves one out).

        `health` answers 200 with `Health.to_dict()` while the runtime serves, 503 otherwise;
        `stats` the runtime's counters as JSON; `metrics` the same in Prometheus text format.
        With `unavailable_handlers`, a handler that raises `DeviceLost` or `RuntimeClosed`
        answers 503 (the worker cannot serve; retry elsewhere) instead of 500.
        """
        from starlette.requests import Request
        from starlette.responses import JSONResponse, PlainTextResponse, Response

        async def unavailable(request: Request, exc: Exception) -> Response:
            return JSONResponse({"detail": f"{type(exc).__name__}: {exc}"}, status_code=503)

        if unavailable_handlers:
            app.add_exception_handler(DeviceLost, unavailable)
            app.add_exception_handler(RuntimeClosed, unavailable)

        async def health_endpoint(request: Request) -> Response:
            state = self.health()
            return JSONResponse(state.to_dict(), status_code=200 if state.ok else 503)

        async def stats_endpoint(request: Request) -> Response:
            if self._runtime is None:
                return JSONResponse({"error": f"runtime is {self._state}"}, status_code=503)
            return JSONResponse(self._runtime.statistics().to_dict())

        async def metrics_endpoint(request: Request) -> Response:
            if self._runtime is None:
                return PlainTextResponse(f"# runtime is {self._state}\n", status_code=503)
            text = prometheus_text(self._runtime.statistics(), healthy=self.health().ok)
            return PlainTextResponse(text, media_type=PROMETHEUS_CONTENT_TYPE)

        for path, endpoint in (
            (health, health_endpoint),
            (stats, stats_endpoint),
            (metrics, metrics_endpoint),
        ):
            if path is not None:
                app.add_route(path, endpoint, methods=["GET"])


__all__ = [
    "Health",
    "HealthState",
    "RuntimeService",
    "ShutdownReport",
    "runtime_threads",
]
