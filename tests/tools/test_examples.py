"""The five example programs: each runs on sim with small arguments, prints the seed's lines
with real numbers, detects wrong results, and rejects bad arguments with its usage text."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hrx_async._core.contract import bf16_bits
from hrx_async._core.lane import Lane
from hrx_async._core.trace import ExecutionTrace
from hrx_async.examples import NAMES, gpu_npu_parallel, sampling, spec
from hrx_async.examples.common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, main_for
from hrx_async.examples.kernels import (
    BatchedGemmBf16,
    bf16_from_f32,
    f32_from_bf16,
)

ROOT = Path(__file__).resolve().parents[2]
FLOAT = r"(\d+(?:\.\d+)?)"


def run_example(
    name: str, args: list[str], capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    code = main_for(spec(name), ["--backend", "sim", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def match_line(pattern: str, out: str) -> re.Match[str]:
    found = re.search(pattern, out, re.MULTILINE)
    assert found is not None, f"no line matches {pattern!r} in:\n{out}"
    return found


# -- gpu_npu_parallel ------------------------------------------------------------------------


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_gpu_npu_parallel_prints_the_seed_lines_and_a_trace(
    loop: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace_path = tmp_path / "trace.json"
    code, out, err = run_example(
        "gpu_npu_parallel", ["--loop", loop, "2048", "16", "3", str(trace_path)], capsys
    )
    assert code == EXIT_OK, err
    assert out.splitlines()[0] == "GPU: sim; NPU: sim-npu"
    match_line(r"^2048 GPU elements \+ 16 NPU matrices; 3 paired samples$", out)
    medians = match_line(
        rf"^sequential median: {FLOAT} ms; parallel median: {FLOAT} ms; speedup: {FLOAT}x$", out
    )
    sequential, parallel, speedup = (float(v) for v in medians.groups())
    assert sequential > 0 and parallel > 0
    # The medians print with 3 decimals (ms) and the speedup with 2: allow for that rounding.
    lowest = (sequential - 0.0005) / (parallel + 0.0005) - 0.005
    highest = (sequential + 0.0005) / max(parallel - 0.0005, 1e-9) + 0.005
    assert lowest <= speedup <= highest
    spread = match_line(
        rf"^spread \(p10\.\.p90\): sequential {FLOAT}\.\.{FLOAT} ms; "
        rf"parallel {FLOAT}\.\.{FLOAT} ms; paired speedup {FLOAT}\.\.{FLOAT}x$",
        out,
    )
    seq_lo, seq_hi, par_lo, par_hi, pair_lo, pair_hi = (float(v) for v in spread.groups())
    assert seq_lo <= sequential + 0.0005 and sequential - 0.0005 <= seq_hi
    assert par_lo <= parallel + 0.0005 and parallel - 0.0005 <= par_hi
    assert 0 < pair_lo <= pair_hi
    # Either the machine looked quiet or a warning says why the speedup cannot be trusted.
    verdicts = re.findall(
        r"^(Machine: quiet|Warning: (?:busy machine|noisy baseline)): ", out, re.M
    )
    assert verdicts and (verdicts == ["Machine: quiet"] or "Machine: quiet" not in verdicts)
    match_line(r"^Both CPU references match exactly, including changed-input replays\.", out)
    overlap = match_line(
        rf"^GPU/NPU host-observed overlap across four replays: {FLOAT} us \(not device", out
    )
    assert float(overlap.group(1)) >= 0
    match_line(rf"^Trace: {re.escape(str(trace_path))}$", out)

    trace = ExecutionTrace.load(trace_path)
    assert sorted(event.lane for event in trace.events) == [Lane.COMPUTE] * 4 + [Lane.NPU] * 4
    assert {event.graph for event in trace.events} == {"parallel"}
    assert not any(event.failed for event in trace.events)


def test_gpu_npu_parallel_catches_a_wrong_gpu_result(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def off_by_one(arrays: list[Any], constants: bytes) -> None:
        np.add(arrays[0].view(np.int32) * 3, 8, out=arrays[1].view(np.int32))

    monkeypatch.setattr(gpu_npu_parallel, "affine_host", off_by_one)
    code, out, err = run_example("gpu_npu_parallel", ["256", "1", "3"], capsys)
    assert code == EXIT_FAILURE
    assert "GPU result differs from the CPU reference" in err
    assert "Both CPU references match" not in out


def test_gpu_npu_parallel_catches_an_npu_that_writes_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class Idle(BatchedGemmBf16):
        def __call__(self, arrays: list[Any], constants: bytes) -> None:
            return None

    monkeypatch.setattr(gpu_npu_parallel, "BatchedGemmBf16", Idle)
    code, _, err = run_example("gpu_npu_parallel", ["256", "2", "3"], capsys)
    assert code == EXIT_FAILURE
    assert "NPU result differs from the CPU reference" in err


def test_gpu_npu_parallel_json_carries_the_measurements(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run_example("gpu_npu_parallel", ["--json", "512", "4", "4"], capsys)
    assert code == EXIT_OK, err
    document = json.loads(out)
    results = document["results"]
    assert document["example"] == "gpu_npu_parallel"
    assert results["backend"] == "sim"
    assert results["gpu_elements"] == 512
    assert results["samples"] == 4
    assert results["speedup"] == pytest.approx(
        results["sequential_median_ms"] / results["parallel_median_ms"]
    )
    assert results["ideal_speedup"] == pytest.approx(
        (results["gpu_only_median_ms"] + results["npu_only_median_ms"])
        / max(results["gpu_only_median_ms"], results["npu_only_median_ms"])
    )
    assert any(line.startswith("sequential median:") for line in document["output"])


# -- how far the speedup can be trusted ---------------------------------------------------------

QUIET = sampling.MachineLoad(load=0.05, cores=4)


def test_spread_is_p10_median_p90() -> None:
    found = sampling.spread([float(v) for v in range(11, 0, -1)])
    assert (found.p10, found.median, found.p90) == (2.0, 6.0, 10.0)
    assert found.relative == pytest.approx(8 / 6)
    assert sampling.spread([3.0]) == sampling.Spread(3.0, 3.0, 3.0)
    with pytest.raises(ValueError):
        sampling.spread([])


def test_a_steady_baseline_on_a_quiet_machine_is_trusted() -> None:
    verdict = sampling.judge([5.0, 5.1, 4.9, 5.05, 4.95, 5.0, 5.02], QUIET)
    assert verdict.trustworthy
    assert verdict.lines == (
        "Machine: quiet (load average 0.05 on 4 usable cores; baseline p10..p90 range 3% "
        "of its median)",
    )


def test_a_noisy_baseline_is_reported() -> None:
    # The same median as above, but samples that swing by half of it.
    samples = [5.0, 3.6, 6.4, 5.0, 4.0, 7.5, 5.1, 3.9, 6.0]
    verdict = sampling.judge(samples, QUIET)
    assert verdict.noisy and not verdict.busy and not verdict.trustworthy
    (line,) = verdict.lines
    assert line.startswith("Warning: noisy baseline: the sequential samples' p10..p90 range is")
    assert "not reliable" in line
    assert not sampling.judge(samples, QUIET, noisy_spread=1.0).noisy


@pytest.mark.parametrize(
    ("load", "cores", "busy"),
    [
        (0.3, 2, False),
        (0.6, 2, True),
        (1.9, 2, True),
        (None, 1, True),
        (None, 2, False),
        (5.0, 8, False),
        (6.6, 8, True),
    ],
)
def test_a_busy_machine_is_reported(load: float | None, cores: int, busy: bool) -> None:
    verdict = sampling.judge([1.0, 1.0, 1.0], sampling.MachineLoad(load, cores))
    assert verdict.busy is busy and not verdict.noisy
    assert any(line.startswith("Warning: busy machine:") for line in verdict.lines) is busy


def test_machine_load_reads_this_machine() -> None:
    machine = sampling.machine_load()
    assert machine.cores >= 1
    assert machine.load is None or machine.load >= 0


def test_gpu_npu_parallel_says_when_the_machine_is_busy_or_the_baseline_noisy(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[list[float]] = []

    def always_noisy(baseline: list[float], machine: Any, needed: int) -> sampling.Verdict:
        seen.append(list(baseline))
        return sampling.judge(baseline, machine, needed, noisy_spread=-1.0)

    monkeypatch.setattr(gpu_npu_parallel, "machine_load", lambda: sampling.MachineLoad(3.5, 2))
    monkeypatch.setattr(gpu_npu_parallel, "judge", always_noisy)
    code, out, err = run_example("gpu_npu_parallel", ["--json", "512", "4", "5"], capsys)
    assert code == EXIT_OK, err
    document = json.loads(out)
    results, lines = document["results"], document["output"]
    assert len(seen) == 1 and len(seen[0]) == 5
    assert results["sequential_median_ms"] == pytest.approx(sorted(seen[0])[2])
    assert results["busy_machine"] and results["noisy_baseline"]
    assert results["load_average"] == 3.5 and results["usable_cores"] == 2
    assert results["sequential_p10_ms"] <= results["sequential_median_ms"]
    assert results["sequential_median_ms"] <= results["sequential_p90_ms"]
    assert results["parallel_p10_ms"] <= results["parallel_p90_ms"]
    assert results["speedup_p10"] <= results["speedup_p90"]
    busy = [line for line in lines if line.startswith("Warning: busy machine:")]
    assert busy == [
        "Warning: busy machine: load average 3.50 on 2 usable cores leaves 0.0 free; this "
        "example needs 2, so the speedup above is not reliable (run it on a quiet machine)"
    ]
    assert any(line.startswith("Warning: noisy baseline:") for line in lines)
    assert not any(line.startswith("Machine: quiet") for line in lines)
    # The warnings follow the speedup they qualify.
    first_warning = lines.index(busy[0])
    assert any(line.startswith("sequential median:") for line in lines[:first_warning])


# -- shared memory examples ----------------------------------------------------------------


def test_shared_roundtrip_checks_every_byte(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_example("shared_roundtrip", ["8192"], capsys)
    assert code == EXIT_OK, err
    assert out.strip() == (
        "GPU -> NPU -> GPU: all 8192 bytes correct, 10 executions, 3 prepared regions"
    )


def test_shared_bench_reports_percentiles(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_example("shared_bench", ["4096"], capsys)
    assert code == EXIT_OK, err
    found = match_line(rf"^bytes=4096 p50_us={FLOAT} p95_us={FLOAT}$", out)
    p50, p95 = float(found.group(1)), float(found.group(2))
    assert 0 < p50 <= p95


# -- gemm_pipeline ---------------------------------------------------------------------------


@pytest.mark.parametrize("args", [[], ["builtin", "gemm", "16", "40", "24"]])
def test_gemm_pipeline_reports_latency_and_unchanged_statistics(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_example("gemm_pipeline", args, capsys)
    assert code == EXIT_OK, err
    m, k, n = (int(v) for v in args[2:]) if args else (8, 8, 8)
    found = match_line(
        rf"^M={m} K={k} N={n} p50_ms={FLOAT} p95_ms={FLOAT} pipelined_requests_s={FLOAT}$", out
    )
    p50, p95, rate = (float(v) for v in found.groups())
    assert 0 < p50 <= p95
    assert rate > 0
    stats = json.loads(out.strip().splitlines()[-1])
    assert stats["copied_bytes"] == 0
    # Weights, ones, and A and C per instance; all shared, so each one is an import.
    assert stats["allocations"] == 6
    assert stats["imports"] == 6
    # 5 warm-up pairs, 50 latency requests and 50 pipelined pairs.
    assert stats["submissions"] == stats["completions"] == 160


def test_gemm_pipeline_catches_a_wrong_npu_program(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    module = tmp_path / "half_gemm.py"
    module.write_text(
        "import numpy as np\n"
        "def gemm(m, k, n):\n"
        "    def run(arrays, constants):\n"
        "        arrays[2].view(np.float32)[:] = k / 2\n"
        "    return run\n"
    )
    code, _, err = run_example("gemm_pipeline", [str(module), "gemm", "4", "8", "4"], capsys)
    assert code == EXIT_FAILURE
    assert "GEMM pipeline output mismatch" in err
    assert "K+1=9" in err


# -- graph_prepare ---------------------------------------------------------------------------


def test_graph_prepare_times_every_size(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_example("graph_prepare", [], capsys)
    assert code == EXIT_OK, err
    rows = re.findall(r"^nodes=(\d+) plan_us=(\d+) prepare_us=(\d+)$", out, re.MULTILINE)
    assert [int(nodes) for nodes, _, _ in rows] == [128, 512, 1024, 2048]
    assert all(int(plan) > 0 and int(prepare) > 0 for _, plan, prepare in rows)


# -- bad arguments ---------------------------------------------------------------------------

BAD_ARGUMENTS = [
    ("gpu_npu_parallel", ["100"], "multiple of 256"),
    ("gpu_npu_parallel", ["256", "0"], "1 <= npu-matrices <= 16384, got 0"),
    ("gpu_npu_parallel", ["256", "1", "2"], "3 <= samples <= 1000, got 2"),
    ("gpu_npu_parallel", ["100"], "got 100"),
    ("gpu_npu_parallel", ["lots"], "invalid integer"),
    ("gpu_npu_parallel", ["256", "1", "3", "t.json", "extra"], "too many arguments"),
    ("shared_roundtrip", ["4097"], "multiple of 4096"),
    ("shared_roundtrip", ["0"], "multiple of 4096"),
    ("shared_roundtrip", [str(128 << 20)], f"4096 <= bytes <= 67108864, got {128 << 20}"),
    ("shared_roundtrip", ["4096", "4096"], "at most one argument"),
    ("shared_bench", ["x"], "invalid integer"),
    ("gemm_pipeline", ["8"], "expected no arguments or 5"),
    ("gemm_pipeline", ["builtin", "gemm", "0", "8", "8"], "invalid matrix extent"),
    ("gemm_pipeline", ["builtin", "gemm", "65536", "65536", "1"], "invalid matrix extent"),
    ("gemm_pipeline", ["builtin", "other", "8", "8", "8"], "symbol is 'gemm'"),
    ("graph_prepare", ["128"], "takes no arguments"),
    ("shared_bench", ["--backend", "vulkan"], "--backend must be one of"),
    ("shared_bench", ["--loop", "curio"], "--loop must be one of"),
    ("shared_bench", ["--fast"], "unknown option"),
    ("shared_bench", ["--npu", "gpu"], "--npu must be one of auto, sim, xrt"),
    ("gpu_npu_parallel", ["--npu", "xrt"], "missing --xclbin and --insts"),
    ("shared_roundtrip", ["--npu=xrt", "--xclbin", "f.xclbin"], "missing --insts"),
    ("shared_bench", ["--npu", "xrt", "--insts", "i.bin", "4096"], "missing --xclbin"),
    ("gemm_pipeline", ["--npu", "xrt"], "missing --xclbin and --insts"),
    ("gemm_pipeline", ["--insts", "i.bin"], "--insts given without --xclbin"),
    ("shared_roundtrip", ["4096", "--xclbin"], "--xclbin needs a value"),
    ("graph_prepare", ["--npu", "sim"], "takes no arguments"),
]


@pytest.mark.parametrize(("name", "args", "message"), BAD_ARGUMENTS)
def test_bad_arguments_exit_64_with_the_usage(
    name: str, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_example(name, args, capsys)
    assert code == EXIT_USAGE
    assert message in err
    assert spec(name).usage in err
    assert out == ""


@pytest.mark.parametrize("name", NAMES)
def test_help_prints_the_usage(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_example(name, ["--help"], capsys)
    assert code == EXIT_OK
    assert out.splitlines()[0] == spec(name).usage
    assert out.splitlines()[0].startswith(f"usage: {name}")


def test_an_unavailable_backend_fails_with_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    code = main_for(spec("shared_bench"), ["--backend", "hip", "4096"])
    assert code in (EXIT_OK, EXIT_FAILURE)
    if code == EXIT_FAILURE:  # the usual case: no AMD GPU here
        assert "backend 'hip' is unavailable" in capsys.readouterr().err


def test_unknown_example_name_lists_the_names() -> None:
    with pytest.raises(ValueError, match="gpu_npu_parallel, shared_roundtrip"):
        spec("nbody")


# -- the wrapper scripts ----------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_wrapper_scripts_run_the_packaged_programs(name: str) -> None:
    script = ROOT / "examples" / f"{name}.py"
    done = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == spec(name).usage


def test_a_wrapper_script_runs_end_to_end_and_fails_with_64_on_bad_input() -> None:
    script = str(ROOT / "examples" / "shared_roundtrip.py")
    ok = subprocess.run(
        [sys.executable, script, "--backend", "sim", "4096"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    assert "all 4096 bytes correct, 10 executions, 3 prepared regions" in ok.stdout
    bad = subprocess.run([sys.executable, script, "12"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == EXIT_USAGE
    assert spec("shared_roundtrip").usage in bad.stderr
    assert spec("shared_roundtrip").usage.endswith("[bytes]")


# -- kernels ---------------------------------------------------------------------------------


def test_bf16_conversion_matches_the_scalar_rounding() -> None:
    values = np.array(
        [0.0, -0.0, 1.0, 1.00390625, 1.01171875, -3.14159, 65504.0, 3.0e38, 1e-40, np.inf],
        dtype=np.float32,
    )
    expected = np.array([bf16_bits(float(v)) for v in values], dtype=np.uint16)
    assert np.array_equal(bf16_from_f32(values), expected)
    nan = bf16_from_f32(np.array([np.nan], dtype=np.float32))
    assert np.isnan(f32_from_bf16(nan)[0])
    exact = np.array([-4.0, 0.5, 3.0, 255.0], dtype=np.float32)
    assert np.array_equal(f32_from_bf16(bf16_from_f32(exact)), exact)


def test_batched_gemm_multiplies_each_pair() -> None:
    rng = np.random.default_rng(7)
    a = rng.integers(-4, 5, (3, 8, 8)).astype(np.float32)
    b = rng.integers(-4, 5, (3, 8, 8)).astype(np.float32)
    out = np.zeros(3 * 256, np.uint8)
    BatchedGemmBf16(3)([bf16_from_f32(a).view(np.uint8), bf16_from_f32(b).view(np.uint8), out], b"")
    assert np.array_equal(out.view(np.float32).reshape(3, 8, 8), a @ b)
