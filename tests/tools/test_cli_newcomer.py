"""The `hrx-async` command as a newcomer types it: `-q` after the command, and output paths
checked before any work runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from hrx_async.examples.common import EXIT_USAGE
from hrx_async.tools.cli import build_parser, main

SMALL_DEMO = ["--elements", "1024", "--matrices", "16", "--samples", "3"]

# Each command with the arguments it needs to parse (nothing here runs).
COMMANDS = {
    "demo": [],
    "info": [],
    "doctor": [],
    "bench": ["graph_prepare"],
    "run": ["--kernel", "m:f", "--grid", "1", "--block", "1"],
    "trace-plot": ["t.json", "-o", "t.png"],
    "compile": ["k.cu", "k"],
    "gc": [],
}


def test_every_command_is_covered() -> None:
    parser = build_parser()
    (commands,) = (a for a in parser._actions if a.dest == "command")
    assert set(commands.choices) == set(COMMANDS)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_quiet_after_every_command(name: str) -> None:
    parser = build_parser()
    args = COMMANDS[name]
    # Before the bench's NAME: after it, the arguments are the program's own (bench_command
    # takes a -q there itself).
    at = 0 if name == "bench" else len(args)
    assert parser.parse_args([name, *args[:at], "-q", *args[at:]]).quiet is True
    assert parser.parse_args(["-q", name, *args]).quiet is True
    assert parser.parse_args([name, *args]).quiet is False


def test_demo_dash_q_runs_quietly(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HRX_BACKEND", "sim")
    monkeypatch.setenv("HRX_NPU", "sim")
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "-q", *SMALL_DEMO]) == 0
    captured = capsys.readouterr()
    assert "Trace: hrx-trace.json" in captured.out
    assert "[hrx-async]" not in captured.err
    assert (tmp_path / "hrx-trace.json").stat().st_size > 0


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["demo", *SMALL_DEMO, "--timeline", "{missing}/x.png"], "--timeline"),
        (["demo", *SMALL_DEMO, "--trace", "{missing}/x.json"], "--trace"),
        (["demo", *SMALL_DEMO, "--trace", "{tmp}"], "--trace"),
        (["bench", "gpu_npu_parallel", "1024", "16", "3", "{missing}/t.json"], "trace.json"),
        (["trace-plot", "{tmp}/t.json", "-o", "{missing}/t.png"], "-o"),
    ],
)
def test_output_paths_are_checked_before_the_work_runs(
    argv: list[str],
    named: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HRX_BACKEND", "sim")
    monkeypatch.setenv("HRX_NPU", "sim")
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "nonexistent"
    (tmp_path / "t.json").write_text('{"traceEvents": []}')
    filled = [item.format(missing=missing, tmp=tmp_path) for item in argv]
    assert main(filled) == EXIT_USAGE
    captured = capsys.readouterr()
    assert named in captured.err
    assert "no such directory" in captured.err or "is a directory" in captured.err
    assert "GPU:" not in captured.out and "checking against" not in captured.err  # nothing ran
    assert not (tmp_path / "hrx-trace.json").exists()


# -- error messages --------------------------------------------------------------------------


def test_no_message_writes_a_range_as_rust_does() -> None:
    package = Path(__file__).resolve().parents[2] / "hrx_async"
    found = [
        f"{path.relative_to(package)}:{number}"
        for path in sorted(package.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "..=" in line
    ]
    assert found == []


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["256", "0"], "1 <= npu-matrices <= 16384, got 0"),
        (["300"], "256 <= gpu-elements <= 67108864, got 300"),
    ],
)
def test_bench_ranges_name_the_offending_value(
    args: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "gpu_npu_parallel", *args]) == EXIT_USAGE
    assert expected in capsys.readouterr().err


def run_usage_error(argv: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> str:
    out = f"{tmp_path / 'o.bin'}:4"
    assert main(
        ["run", "--backend", "sim", "--grid", "1", "--block", "1", "--out", out, *argv]
    ) == (EXIT_USAGE)
    return capsys.readouterr().err


def test_run_says_a_kernel_file_does_not_exist(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "nosuchfile.py"
    err = run_usage_error(["--kernel", f"{missing}:f"], capsys, tmp_path)
    assert f"{str(missing)!r}: no such file" in err


@pytest.mark.parametrize(
    ("option", "text", "expected"),
    [
        ("--f32", "1e999", "--f32 needs a finite number, got '1e999'"),
        ("--f32", "nan", "--f32 needs a finite number"),
        ("--f32", "1e39", "does not fit f32"),
        ("--i32", "4294967296", "does not fit i32"),
    ],
)
def test_run_refuses_scalars_that_do_not_fit(
    option: str, text: str, expected: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    err = run_usage_error(["--kernel", "no_module:f", option, text], capsys, tmp_path)
    assert expected in err


def test_run_help_has_readable_placeholders_and_says_how_scalars_arrive(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["run", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for placeholder in ("--i32 INT", "--f32 FLOAT", "--in FILE", "--out PATH:BYTES", "--grid X"):
        assert placeholder in text
    assert "function(arrays, constants)" in text and "little-endian" in text


def test_trace_plot_refuses_a_negative_duration(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    trace = tmp_path / "t.json"
    trace.write_text('[{"ph": "X", "name": "a", "ts": 0, "dur": -5, "pid": 0, "tid": 1}]')
    assert main(["trace-plot", str(trace), "-o", str(tmp_path / "t.png")]) == 1
    assert "trace event 0 has a negative 'dur' (-5 us)" in capsys.readouterr().err
    assert not (tmp_path / "t.png").exists()
