"""Argument checks shared by the models package: each raises `ContractError` naming the value."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from typing import Any

from ..errors import ContractError


def shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def integer(value: object, what: str, minimum: int = 0, maximum: int | None = None) -> int:
    """An int (numpy integers too, never bools) in [minimum, maximum]."""
    number: int | None = None
    if not isinstance(value, bool | float) and hasattr(value, "__index__"):
        try:
            number = int(value.__index__())
        except Exception:
            number = None
    if number is None or number < minimum or (maximum is not None and number > maximum):
        bounds = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        raise ContractError(f"{what} must be an integer {bounds}, got {shown(value)}")
    return number


def timeout(value: object, what: str = "timeout") -> float | None:
    """None (no limit) or a finite number of seconds >= 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ContractError(f"{what} must be None or seconds >= 0, got {shown(value)}")
    if value < 0:
        raise ContractError(f"{what} must be None or seconds >= 0, got {shown(value)}")
    return float(value)


def key(value: object, what: str = "key") -> Hashable:
    try:
        hash(value)
    except TypeError:
        raise ContractError(f"a {what} must be hashable, got {shown(value)}") from None
    return value


def function(value: object, what: str) -> Callable[..., Any]:
    if not callable(value):
        raise ContractError(f"{what} must be callable, got {shown(value)}")
    return value
