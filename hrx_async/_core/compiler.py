"""The compiler's class options, importable with or without the compiler installed.

`mypyc_attr` is `mypy_extensions.mypyc_attr` to the type checker and the compiler, which
read it from the source (a compiled module never calls it). At run time a pure install may
lack mypy_extensions, and there the options mean nothing: this one returns the class as it
is. Not compiled itself (see `_build.COMPILED`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from mypy_extensions import mypyc_attr as mypyc_attr
else:
    _Class = TypeVar("_Class")

    def mypyc_attr(*attrs: str, **kwattrs: object) -> Callable[[_Class], _Class]:
        return lambda cls: cls


__all__ = ["mypyc_attr"]
