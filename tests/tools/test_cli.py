"""The `hrx-async` command: demo end to end, info/doctor, bench, run, trace-plot, exit codes."""

from __future__ import annotations

import builtins
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hrx_async._core.lane import Lane
from hrx_async._core.trace import ExecutionTrace, TraceEvent
from hrx_async.errors import ContractError
from hrx_async.examples.common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from hrx_async.tools.cli import build_parser, main
from hrx_async.tools.plot import load_timeline
from hrx_async.tools.runner import kernel_source
from tests.helpers import fifo_with_a_late_writer

# The Chrome trace-event JSON the runtime writes (what Perfetto and chrome://tracing read).
TRACE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["traceEvents", "displayTimeUnit", "dropped_events", "otherData"],
    "properties": {
        "displayTimeUnit": {"const": "ms"},
        "dropped_events": {"type": "integer", "minimum": 0},
        "otherData": {
            "type": "object",
            "required": ["note"],
            "properties": {"note": {"type": "string", "pattern": "host-observed"}},
        },
        "traceEvents": {
            "type": "array",
            "minItems": 1,
            "items": {
                "oneOf": [
                    {
                        "type": "object",
                        "required": ["name", "ph", "pid", "tid", "args"],
                        "properties": {
                            "ph": {"const": "M"},
                            "name": {"enum": ["process_name", "thread_name"]},
                            "pid": {"const": 0},
                            "tid": {"type": "integer", "minimum": 0, "maximum": 4},
                            "args": {
                                "type": "object",
                                "required": ["name"],
                                "properties": {"name": {"type": "string"}},
                            },
                        },
                    },
                    {
                        "type": "object",
                        "required": ["name", "cat", "ph", "pid", "tid", "ts", "dur", "args"],
                        "properties": {
                            "ph": {"const": "X"},
                            "name": {"type": "string", "pattern": "^.+#[0-9]+$"},
                            "cat": {"enum": [lane.label for lane in Lane]},
                            "pid": {"const": 0},
                            "tid": {"type": "integer", "minimum": 0, "maximum": 4},
                            "ts": {"type": "number"},
                            "dur": {"type": "number", "minimum": 0},
                            "args": {
                                "type": "object",
                                "required": ["graph", "region", "copied_bytes", "failed"],
                                "properties": {
                                    "graph": {"type": "string"},
                                    "region": {"type": "integer", "minimum": 0},
                                    "copied_bytes": {"type": "integer", "minimum": 0},
                                    "failed": {"type": "boolean"},
                                },
                                "additionalProperties": False,
                            },
                        },
                    },
                ]
            },
        },
    },
}


def command() -> list[str]:
    """The installed console script next to this interpreter, else `python -m hrx_async`."""
    script = Path(sys.executable).with_name("hrx-async")
    if script.exists():
        return [str(script)]
    found = shutil.which("hrx-async")
    return [found] if found else [sys.executable, "-m", "hrx_async"]


def validate_trace(path: Path) -> dict[str, Any]:
    jsonschema = pytest.importorskip("jsonschema")
    document: dict[str, Any] = json.loads(path.read_text())
    jsonschema.validate(document, TRACE_SCHEMA)
    return document


def decode_png(path: Path) -> None:
    image = pytest.importorskip("matplotlib.image")
    assert path.stat().st_size > 0
    pixels = image.imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 50 and pixels.shape[1] > 50


# -- demo ------------------------------------------------------------------------------------


def test_demo_end_to_end_writes_a_valid_trace_and_a_picture(tmp_path: Path) -> None:
    env = {**os.environ, "HRX_BACKEND": "sim"}
    done = subprocess.run(
        [*command(), "demo"], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=240
    )
    assert done.returncode == 0, done.stderr
    assert "GPU: sim; NPU: sim-npu" in done.stdout
    assert "Both CPU references match exactly" in done.stdout
    assert "speedup:" in done.stdout
    assert "Trace: hrx-trace.json" in done.stdout
    assert "[hrx-async]" in done.stderr  # progress goes to stderr
    document = validate_trace(tmp_path / "hrx-trace.json")
    regions = [e for e in document["traceEvents"] if e["ph"] == "X"]
    assert sorted(e["tid"] for e in regions) == [1] * 4 + [3] * 4
    if "Timeline: hrx-timeline.png" in done.stdout:
        decode_png(tmp_path / "hrx-timeline.png")
    else:  # only without matplotlib
        assert "pip install" in done.stdout


def test_demo_without_matplotlib_still_writes_the_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    trace, picture = tmp_path / "t.json", tmp_path / "t.png"
    code = main(
        [
            "-q",
            "demo",
            "--backend",
            "sim",
            "--elements",
            "1024",
            "--matrices",
            "8",
            "--samples",
            "3",
            "--trace",
            str(trace),
            "--timeline",
            str(picture),
        ]
    )
    out = capsys.readouterr().out
    assert code == EXIT_OK
    assert "Timeline: not drawn" in out
    assert 'pip install "hrx-async[plot]"' in out
    assert not picture.exists()
    assert len(ExecutionTrace.load(trace).events) == 8


def test_demo_rejects_bad_sizes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["demo", "--elements", "1000", "--trace", str(tmp_path / "t.json")])
    assert code == EXIT_USAGE
    assert "multiple of 256" in capsys.readouterr().err


# -- info and doctor -------------------------------------------------------------------------


def test_info_reports_backends(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "sim: available" in out
    assert "numpy:" in out
    assert "Runtime() opens:" in out


def test_info_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "--json"]) == EXIT_OK
    data = json.loads(capsys.readouterr().out)
    by_name = {report["backend"]: report for report in data["backends"]}
    assert set(by_name) == {"sim", "cuda", "hip"}
    assert by_name["sim"]["available"] is True
    for report in by_name.values():
        assert report["available"] or report["reason"]
    assert data["packages"]["numpy"] == np.__version__
    assert data["auto"] in ("sim", "cuda", "hip")


def test_doctor_self_tests_the_usable_backends(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["doctor", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert data["self_test"]["sim"] is None
    assert set(data["device_nodes"]) >= {"NVIDIA GPU", "NPU (accel)"}
    failed = [name for name, problem in data["self_test"].items() if problem]
    assert code == (EXIT_FAILURE if failed else EXIT_OK)


# -- bench -----------------------------------------------------------------------------------


def test_bench_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["-q", "bench", "shared_bench", "8192", "--backend", "sim", "--json"])
    assert code == EXIT_OK
    document = json.loads(capsys.readouterr().out)
    assert document["example"] == "shared_bench"
    assert document["args"] == ["8192"]
    assert document["results"]["bytes"] == 8192
    assert 0 < document["results"]["p50_us"] <= document["results"]["p95_us"]
    assert document["output"][0].startswith("bytes=8192 p50_us=")


def test_bench_options_before_the_name(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "--backend", "sim", "--loop", "trio", "shared_roundtrip", "4096", "-q"])
    captured = capsys.readouterr()
    assert code == EXIT_OK
    assert "all 4096 bytes correct" in captured.out
    assert "[hrx-async]" not in captured.err


def test_bench_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "nbody"]) == EXIT_USAGE
    assert "invalid choice" in capsys.readouterr().err
    assert main(["bench", "gpu_npu_parallel", "100"]) == EXIT_USAGE
    assert "usage: gpu_npu_parallel" in capsys.readouterr().err


# -- run -------------------------------------------------------------------------------------

KERNELS = """
import struct
import numpy as np

def scale(arrays, constants):
    (factor,) = struct.unpack("<f", constants)
    np.multiply(arrays[0].view(np.float32), np.float32(factor), out=arrays[1].view(np.float32))

def bump(arrays, constants):
    (step,) = struct.unpack("<i", constants)
    counts = arrays[0].view(np.int32)
    counts += step
"""


@pytest.fixture
def kernels(tmp_path: Path) -> Path:
    path = tmp_path / "kernels.py"
    path.write_text(KERNELS)
    return path


def test_run_launches_and_dumps_the_output(
    kernels: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, target = tmp_path / "x.bin", tmp_path / "y.bin"
    values = np.arange(256, dtype=np.float32)
    values.tofile(source)
    code = main(
        [
            "run",
            "--backend",
            "sim",
            "--kernel",
            f"{kernels}:scale",
            "--grid",
            "1",
            "--block",
            "256",
            "--in",
            str(source),
            "--out",
            f"{target}:1024",
            "--f32",
            "2.5",
            "--repeat",
            "5",
            "--rotate-input",
            "0:3",
        ]
    )
    out = capsys.readouterr().out
    assert code == EXIT_OK
    report = json.loads(out)
    assert set(report) == {"launches", "total_ms", "per_launch_us", "input_copies"}
    assert report["launches"] == 5
    assert report["input_copies"] == 3
    assert report["per_launch_us"] == pytest.approx(report["total_ms"] * 1000 / 5, rel=1e-3)
    assert np.array_equal(np.fromfile(target, np.float32), values * np.float32(2.5))


def test_run_warms_up_once_before_repeated_launches(
    kernels: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    counts = tmp_path / "counts.bin"
    np.zeros(64, np.int32).tofile(counts)
    args = ["run", "--backend", "sim", "--kernel", f"{kernels}:bump", "--grid", "1"]
    args += ["--block", "64", "--inout", str(counts), "--i32", "2"]
    assert main([*args, "--repeat", "3"]) == EXIT_OK
    # One warm-up plus three timed launches, each adding 2.
    assert np.array_equal(np.fromfile(counts, np.int32), np.full(64, 8, np.int32))
    assert main(args) == EXIT_OK  # a single launch has no warm-up
    assert np.array_equal(np.fromfile(counts, np.int32), np.full(64, 10, np.int32))
    capsys.readouterr()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--out", "y.bin"], "PATH:BYTES"),
        (["--out", "y.bin:0"], ">= 1"),
        (["--in", "missing.bin"], "no such file"),
        (["--in", "x.bin", "--out", "nowhere/y.bin:8"], "no such directory 'nowhere'"),
        (["--in", "x.bin", "--out", ".:8"], "is a directory, not a file"),
        (["--out", "y.bin:8", "--rotate-input", "0:2"], "only --in buffers"),
        (["--in", "x.bin", "--rotate-input", "0:1"], "2 <= COUNT <= 64"),
        (["--in", "x.bin", "--rotate-input", "3:2"], "INDEX"),
        (["--in", "x.bin", "--repeat", "0"], "--repeat"),
        (["--in", "x.bin", "--grid", "0,1"], "--grid"),
        (["--in", "x.bin", "--i32", "1.5"], "--i32 needs a number"),
        ([], "at least one buffer"),
    ],
)
def test_run_usage_errors_exit_64(
    extra: list[str],
    message: str,
    kernels: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    np.zeros(16, np.float32).tofile(tmp_path / "x.bin")
    args = ["run", "--backend", "sim", "--kernel", f"{kernels}:scale", "--block", "16"]
    if "--grid" not in extra:
        args += ["--grid", "1"]
    assert main([*args, *extra]) == EXIT_USAGE
    assert message in capsys.readouterr().err


def test_run_needs_kernel_grid_and_block(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--grid", "1", "--block", "1"]) == EXIT_USAGE
    assert "--kernel" in capsys.readouterr().err


def test_run_rejects_a_kernel_that_is_not_module_function(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "x.bin"
    np.zeros(4, np.float32).tofile(source)
    args = ["run", "--backend", "sim", "--grid", "1", "--block", "1", "--in", str(source)]
    assert main([*args, "--kernel", "nomodule"]) == EXIT_USAGE
    assert "module:function" in capsys.readouterr().err
    assert main([*args, "--kernel", "json:no_such_function"]) == EXIT_USAGE
    assert "no callable 'no_such_function'" in capsys.readouterr().err


def run_args(kernel: str, *buffers: str) -> list[str]:
    return ["run", "--backend", "sim", "--kernel", kernel, "--grid", "1", "--block", "16", *buffers]


def one_line(text: str) -> str:
    assert text.endswith("\n") and text.count("\n") == 1, text
    return text


@pytest.mark.parametrize(
    ("make", "what"),
    [
        (lambda tmp: "/dev/zero", "a character device"),
        (lambda tmp: str(tmp), "a directory"),
        (lambda tmp: (os.mkfifo(tmp / "pipe"), str(tmp / "pipe"))[1], "a FIFO (named pipe)"),
    ],
    ids=["device", "directory", "fifo"],
)
@pytest.mark.parametrize("kind", ["--in", "--inout"])
def test_run_refuses_input_that_is_not_a_regular_file(
    make: Any,
    what: str,
    kind: str,
    kernels: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if not hasattr(os, "mkfifo") or not Path("/dev/zero").exists():
        pytest.skip("needs POSIX device files and FIFOs")
    name = make(tmp_path)
    assert main(run_args(f"{kernels}:scale", kind, name)) == EXIT_USAGE
    err = one_line(capsys.readouterr().err)
    assert f"{kind} {name!r} is {what}, not a regular file" in err
    assert "no such file" not in err


@pytest.mark.parametrize(
    ("out", "message"),
    [
        (f"y.bin:{1 << 60}", "of host memory, but only"),
        (f"y.bin:{10**24}", "more than this machine can address"),
    ],
)
def test_run_refuses_buffers_larger_than_host_memory_before_allocating(
    out: str,
    message: str,
    kernels: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    np.zeros(16, np.float32).tofile(tmp_path / "x.bin")
    code = main(run_args(f"{kernels}:scale", "--in", "x.bin", "--out", out))
    assert code == EXIT_USAGE
    err = one_line(capsys.readouterr().err)
    assert err.startswith("hrx-async run: error: the buffers need ") and message in err
    assert not (tmp_path / "y.bin").exists()


LIMITED_RUN = """
import resource, sys
from hrx_async.tools.cli import main

with open("/proc/self/status") as status:
    used = next(int(line.split()[1]) for line in status if line.startswith("VmSize:")) * 1024
limit = used + (1 << 30)
resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
sys.exit(main(sys.argv[1:]))
"""


def test_run_refuses_an_input_larger_than_the_memory_limit(kernels: Path, tmp_path: Path) -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("needs Linux /proc and RLIMIT_AS")
    big = tmp_path / "big.bin"
    with big.open("wb") as file:
        file.truncate(4 << 30)  # sparse: no disk space used
    done = subprocess.run(
        [sys.executable, "-c", LIMITED_RUN, *run_args(f"{kernels}:scale", "--in", str(big))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == EXIT_USAGE, done.stderr
    err = one_line(done.stderr)
    assert "the buffers need 8589934592 bytes (8.0 GiB) of host memory" in err
    assert "address-space limit (ulimit -v)" in err


BROKEN_KERNELS = {
    "syntax": ("import numpy as np\n\ndef scale(arrays, constants:\n    pass\n", 3),
    "raises": ("import numpy as np\n\nnp.zeros(4)\nraise RuntimeError('no device here')\n", 4),
    "raises_below": ("import json\n\njson.loads('{nope')\n", 3),
    "imports_missing": ("import numpy as np\n\nimport hrx_no_such_dependency\n", 3),
}


@pytest.mark.parametrize("case", sorted(BROKEN_KERNELS))
@pytest.mark.parametrize("by", ["file", "module"])
def test_run_reports_a_broken_kernel_module_in_one_line(
    case: str,
    by: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    text, line = BROKEN_KERNELS[case]
    name = f"hrx_broken_kernel_{case}_{by}"
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    source = tmp_path / "x.bin"
    np.zeros(16, np.float32).tofile(source)
    if by == "module":
        monkeypatch.syspath_prepend(str(tmp_path))
        kernel = f"{name}:scale"
    else:
        kernel = f"{path}:scale"
    code = main(run_args(kernel, "--in", str(source)))
    err = one_line(capsys.readouterr().err)
    assert f"{path}, line {line}" in err
    if case == "syntax":
        assert code == EXIT_USAGE
        assert "is not valid Python" in err and "SyntaxError" in err
    elif case == "imports_missing":
        assert code == EXIT_USAGE
        assert "cannot import kernel" in err
        assert "No module named 'hrx_no_such_dependency'" in err
    else:
        assert code == EXIT_FAILURE
        assert "raised on import" in err
        assert ("RuntimeError: no device here" if case == "raises" else "JSONDecodeError") in err
    assert name not in sys.modules


def test_gpu_kernel_files_must_be_regular_utf8_files(tmp_path: Path) -> None:
    if not Path("/dev/zero").exists():
        pytest.skip("needs /dev/zero")
    with pytest.raises(ContractError, match="'/dev/zero' is a character device, not a regular"):
        kernel_source("/dev/zero:k", "cuda", "sm_90")
    with pytest.raises(ContractError, match="is a directory, not a regular file"):
        kernel_source(f"{tmp_path}:k", "hip", "gfx942")
    with pytest.raises(ContractError, match="no such file"):
        kernel_source(f"{tmp_path / 'missing.cu'}:k", "cuda", "sm_90")
    latin1 = tmp_path / "kernel.cu"
    latin1.write_bytes(b'// caf\xe9\nextern "C" __global__ void k() {}\n')
    with pytest.raises(ContractError, match="is not UTF-8 source text"):
        kernel_source(f"{latin1}:k", "cuda", "sm_90")
    latin1.write_bytes(b'extern "C" __global__ void k() {}\n')
    source, name = kernel_source(f"{latin1}:k", "cuda", "sm_90")
    assert name == "k" and source.cxx is not None and "__global__" in source.cxx


# -- trace-plot ------------------------------------------------------------------------------


def sample_trace(path: Path) -> None:
    ExecutionTrace(
        events=(
            TraceEvent("g", 0, Lane.UPLOAD, 0.0, 100.0, 4096, False),
            TraceEvent("g", 1, Lane.COMPUTE, 100.0, 300.0, 0, False),
            TraceEvent("g", 2, Lane.NPU, 150.0, 200.0, 0, True),
        )
    ).write(path)


def test_trace_plot_draws_a_picture(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    trace, picture = tmp_path / "trace.json", tmp_path / "timeline.png"
    sample_trace(trace)
    validate_trace(trace)
    assert main(["trace-plot", str(trace), "-o", str(picture)]) == EXIT_OK
    assert "3 bars on 3 rows" in capsys.readouterr().out
    decode_png(picture)


def test_trace_plot_failures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert main(["trace-plot", str(broken), "-o", str(tmp_path / "x.png")]) == EXIT_FAILURE
    assert "is not JSON" in capsys.readouterr().err
    missing = tmp_path / "missing.json"
    assert main(["trace-plot", str(missing), "-o", str(tmp_path / "x.png")]) == EXIT_FAILURE
    assert main(["trace-plot", str(broken)]) == EXIT_USAGE  # no -o


PNG_START = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"


def test_trace_plot_of_a_picture_is_a_one_line_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")  # the output's suffix is checked first
    picture = tmp_path / "picture.png"
    picture.write_bytes(PNG_START)
    assert main(["trace-plot", str(picture), "-o", str(tmp_path / "out.png")]) == EXIT_USAGE
    err = one_line(capsys.readouterr().err)
    assert err.startswith("hrx-async trace-plot: error: ") and "is not UTF-8 text" in err
    assert not (tmp_path / "out.png").exists()
    with pytest.raises(ContractError, match="not a trace"):
        load_timeline(picture)


def test_trace_plot_refuses_what_is_no_regular_file_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    if not hasattr(os, "mkfifo") or not Path("/dev/zero").exists():
        pytest.skip("needs POSIX device files and FIFOs")
    with fifo_with_a_late_writer(tmp_path / "trace.json") as fifo:
        cases = ((fifo, "a FIFO"), (tmp_path, "a directory"), ("/dev/zero", "a character"))
        for name, kind in cases:
            code = main(["trace-plot", str(name), "-o", str(tmp_path / "out.png")])
            err = one_line(capsys.readouterr().err)
            assert code == EXIT_USAGE, err
            assert f"is {kind}" in err and "not a regular file" in err


# -- the command itself ----------------------------------------------------------------------


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == EXIT_USAGE
    assert "usage: hrx-async" in capsys.readouterr().err


def test_version_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == EXIT_OK
    assert capsys.readouterr().out.startswith("hrx-async ")
    assert main(["--help"]) == EXIT_OK
    out = capsys.readouterr().out
    for name in ("demo", "info", "doctor", "bench", "run", "trace-plot"):
        assert name in out


def test_kernel_cache_commands_are_registered_when_present() -> None:
    try:
        import hrx_async.backends.kernel_cache  # noqa: F401
    except ImportError:
        pytest.skip("no kernel cache module in this build")
    parser = build_parser()
    assert parser.parse_args(["gc", "7"]).handler is not None


def test_python_dash_m_is_the_same_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hrx_async", "bench", "nbody"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == EXIT_USAGE
    assert "invalid choice: 'nbody'" in done.stderr
