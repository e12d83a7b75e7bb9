"""The xrt backend and the fake pyxrt against XRT's own binding, without an NPU.

The binding's surface is read from XRT's sources, when they are at hand beside
this checkout (otherwise from `xrt_binding_surface.json`, made from them): the
stub `pyxrt.pyi` (parsed with `ast`) and the binding `pyxrt.cpp` (its
`py::class_`/`py::enum_` declarations and `.def` / `.value` chains). The stub
stops after `run.__init__`, so `bo`, `kernel`, `xclbin` and the rest of `run`
come from the binding source alone; where both describe a name they must agree.

Then every pyxrt name `xrt.py`/`xrt_*.py` reach (found with `ast`: chains on
the module object, constructor calls, and calls of binding methods on its
objects) must exist with a compatible argument count, and the fake in
`tests/fake_pyxrt.py` is held to the same surface, so neither can drift from
the binding. A use added to the backend is checked with no change here.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

import hrx_async.backends.xrt as xrt_backend

sys.path.insert(0, str(Path(__file__).parent.parent))
import fake_pyxrt

REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference" / "xrt"
HAVE_REFERENCE = (REFERENCE / "pyxrt.cpp").is_file() and (REFERENCE / "pyxrt.pyi").is_file()
SURFACE_FILE = Path(__file__).parent.parent / "xrt_binding_surface.json"
"""The binding's surface (names, kinds, positional argument counts) as read from XRT's
sources, committed so that the checks run where those sources are not at hand."""
needs_reference = pytest.mark.skipif(
    not HAVE_REFERENCE, reason="XRT's binding sources are not beside this checkout"
)
BACKEND_FILES = sorted(Path(xrt_backend.__file__).parent.glob("xrt*.py"))
MODULE_NAMES = {"xrt", "module"}
"""Local names the backend gives the pyxrt module (`self.xrt` too)."""
NOT_PYXRT = {"self._wake", "self._thread", "thread", "self.lock", "path", "data"}
"""Receivers in the backend that are threading or pathlib objects, not pyxrt ones."""

# Values from XRT's headers (ert.h, xrt/xrt_bo.h).
ENUM_VALUES = {
    "ert_cmd_state": {
        "ERT_CMD_STATE_NEW": 1,
        "ERT_CMD_STATE_QUEUED": 2,
        "ERT_CMD_STATE_COMPLETED": 4,
        "ERT_CMD_STATE_ERROR": 5,
        "ERT_CMD_STATE_ABORT": 6,
        "ERT_CMD_STATE_SUBMITTED": 7,
        "ERT_CMD_STATE_TIMEOUT": 8,
        "ERT_CMD_STATE_NORESPONSE": 9,
        "ERT_CMD_STATE_SKERROR": 10,
        "ERT_CMD_STATE_SKCRASHED": 11,
    },
    "xclBOSyncDirection": {
        "XCL_BO_SYNC_BO_TO_DEVICE": 0,
        "XCL_BO_SYNC_BO_FROM_DEVICE": 1,
        "XCL_BO_SYNC_BO_GMIO_TO_AIE": 2,
        "XCL_BO_SYNC_BO_AIE_TO_GMIO": 3,
    },
}


@dataclass
class Entry:
    kind: str  # "class", "enum", "member", "method", "function", "value"
    arities: set[int] | None = field(default_factory=set)
    """Positional argument counts (self excluded); None when the source does not say."""

    def allow(self, arity: int | None) -> None:
        if arity is None or self.arities is None:
            self.arities = None
        else:
            self.arities.add(arity)


Surface = dict[str, Entry]


def _add(
    surface: Surface, path: str, kind: str, arity: int | None = None, counted: bool = False
) -> None:
    entry = surface.setdefault(path, Entry(kind))
    if counted:
        entry.allow(arity)


# -- the binding source --------------------------------------------------------------------


def _statements(text: str) -> list[str]:
    """Statements at parenthesis depth 0 (lambda bodies stay inside their `.def(...)`)."""
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(
        r'"(?:\\.|[^"\\])*"',
        lambda m: m.group(0).translate(str.maketrans(";(){}[]<>", "         ")),
        text,
    )
    out, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char in "([":
            depth += 1
        elif char in ")]":
            depth -= 1
        elif char in "{}" and depth == 0:
            start = index + 1
        elif char == ";" and depth == 0:
            out.append(text[start:index].strip())
            start = index + 1
    return out


def _balanced(text: str, start: int) -> str:
    """The text inside the parentheses opening at text[start]."""
    depth = 0
    for index in range(start, len(text)):
        if text[index] in "({[":
            depth += 1
        if text[index] in ")}]":
            depth -= 1
            if depth == 0:
                return text[start + 1 : index]
    raise ValueError("unbalanced")


def _top_level_split(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        if char in "(<{[":
            depth += 1
        elif char in ")>}]":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current.strip())
    return parts


def _lambda_arity(text: str) -> int | None:
    match = re.match(r"\(?\s*\[[^\]]*\]\s*\(", text)
    if not match:
        return None
    params = _balanced(text, match.end() - 1).strip()
    if "py::args" in params:
        return None  # variadic
    return 0 if not params else len(_top_level_split(params))


def _calls(statement: str, name: str) -> list[str]:
    """The argument text of each `.name(` call at the chain's top level."""
    found, depth, index = [], 0, 0
    while index < len(statement):
        char = statement[index]
        if char in "({[":
            depth += 1
        elif char in ")}]":
            depth -= 1
        elif depth == 0 and statement.startswith(f".{name}(", index):
            open_at = index + len(name) + 1
            found.append(_balanced(statement, open_at))
            index = open_at
            continue
        index += 1
    return found


@cache
def binding_surface() -> Surface:
    text = (REFERENCE / "pyxrt.cpp").read_text()
    statements = _statements(text)
    owners: dict[str, str] = {"m": ""}
    for match in re.finditer(r'py::module_\s+(\w+)\s*=\s*m\.def_submodule\(\s*"(\w+)"', text):
        owners[match.group(1)] = match.group(2) + "."
    declaration = re.compile(r'py::(class_|enum_)<[^;]*?>\s*(\w+)?\s*\(\s*(\w+)\s*,\s*"(\w+)"')
    for statement in statements:  # variable names first: a chain may precede its declaration
        for match in declaration.finditer(statement):
            if match.group(2):
                owners[match.group(2)] = owners.get(match.group(3), "") + match.group(4) + "."
    owners["pyker"] = "kernel."
    owners["pydevice"] = "device."
    surface: Surface = {}
    for statement in statements:
        match = declaration.search(statement)
        if match and statement.lstrip().startswith("py::"):
            parent = owners.get(match.group(3), "")
            path = parent + match.group(4)
            kind = "enum" if match.group(1) == "enum_" else "class"
            _add(surface, path, kind)
            prefix = path + "."
            if kind == "enum":
                for value in _calls(statement, "value"):
                    member = value.split(",")[0].strip().strip('"')
                    _add(surface, prefix + member, "member")
                    if "export_values" in statement:
                        _add(surface, parent + member, "value")
        else:
            head = re.match(r"\s*(\w+)\s*\.", statement)
            if not head or head.group(1) not in owners:
                continue
            prefix = owners[head.group(1)]
        for args in _calls(statement, "def"):
            if args.lstrip().startswith("py::init"):
                template = re.match(r"\s*py::init<(.*?)>\s*\(", args, re.S)
                if template:
                    arity: int | None = len(_top_level_split(template.group(1)))
                else:
                    arity = _lambda_arity(args[args.index("(") + 1 :])
                _add(surface, prefix + "__init__", "method", arity, True)
                continue
            name = re.match(r'\s*"(\w+)"\s*,\s*(.*)', args, re.S)
            if not name:
                continue
            rest = name.group(2)
            lambda_arity = _lambda_arity(rest)
            kind = "function" if head and head.group(1) == "m" else "method"
            # None for a member function pointer: only the header has its count.
            arity = None if lambda_arity is None else lambda_arity - (kind == "method")
            _add(surface, prefix + name.group(1), kind, arity, True)
    return surface


@cache
def stub_surface() -> Surface:
    tree = ast.parse((REFERENCE / "pyxrt.pyi").read_text())
    surface: Surface = {}

    def visit(body: list[ast.stmt], prefix: str, in_class: bool) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                enum = any(ast.unparse(b) == "IntEnum" for b in node.bases)
                _add(surface, prefix + node.name, "enum" if enum else "class")
                visit(node.body, prefix + node.name + ".", True)
            elif isinstance(node, ast.FunctionDef):
                count = len(node.args.args) - (1 if in_class else 0)
                _add(surface, prefix + node.name, "method" if in_class else "function", count, True)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                _add(surface, prefix + node.target.id, "member")

    visit(tree.body, "", False)
    return surface


@cache
def surface() -> Surface:
    """The binding's surface: read from XRT's sources when at hand, else the committed one."""
    if HAVE_REFERENCE:
        return reference_surface()
    data = json.loads(SURFACE_FILE.read_text())
    return {
        path: Entry(item["kind"], None if item["arities"] is None else set(item["arities"]))
        for path, item in data.items()
    }


def dump_surface(found: Surface) -> dict[str, dict[str, object]]:
    return {
        path: {
            "kind": entry.kind,
            "arities": None if entry.arities is None else sorted(entry.arities),
        }
        for path, entry in sorted(found.items())
    }


@cache
def reference_surface() -> Surface:
    merged: Surface = {}
    for source in (binding_surface(), stub_surface()):
        for path, entry in source.items():
            target = merged.setdefault(path, Entry(entry.kind))
            if entry.arities is None:
                target.arities = None
            elif target.arities is not None:
                target.arities |= entry.arities
    return merged


# -- what the backend uses -----------------------------------------------------------------


def _module_path(node: ast.expr) -> str | None:
    """'bo.host_only' for `xrt.bo.host_only` / `self.xrt.bo.host_only`; '' for the module."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Name) and node.value.id == "self" and node.attr == "xrt":
            return ".".join(reversed(parts))
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in MODULE_NAMES:
        return ".".join(reversed(parts))
    return None


@dataclass(frozen=True)
class Use:
    where: str
    path: str
    arity: int | None  # None: an attribute, not a call


def backend_uses() -> tuple[list[Use], list[Use]]:
    """(uses rooted at the pyxrt module, calls of binding method names on other objects)."""
    method_names = {p.rsplit(".", 1)[-1] for p, e in surface().items() if e.kind == "method"}
    method_names -= {"__init__"}
    module_uses: list[Use] = []
    method_uses: list[Use] = []
    for file in BACKEND_FILES:
        tree = ast.parse(file.read_text())
        for node in ast.walk(tree):
            where = f"{file.name}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Call):
                path = _module_path(node.func)
                if path:
                    module_uses.append(Use(where, path, len(node.args)))
                    continue
                func = node.func
                if (
                    isinstance(func, ast.Attribute)
                    and func.attr in method_names
                    and _module_path(func.value) is None
                    and ast.unparse(func.value) not in NOT_PYXRT
                ):
                    method_uses.append(Use(where, func.attr, len(node.args)))
            elif isinstance(node, ast.Attribute):
                path = _module_path(node)
                if path:
                    module_uses.append(Use(where, path, None))
    return module_uses, method_uses


def _check(path: str, arity: int | None, where: str) -> str | None:
    entry = surface().get(path)
    if entry is None:
        return f"{where}: pyxrt.{path} is not in the binding"
    if arity is None or entry.kind in ("member", "value", "enum"):
        return None
    target = entry
    if entry.kind == "class":
        target = surface().get(path + ".__init__", Entry("method", None))
    if target.arities is not None and arity not in target.arities:
        return (
            f"{where}: pyxrt.{path} takes {sorted(target.arities)} arguments, called with {arity}"
        )
    return None


# -- tests ---------------------------------------------------------------------------------


@needs_reference
def test_the_committed_surface_is_the_binding() -> None:
    """Regenerate with `python tests/backends/test_xrt_conformance.py` when XRT's sources change."""
    assert json.loads(SURFACE_FILE.read_text()) == dump_surface(reference_surface())


@needs_reference
def test_the_parsers_read_the_binding() -> None:
    found = surface()
    for path, arities in {
        "bo.__init__": {3, 4},
        "bo.sync": {1, 3},
        "bo.write": {2},
        "bo.read": {2},
        "run.set_arg": {2},
        "run.wait": {0, 1},
        "run.start": {0},
        "kernel.__init__": {2, 3, 4},
        "hw_context.__init__": {0, 2, 3, 4},
        "device.__init__": {0, 1},
        "ext.bo.__init__": {2, 3, 4},
    }.items():
        assert found[path].arities == arities, (path, found[path].arities)
    for path in (
        "bo.host_only",
        "bo.cacheable",
        "bo.flags.host_only",
        "run.state",
        "kernel.group_id",
        "xclbin.xclbinkernel.get_num_args",
        "ert_cmd_state",
        "xrt_info_device.name",
        "enumerate_devices",
    ):
        assert path in found, path
    assert "ert_cmd_state.ERT_CMD_STATE_RUNNING" not in found


@needs_reference
def test_stub_and_binding_agree_where_both_speak() -> None:
    stub, binding = stub_surface(), binding_surface()
    disagreements = []
    for path, entry in stub.items():
        other = binding.get(path)
        if other is None:
            if entry.kind in ("member", "value") or path.startswith("xrt_msg_level"):
                continue  # module-level aliases of exported enum values
            if path in ("XCL_BO_FLAGS_NONE", "memory_group", "export_handle", "pid_type"):
                continue
            disagreements.append(f"{path}: in the stub only")
        elif entry.arities and other.arities and not entry.arities & other.arities:
            disagreements.append(f"{path}: stub {entry.arities}, binding {other.arities}")
    assert not disagreements, "\n".join(disagreements)


def test_backend_uses_only_the_binding() -> None:
    module_uses, method_uses = backend_uses()
    assert module_uses and method_uses  # the scan sees the backend's calls
    problems = [p for use in module_uses if (p := _check(use.path, use.arity, use.where))]
    for use in method_uses:
        owners = [
            e
            for path, e in surface().items()
            if path.endswith("." + use.path) and e.kind == "method"
        ]
        counts: set[int] | None = set()
        for entry in owners:
            if entry.arities is None or counts is None:
                counts = None
            else:
                counts |= entry.arities
        if counts is not None and use.arity not in counts:
            problems.append(
                f"{use.where}: .{use.path}() takes {sorted(counts)}, called with {use.arity}"
            )
        if use.path in ("wait", "wait2", "add_callback"):
            problems.append(f"{use.where}: .{use.path}() blocks holding the GIL or is not callable")
    assert not problems, "\n".join(problems)


def test_backend_uses_exist_in_the_fake() -> None:
    fake = fake_pyxrt.install()
    try:
        module_uses, _ = backend_uses()
        missing = []
        for use in module_uses:
            target: object = fake
            for part in use.path.split("."):
                if not hasattr(target, part):
                    missing.append(f"{use.where}: fake has no pyxrt.{use.path}")
                    break
                target = getattr(target, part)
        assert not missing, "\n".join(missing)
    finally:
        fake_pyxrt.uninstall()


def _fake_paths() -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    fake = fake_pyxrt.install()
    fake_pyxrt.uninstall()

    def visit(prefix: str, owner: object, names: list[str]) -> None:
        for name in names:
            value = getattr(owner, name)
            path = prefix + name
            out.append((path, value))
            if inspect.isclass(value):
                own = [
                    n for n in vars(value) if not n.startswith("_") or n in ("__init__", "__call__")
                ]
                if issubclass(value, int):  # an enum: its members
                    own = [n for n in value.__members__]
                visit(path + ".", value, own)

    visit("", fake, list(fake_pyxrt.PUBLIC))
    return out


def test_fake_is_a_subset_of_the_binding() -> None:
    problems = []
    for path, value in _fake_paths():
        if path.endswith("__call__") or path == "ext":
            continue
        entry = surface().get(path)
        if entry is None:
            problems.append(f"fake has pyxrt.{path}, the binding does not")
            continue
        if inspect.isfunction(value) and entry.arities:
            params = list(inspect.signature(value).parameters.values())
            if any(p.kind is p.VAR_POSITIONAL for p in params):
                continue  # dispatches by hand over the binding's overloads (tested below)
            positional = [p for p in params if p.name != "self"]
            if any(p.default is not p.empty for p in positional):
                problems.append(f"fake pyxrt.{path} has defaults the binding lacks")
            if len(positional) not in entry.arities:
                problems.append(
                    f"fake pyxrt.{path} takes {len(positional)}, binding {entry.arities}"
                )
    assert not problems, "\n".join(problems)


def test_fake_enum_values_match_xrt() -> None:
    for enum_name, members in ENUM_VALUES.items():
        enum = getattr(fake_pyxrt, enum_name)
        assert {m.name: m.value for m in enum} == members
        for member in members:
            assert f"{enum_name}.{member}" in surface()


def test_fake_overloads_like_the_binding(tmp_path: Path) -> None:
    fake = fake_pyxrt.install()
    try:
        device = fake.device(0)
        bo = fake.bo(device, 64, fake.bo.host_only, 0)
        with pytest.raises(TypeError):
            bo.sync(fake.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE, 64)  # no default offset
        with pytest.raises(TypeError):
            bo.read(4)  # type: ignore[call-arg]
        with pytest.raises(TypeError):
            bo.write(b"1234")  # type: ignore[call-arg]
        fake.bo(bo, 16, 16)  # a sub-buffer
        xclbin = fake_pyxrt.write_xclbin(tmp_path / "k.xclbin", {"K": 5})
        context = fake.hw_context(device, device.register_xclbin(fake.xclbin(str(xclbin))))
        kernel = fake.kernel(context, "K")
        fake_pyxrt.FAKE.references["K"] = lambda arrays: None
        run = kernel(3, bo, "skipped", 2.5, bo)  # non-bo, non-int arguments are skipped silently
        assert sorted(run._args) == [0, 1, 4]
        assert int(run.state()) == 5  # its instructions never reached the device: ERROR
        with pytest.raises(TypeError):
            run.set_arg(0, "x")
        with pytest.raises(TypeError):
            run.wait2()
        fake_pyxrt.FAKE.hang_next = 1
        hung = fake.run(kernel)
        hung.set_arg(1, bo)
        hung.start()
        assert hung.state() == 3 and not isinstance(hung.state(), fake.ert_cmd_state)
    finally:
        fake_pyxrt.uninstall()


if __name__ == "__main__":
    SURFACE_FILE.write_text(json.dumps(dump_surface(reference_surface()), indent=1) + "\n")
