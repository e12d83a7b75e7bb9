"""Which build runs (mypyc-compiled core or pure Python), and that `hrx-async info` says so.

HRX_ASYNC_EXPECT_BUILD=compiled (or pure) makes the suite check that it really runs on that
build: CI sets it, so that a compile that fell back, or tests that import the source tree
instead of the installed package, cannot pass for a test of the compiled build.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
from pathlib import Path

import pytest

import hrx_async
from hrx_async import _build
from hrx_async.examples.common import EXIT_OK
from hrx_async.tools.cli import main

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def fake_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A package `fakepkg` with a module `fast` that is an extension module file (never
    loaded: finding a spec does not load it) and a module `slow` that is source."""
    package = tmp_path / "fakepkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "slow.py").write_text("")
    (package / f"fast{importlib.machinery.EXTENSION_SUFFIXES[0]}").write_bytes(b"")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "fakepkg"


def test_an_extension_module_counts_as_compiled_and_a_source_one_does_not(
    fake_package: str,
) -> None:
    assert _build.is_compiled(f"{fake_package}.fast")
    assert not _build.is_compiled(f"{fake_package}.slow")
    assert not _build.is_compiled(f"{fake_package}.missing")


@pytest.mark.parametrize(
    ("listed", "kind"),
    [
        (("fast",), "compiled"),
        (("slow",), "pure"),
        (("fast", "slow"), "partial"),
        ((), "pure"),
    ],
)
def test_the_build_is_what_the_listed_modules_are(
    fake_package: str, monkeypatch: pytest.MonkeyPatch, listed: tuple[str, ...], kind: str
) -> None:
    modules = tuple(f"{fake_package}.{name}" for name in listed)
    monkeypatch.setattr(_build, "COMPILED", modules)
    report = _build.build()
    assert report["kind"] == kind
    assert report["compiled"] == [m for m in modules if m.endswith(".fast")]
    assert report["pure"] == [m for m in modules if m.endswith(".slow")]


def test_every_listed_module_is_a_module_of_the_package() -> None:
    root = Path(hrx_async.__file__).parent
    for module in _build.COMPILED:
        package, _, name = module.partition(".")
        assert package == "hrx_async", module
        assert root.joinpath(*name.split(".")).with_suffix(".py").is_file(), module


def test_setup_py_reads_the_same_list() -> None:
    """setup.py takes COMPILED from _build.py as a literal, without importing the package."""
    pytest.importorskip("setuptools")
    spec = importlib.util.spec_from_file_location("hrx_setup", ROOT / "setup.py")
    assert spec is not None and spec.loader is not None
    setup_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup_py)  # only defines: setup() runs when it is __main__
    assert tuple(setup_py.compiled_modules()) == _build.COMPILED


def test_the_suite_runs_on_the_build_it_was_asked_to() -> None:
    expected = os.environ.get("HRX_ASYNC_EXPECT_BUILD")
    if not expected:
        pytest.skip("HRX_ASYNC_EXPECT_BUILD is not set")
    report = _build.build()
    assert report["kind"] == expected, (
        f"expected the {expected} build, hrx_async from {hrx_async.__file__} is {report}"
    )


def test_info_reports_the_build(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "--json"]) == EXIT_OK
    data = json.loads(capsys.readouterr().out)
    assert data["build"] == _build.build()
    assert main(["info"]) == EXIT_OK
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("build: "))
    if data["build"]["kind"] == "pure":
        assert line == "build: pure Python"
    else:
        assert all(module in line for module in data["build"]["compiled"])
