"""The runtime's counters as metrics: names, help texts and the Prometheus text format.

One table serves both exporters, so `/metrics` of an ASGI worker and the Ray Serve
metrics of a replica (`hrx_async.serve.ray`) name every counter the same way.
"""

from __future__ import annotations

import re

from .._core.stats import FIELD_NAMES, Statistics
from ..errors import ContractError

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

METRIC_PREFIX = "hrx_"

METRIC_HELP: dict[str, str] = {
    "native_graphs_prepared": "Native device graphs built by prepare().",
    "copy_streams_created": "Copy streams created.",
    "allocations": "Buffers allocated.",
    "imports": "Allocations imported into an NPU (shared placement).",
    "submissions": "Graph submissions admitted.",
    "completions": "Graph submissions finished (succeeded, failed or cancelled).",
    "copied_bytes": "Bytes copied by graph copies on any lane.",
    "uploaded_bytes": "Bytes copied host to device.",
    "downloaded_bytes": "Bytes copied device to host.",
    "device_copied_bytes": "Bytes copied device to device.",
    "cache_maintenance_bytes": "Bytes flushed or invalidated for NPU cache coherence.",
    "live_bytes": "Bytes allocated now.",
    "peak_bytes": "Highest live_bytes seen.",
    "host_copied_bytes": "Bytes copied host to host (copies recorded on the host lane).",
}
"""What each `Statistics` field counts, by field name."""

GAUGE_FIELDS = frozenset({"live_bytes", "peak_bytes"})
"""The fields that go up and down (or hold a high-water mark); every other field only grows."""

HEALTHY_HELP = "1 while the runtime can run work, else 0."

_PREFIX = re.compile(r"(?:[a-zA-Z_:][a-zA-Z0-9_:]*)?")
"""What a metric name may start with: Prometheus names match [a-zA-Z_:][a-zA-Z0-9_:]*, and
every field name is such a name, so an empty prefix is fine too."""


def check_prefix(prefix: object) -> str:
    """`prefix` when metric names made with it are valid; ContractError otherwise."""
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
        shown = repr(prefix) if len(repr(prefix)) <= 60 else repr(prefix)[:57] + "..."
        raise ContractError(
            f"a metric name prefix is letters, digits, '_' and ':', not starting with a "
            f"digit (Prometheus names match [a-zA-Z_:][a-zA-Z0-9_:]*), got {shown}"
        )
    return prefix


def prometheus_text(
    statistics: Statistics, healthy: bool | None = None, prefix: str = METRIC_PREFIX
) -> str:
    """The counters in the Prometheus text exposition format (counters end in `_total`).

    ContractError, before anything is made, for a prefix no metric name may start with,
    `statistics` that are no `Statistics` or `healthy` neither None nor a bool."""
    check_prefix(prefix)
    if not isinstance(statistics, Statistics):
        raise ContractError(f"statistics must be a Statistics, got {type(statistics).__name__}")
    if healthy is not None and not isinstance(healthy, bool):
        raise ContractError(f"healthy must be None, True or False, got {healthy!r}")
    lines: list[str] = []
    values = statistics.to_dict()
    for name in FIELD_NAMES:
        gauge = name in GAUGE_FIELDS
        metric = f"{prefix}{name}" if gauge else f"{prefix}{name}_total"
        lines.append(f"# HELP {metric} {METRIC_HELP.get(name, name)}")
        lines.append(f"# TYPE {metric} {'gauge' if gauge else 'counter'}")
        lines.append(f"{metric} {values[name]}")
    if healthy is not None:
        lines.append(f"# HELP {prefix}healthy {HEALTHY_HELP}")
        lines.append(f"# TYPE {prefix}healthy gauge")
        lines.append(f"{prefix}healthy {int(healthy)}")
    return "\n".join(lines) + "\n"


__all__ = [
    "GAUGE_FIELDS",
    "HEALTHY_HELP",
    "METRIC_HELP",
    "METRIC_PREFIX",
    "PROMETHEUS_CONTENT_TYPE",
    "check_prefix",
    "prometheus_text",
]
