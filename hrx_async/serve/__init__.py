"""Serving: a runtime per worker process, owned by the web app that uses it.

* `RuntimeService` (`asgi`): an ASGI app's lifespan opens one runtime and drains it at
  shutdown; FastAPI dependencies hand it out; `/healthz`, `/stats` and `/metrics` report it.
* `prometheus_text` (`metrics`): the runtime's counters in the Prometheus text format.
* `hrx_async.serve.ray`: the same app on Ray Serve, one runtime per replica and one
  replica per GPU, across the machines of a Ray cluster. It needs the `ray` extra and is
  imported only when asked for, so `import hrx_async.serve` never loads Ray.

FastAPI and Starlette are imported only when an app is built or routes are added (the
`serve` extra).
"""

from .asgi import Health, HealthState, RuntimeService, ShutdownReport, logger, runtime_threads
from .metrics import PROMETHEUS_CONTENT_TYPE, prometheus_text

__all__ = [
    "PROMETHEUS_CONTENT_TYPE",
    "Health",
    "HealthState",
    "RuntimeService",
    "ShutdownReport",
    "logger",
    "prometheus_text",
    "runtime_threads",
]
