"""Argument checks shared by the public entry points.

Each check either returns the argument in its canonical form (a plain `int`, a `tuple`,
...) or raises `ContractError` naming the argument, showing the offending value and
saying what is allowed. A check changes nothing, so an entry point that runs its checks
before acting leaves graphs, buffers and statistics as they were when one fails.

Rules every check follows:

* integers (sizes, offsets, counts, indices) are `int` or a numpy integer; `bool` is not
  one (it is an `int` subclass, but `True` as a size is always a mistake), nor are floats,
  strings or objects that merely define `__index__`;
* ordered collections (views, bindings, accesses, shapes) are any iterable except strings,
  bytes-like objects, sets and mappings, whose iteration order or element type would
  silently bind the wrong things.
"""

from __future__ import annotations

import numbers
import operator
from collections.abc import Callable, Mapping, Set
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from ..errors import ContractError

if TYPE_CHECKING:
    pass

T = TypeVar("T")

MAX_ALLOCATION = 2**62
"""The largest allocation size asked of a backend (4 EiB, beyond any machine): larger
sizes cannot be expressed to the native allocators at all."""

MAX_DIM = 2**31 - 1
"""The largest grid or block extent: launch dimensions are 32-bit on every backend."""


def shown(value: object) -> str:
    """`repr(value)` for an error message: never raises, never longer than a line or two."""
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__} object>"
    return text if len(text) <= 160 else f"{text[:150]}... ({type(value).__name__})"


def as_integer(value: object) -> int | None:
    """`value` as a plain int when it is an integer (int or numpy integer, not bool)."""
    if type(value) is int:
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return operator.index(value)
    return None


def _bounds(minimum: int, maximum: int | None) -> str:
    if maximum is None:
        return f">= {minimum}"
    return f"in {minimum}..{maximum}"


def integer(value: object, what: str, minimum: int = 0, maximum: int | None = None) -> int:
    """An integer in [minimum, maximum]; `what` names the argument in the message."""
    number = as_integer(value)
    if number is None or number < minimum or (maximum is not None and number > maximum):
        raise ContractError(
            f"{what} must be an integer {_bounds(minimum, maximum)} (not a bool or float), "
            f"got {shown(value)}"
        )
    return number


def flag(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise ContractError(f"{what} must be True or False, got {shown(value)}")
    return value


def text(value: object, what: str, *, empty: bool = True) -> str:
    if not isinstance(value, str) or (not empty and not value):
        allowed = "a string" if empty else "a non-empty string"
        raise ContractError(f"{what} must be {allowed}, got {shown(value)}")
    return value


def choice(value: object, what: str, allowed: tuple[str | None, ...]) -> str | None:
    """One of `allowed` (strings and None), compared by identity of type first."""
    if (value is None and None in allowed) or (isinstance(value, str) and value in allowed):
        return value
    names = ", ".join(repr(a) for a in allowed)
    raise ContractError(f"{what} must be one of {names}; got {shown(value)}")


def instance(value: object, kind: type[T], what: str, hint: str = "") -> T:
    if not isinstance(value, kind):
        extra = f" ({hint})" if hint else ""
        name = kind.__name__
        article = "an" if name[:1] in "AEIOU" else "a"
        raise ContractError(f"{what} must be {article} {name}{extra}, got {shown(value)}")
    return value


def function(value: object, what: str) -> Callable[..., Any]:
    if not callable(value):
        raise ContractError(f"{what} must be callable, got {shown(value)}")
    return value


_NOT_ORDERED = (str, bytes, bytearray, memoryview, Set, Mapping)


def items(value: object, what: str) -> tuple[Any, ...]:
    """The elements of an ordered iterable, as a tuple (iterated once)."""
    if isinstance(value, _NOT_ORDERED):
        raise ContractError(
            f"{what} must be an ordered collection (a list or tuple), got {shown(value)}"
        )
    try:
        iterator = iter(value)  # type: ignore[call-overload]
    except TypeError:
        raise ContractError(
            f"{what} must be an iterable (a list or tuple), got {shown(value)}"
        ) from None
    return tuple(iterator)


def dims(name: str, value: object) -> tuple[int, int, int]:
    """A grid or block shape: 1 to 3 integers in 1..MAX_DIM, padded with 1s to three."""
    problem = f"{name} must be 1 to 3 positive integers (each at most {MAX_DIM}), got"
    if isinstance(value, _NOT_ORDERED):
        raise ContractError(f"{problem} {shown(value)}")
    try:
        values = tuple(iter(value))  # type: ignore[call-overload]
    except TypeError:
        raise ContractError(f"{problem} {shown(value)}") from None
    numbers_ = [as_integer(v) for v in values]
    if not 1 <= len(numbers_) <= 3 or not all(
        n is not None and 1 <= n <= MAX_DIM for n in numbers_
    ):
        raise ContractError(f"{problem} {shown(value)}")
    padded = [n for n in numbers_ if n is not None] + [1] * (3 - len(numbers_))
    return (padded[0], padded[1], padded[2])


def byte_string(value: object, what: str) -> bytes:
    """Raw bytes from a bytes-like object (bytes, bytearray, memoryview, numpy array).

    Numbers are refused, numpy scalars included: their raw bytes are rarely what was meant.
    """
    if isinstance(value, str | numbers.Number | np.generic) or value is None:
        raise ContractError(f"{what} must be bytes-like, got {shown(value)}")
    try:
        view = memoryview(value)  # type: ignore[arg-type]
    except TypeError:
        raise ContractError(f"{what} must be bytes-like, got {shown(value)}") from None
    with view:
        return view.tobytes()


def view_range(buffer_nbytes: int, offset: object, nbytes: object) -> tuple[int, int]:
    """A byte range [offset, offset + nbytes) that lies inside a buffer and is not empty."""
    start, length = as_integer(offset), as_integer(nbytes)
    if start is None or length is None or start < 0 or length < 1:
        raise ContractError(
            f"a view needs an integer offset >= 0 and an integer length >= 1, got offset "
            f"{shown(offset)} and length {shown(nbytes)}"
        )
    if start + length > buffer_nbytes:
        raise ContractError(
            f"view [{start}:{start + length}] is outside its {buffer_nbytes}-byte buffer"
        )
    return start, length


def string_map(value: object, what: str) -> dict[str, str]:
    """Compiler defines: a mapping of non-empty names to strings or integers (not bools)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ContractError(f"{what} must be a mapping of names to str or int, got {shown(value)}")
    flags: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            raise ContractError(f"{what} names must be non-empty strings, got {shown(key)}")
        if isinstance(item, str):
            flags[key] = item
        else:
            number = as_integer(item)
            if number is None:
                raise ContractError(
                    f"{what}[{key!r}] must be a str or an integer, got {shown(item)}"
                )
            flags[key] = str(number)
    return flags
