"""`info` and `doctor` say what `Runtime()` really does here, and fail when it would fail;
the CUDA backend's hints name what is missing; the example service's exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import anyio
import pytest

import hrx_async
from hrx_async.backends import cuda, probe
from hrx_async.errors import BackendUnavailable, ContractError
from hrx_async.examples.common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from hrx_async.tools import doctor
from hrx_async.tools.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """cuda cannot open, whatever this machine has."""
    real_probe = doctor.probe

    def fake(name: str) -> dict[str, Any]:
        if name == "cuda":
            return {"backend": "cuda", "available": False, "reason": "no GPU here", "install": ""}
        return real_probe(name)

    monkeypatch.setattr(doctor, "probe", fake)


# -- 3: what Runtime() opens -------------------------------------------------------------------


@pytest.mark.parametrize("command", ["info", "doctor"])
def test_a_bogus_hrx_backend_fails(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HRX_BACKEND", "bogus")
    assert main([command]) == EXIT_FAILURE
    captured = capsys.readouterr()
    assert "opens: bogus" not in captured.out and "all checks passed" not in captured.out
    assert captured.err.startswith(f"hrx-async {command}: error: Runtime() fails here: ")
    assert "HRX_BACKEND must be one of auto, sim, cuda, hip; got 'bogus'" in captured.err


@pytest.mark.parametrize("command", ["info", "doctor"])
def test_a_forced_backend_that_cannot_open_fails(
    command: str,
    no_cuda: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("HRX_BACKEND", "cuda")
    assert main([command]) == EXIT_FAILURE
    captured = capsys.readouterr()
    assert "all checks passed" not in captured.out
    assert "backend 'cuda' is unavailable: no GPU here" in captured.err


def test_doctor_json_reports_the_failure(
    no_cuda: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HRX_BACKEND", "cuda")
    assert main(["doctor", "--json"]) == EXIT_FAILURE
    data = json.loads(capsys.readouterr().out)
    assert data["auto"] is None and "unavailable" in data["auto_error"]


def test_hrx_backend_cuda_without_a_gpu_fails_for_real(tmp_path: Path) -> None:
    if probe("cuda")["available"]:
        pytest.skip("CUDA opens on this machine")
    done = subprocess.run(
        [sys.executable, "-m", "hrx_async", "doctor"],
        env={**_clean_env(), "HRX_BACKEND": "cuda"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == EXIT_FAILURE
    assert "hrx-async doctor: error: Runtime() fails here: backend 'cuda' is unavailable" in (
        done.stderr
    )


def _clean_env() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key != "HRX_BACKEND"}


@pytest.mark.parametrize("forced", [None, "sim", "auto", ""])
def test_info_names_the_backend_runtime_opens(
    forced: str | None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if forced is None:
        monkeypatch.delenv("HRX_BACKEND", raising=False)
    else:
        monkeypatch.setenv("HRX_BACKEND", forced)

    async def opened() -> str:
        async with hrx_async.Runtime(npu=None) as rt:
            return rt.backend_name

    assert main(["info"]) == EXIT_OK
    out = capsys.readouterr().out
    data = doctor.info()
    assert data["auto_error"] is None
    assert data["auto"] == anyio.run(opened)
    assert f"Runtime() opens: {data['auto']}" in out


def test_resolve_follows_the_auto_order() -> None:
    from hrx_async.backends import resolve

    down = {"available": False, "reason": "absent", "install": "get it"}
    up = {"available": True}
    assert resolve("auto", {"cuda": down, "hip": up, "sim": up}) == "hip"
    assert resolve("auto", {"cuda": down, "hip": down, "sim": up}) == "sim"
    assert resolve("sim", {"sim": up}) == "sim"
    with pytest.raises(BackendUnavailable, match="absent") as caught:
        resolve("cuda", {"cuda": down})
    assert caught.value.install == "get it"
    with pytest.raises(ContractError, match="backend must be one of"):
        resolve("metal")


# -- 5: the CUDA hints ---------------------------------------------------------------------------


def test_missing_nvrtc_names_the_package_that_brings_it(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = mock.Mock()
    broken.nvrtcVersion.side_effect = RuntimeError("Failed to dlopen libnvrtc.so.12")
    monkeypatch.setattr(cuda, "_nvrtc", lambda: broken)
    with pytest.raises(BackendUnavailable, match="NVRTC could not be loaded") as caught:
        cuda.nvrtc_version()
    assert "nvidia-cuda-nvrtc" in caught.value.install
    assert "hrx-async[cuda]" not in caught.value.install


@pytest.mark.parametrize(("version", "package"), [("12.9.0", "-cu12"), ("13.0.1", " ")])
def test_the_nvrtc_package_matches_cuda_bindings(
    version: str, package: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cuda.importlib.metadata, "version", lambda name: version)
    assert f"nvidia-cuda-nvrtc{package}" in cuda.nvrtc_install()


def _fake_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    status = mock.Mock()
    status.name = "cudaErrorInsufficientDriver"
    status.__bool__ = lambda self: True  # type: ignore[method-assign]
    rt, dr = mock.MagicMock(), mock.MagicMock()
    rt.cudaGetDeviceCount.return_value = (status, 0)
    rt.cudaGetErrorString.return_value = (0, b"CUDA driver version is insufficient")
    monkeypatch.setattr(cuda, "_bindings", lambda: (rt, dr))


def test_no_driver_is_called_no_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_runtime(monkeypatch)
    monkeypatch.setattr(cuda, "nvidia_driver_present", lambda: False)
    with pytest.raises(BackendUnavailable) as caught:
        cuda.open_backend()
    assert "no NVIDIA driver" in caught.value.reason
    assert "insufficient" not in str(caught.value).lower()
    assert "NVIDIA driver" in caught.value.install


def test_an_old_driver_is_still_called_insufficient(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_runtime(monkeypatch)
    monkeypatch.setattr(cuda, "nvidia_driver_present", lambda: True)
    with pytest.raises(BackendUnavailable, match="insufficient"):
        cuda.open_backend()


# -- 8: the example service's exit codes ---------------------------------------------------------


def run_service(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / "service.py"), "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env or _clean_env(),
    )


@pytest.mark.parametrize("args", [["--slots", "many"], ["--backend", "bogus"], ["--batch", "0"]])
def test_service_usage_errors_exit_64(args: list[str]) -> None:
    done = run_service(*args)
    assert done.returncode == EXIT_USAGE
    assert "service.py: error: " in done.stderr and "Traceback" not in done.stderr


def test_service_with_an_unavailable_backend_exits_1_in_one_line() -> None:
    if probe("cuda")["available"]:
        pytest.skip("CUDA opens on this machine")
    done = run_service("--backend", "cuda")
    assert done.returncode == EXIT_FAILURE
    assert done.stderr.startswith("service.py: error: backend 'cuda' is unavailable")
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("value", "fails"), [("bogus", True), ("xrt", True), ("sim", False), ("none", False)]
)
def test_info_reports_the_npu_runtime_would_use(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: str, fails: bool
) -> None:
    monkeypatch.setitem(sys.modules, "pyxrt", None)  # no XRT here, whatever the machine has
    monkeypatch.setenv("HRX_NPU", value)
    status = main(["info"])
    captured = capsys.readouterr()
    assert status == (EXIT_FAILURE if fails else EXIT_OK)
    if fails:
        assert "Runtime() fails here" in captured.err
    else:
        assert f"Runtime() NPU: {value}" in captured.out


def test_info_says_the_npu_falls_back_to_sim_without_xrt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pyxrt", None)
    monkeypatch.delenv("HRX_NPU", raising=False)
    report = doctor.npu_report()
    assert report["opens"] == "sim" and report["error"] is None
    assert any(not check["ok"] for check in report["xrt"])
