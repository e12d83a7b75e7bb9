"""Setting up as the README says: what each install brings, what its hints say, and what the
default test run prints."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from hrx_async._core.install import install_hint
from hrx_async.backends import cuda, hip
from hrx_async.models import _format
from hrx_async.serve import ray
from hrx_async.tools import plot

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
EXTRAS = PYPROJECT["project"]["optional-dependencies"]


def _readme_shell_lines() -> list[str]:
    return [
        line.strip()
        for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", README, re.DOTALL | re.MULTILINE)
        if lang == "sh"
        for line in body.splitlines()
    ]


def test_the_main_job_installs_only_what_the_demo_needs() -> None:
    demo = [line for line in _readme_shell_lines() if line.endswith("hrx-async demo")]
    assert len(demo) == 1 and "pip install '.[plot]' &&" in demo[0], demo
    tests = [line for line in _readme_shell_lines() if "pytest" in line]
    assert len(tests) == 1 and "pip install '.[test,dev]' &&" in tests[0], tests
    # What the demo imports beyond the core: matplotlib, for the picture.
    assert any(item.startswith("matplotlib") for item in EXTRAS["plot"])


def test_the_cuda_extra_brings_nvrtc() -> None:
    assert "nvidia-cuda-nvrtc-cu12" in EXTRAS["cuda"]
    # Its bindings are of the same CUDA major version as that NVRTC.
    (bindings,) = (item for item in EXTRAS["cuda"] if item.startswith("cuda-bindings"))
    assert "<13" in bindings
    (row,) = (line for line in README.splitlines() if line.startswith("| `cuda` |"))
    install = row.split("|")[2]  # the install column: the extra alone
    assert "nvrtc" not in install.lower() and "pip install '.[cuda]'" in install


@pytest.mark.parametrize(
    ("hint", "extra"),
    [
        (cuda.INSTALL, "cuda"),
        (hip.INSTALL, "hip"),
        (ray.INSTALL, "ray"),
        (_format.INSTALL, "models"),
        (plot._INSTALL, "plot"),
        (install_hint("trio"), "trio"),
        (install_hint("torch"), "torch"),  # what hrx_async.torch says without PyTorch
    ],
)
def test_install_hints_work_from_an_index_and_from_a_checkout(hint: str, extra: str) -> None:
    assert extra in EXTRAS
    assert f'pip install "hrx-async[{extra}]"' in hint  # from an index
    assert f'pip install ".[{extra}]"' in hint  # from a checkout


def test_the_default_test_run_lists_no_skipped_tests(tmp_path: Path) -> None:
    """The GPU tests skip without a GPU; the summary does not list each of them, unless
    asked with -rs."""
    (tmp_path / "test_skips.py").write_text(
        "import pytest\n\n\ndef test_skips():\n    pytest.skip('no such device here')\n"
    )

    def summary(*options: str) -> str:
        done = subprocess.run(
            [
                *(sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "-q"),
                *(*options, "-p", "no:cacheprovider", str(tmp_path / "test_skips.py")),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    assert "1 skipped" in summary()
    assert "SKIPPED" not in summary()
    assert "SKIPPED [1]" in summary("-rs") and "no such device here" in summary("-rs")


def test_the_rules_table_says_what_the_await_and_the_submission_see() -> None:
    (row,) = (
        line
        for line in README.splitlines()
        if line.startswith("| an `async def` host function awaits work")
    )
    said = row.split("|")[2]
    assert "`ContractError`" in said and "`ExecutionError`" in said
