"""Lane numbers and queue keys. The numbers are the original's, and they appear in traces as
thread ids."""

from __future__ import annotations

import enum


class Lane(enum.IntEnum):
    """A scheduling lane. Each lane runs one region at a time, in admission order."""

    UPLOAD = 0
    COMPUTE = 1
    DOWNLOAD = 2
    NPU = 3
    HOST = 4

    @property
    def label(self) -> str:
        return self.name.lower()


QueueKey = tuple[Lane, int]
"""A lane and the device index it serves (NPU lanes are per NPU)."""

__all__ = ["Lane", "QueueKey"]
