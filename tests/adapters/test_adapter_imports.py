"""The PyTorch and CuPy adapters are optional: `import hrx_async` imports neither library,
and importing an adapter without its library raises `BackendUnavailable` saying what to
install. Each check runs in a fresh interpreter, where the library is made unimportable
(`sys.modules[name] = None`) whether or not it is installed here."""

from __future__ import annotations

import subprocess
import sys

import pytest

CASES = [
    ("hrx_async.torch", "torch", "hrx-async[torch]"),
    ("hrx_async.cupy", "cupy", "cupy-cuda12x"),
]


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_importing_hrx_async_imports_neither_library() -> None:
    done = run(
        "import sys, hrx_async, hrx_async.backends, hrx_async.models\n"
        "print(sorted({'torch', 'cupy'} & set(sys.modules)))"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(("module", "library", "hint"), CASES)
def test_an_adapter_without_its_library_says_what_to_install(
    module: str, library: str, hint: str
) -> None:
    done = run(
        f"import sys\nsys.modules[{library!r}] = None\n"
        "from hrx_async.errors import BackendUnavailable\n"
        "try:\n"
        f"    import {module}\n"
        "except BackendUnavailable as error:\n"
        "    print(error.backend, '|', error.install, '|', error)\n"
    )
    assert done.returncode == 0, done.stderr
    backend, install, message = done.stdout.strip().split(" | ")
    assert backend == library and hint in install and "cannot be imported" in message
