"""Serving: a runtime per worker process, owned by the web app that uses it.

* `SlotPool`, `Slot` and `Batcher` (`slots`): a fixed set of reusable resources per
  runtime (buffers and prepared graphs, say) handed to one request at a time, and
  batching of requests that arrive together.

* `RuntimeService` (`asgi`): an ASGI app's lifespan opens one runtime and drains it at
  shutdown; FastAPI dependencies hand it out; `/healthz`, `/stats` and `/metrics` report it.
* `prometheus_text` (`metrics`): the runtime's counters in the Prometheus text format.
* `read_body` and `load_json` (`body`): request bodies within a size limit, counted as
  they stream in, and JSON within a nesting depth; refusals are `RequestRefused` with the
  HTTP status to answer (400 malformed, 413 too large, 422 well-formed but not taken);
  `raw_pixels` reads raw u8 RGB pictures with their ``X-Image-Shape`` the same way.
* `hrx_async.serve.ray`: the same app on Ray Serve, one runtime per replica and one
  replica per GPU, across the machines of a Ray cluster. It needs the `ray` extra and is
  imported only when asked for, so `import hrx_async.serve` never loads Ray.

FastAPI and Starlette are imported only when an app is built or routes are added (the
`serve` extra).
"""

from .asgi import Health, HealthState, RuntimeService, ShutdownReport, logger, runtime_threads
from .body import RequestRefused, json_depth, load_json, media_type, raw_pixels, read_body
from .metrics import PROMETHEUS_CONTENT_TYPE, prometheus_text
from .slots import Batcher, Slot, SlotPool

__all__ = [
    "PROMETHEUS_CONTENT_TYPE",
    "Batcher",
    "Health",
    "HealthState",
    "RequestRefused",
    "RuntimeService",
    "ShutdownReport",
    "Slot",
    "SlotPool",
    "json_depth",
    "load_json",
    "logger",
    "media_type",
    "prometheus_text",
    "raw_pixels",
    "read_body",
    "runtime_threads",
]
