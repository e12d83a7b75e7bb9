"""What a new user meets first: picture formats, missing event loops, plain Chrome traces,
steady benchmark sizes, one error style, a readable timeline, the kernel cache's place."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import anyio
import pytest

from hrx_async._core.lane import Lane
from hrx_async._core.trace import ExecutionTrace, TraceEvent
from hrx_async.backends import kernel_cache
from hrx_async.examples import graph_prepare
from hrx_async.examples.common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, Report
from hrx_async.tools.cli import main

ROOT = Path(__file__).resolve().parent.parent


def run_python(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def sample_trace(path: Path) -> None:
    ExecutionTrace(
        events=(
            TraceEvent("g", 0, Lane.UPLOAD, 0.0, 100.0, 4096, False),
            TraceEvent("g", 1, Lane.COMPUTE, 100.0, 300.0, 0, False),
            TraceEvent("g", 1, Lane.COMPUTE, 500.0, 300.0, 0, False),
        )
    ).write(path)


def decode_png(path: Path) -> None:
    image = pytest.importorskip("matplotlib.image")
    pixels = image.imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 50 and pixels.shape[1] > 50


# -- 1: an unknown picture format is a usage error ---------------------------------------------


def test_trace_plot_to_an_unknown_format_is_a_usage_error_naming_the_formats(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    trace = tmp_path / "trace.json"
    sample_trace(trace)
    for name in ("out.xyz", "out"):
        assert main(["trace-plot", str(trace), "-o", str(tmp_path / name)]) == EXIT_USAGE
        err = capsys.readouterr().err
        assert err.startswith("hrx-async trace-plot: error: ")
        assert ".png" in err and ".svg" in err and "Traceback" not in err
        assert not (tmp_path / name).exists()


def test_demo_refuses_an_unknown_picture_format_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    trace = tmp_path / "t.json"
    argv = ["demo", "--trace", str(trace), "--timeline", str(tmp_path / "t.xyz")]
    assert main(argv) == EXIT_USAGE
    assert capsys.readouterr().err.startswith("hrx-async demo: error: cannot draw a picture")
    assert not trace.exists()


# -- 2: --loop trio / uvloop without the package ----------------------------------------------

NO_MODULE = """
import sys
sys.modules[sys.argv[1]] = None  # as if it were not installed
from hrx_async.tools.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("loop", ["trio", "uvloop"])
@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--loop", "{loop}", "graph_prepare"],
        ["demo", "--loop", "{loop}", "--elements", "4096", "--matrices", "8", "--samples", "3"],
    ],
)
def test_a_missing_event_loop_names_its_extra(loop: str, argv: list[str], tmp_path: Path) -> None:
    argv = [item.format(loop=loop) for item in argv]
    if argv[0] == "demo":
        argv += ["--trace", str(tmp_path / "t.json"), "--timeline", str(tmp_path / "t.png")]
    done = run_python(NO_MODULE, loop, *argv)
    assert done.returncode == EXIT_FAILURE, done.stderr
    assert f'pip install "hrx-async[{loop}]"' in done.stderr
    assert done.stderr.count("error:") == 1 and "Traceback" not in done.stderr


def test_an_example_run_alone_names_the_missing_extra() -> None:
    code = "import sys; sys.modules['trio'] = None; import runpy; sys.argv[0] = 'graph_prepare'; "
    code += "runpy.run_module('hrx_async.examples.graph_prepare', run_name='__main__')"
    done = run_python(code, "--loop", "trio")
    assert done.returncode == EXIT_FAILURE
    assert "graph_prepare: error: --loop trio needs trio, which is not installed" in done.stderr
    assert 'pip install "hrx-async[trio]"' in done.stderr


def test_uvloop_runs_the_bench(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("uvloop")
    assert main(["bench", "--loop", "uvloop", "--json", "shared_roundtrip"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out)["loop"] == "uvloop"


def test_the_extras_exist() -> None:
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert any(item.startswith("trio") for item in extras["trio"])
    assert any(item.startswith("uvloop") for item in extras["uvloop"])
    for name in ("cache", "cuda", "hip"):
        assert any(item.startswith("platformdirs") for item in extras[name])


# -- 4: standard Chrome traces ------------------------------------------------------------------

PLAIN_EVENTS: list[dict[str, Any]] = [
    {"name": "thread_name", "ph": "M", "pid": 7, "tid": 11, "args": {"name": "worker"}},
    {"name": "load", "ph": "X", "pid": 7, "tid": 11, "ts": 10, "dur": 50},
    {"name": "step", "ph": "B", "pid": 7, "tid": 12, "ts": 20},
    {"name": "step", "ph": "E", "pid": 7, "tid": 12, "ts": 90},
    {"name": "mark", "ph": "i", "pid": 7, "tid": 12, "ts": 95, "s": "t"},
]


@pytest.mark.parametrize(
    "text",
    [
        json.dumps(PLAIN_EVENTS),  # the JSON array format
        json.dumps(PLAIN_EVENTS)[:-1] + ",\n",  # the array format may omit its closing bracket
        json.dumps({"traceEvents": PLAIN_EVENTS, "displayTimeUnit": "ns"}),  # no args at all
    ],
    ids=["array", "array-unclosed", "object-without-args"],
)
def test_trace_plot_reads_standard_chrome_traces(
    text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    trace, picture = tmp_path / "chrome.json", tmp_path / "chrome.png"
    trace.write_text(text)
    assert main(["trace-plot", str(trace), "-o", str(picture)]) == EXIT_OK
    assert "2 bars on 2 rows" in capsys.readouterr().out
    decode_png(picture)


def test_a_chrome_trace_becomes_named_rows_and_bars() -> None:
    from hrx_async.tools.plot import timeline_from_chrome

    timeline = timeline_from_chrome(PLAIN_EVENTS)
    assert timeline.rows == ("worker", "thread 12")
    assert [(s.row, s.start_us, s.duration_us, s.label) for s in timeline.spans] == [
        (0, 10.0, 50.0, "load"),
        (1, 20.0, 70.0, "step"),
    ]


def test_a_trace_without_bars_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "empty.json"
    trace.write_text(json.dumps([PLAIN_EVENTS[0]]))
    assert main(["trace-plot", str(trace), "-o", str(tmp_path / "x.png")]) == EXIT_FAILURE
    assert "no complete" in capsys.readouterr().err


# -- 7: graph_prepare collects before each size -----------------------------------------------


def test_graph_prepare_collects_before_each_size(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real_collect = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *args: calls.append(1) or real_collect(*args))
    counts = (8, 16, 32)
    result = anyio.run(graph_prepare.run, counts, "sim", Report(emit=None))
    assert [row["nodes"] for row in result.values["rows"]] == list(counts)
    assert len(calls) >= len(counts)
    assert gc.get_freeze_count() == 0


def test_quiet_gc_freezes_for_the_block_and_keeps_a_callers_freeze() -> None:
    from hrx_async.tools.benchmark import quiet_gc

    assert gc.get_freeze_count() == 0
    with quiet_gc():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
    gc.freeze()
    try:
        with quiet_gc():
            pass
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


# -- 8: bench usage, one error style, the timeline's legend and labels --------------------------


def test_bench_without_a_name_asks_for_the_name_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "required: NAME\n" in err and "args" not in err.splitlines()[-1]


def test_every_command_prefixes_errors_alike(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = [
        (["bench", "graph_prepare", "extra"], "bench", EXIT_USAGE),
        (["gc", "soon"], "gc", EXIT_USAGE),
        (["compile", str(tmp_path / "missing.cu"), "k"], "compile", EXIT_FAILURE),
        (["trace-plot", str(tmp_path / "missing.json"), "-o", "x.png"], "trace-plot", EXIT_FAILURE),
        (["run", "--kernel", "m:f", "--grid", "0", "--block", "1"], "run", EXIT_USAGE),
    ]
    for argv, command, status in cases:
        assert main(argv) == status, argv
        err = capsys.readouterr().err
        assert err.startswith(f"hrx-async {command}: error: "), err


def _drawn_figure(trace: ExecutionTrace, path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from hrx_async.tools.plot import plot_timeline

    drawn: list[Any] = []
    real_savefig = Figure.savefig

    def keep(self: Any, *args: Any, **kwargs: Any) -> Any:
        drawn.append(self)
        return real_savefig(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    plot_timeline(trace, path, title="t")
    (figure,) = drawn
    return figure


def test_the_timeline_legend_covers_no_bar_and_bars_are_labelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The last bar sits in the top row at the right edge, where a legend inside the axes goes.
    trace = ExecutionTrace(
        events=(
            TraceEvent("replay", 0, Lane.COMPUTE, 0.0, 400.0, 0, False),
            TraceEvent("replay", 1, Lane.NPU, 100.0, 400.0, 0, False),
            TraceEvent("replay", 0, Lane.COMPUTE, 600.0, 400.0, 0, False),
            TraceEvent("replay", 1, Lane.NPU, 620.0, 300.0, 0, True),
        )
    )
    figure = _drawn_figure(trace, tmp_path / "t.png", monkeypatch)
    axes = figure.axes[0]
    renderer = figure.canvas.get_renderer()
    legend = axes.get_legend().get_window_extent(renderer)
    for collection in axes.collections:
        for path in collection.get_paths():
            box = path.get_extents(collection.get_transform())
            assert not box.overlaps(legend), "the legend covers a bar"
    labels = {text.get_text() for text in axes.texts}
    assert {"replay#0 r1", "replay#0 r2", "replay#1 r1", "replay#1 r2"} <= labels


# -- 9: the kernel cache's directory ------------------------------------------------------------


def test_the_kernel_cache_goes_where_platformdirs_says(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[Any, ...]] = []

    def user_cache_dir(*args: Any, **kwargs: Any) -> str:
        asked.append((args, kwargs))
        return "/somewhere/Library/Caches/hrx_async"

    fake = types.ModuleType("platformdirs")
    fake.user_cache_dir = user_cache_dir  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "platformdirs", fake)
    assert kernel_cache.default_cache_dir() == Path("/somewhere/Library/Caches/hrx_async")
    assert asked == [(("hrx_async",), {"appauthor": False})]
    assert kernel_cache.KernelCache().root == Path("/somewhere/Library/Caches/hrx_async")


def test_without_platformdirs_the_cache_follows_xdg(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "platformdirs", None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert kernel_cache.default_cache_dir() == tmp_path / "hrx_async"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert kernel_cache.default_cache_dir() == Path.home() / ".cache" / "hrx_async"


def test_real_platformdirs_agrees_with_xdg_on_linux(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("platformdirs")
    if not sys.platform.startswith("linux"):
        pytest.skip("the XDG rule is Linux's")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert kernel_cache.default_cache_dir() == tmp_path / "hrx_async"
