"""The package's shape: its layers, no import cycles, no reaching into private names, small
modules.

Every module of `hrx_async` is parsed with `ast` (nothing is imported), and
its imports are resolved to the package's own modules:

* an import inside a function counts (it runs whenever the function does), and so
  does one under `if TYPE_CHECKING:` (the design depends on it even if a run does not):
  a cycle through typing-only imports is a cycle too;
* `from P import x` depends on submodule `P.x` when there is one, else on P
  itself (a package's `__init__`); importing from a package that does not
  contain the importer also runs that package's `__init__` (and those of the
  packages above it), so it depends on them too;
* a private name (`_x`, not `__x__`) may be imported only when it is a module,
  and only from inside the package that holds it; nor is one read as an attribute of
  a module or class imported from another package (`module._x`, `Class._x`);
* each module belongs to a layer (`LAYERS`) and imports only its own layer and those
  below it: `_core` only itself and `errors`, `backends` only `_core` and `errors`,
  nothing below `models`/`image`/`serve` imports them, nothing imports `tools`.

The failure messages name every offender: each cycle as a path of modules
with the line of every import on it, each private import with its line, each arrow
that climbs a layer with its line, and each long file with its line count.
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
    typing_only: bool = False
    """The import is under `if TYPE_CHECKING:`."""


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
            for target in dict.fromkeys(needed):
                if target != module:
                    edges.append(Edge(module, target, node.lineno, deferred, typing_only))
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
        f"{edge.source} (line {edge.line}{', in a function' if edge.deferred else ''}"
        f"{', typing only' if edge.typing_only else ''})"
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


# -- layers -----------------------------------------------------------------------------------

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("leaves", ("hrx_async.errors", "hrx_async.files", "hrx_async._build")),
    ("core", ("hrx_async._core",)),
    ("backends", ("hrx_async.backends",)),
    ("runtime", ("hrx_async._runtime",)),
    ("api", ("hrx_async", "hrx_async.runtime", "hrx_async.blocking")),
    (
        "namespaces",
        (
            "hrx_async.models",
            "hrx_async.image",
            "hrx_async.serve",
            "hrx_async.tensor",
            "hrx_async.torch",
            "hrx_async.cupy",
        ),
    ),
    ("tools", ("hrx_async.tools", "hrx_async.examples", "hrx_async.__main__")),
)
"""Bottom to top. A module is in the layer of the longest prefix that names it."""

ONLY: dict[str, tuple[str, ...]] = {
    "core": ("leaves", "core"),
    "backends": ("leaves", "core", "backends"),
}
"""Layers that may import only the ones listed (the rest import any layer below them)."""
LEAVES_BELOW_BACKENDS = ("hrx_async.errors",)
"""Of the leaves, what `_core` and `backends` may import: `errors` alone."""


def layer_of(module: str) -> str:
    best, found = -1, ""
    for name, prefixes in LAYERS:
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), name
    assert found, f"{module} is in no layer: add it to LAYERS"
    return found


def climbing(edges: list[Edge]) -> list[Edge]:
    """The imports that reach a layer their module may not import."""
    order = [name for name, _ in LAYERS]
    found = []
    for edge in edges:
        source, target = layer_of(edge.source), layer_of(edge.target)
        allowed = ONLY.get(source, tuple(order[: order.index(source) + 1]))
        if target not in allowed or (
            source in ONLY and target == "leaves" and edge.target not in LEAVES_BELOW_BACKENDS
        ):
            found.append(edge)
    return found


# -- private attributes of what another package exports -------------------------------------


def private_attributes(package: Package) -> list[PrivateImport]:
    """`name._x` where `name` is a module or a name imported from another package."""
    found: list[PrivateImport] = []
    for module in package.files:
        tree = ast.parse(package.source(module), filename=str(package.files[module]))
        foreign: dict[str, str] = {}
        own = package.package_of(module)
        for node, _deferred, _typing in _imports(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in package.files and alias.asname:
                        foreign[alias.asname] = alias.name
                continue
            origin = _origin(package, module, node)
            if origin not in package.files:
                continue
            for alias in node.names:
                source = f"{origin}.{alias.name}"
                holder = source if source in package.files else origin
                home = package.package_of(holder)
                # Its own package, or one it is inside of, is not another package.
                if not (home == own or _inside(own, home)):
                    foreign[alias.asname or alias.name] = source
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in foreign
                and _is_private(node.attr)
            ):
                what = f"reads private {node.attr} of {foreign[node.value.id]}"
                found.append(PrivateImport(module, node.lineno, what))
    return list(dict.fromkeys(found))


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



def test_no_import_cycles_counting_typing_imports(
    analysed: tuple[list[Edge], list[PrivateImport]],
) -> None:
    cycles = find_cycles(analysed[0])
    assert not cycles, f"{len(cycles)} import cycle(s) between modules of {PACKAGE}:\n" + "\n".join(
        f"  {describe_cycle(cycle)}" for cycle in cycles
    )


def test_each_import_stays_in_its_layer_or_below(
    analysed: tuple[list[Edge], list[PrivateImport]],
) -> None:
    offenders = climbing(analysed[0])
    assert not offenders, f"{len(offenders)} import(s) that climb a layer:\n" + "\n".join(
        f"  {e.source} ({layer_of(e.source)}) line {e.line} -> {e.target} ({layer_of(e.target)})"
        for e in offenders
    )


def test_every_module_is_in_a_layer(package: Package) -> None:
    for module in package.files:
        layer_of(module)


def test_no_private_attributes_of_another_packages_names(package: Package) -> None:
    offenders = [
        o for o in private_attributes(package) if (o.module, o.what) not in PRIVATE_ATTRIBUTES
    ]
    assert not offenders, f"{len(offenders)} read(s) of another package's private names:\n" + (
        "\n".join(f"  {o.module} line {o.line}: {o.what}" for o in offenders)
    )


PRIVATE_ATTRIBUTES = {
    ("hrx_async.models.chain", "reads private _make of hrx_async._core.memory.View"): (
        "inside hrx_async.models (its own work)"
    ),
}


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
    typing = [
        (edge.source, edge.target, edge.typing_only) for edge in edges if edge.source == "pkg.d"
    ]
    assert typing == [("pkg.d", "pkg.a", True)]  # counted, and marked typing only
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


def test_the_checker_finds_arrows_that_climb() -> None:
    def edge(source: str, target: str) -> Edge:
        return Edge(source, target, 1, False)

    wrong = [
        edge("hrx_async._core.graph", "hrx_async._runtime.prepared"),
        edge("hrx_async._core.trace", "hrx_async.files"),
        edge("hrx_async.backends.sim", "hrx_async._runtime.region"),
        edge("hrx_async.backends.kernel_cache", "hrx_async.files"),
        edge("hrx_async.runtime", "hrx_async.serve.slots"),
        edge("hrx_async.serve.asgi", "hrx_async.tools.cli"),
        edge("hrx_async._runtime.session", "hrx_async.blocking"),
    ]
    right = [
        edge("hrx_async._core.graph", "hrx_async.errors"),
        edge("hrx_async.backends.sim", "hrx_async._core.lane"),
        edge("hrx_async._runtime.session", "hrx_async.backends"),
        edge("hrx_async.models.chain", "hrx_async.serve.slots"),
        edge("hrx_async.tools.cli", "hrx_async.examples"),
        edge("hrx_async.models._format", "hrx_async.files"),
    ]
    assert climbing(wrong + right) == wrong


def test_the_checker_names_private_attributes_of_other_packages(tmp_path: Path) -> None:
    package = _make(
        tmp_path,
        {
            "__init__.py": "",
            "a/__init__.py": "",
            "a/m.py": "class K:\n    _x = 1\n",
            "a/o.py": "from .m import K\nK._x\n",
            "b/__init__.py": "",
            "b/n.py": "from ..a.m import K\nfrom ..a import m\nK._x\nm._y\nK.__name__\n",
        },
    )
    assert [(p.module, p.line, p.what) for p in private_attributes(package)] == [
        ("pkg.b.n", 3, "reads private _x of pkg.a.m.K"),
        ("pkg.b.n", 4, "reads private _y of pkg.a.m"),
    ]
