"""Scheduling lanes: lane numbers, lane tasks, admission and the host lane."""

from .._core.lane import Lane

__all__ = ["Lane"]
