"""`Statistics`: a frozen snapshot of the runtime's counters (`counters.Counters`).

The two are kept apart so a caller can hold a snapshot while the runtime keeps counting,
and so the runtime's hot path pays only for native field updates (`Counters` is compiled).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Statistics:
    """A point-in-time copy of the runtime's counters.

    The field order is part of the format: `to_dict()` and `to_json()` list the counters
    in this order, so dumps from different runs line up.
    """

    native_graphs_prepared: int = 0
    copy_streams_created: int = 0
    allocations: int = 0
    imports: int = 0
    submissions: int = 0
    completions: int = 0
    copied_bytes: int = 0
    uploaded_bytes: int = 0
    downloaded_bytes: int = 0
    device_copied_bytes: int = 0
    cache_maintenance_bytes: int = 0
    live_bytes: int = 0
    peak_bytes: int = 0
    host_copied_bytes: int = 0

    def to_dict(self) -> dict[str, int]:
        """The 14 counters by name, in field order."""
        return {name: getattr(self, name) for name in FIELD_NAMES}

    def to_json(self) -> str:
        """The counters as a compact JSON object, keys in field order."""
        return json.dumps(self.to_dict(), separators=(",", ":"))


FIELD_NAMES: tuple[str, ...] = tuple(field.name for field in dataclasses.fields(Statistics))
"""The counter names in their canonical order."""


__all__ = ["FIELD_NAMES", "Statistics"]
