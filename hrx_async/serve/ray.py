"""Ray Serve: the same web app on many GPUs and machines, one runtime per replica.

    from ray import serve
    from hrx_async.serve.ray import runtime_application

    serve.run(
        runtime_application("examples/service.py:create_app", backend="cuda", num_replicas=4),
        route_prefix="/",
    )

Each replica is a Ray actor holding one GPU (`num_gpus=1`: Ray sets
`CUDA_VISIBLE_DEVICES` to that GPU, so the runtime's device 0 is it) and serving its own
copy of the app, built from the app factory in the replica (`hrx_async.serve.factory`):

* start-up: the app's lifespan opens the runtime (`RuntimeService.lifespan`) before Ray
  Serve routes any request to the replica;
* health: `check_health` raises once `RuntimeService.health()` is not ok, after a sticky
  device error for instance, so Ray Serve replaces the replica;
* metrics: every `metrics_period_s` the runtime's counters go out as Ray Serve metrics
  named `hrx_<counter>` plus `hrx_healthy` (`hrx_async.serve.ray_metrics`);
* shutdown: after its in-flight requests, Ray Serve closes the app, whose lifespan drains
  and closes the runtime; the replica then logs the `ShutdownReport` to its Ray Serve log
  ("hrx runtime closed: drained=True ...").

Importing this module does not import Ray; building a deployment does, and without the
`ray` extra raises `BackendUnavailable` saying what to install.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from .._core.install import install_hint
from ..errors import BackendUnavailable, ContractError, DeviceLost, RuntimeClosed
from .factory import AppFactory, ReplicaApp
from .ray_metrics import RuntimeMetrics

INSTALL = install_hint("ray")

# Ray Serve writes its logger and that logger's children to each replica's own log file,
# tagged with the replica.
SERVE_LOGGER = "ray.serve"
replica_logger = logging.getLogger(f"{SERVE_LOGGER}.hrx")


def ray_serve() -> Any:
    """`ray.serve`, or `BackendUnavailable` naming the extra to install."""
    try:
        from ray import serve
    except ImportError as exc:
        raise BackendUnavailable("ray", f"Ray Serve cannot be imported ({exc})", INSTALL) from exc
    return serve


class RuntimeReplica:
    """The deployment class: one replica, one runtime, inside Ray Serve's ingress wrapper.

    Ray Serve's `serve.ingress` wraps this class around a `ReplicaApp`; the wrapper
    provides `self.app` and runs the app's lifespan after `__init__` and at shutdown
    (the `ReplicaApp` logs the runtime's `ShutdownReport` then). The metrics exporter
    needs no stopping: it skips a closed runtime, and the process ends with the replica.
    """

    def __init__(self, metrics_period_s: float = 5.0) -> None:
        if not metrics_period_s >= 0:
            raise ContractError(f"metrics_period_s must be >= 0 (0: none), got {metrics_period_s}")
        self._metrics_period_s = metrics_period_s
        self._exporter: asyncio.Task[None] | None = None
        # Ray Serve quiets "ray.serve" to WARNING while it runs the app's lifespan, which is
        # where the shutdown report is logged; pin this logger at the level configured now.
        replica_logger.setLevel(logging.getLogger(SERVE_LOGGER).getEffectiveLevel())
        self._start_exporter()

    def _replica_app(self) -> ReplicaApp:
        app = getattr(self, "app", None)
        if not isinstance(app, ReplicaApp):
            raise ContractError(
                f"{type(self).__name__} serves a ReplicaApp through serve.ingress; "
                "build it with runtime_deployment()"
            )
        return app

    async def check_health(self) -> None:
        """Ray Serve's periodic health check: raises while the runtime cannot serve."""
        self._start_exporter()
        app = self._replica_app()
        if not app.built:
            raise RuntimeClosed("the replica's app is not built yet")
        health = app.service.health()
        if not health.ok:
            error = DeviceLost if health.state == "device_lost" else RuntimeClosed
            raise error(f"hrx runtime is {health.state} (backend {health.backend})")

    def _start_exporter(self) -> None:
        if self._exporter is not None or self._metrics_period_s == 0:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # not constructed on the replica's loop: the first health check starts it
        self._exporter = loop.create_task(self._export_forever(), name="hrx-ray-metrics")

    async def _export_forever(self) -> None:
        metrics = RuntimeMetrics()
        while True:
            try:
                self._export_once(metrics)
            except Exception:  # a metrics hiccup must not stop the next exports
                replica_logger.exception("exporting the hrx runtime's metrics failed")
            await asyncio.sleep(self._metrics_period_s)

    def _export_once(self, metrics: RuntimeMetrics) -> None:
        app = self._replica_app()
        if not app.built:
            return
        service = app.service
        try:
            statistics = service.statistics()
        except RuntimeClosed:
            return  # not open yet, or closed: nothing new to count
        metrics.export(statistics, service.health().ok)


def runtime_deployment(
    app: AppFactory,
    *,
    backend: str | None = "auto",
    app_options: Mapping[str, Any] | None = None,
    name: str = "hrx",
    num_replicas: int = 1,
    num_gpus: float = 1,
    num_cpus: float = 1,
    max_ongoing_requests: int = 64,
    health_check_period_s: float = 10.0,
    graceful_shutdown_timeout_s: float = 30.0,
    **deployment_options: Any,
) -> Any:
    """A Ray Serve deployment whose replicas each serve `app(backend=..., **app_options)`.

    `app` names the factory (`"path/to/file.py:create_app"`, `"module:create_app"`, or the
    function); the app it returns keeps its `RuntimeService` in `app.state.service`.
    `backend` goes to the factory (None: not passed). Each replica reserves `num_gpus`
    GPUs (1: the replica's runtime owns one; 0 for the sim backend) and `num_cpus` CPUs.
    `max_ongoing_requests` is above Ray Serve's default so a `Batcher` has requests to
    gather; `deployment_options` go to `serve.deployment` as they are (autoscaling_config,
    ...). Bind it to get an application: `runtime_deployment(...).bind(metrics_period_s)`.
    """
    serve = ray_serve()
    options = dict(app_options or {})
    if backend is not None:
        options["backend"] = backend
    replica_app = ReplicaApp(app, options, report_logger=replica_logger.name)
    ingress = serve.ingress(replica_app)(RuntimeReplica)
    actor_options = dict(deployment_options.pop("ray_actor_options", None) or {})
    actor_options.update(num_gpus=num_gpus, num_cpus=num_cpus)
    return serve.deployment(
        ingress,
        name=name,
        num_replicas=num_replicas,
        ray_actor_options=actor_options,
        max_ongoing_requests=max_ongoing_requests,
        health_check_period_s=health_check_period_s,
        graceful_shutdown_timeout_s=graceful_shutdown_timeout_s,
        **deployment_options,
    )


def runtime_application(app: AppFactory, *, metrics_period_s: float = 5.0, **options: Any) -> Any:
    """`runtime_deployment(app, **options)` bound into an application for `serve.run`."""
    return runtime_deployment(app, **options).bind(metrics_period_s)


__all__ = [
    "INSTALL",
    "RuntimeReplica",
    "ray_serve",
    "replica_logger",
    "runtime_application",
    "runtime_deployment",
]
