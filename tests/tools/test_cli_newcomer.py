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
