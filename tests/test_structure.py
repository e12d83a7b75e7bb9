"""The package's shape: no import cycles, no reaching into private names, small modules.

Every module of `hrx_async` is parsed with `ast` (nothing is imported), and
its imports are resolved to the package's own modules:

* an import inside a function counts (it runs whenever the function does);
  one under `if TYPE_CHECKING:` does not, for the cycle check;
* `from P import x` depends on submodule `P.x` when there is one, else on P
  itself (a package's `__init__`); importing from a package that does not
  contain the importer also runs that package's `__init__` (and those of the
  packages above it), so it depends on them too;
* a private name (`_x`, not `__x__`) may be imported only when it is a module,
  and only from inside the package that holds it.

The failure messages name every offender: each cycle as a path of modules
with the line of every import on it, each private import with its line, and
each long file with its line count.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import textwrap
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import hrx_async

PACKAGE = "hrx_async"
ROOT = Path(hrx_async.__file__).parent
MAX_LINES = 650


@dataclasses.dataclass(frozen=True)
class Edge:
    """Module `source` needs module `target` when it runs the import on `line`."""

    source: str
    target: str
    line: int
    deferred: bool
    """The import is inside a function."""


@dataclasses.dataclass(frozen=True)
class PrivateImport:
    module: str
    line: int
    what: str


@dataclasses.dataclass
class Package:
    """The modules of one package tree, by dotted name."""

    name: str
    root: Path
    files: dict[str, Path]

    @classmethod
    def scan(cls, root: Path, name: str) -> Package:
        files: dict[str, Path] = {}
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            # Only directories with an __init__.py are packages of the tree.
            if not all(
                (root.joinpath(*parts[:i]) / "__init__.py").exists() for i in range(1, len(parts))
            ):
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[".".join((name, *parts))] = path
        return cls(name, root, files)

    def is_package(self, module: str) -> bool:
        return self.files[module].name == "__init__.py"

    def package_of(self, module: str) -> str:
        """The package a relative import of `module` starts from."""
        return module if self.is_package(module) else module.rpartition(".")[0]

    def source(self, module: str) -> str:
        return self.files[module].read_text(encoding="utf-8")


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _imports(
    tree: ast.AST,
) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool, bool]]:
    """Every import statement: (node, inside a function, under `if TYPE_CHECKING:`)."""

    def walk(node: ast.AST, deferred: bool, typing_only: bool) -> Iterator[Any]:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, deferred, typing_only
            return
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                yield from walk(child, deferred, True)
            for child in node.orelse:
                yield from walk(child, deferred, typing_only)
            return
        inner = deferred or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            yield from walk(child, inner, typing_only)

    yield from walk(tree, False, False)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _inside(module: str, package: str) -> bool:
    return module.startswith(package + ".")


def analyse(package: Package) -> tuple[list[Edge], list[PrivateImport]]:
    """The dependency edges between the package's modules, and its private imports."""
    edges: list[Edge] = []
    private: list[PrivateImport] = []
    for module in package.files:
        tree = ast.parse(package.source(module), filename=str(package.files[module]))
        for node, deferred, typing_only in _imports(tree):
            needed: list[str] = []
            reached: list[str] = []  # the modules the import names, for the private check
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in package.files:
                        needed.extend(_runs(package, module, alias.name))
                        reached.append(alias.name)
            else:
                origin = _origin(package, module, node)
                if origin not in package.files:
                    continue  # outside the tree (or broken, which other tests find)
                needed.extend(_runs(package, module, origin))
                reached.append(origin)
                for alias in node.names:
                    submodule = f"{origin}.{alias.name}"
                    if submodule in package.files:
                        needed.append(submodule)
                        reached.append(submodule)
                        continue
                    needed.append(origin)  # a name defined by `origin` itself
                    if _is_private(alias.name):
                        what = f"imports private name {alias.name} from {origin}"
                        private.append(PrivateImport(module, node.lineno, what))
            for target in reached:
                owner = _private_owner(target)
                if owner is not None and not (module == owner[0] or _inside(module, owner[0])):
                    what = f"imports private module {owner[1]} of another package ({target})"
                    private.append(PrivateImport(module, node.lineno, what))
            if typing_only:
                continue
            for target in dict.fromkeys(needed):
                if target != module:
                    edges.append(Edge(module, target, node.lineno, deferred))
    return edges, list(dict.fromkeys(private))


def _origin(package: Package, module: str, node: ast.ImportFrom) -> str:
    """The absolute name of the module a `from ... import` reads from."""
    if not node.level:
        return node.module or ""
    base = package.package_of(module)
    for _ in range(node.level - 1):
        base = base.rpartition(".")[0]
    return f"{base}.{node.module}" if node.module else base


def _runs(package: Package, importer: str, target: str) -> list[str]:
    """The modules importing `target` runs: the packages above it and itself, except the
    importer's own packages (imported before the importer runs) and the importer."""
    parts = target.split(".")
    chain = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return [
        name
        for name in chain
        if name in package.files and name != importer and not _inside(importer, name)
    ]


def _private_owner(target: str) -> tuple[str, str] | None:
    """(package holding it, private module) for the outermost private part of `target`."""
    parts = target.split(".")
    for index in range(1, len(parts)):
        if _is_private(parts[index]):
            return ".".join(parts[:index]), ".".join(parts[: index + 1])
    return None


# -- cycles --------------------------------------------------------------------------------


def _components(nodes: list[str], graph: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(graph.get(start, ())))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph.get(child, ()))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    found.append(sorted(component))
    return found


def _shortest_path(
    graph: dict[str, list[str]], start: str, goal: str, within: set[str]
) -> list[str]:
    previous: dict[str, str] = {}
    queue = deque([start])
    seen = {start}
    while queue:
        node = queue.popleft()
        if node == goal:
            path = [goal]
            while path[-1] != start:
                path.append(previous[path[-1]])
            return path[::-1]
        for child in graph.get(node, ()):
            if child in within and child not in seen:
                seen.add(child)
                previous[child] = node
                queue.append(child)
    raise AssertionError(f"{goal} is not reachable from {start}")


def find_cycles(edges: list[Edge]) -> list[list[Edge]]:
    """For every import edge that lies on a cycle, the shortest cycle through it (deduplicated).

    Each cycle starts at its smallest module name, so the same cycle is reported once.
    """
    first: dict[tuple[str, str], Edge] = {}
    for edge in edges:
        first.setdefault((edge.source, edge.target), edge)
    graph: dict[str, list[str]] = {}
    for source, target in first:
        graph.setdefault(source, []).append(target)
    nodes = sorted({name for pair in first for name in pair})
    cycles: dict[tuple[str, ...], list[Edge]] = {}
    for component in _components(nodes, graph):
        if len(component) < 2:
            continue
        members = set(component)
        for (source, target), _edge in sorted(first.items()):
            if source not in members or target not in members:
                continue
            path = [source, *_shortest_path(graph, target, source, members)]
            ring = path[:-1]
            turn = ring.index(min(ring))
            ring = ring[turn:] + ring[:turn]
            key = tuple(ring)
            if key not in cycles:
                closed = [*ring, ring[0]]
                cycles[key] = [first[(a, b)] for a, b in itertools.pairwise(closed)]
    return [cycles[key] for key in sorted(cycles)]


def describe_cycle(cycle: list[Edge]) -> str:
    hops = [
        f"{edge.source} (line {edge.line}{', in a function' if edge.deferred else ''})"
        for edge in cycle
    ]
    return " -> ".join([*hops, cycle[0].source])


def long_files(package: Package, limit: int = MAX_LINES) -> list[str]:
    found = []
    for module, path in sorted(package.files.items()):
        count = len(package.source(module).splitlines())
        if count > limit:
            found.append(f"{path.relative_to(package.root.parent)}: {count} lines")
    return found


# -- the package ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def package() -> Package:
    return Package.scan(ROOT, PACKAGE)


@pytest.fixture(scope="module")
def analysed(package: Package) -> tuple[list[Edge], list[PrivateImport]]:
    return analyse(package)


def test_the_walk_sees_the_whole_package(package: Package) -> None:
    assert f"{PACKAGE}.runtime" in package.files
    assert f"{PACKAGE}._runtime" in package.files  # a package, by its __init__
    assert f"{PACKAGE}.backends._stream" in package.files
    assert len(package.files) == len(list(ROOT.rglob("*.py")))


def test_no_import_cycles(analysed: tuple[list[Edge], list[PrivateImport]]) -> None:
    cycles = find_cycles(analysed[0])
    assert not cycles, f"{len(cycles)} import cycle(s) between modules of {PACKAGE}:\n" + "\n".join(
        f"  {describe_cycle(cycle)}" for cycle in cycles
    )


def test_no_imports_of_private_names(analysed: tuple[list[Edge], list[PrivateImport]]) -> None:
    offenders = analysed[1]
    assert not offenders, f"{len(offenders)} import(s) of another module's private names:\n" + (
        "\n".join(f"  {o.module} line {o.line}: {o.what}" for o in offenders)
    )


def test_no_module_over_the_line_limit(package: Package) -> None:
    offenders = long_files(package)
    assert not offenders, f"modules over {MAX_LINES} lines:\n" + "\n".join(
        f"  {o}" for o in offenders
    )


# -- the checker itself, on a package made for it --------------------------------------------


def _make(tmp_path: Path, files: dict[str, str]) -> Package:
    root = tmp_path / "pkg"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return Package.scan(root, "pkg")


def test_the_checker_resolves_relative_package_and_deferred_imports(tmp_path: Path) -> None:
    package = _make(
        tmp_path,
        {
            "__init__.py": "from .a import A\n",
            "a.py": "from .sub import b\nA = 1\n",
            "sub/__init__.py": "from .. import c\n",
            "sub/b.py": "def f():\n    from ..a import A\n",
            "c.py": "from . import __version__\n",
            "d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A\n",
            "e.py": "import pkg.sub.b\n",
            "notes/loose.py": "from pkg.a import A\n",
        },
    )
    assert "pkg.notes.loose" not in package.files  # no __init__.py: not part of the tree
    edges, private = analyse(package)
    pairs = {(edge.source, edge.target) for edge in edges}
    assert ("pkg.a", "pkg.sub") in pairs  # the package's __init__ runs
    assert ("pkg.a", "pkg.sub.b") in pairs  # and the submodule is imported
    assert ("pkg.sub", "pkg.c") in pairs  # `from .. import c` is the module c
    assert ("pkg.sub", "pkg") not in pairs  # the importer's own package is no dependency
    assert ("pkg.sub.b", "pkg.a") in pairs
    assert ("pkg.c", "pkg") in pairs  # a name taken from the package's __init__
    assert ("pkg.e", "pkg.sub") in pairs and ("pkg.e", "pkg.sub.b") in pairs
    assert not any(edge.source == "pkg.d" for edge in edges)  # typing only
    assert private == []
    cycles = find_cycles(edges)
    assert [describe_cycle(cycle) for cycle in cycles] == [
        "pkg (line 1) -> pkg.a (line 1) -> pkg.sub (line 1) -> pkg.c (line 1) -> pkg",
        "pkg.a (line 1) -> pkg.sub.b (line 2, in a function) -> pkg.a",
    ]


def test_the_checker_names_private_imports(tmp_path: Path) -> None:
    package = _make(
        tmp_path,
        {
            "__init__.py": "",
            "_impl.py": "_hidden = 1\nshown = 2\n",
            "a.py": "from ._impl import shown\nfrom . import _impl\n",
            "b.py": "def f():\n    from .a import _secret\n",
            "sub/__init__.py": "from .._impl import shown\n",
            "sub/_inner.py": "",
            "c.py": "from .sub._inner import x\nimport pkg.sub._inner\nfrom .sub import _inner\n",
        },
    )
    _, private = analyse(package)
    assert [(p.module, p.line, p.what) for p in private] == [
        ("pkg.b", 2, "imports private name _secret from pkg.a"),
        ("pkg.c", 1, "imports private module pkg.sub._inner of another package (pkg.sub._inner)"),
        ("pkg.c", 2, "imports private module pkg.sub._inner of another package (pkg.sub._inner)"),
        ("pkg.c", 3, "imports private module pkg.sub._inner of another package (pkg.sub._inner)"),
    ]


def test_the_checker_counts_lines(tmp_path: Path) -> None:
    package = _make(tmp_path, {"__init__.py": "", "big.py": "x = 1\n" * 12, "small.py": "y = 2\n"})
    assert long_files(package, limit=10) == ["pkg/big.py: 12 lines"]
