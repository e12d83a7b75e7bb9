"""The HIP driver table against the real hip-python package, and HIP without ROCm.

No AMD GPU is needed. `hrx_async/backends/hip.py` is parsed with `ast`; every
hip-python name it reaches (`hip.X`, `hiprtc.X`, `self.hip.X`, ...) must exist
in the installed package, every call must bind to the function's signature,
and every tuple unpacked from a call must have the length the package's stub
documents. A call added to hip.py is checked with no change here.

Without ROCm, `Runtime(backend="hip")` must say that libamdhip64.so is
missing, and `backend="auto"` must fall back with that reason.
"""

from __future__ import annotations

import ast
import ctypes
import functools
import importlib
import inspect
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import hrx_async as hrx
from hrx_async.backends import hip as hip_backend
from hrx_async.backends import probe
from hrx_async.backends.kernel_cache import cache_key
from hrx_async.errors import BackendUnavailable, ContractError

HIP_PY = Path(hip_backend.__file__)


def _import_bindings() -> tuple[Any, Any]:
    try:
        from hip import hip, hiprtc
    except ImportError:  # the test extra installs it; a bare environment may not have it
        return None, None
    return hip, hiprtc


hip_module, hiprtc_module = _import_bindings()

needs_hip_python = pytest.mark.skipif(
    hip_module is None, reason="hip-python is not installed (pip install 'hrx-async[test]')"
)

BINDING_NAME = re.compile(r"(hip[A-Z]|HIP_|hiprtc[A-Z]|HIPRTC_)\w*")
TUPLE_SIZE = re.compile(r"A :py:obj:`~\.tuple` of size (\d+)")


# -- the checker ---------------------------------------------------------------------------


def _modules() -> dict[str, ModuleType]:
    """How hip.py names the two binding modules: local names and the table's attributes."""
    assert hip_module is not None and hiprtc_module is not None
    return {"hip": hip_module, "hiprtc": hiprtc_module, "rtc": hiprtc_module}


def _root_module(node: ast.expr) -> ModuleType | None:
    """The binding module an expression stands for: `hip`, `hiprtc`, `self.hip`, `table.rtc`."""
    modules = _modules()
    if isinstance(node, ast.Name):
        return modules.get(node.id)
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.attr in ("hip", "rtc")
    ):
        return modules[node.attr]
    return None


def _chain(node: ast.Attribute) -> tuple[ModuleType | None, list[str]]:
    """(module, [names]) of `module.a.b.c`; module None when the chain starts elsewhere."""
    names: list[str] = []
    current: ast.expr = node
    while isinstance(current, ast.Attribute):
        module = _root_module(current)
        if module is not None:
            return module, names
        names.insert(0, current.attr)
        current = current.value
    return _root_module(current), names


@functools.cache
def _stub(module_name: str) -> dict[str, ast.FunctionDef]:
    """The functions of a binding module's `.pyi` stub, by name."""
    module = importlib.import_module(module_name)
    path = Path(str(module.__file__)).with_name(module_name.rsplit(".", 1)[-1] + ".pyi")
    tree = ast.parse(path.read_text())
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


def _tuple_size(module: ModuleType, name: str) -> int | None:
    """How many values the stub says the function returns (status included)."""
    stub = _stub(module.__name__).get(name)
    if stub is None:
        return None
    match = TUPLE_SIZE.search(ast.get_docstring(stub) or "")
    return int(match.group(1)) if match else None


def _signature(module: ModuleType, name: str) -> inspect.Signature:
    try:
        return inspect.signature(getattr(module, name))
    except (TypeError, ValueError):
        stub = _stub(module.__name__)[name]
        params = [
            inspect.Parameter(arg.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD)
            for arg in stub.args.args
        ]
        return inspect.Signature(params)


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _binding_call(node: ast.AST) -> tuple[ModuleType, str] | None:
    """(module, function name) when `node` calls a binding function."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return None
    module, names = _chain(node.func)
    if module is None or len(names) != 1:
        return None
    return module, names[0]


def _unpacked_length(call: ast.Call, parents: dict[ast.AST, ast.AST]) -> tuple[int, bool] | None:
    """(values the code expects back, through `_check`?) for a call whose result is used."""
    parent = parents.get(call)
    through_check = False
    if (
        isinstance(parent, ast.Call)
        and isinstance(parent.func, ast.Attribute)
        and parent.func.attr == "_check"
        and parent.args
        and parent.args[0] is call
    ):
        through_check = True
        call, parent = parent, parents.get(parent)
    if isinstance(parent, ast.Assign) and isinstance(parent.targets[0], ast.Tuple):
        return len(parent.targets[0].elts), through_check
    if through_check and not isinstance(parent, ast.Expr):
        return 1, True  # `_check` hands back the single output itself
    return None


def binding_problems(source: str) -> tuple[list[str], set[str]]:
    """What in `source` does not fit the installed hip-python, and the names it checked."""
    tree = ast.parse(source)
    parents = _parents(tree)
    problems: list[str] = []
    checked: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and BINDING_NAME.fullmatch(node.attr):
            module, names = _chain(node)
            if module is None:
                problems.append(
                    f"line {node.lineno}: {node.attr} is reached through an alias; write "
                    "hip.…, hiprtc.…, self.hip.… or self.rtc.… so it can be checked"
                )
                continue
            target: Any = module
            for depth, name in enumerate(names):
                if not hasattr(target, name):
                    where = ".".join([module.__name__, *names[:depth]])
                    problems.append(f"line {node.lineno}: {where} has no {name}")
                    break
                target = getattr(target, name)
            else:
                checked.add(".".join(names))
        found = _binding_call(node)
        if found is None:
            continue
        assert isinstance(node, ast.Call)
        module, name = found
        if not hasattr(module, name):
            continue  # reported above
        if not callable(getattr(module, name)) or inspect.isclass(getattr(module, name)):
            continue
        if any(isinstance(arg, ast.Starred) for arg in node.args) or any(
            keyword.arg is None for keyword in node.keywords
        ):
            problems.append(
                f"line {node.lineno}: {name} is called with * or ** arguments; write each "
                "argument out so its count can be checked"
            )
            continue
        signature = _signature(module, name)
        try:
            signature.bind(*node.args, **{k.arg: k.value for k in node.keywords if k.arg})
        except TypeError as exc:
            problems.append(f"line {node.lineno}: {name}{signature} does not take this call: {exc}")
        expected = _unpacked_length(node, parents)
        size = _tuple_size(module, name)
        if expected is not None and size is not None:
            wanted, through_check = expected
            got = size - 1 if through_check else size
            if wanted != got:
                what = "outputs" if through_check else "values"
                problems.append(
                    f"line {node.lineno}: {name} returns {got} {what}, the code unpacks {wanted}"
                )
    return problems, checked


# -- API conformance -----------------------------------------------------------------------


@needs_hip_python
def test_every_hip_python_name_and_call_in_the_driver_table_fits_the_package() -> None:
    problems, checked = binding_problems(HIP_PY.read_text())
    assert problems == []
    # The walk really saw the table: the calls that matter most are among the names checked.
    for name in (
        "hipGraphInstantiate",
        "hipModuleLaunchKernel",
        "hipStreamWaitEvent",
        "hipHostMalloc",
        "hipKernelGetParamInfo",
        "hiprtcCompileProgram",
        "hipError_t.hipErrorNotReady",
        "hipStreamCaptureMode.hipStreamCaptureModeThreadLocal",
    ):
        assert name in checked
    assert len(checked) > 60


@needs_hip_python
def test_the_checker_reports_each_kind_of_mistake() -> None:
    source = """
def broken(self, hip, hiprtc, stream, graph):
    hip.hipMallocc(16)
    hip.hipMalloc(16, 0)
    status, graph_exec = hip.hipGraphInstantiate(graph, 0)
    (status,) = self.hip.hipStreamEndCapture(stream)
    a, b = self._check(hip.hipStreamCreateWithFlags(0), "x")
    value = self._check(hip.hipMemGetInfo(), "x")
    flag = hip.hipError_t.hipErrorNotReadyYet
    hiprtc.hiprtcCompileProgram(*stream)
    names = self.rtc
    names.hiprtcVersion()
"""
    problems, _ = binding_problems(source)
    text = "\n".join(problems)
    assert "has no hipMallocc" in text
    assert "hipMalloc(size) does not take this call" in text
    assert "hipGraphInstantiate returns 4 values, the code unpacks 2" in text
    assert "hipStreamEndCapture returns 2 values, the code unpacks 1" in text
    assert "hipStreamCreateWithFlags returns 1 outputs, the code unpacks 2" in text
    assert "hipMemGetInfo returns 2 outputs, the code unpacks 1" in text
    assert "hipError_t has no hipErrorNotReadyYet" in text
    assert "hiprtcCompileProgram is called with * or ** arguments" in text
    assert "hiprtcVersion is reached through an alias" in text
    assert len(problems) == 9


@needs_hip_python
def test_sticky_error_names_are_hip_error_codes() -> None:
    assert hip_module is not None
    members = set(hip_module.hipError_t.__members__)
    assert members >= hip_backend.STICKY_ERRORS
    assert "hipErrorIllegalAddress" in hip_backend.STICKY_ERRORS
    assert "hipErrorNotReady" not in hip_backend.STICKY_ERRORS


@needs_hip_python
def test_struct_fields_the_table_reads_exist() -> None:
    assert hip_module is not None
    props = hip_module.hipDeviceProp_t()
    for field in ("name", "gcnArchName", "totalGlobalMem", "multiProcessorCount"):
        assert hasattr(props, field), field
    attributes = hip_module.hipPointerAttribute_t()
    assert isinstance(attributes.type, hip_module.hipMemoryType)
    assert isinstance(attributes.device, int)


def test_importing_the_backend_does_not_import_hip_python() -> None:
    code = (
        "import sys, hrx_async, hrx_async.backends.hip; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('hip', 'rocm')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


# -- targets and compile options -----------------------------------------------------------


@pytest.mark.parametrize("target", ["gfx1151", "gfx90a", "gfx942:sramecc+:xnack-", "gfx11-generic"])
def test_compile_options_name_the_offload_arch(target: str) -> None:
    options = hip_backend.compile_options(target, {"N": "4", "ALPHA": "2.0f"})
    assert options == [f"--offload-arch={target}", "-DALPHA=2.0f", "-DN=4"]


@pytest.mark.parametrize("target", ["sm_90", "gfx", "", "gfx90a:xnack", "GFX90A", "gfx90a "])
def test_compile_options_refuse_what_is_no_gfx_target(target: str) -> None:
    with pytest.raises(ContractError, match=re.escape(repr(target))):
        hip_backend.compile_options(target, {})


@pytest.mark.parametrize("name", ["", "1N", "A-B", "A B"])
def test_compile_options_refuse_bad_define_names(name: str) -> None:
    with pytest.raises(ContractError, match=re.escape(repr(name))):
        hip_backend.compile_options("gfx1151", {name: "1"})


@needs_hip_python
def test_the_table_compiles_for_the_devices_feature_flags() -> None:
    table = hip_backend.HipTable()
    table.arch = "gfx90a:sramecc+:xnack-"
    assert table.compile_options("gfx90a", {})[0] == "--offload-arch=gfx90a:sramecc+:xnack-"
    # An explicit other target is compiled as asked.
    assert table.compile_options("gfx942", {})[0] == "--offload-arch=gfx942"
    other = hip_backend.HipTable()
    other.arch = "gfx90a:sramecc+:xnack+"
    keys = {
        cache_key("src", t.compile_options("gfx90a", {}), "gfx90a", "hiprtc-7.1")
        for t in (table, other)
    }
    assert len(keys) == 2, "xnack on and off must not share cached code"


# -- without ROCm --------------------------------------------------------------------------


def _rocm_loads() -> bool:
    try:
        ctypes.CDLL("libamdhip64.so")
    except OSError:
        return False
    return True


@functools.cache
def _cuda_usable() -> bool:
    try:
        return bool(probe("cuda").get("available"))
    except Exception:
        return False


no_rocm = pytest.mark.skipif(_rocm_loads(), reason="ROCm's libamdhip64.so loads here")


@no_rocm
@pytest.mark.anyio
async def test_runtime_hip_without_rocm_names_the_missing_library(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("HRX_BACKEND", raising=False)
    runtime = hrx.Runtime(backend="hip")
    with pytest.raises(BackendUnavailable) as caught:
        async with runtime:
            pass
    assert caught.value.backend == "hip"
    if hip_module is not None:
        assert "libamdhip64.so" in caught.value.reason
        assert "ROCm" in caught.value.install
    else:
        assert "hip-python" in caught.value.reason
        assert "hrx-async[hip]" in caught.value.install


@no_rocm
@pytest.mark.anyio
async def test_auto_falls_back_to_sim_and_says_why_hip_was_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if _cuda_usable():
        pytest.skip("a CUDA device answers here, so auto opens it")
    monkeypatch.delenv("HRX_BACKEND", raising=False)
    async with hrx.Runtime(backend="auto") as rt:
        assert rt.gpu().backend == "sim"
        hip_reasons = [reason for reason in rt.fallback_reasons if "'hip'" in reason]
    assert len(hip_reasons) == 1
    expected = "libamdhip64.so" if hip_module is not None else "hip-python"
    assert expected in hip_reasons[0]


def test_a_bad_fence_wait_mode_is_refused_before_any_device_is_touched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HRX_HIP_FENCE_WAIT", "sometimes")
    with pytest.raises(ContractError, match="'sometimes'"):
        hip_backend.open_backend()


@needs_hip_python
@no_rocm
def test_hiprtc_without_rocm_is_unavailable_not_a_crash() -> None:
    with pytest.raises(BackendUnavailable, match=re.escape("libhiprtc.so")):
        hip_backend.compile_cxx('extern "C" __global__ void k() {}', "k", ["--offload-arch=gfx90a"])


# -- doctor --------------------------------------------------------------------------------


def _walk(value: Any) -> Iterator[Any]:
    yield value
    if isinstance(value, dict):
        for item in value.values():
            yield from _walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item)


def test_doctor_reports_every_part_as_plain_data() -> None:
    report = hip_backend.hip_doctor()
    assert json.loads(json.dumps(report)) == report
    assert set(report) == {
        "hip_python",
        "library",
        "devices",
        "devices_error",
        "kfd",
        "render_nodes",
    }
    assert report["hip_python"]["importable"] is (hip_module is not None)
    assert report["library"]["name"] == "libamdhip64.so"
    assert report["kfd"]["path"] == "/dev/kfd"
    assert report["kfd"]["present"] is Path("/dev/kfd").exists()
    for node in report["render_nodes"]:
        assert node["path"].startswith("/dev/dri/renderD") and node["present"]


@no_rocm
def test_doctor_gives_the_loaders_reason_when_rocm_is_missing() -> None:
    report = hip_backend.hip_doctor()
    library = report["library"]
    assert library["loaded"] is False
    assert "libamdhip64.so" in library["error"]
    assert report["devices"] == []


def test_doctor_without_hip_python_still_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry makes `from hip import ...` raise ImportError, as an absent package does.
    monkeypatch.setitem(sys.modules, "hip", None)
    report = hip_backend.hip_doctor()
    assert report["hip_python"]["importable"] is False
    assert "hip-python is not installed" in report["hip_python"]["error"]
    assert report["library"]["path"] == "libamdhip64.so"
    assert report["devices"] == []
    assert report["library"]["loaded"] is (report["library"]["error"] is None)
