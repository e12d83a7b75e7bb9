"""Every public name has a docstring: the classes, functions, methods and properties that the
public namespaces export (`hrx_async`, `hrx_async.models`, `hrx_async.image`,
`hrx_async.tensor`, `hrx_async.serve`) and those `hrx_async.errors` defines; and, from the
source alone, what the adapters that need an optional library export (`hrx_async.torch`,
`hrx_async.cupy`).

Docstrings are read from the source (with `ast`), not from the imported objects, so the check
is the same on the compiled build (where mypyc may not keep `__doc__`) and on the pure one, and
so a docstring that Python makes up (a dataclass's or a NamedTuple's signature) does not count.
The API reference of the documentation site is generated from these docstrings.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import itertools
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

PACKAGE_ROOT = Path(__file__).resolve().parent.parent / "hrx_async"
NAMESPACES = (
    "hrx_async",
    "hrx_async.models",
    "hrx_async.image",
    "hrx_async.tensor",
    "hrx_async.serve",
    "hrx_async.errors",
)


@cache
def _tree(module: str) -> ast.Module | None:
    """The parsed source of `module` from the checkout, or None for a module without one."""
    relative = Path(*module.split(".")[1:])
    for path in (PACKAGE_ROOT / relative / "__init__.py", PACKAGE_ROOT / f"{relative}.py"):
        if module != "hrx_async" and path.name == "__init__.py" and not path.parent.is_dir():
            continue
        if path.is_file():
            return ast.parse(path.read_text(), str(path))
    return None


Definition = ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef


def _find(body: list[ast.stmt], name: str) -> list[Definition]:
    """The definitions called `name` in `body`, including those under `if`/`try` blocks."""
    found: list[Definition] = []
    for node in body:
        if isinstance(node, Definition) and node.name == name:
            found.append(node)
        elif isinstance(node, ast.If | ast.Try):
            for block in (node.body, node.orelse, getattr(node, "finalbody", [])):
                found.extend(_find(block, name))
    return found


def _definitions(module: str, qualname: str) -> list[Definition] | None:
    """Where `qualname` is defined in `module`'s source; None when it cannot be found there."""
    tree = _tree(module)
    if tree is None or "<locals>" in qualname:
        return None
    scopes: list[Definition] = []
    body: list[ast.stmt] = tree.body
    for part in qualname.split("."):
        scopes = _find(body, part)
        if not scopes:
            return None
        body = [node for scope in scopes for node in scope.body]
    return scopes


def _attribute_docstring(module: str, qualname: str) -> str | None:
    """The docstring written under a class attribute (`dtype = property(...)` then a string),
    the convention the API reference (griffe) reads for attributes."""
    owner, _, name = qualname.rpartition(".")
    scopes = _definitions(module, owner) if owner else None
    for scope in scopes or []:
        body = scope.body
        for node, after in itertools.pairwise(body):
            targets = node.targets if isinstance(node, ast.Assign) else []
            if any(isinstance(t, ast.Name) and t.id == name for t in targets) and (
                isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                return after.value.value
    return None


def _documented(definitions: list[Definition]) -> bool:
    # An overloaded function's implementation carries the docstring; any one will do.
    return any((ast.get_docstring(node) or "").strip() for node in definitions)


def _public_objects() -> dict[str, object]:
    """Each public object of the namespaces, under the name a user reaches it by."""
    objects: dict[str, object] = {}
    for name in NAMESPACES:
        module: ModuleType = importlib.import_module(name)
        names = getattr(module, "__all__", None)
        if names is None:  # hrx_async.errors: what it defines
            names = [
                item
                for item, value in vars(module).items()
                if not item.startswith("_") and getattr(value, "__module__", None) == name
            ]
        for item in names:
            value = getattr(module, item)
            if inspect.isclass(value) or inspect.isroutine(value):
                objects.setdefault(f"{name}.{item}", value)
    return objects


def _member_kind(cls: type, member: str) -> str | None:
    """'method' or 'property' when `member` of `cls` is one defined in hrx_async, else None."""
    for owner in cls.__mro__:
        if member not in vars(owner):
            continue
        if not owner.__module__.startswith("hrx_async"):
            return None
        definitions = _definitions(owner.__module__, f"{owner.__qualname__}.{member}")
        if definitions is not None:
            functions = [d for d in definitions if not isinstance(d, ast.ClassDef)]
            return "method" if functions else None
        raw = vars(owner)[member]
        if isinstance(raw, property):
            return "property"
        if inspect.isroutine(raw) or isinstance(raw, classmethod | staticmethod):
            return "method"
        return None
    return None


def _member_documented(cls: type, member: str) -> bool:
    """True when `member` has a docstring where `cls` gets it, or where an override's base
    (within hrx_async) documents it: an override keeps the contract it implements."""
    for owner in cls.__mro__:
        if member not in vars(owner) or not owner.__module__.startswith("hrx_async"):
            continue
        definitions = _definitions(owner.__module__, f"{owner.__qualname__}.{member}")
        raw = vars(owner)[member]
        if definitions is not None:
            if _documented(definitions):
                return True
            continue
        if _attribute_docstring(owner.__module__, f"{owner.__qualname__}.{member}") or (
            not isinstance(raw, property) and inspect.getdoc(raw)
        ):
            return True
    return False


def _object_documented(value: object) -> bool:
    module = getattr(value, "__module__", "") or ""
    qualname = getattr(value, "__qualname__", "") or ""
    definitions = _definitions(module, qualname) if module.startswith("hrx_async") else None
    if definitions is not None:
        return _documented(definitions)
    return bool(inspect.getdoc(value))


def undocumented() -> list[str]:
    """Every public name without a docstring, as `namespace.Name` or `namespace.Name.member`."""
    missing: list[str] = []
    for where, value in sorted(_public_objects().items()):
        if not _object_documented(value):
            missing.append(where)
        if not inspect.isclass(value):
            continue
        for member in sorted(dir(value)):
            if member.startswith("_") or _member_kind(value, member) is None:
                continue
            if not _member_documented(value, member):
                missing.append(f"{where}.{member}")
    return missing


OPTIONAL_NAMESPACES = ("hrx_async.torch", "hrx_async.cupy")
"""Namespaces that import an optional library (PyTorch, CuPy) and so may not import here:
checked from their source alone, following `from .module import name` to the definition."""


def _source_exports(module: str) -> list[tuple[str, str]]:
    """(defining module, name) for each name in `module`'s literal `__all__`."""
    tree = _tree(module)
    assert tree is not None, f"no source for {module}"
    listed: list[str] = []
    origins: dict[str, str] = {}
    package = (
        module
        if (PACKAGE_ROOT / Path(*module.split(".")[1:])).is_dir()
        else (module.rpartition(".")[0])
    )
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            listed = list(ast.literal_eval(node.value))
        elif isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            for alias in node.names:
                origins[alias.asname or alias.name] = f"{package}.{node.module}"
    assert listed, f"{module} has no literal __all__"
    return [(origins.get(name, module), name) for name in listed]


def undocumented_in_source(module: str) -> list[str]:
    """Every name `module` exports without a docstring, and every public method of an
    exported class without one, found in the source."""
    missing: list[str] = []
    for home, name in _source_exports(module):
        definitions = _definitions(home, name)
        if definitions is None:
            continue  # a constant: nothing to document
        if not _documented(definitions):
            missing.append(f"{module}.{name}")
        for cls in (d for d in definitions if isinstance(d, ast.ClassDef)):
            for member in cls.body:
                if (
                    isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef)
                    and not member.name.startswith("_")
                    and not (ast.get_docstring(member) or "").strip()
                ):
                    missing.append(f"{module}.{name}.{member.name}")
    return missing


def test_the_optional_namespaces_document_every_public_name() -> None:
    found = {module: _source_exports(module) for module in OPTIONAL_NAMESPACES}
    assert all(found.values()), found  # the check reaches something in each
    missing = [where for module in OPTIONAL_NAMESPACES for where in undocumented_in_source(module)]
    assert not missing, f"{len(missing)} public names lack a docstring:\n" + "\n".join(missing)


def test_the_check_finds_what_it_checks() -> None:
    """The check reaches classes, functions, methods and properties (it could pass vacuously
    if it found nothing)."""
    objects = _public_objects()
    assert "hrx_async.Runtime" in objects and "hrx_async.errors.ContractError" in objects
    assert _member_kind(objects["hrx_async.Runtime"], "graph") == "method"  # type: ignore[arg-type]
    buffer = objects["hrx_async.Buffer"]
    assert _member_kind(buffer, "freed") == "method"  # type: ignore[arg-type]  # a property
    assert _member_kind(buffer, "nbytes") is None  # type: ignore[arg-type]  # an attribute
    assert _definitions("hrx_async.runtime", "Runtime.graph")


def test_every_public_name_has_a_docstring() -> None:
    missing = undocumented()
    assert not missing, f"{len(missing)} public names lack a docstring:\n" + "\n".join(missing)


if __name__ == "__main__":  # python tests/test_docstrings.py: the list, one a line
    print("\n".join(undocumented()))
    sys.exit(0)
