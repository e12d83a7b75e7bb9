"""The runtime's counters as Ray Serve metrics, for a replica of `hrx_async.serve.ray`.

Ray Serve tags each metric with its deployment, replica and application and exports it
with the cluster's other metrics (Prometheus names gain Ray's `ray_` prefix, and counters
a `_total` suffix: `ray_hrx_submissions_total`). The names and help texts are those of
`/metrics` (`hrx_async.serve.metrics`), so one dashboard reads both.

`Statistics` holds running totals, while a Ray counter only counts up by what it is
given, so each export adds what a counter gained since the last one.
"""

from __future__ import annotations

from typing import Any

from .._core.stats import FIELD_NAMES, Statistics
from .metrics import GAUGE_FIELDS, HEALTHY_HELP, METRIC_HELP, METRIC_PREFIX, check_prefix


class RuntimeMetrics:
    """Ray Serve gauges and counters named `hrx_<field>`, plus the gauge `hrx_healthy`.

    Create it inside a replica (Ray Serve adds the replica's tags then); needs Ray.
    """

    def __init__(self, prefix: str = METRIC_PREFIX) -> None:
        check_prefix(prefix)
        from ray.serve import metrics

        self._counters: dict[str, Any] = {}
        self._gauges: dict[str, Any] = {}
        for name in FIELD_NAMES:
            kind = metrics.Gauge if name in GAUGE_FIELDS else metrics.Counter
            table = self._gauges if name in GAUGE_FIELDS else self._counters
            table[name] = kind(f"{prefix}{name}", description=METRIC_HELP.get(name, name))
        self._healthy = metrics.Gauge(f"{prefix}healthy", description=HEALTHY_HELP)
        self._exported = Statistics()

    def export(self, statistics: Statistics, healthy: bool) -> None:
        """Set the gauges and add to each counter what it gained since the last export."""
        before = self._exported
        for name, counter in self._counters.items():
            gained = getattr(statistics, name) - getattr(before, name)
            if gained > 0:  # Ray refuses increments of 0
                counter.inc(gained)
        for name, gauge in self._gauges.items():
            gauge.set(getattr(statistics, name))
        self._healthy.set(int(healthy))
        self._exported = statistics


__all__ = ["RuntimeMetrics"]
