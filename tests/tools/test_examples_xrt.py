"""The four NPU examples on the xrt backend, against the fake pyxrt (tests/fake_pyxrt.py).

The fake runs an NPU program through the host reference registered for its kernel
name, on the device copy of the buffers it was given, so a result is right only
when the backend set the arguments and synced the right bytes. Each example checks
every value of its output itself (and exits 1 when one is wrong); these tests also
count the runs the fake executed and check the bytes each run saw.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from hrx_async.examples import spec
from hrx_async.examples.common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, main_for
from hrx_async.examples.kernels import BatchedGemmBf16, GemmBf16, npu_copy

sys.path.insert(0, str(Path(__file__).parent.parent))
import fake_pyxrt

KERNEL = "MLIR_AIE"
Reference = Callable[[list[np.ndarray[Any, Any]]], None]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.delenv("HRX_NPU", raising=False)
    with fake_pyxrt.installed() as module:
        yield module


@pytest.fixture
def program(tmp_path: Path) -> list[str]:
    """The NPU options naming an xclbin with kernel MLIR_AIE (8 arguments) and its insts."""
    xclbin = fake_pyxrt.write_xclbin(tmp_path / "final.xclbin", {KERNEL: 8, "copy_kernel": 5})
    insts = tmp_path / "insts.bin"
    np.arange(1, 65, dtype=np.uint32).tofile(insts)
    return ["--xclbin", str(xclbin), "--insts", str(insts)]


class Recorder:
    """A host reference that counts its runs and lets a test look at each run's buffers."""

    def __init__(self, program: Callable[[list[Any], bytes], None], check: Any = None) -> None:
        self.program = program
        self.check = check
        self.runs = 0

    def __call__(self, arrays: list[np.ndarray[Any, Any]]) -> None:
        if self.check is not None:
            self.check(arrays)
        self.program(arrays, b"")
        self.runs += 1


def run_example(
    name: str, args: list[str], capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    code = main_for(spec(name), ["--backend", "sim", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def run_json(name: str, args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code, out, err = run_example(name, ["--json", *args], capsys)
    assert code == EXIT_OK, err
    document: dict[str, Any] = json.loads(out)
    return document


# -- gpu_npu_parallel ------------------------------------------------------------------------


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_gpu_npu_parallel_on_xrt(
    loop: str, fake: ModuleType, program: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    gemm = Recorder(BatchedGemmBf16(16))
    fake_pyxrt.FAKE.references[KERNEL] = gemm
    args = ["--loop", loop, "--npu", "xrt", *program, "2048", "16", "3"]
    document = run_json("gpu_npu_parallel", args, capsys)
    results, lines = document["results"], document["output"]
    assert lines[0] == "GPU: sim; NPU: npu1"
    assert results["npu_target"] == "npu1" and results["npu_backend"] == "xrt"
    assert any(line.startswith("Both CPU references match exactly") for line in lines)
    # 3 checked passes (NPU alone, then in parallel), 3 paired samples, 4 traced replays.
    assert gemm.runs == fake_pyxrt.FAKE.starts == 3 * 2 + 3 * 2 + 4
    assert results["speedup"] > 0 and results["sequential_p10_ms"] <= results["sequential_p90_ms"]


def test_gpu_npu_parallel_on_xrt_catches_a_wrong_npu_program(
    fake: ModuleType, program: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    def off_by_one(arrays: list[Any], constants: bytes) -> None:
        BatchedGemmBf16(4)(arrays, constants)
        arrays[2].view(np.float32)[5] += 1.0

    fake_pyxrt.FAKE.references[KERNEL] = Recorder(off_by_one)
    code, out, err = run_example(
        "gpu_npu_parallel", ["--npu", "xrt", *program, "256", "4", "3"], capsys
    )
    assert code == EXIT_FAILURE
    assert "NPU result differs from the CPU reference (input set 0) at value 5" in err
    assert "Both CPU references match" not in out


# -- shared_roundtrip and shared_bench -------------------------------------------------------


def all_bytes(value: int) -> Callable[[list[np.ndarray[Any, Any]]], None]:
    def check(arrays: list[np.ndarray[Any, Any]]) -> None:
        assert np.all(arrays[0] == value), "the NPU read bytes the GPU fill did not write"

    return check


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_shared_roundtrip_on_xrt(
    loop: str, fake: ModuleType, program: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    copy = Recorder(npu_copy, all_bytes(0x5A))
    fake_pyxrt.FAKE.references[KERNEL] = copy
    code, out, err = run_example(
        "shared_roundtrip", ["--loop", loop, "--npu", "xrt", *program, "8192"], capsys
    )
    assert code == EXIT_OK, err
    assert out.strip() == (
        "GPU -> NPU -> GPU: all 8192 bytes correct, 10 executions, 3 prepared regions"
    )
    assert copy.runs == fake_pyxrt.FAKE.starts == 10


def test_shared_roundtrip_on_xrt_catches_an_npu_that_copies_nothing(
    fake: ModuleType, program: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    def half(arrays: list[Any], constants: bytes) -> None:
        arrays[1][: arrays[1].size // 2] = arrays[0][: arrays[0].size // 2]

    fake_pyxrt.FAKE.references[KERNEL] = Recorder(half)
    code, _, err = run_example("shared_roundtrip", ["--npu", "xrt", *program, "8192"], capsys)
    assert code == EXIT_FAILURE
    assert "mismatch in execution 1: 4096 of 8192 bytes wrong, first at offset 4096" in err


def test_shared_bench_on_xrt_with_a_named_kernel(
    fake: ModuleType, program: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    copy = Recorder(npu_copy, all_bytes(0x35))
    fake_pyxrt.FAKE.references["copy_kernel"] = copy
    args = ["--npu", "xrt", *program, "--npu-kernel", "copy_kernel", "4096"]
    document = run_json("shared_bench", args, capsys)
    results = document["results"]
    assert results["npu_target"] == "npu1" and results["bytes"] == 4096
    assert 0 < results["p50_us"] <= results["p95_us"]
    assert document["output"] == [
        f"bytes=4096 p50_us={results['p50_us']:.2f} p95_us={results['p95_us']:.2f}"
    ]
    assert copy.runs == fake_pyxrt.FAKE.starts == 5 + 100


# -- gemm_pipeline ---------------------------------------------------------------------------


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_gemm_pipeline_on_xrt(
    loop: str, fake: ModuleType, program: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    def ones_in(arrays: list[np.ndarray[Any, Any]]) -> None:
        # A is all ones (bf16) after the GPU Euler step, and so are the weights.
        assert np.all(arrays[0].view(np.uint16) == 0x3F80)
        assert np.all(arrays[1].view(np.uint16) == 0x3F80)

    gemm = Recorder(GemmBf16(16, 40, 24), ones_in)
    fake_pyxrt.FAKE.references[KERNEL] = gemm
    args = ["--loop", loop, "--npu", "xrt", *program, "builtin", "gemm", "16", "40", "24"]
    document = run_json("gemm_pipeline", args, capsys)
    results = document["results"]
    assert results["npu_target"] == "npu1"
    assert (results["m"], results["k"], results["n"]) == (16, 40, 24)
    assert 0 < results["p50_ms"] <= results["p95_ms"] and results["pipelined_requests_s"] > 0
    stats = results["statistics"]
    assert stats["copied_bytes"] == 0
    assert stats["submissions"] == stats["completions"] == 160
    assert gemm.runs == fake_pyxrt.FAKE.starts == 160


def test_gemm_pipeline_on_xrt_catches_a_wrong_npu_program(
    fake: ModuleType, program: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    def short(arrays: list[Any], constants: bytes) -> None:
        GemmBf16(4, 8, 4)(arrays, constants)
        arrays[2].view(np.float32)[-1] = 0.0  # the GPU epilogue then adds 1.0

    fake_pyxrt.FAKE.references[KERNEL] = Recorder(short)
    args = ["--npu", "xrt", *program, "builtin", "gemm", "4", "8", "4"]
    code, _, err = run_example("gemm_pipeline", args, capsys)
    assert code == EXIT_FAILURE
    assert "1 of 16 values differ from K+1=9, first C[15]=1.0" in err


# -- choosing the NPU ------------------------------------------------------------------------


def test_auto_uses_xrt_when_the_program_is_given(
    fake: ModuleType, program: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    fake_pyxrt.FAKE.references[KERNEL] = Recorder(npu_copy)
    document = run_json("shared_roundtrip", ["--npu", "auto", *program, "4096"], capsys)
    assert document["results"]["npu_target"] == "npu1"
    assert fake_pyxrt.FAKE.starts == 10


@pytest.mark.parametrize("npu", [[], ["--npu", "auto"], ["--npu", "sim"]])
def test_without_a_program_auto_and_sim_use_the_sim_npu(
    npu: list[str], fake: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, args in (
        ("shared_roundtrip", ["4096"]),
        ("shared_bench", ["4096"]),
        ("gemm_pipeline", []),
        ("gpu_npu_parallel", ["256", "2", "3"]),
    ):
        document = run_json(name, [*npu, *args], capsys)
        assert document["results"]["npu_target"] == "sim-npu", name
    assert fake_pyxrt.FAKE.starts == 0 and fake_pyxrt.FAKE.contexts_created == 0


def test_sim_ignores_the_program_files(
    fake: ModuleType, program: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    document = run_json("gpu_npu_parallel", ["--npu", "sim", *program, "256", "2", "3"], capsys)
    assert document["results"]["npu_target"] == "sim-npu"
    assert fake_pyxrt.FAKE.starts == 0


def test_auto_falls_back_to_the_sim_npu_when_no_npu_opens(
    fake: ModuleType, program: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    fake_pyxrt.FAKE.devices = 0
    document = run_json("shared_roundtrip", [*program, "4096"], capsys)
    assert document["results"]["npu_target"] == "sim-npu"
    code, _, err = run_example("shared_roundtrip", ["--npu", "xrt", *program, "4096"], capsys)
    assert code == EXIT_FAILURE
    assert "does not open" in err


@pytest.mark.parametrize(
    "name", ["gpu_npu_parallel", "shared_roundtrip", "shared_bench", "gemm_pipeline"]
)
def test_xrt_without_the_program_is_a_usage_error(
    name: str, fake: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_example(name, ["--npu", "xrt"], capsys)
    assert code == EXIT_USAGE and out == ""
    assert (
        f"{name}: error: --npu xrt needs the NPU program's files: missing --xclbin and --insts"
        in err
    )
    assert spec(name).usage in err
    assert fake_pyxrt.FAKE.contexts_created == 0


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda p: ["--xclbin", p[1] + ".missing", *p[2:]], "does not exist"),
        (lambda p: [*p[:3], p[3] + ".missing"], "cannot read NPU instruction file"),
        (lambda p: [*p, "--npu-kernel", "NOPE"], "has no kernel 'NOPE'"),
    ],
)
def test_bad_program_files_fail_with_exit_1(
    edit: Callable[[list[str]], list[str]],
    message: str,
    fake: ModuleType,
    program: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run_example("shared_bench", ["--npu", "xrt", *edit(program), "4096"], capsys)
    assert code == EXIT_FAILURE and out == ""
    assert message in err
    assert fake_pyxrt.FAKE.starts == 0
