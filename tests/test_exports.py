"""Each public name has one home: `hrx_async` exports the core (runtime, memory, graphs,
kernels, errors); `hrx_async.models`, `hrx_async.image` and `hrx_async.serve` export their
own, and none exports another's. `hrx_async.errors` is the module the errors are defined in
(`from hrx_async.errors import ...` is how the package itself reaches them); `hrx_async`
re-exports them as part of the core.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

NAMESPACES = ("hrx_async", "hrx_async.models", "hrx_async.image", "hrx_async.serve")


def _module(name: str) -> ModuleType:
    return importlib.import_module(name)


@pytest.mark.parametrize("name", NAMESPACES)
def test_each_namespace_lists_what_it_exports(name: str) -> None:
    module = _module(name)
    listed = module.__all__
    assert len(listed) == len(set(listed)), f"{name}.__all__ lists a name twice"
    missing = [item for item in listed if not hasattr(module, item)]
    assert not missing, f"{name}.__all__ names what it lacks: {missing}"


def test_each_public_name_is_exported_from_exactly_one_namespace() -> None:
    homes: dict[str, list[str]] = {}
    for name in NAMESPACES:
        for item in _module(name).__all__:
            homes.setdefault(item, []).append(name)
    twice = {item: where for item, where in homes.items() if len(where) > 1}
    assert not twice, f"exported from more than one namespace: {twice}"


def test_no_object_is_exported_under_two_names() -> None:
    owners: dict[int, str] = {}
    for name in NAMESPACES:
        module = _module(name)
        for item in module.__all__:
            value = getattr(module, item)
            if isinstance(value, str | int | float | tuple | frozenset):
                continue  # constants: equal values may be distinct names
            where = f"{name}.{item}"
            assert owners.setdefault(id(value), where) == where, (
                f"{where} is {owners[id(value)]} again"
            )


@pytest.mark.parametrize("name", NAMESPACES[1:])
def test_the_core_does_not_reexport_a_sub_namespace(name: str) -> None:
    core = _module("hrx_async")
    leaked = sorted(item for item in _module(name).__all__ if item in vars(core))
    assert not leaked, f"hrx_async holds names of {name}: {leaked}"


def test_the_errors_are_the_cores() -> None:
    errors, core = _module("hrx_async.errors"), _module("hrx_async")
    assert set(errors.__all__) <= set(core.__all__)
    for item in errors.__all__:
        assert getattr(core, item) is getattr(errors, item)
