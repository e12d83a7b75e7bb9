"""The timeline plot writes a real, decodable image."""

import builtins
from pathlib import Path
from typing import Any

import pytest

from hrx_async._core.lane import Lane
from hrx_async._core.trace import ExecutionTrace, TraceEvent
from hrx_async.errors import ContractError, Unsupported
from hrx_async.tools.plot import Span, Timeline, legend_entries, plot_timeline


def make_trace(failed: bool) -> ExecutionTrace:
    return ExecutionTrace(
        events=(
            TraceEvent("g", 0, Lane.UPLOAD, 1_000.0, 500.0, 4096, False),
            TraceEvent("g", 1, Lane.COMPUTE, 1_500.0, 2_000.0, 0, False),
            TraceEvent("g", 2, Lane.DOWNLOAD, 3_500.0, 400.0, 4096, failed),
            TraceEvent("g", 0, Lane.UPLOAD, 1_600.0, 500.0, 4096, False),
        )
    )


@pytest.mark.parametrize("failed", [False, True])
def test_plot_writes_a_decodable_png(tmp_path: Path, failed: bool) -> None:
    image_module = pytest.importorskip("matplotlib.image")
    path = tmp_path / "timeline.png"
    plot_timeline(make_trace(failed), path, title="pipeline")
    assert path.stat().st_size > 0
    pixels = image_module.imread(path)
    height, width = pixels.shape[:2]
    assert height > 0
    assert width > 0


def test_plot_rejects_an_empty_trace(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    with pytest.raises(ContractError, match="empty"):
        plot_timeline(ExecutionTrace(events=()), tmp_path / "empty.png")


def test_plot_without_matplotlib_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(Unsupported, match=r'pip install "hrx-async\[plot\]"'):
        plot_timeline(make_trace(False), tmp_path / "never.png")
    assert not (tmp_path / "never.png").exists()


def _mixed_trace() -> ExecutionTrace:
    return ExecutionTrace(
        events=(
            TraceEvent("g", 0, Lane.COMPUTE, 0.0, 2_000.0, 0, False),
            TraceEvent("g", 1, Lane.NPU, 2_000.0, 3_000.0, 0, False),
            TraceEvent("g", 2, Lane.HOST, 5_000.0, 1_000.0, 0, False),
        )
    )


def test_the_legend_names_gpu_npu_and_host_work() -> None:
    timeline = Timeline.from_trace(_mixed_trace())
    assert timeline.kinds == ("GPU", "NPU", "host")
    assert [label for label, _ in legend_entries(timeline)] == ["GPU work", "NPU work", "host work"]
    only_gpu = Timeline.from_trace(make_trace(False))
    assert [label for label, _ in legend_entries(only_gpu)] == ["GPU work"]
    # A trace from another tool: rows are threads of unknown kind, one entry for all bars.
    foreign = Timeline(("thread 1",), (Span(0, 0.0, 10.0, "x"),))
    assert [label for label, _ in legend_entries(foreign)] == ["region (label: name, replay)"]


def test_npu_bars_are_drawn_in_their_own_colour(tmp_path: Path) -> None:
    image_module = pytest.importorskip("matplotlib.image")
    colors = pytest.importorskip("matplotlib.colors")
    path = tmp_path / "mixed.png"
    plot_timeline(_mixed_trace(), path)
    pixels = image_module.imread(path)[..., :3]

    def share(name: str) -> float:
        want = colors.to_rgb(name)
        close = (abs(pixels - want) < 0.02).all(axis=-1)
        return float(close.mean())

    # Each kind fills a visible part of the picture (bars and legend patches).
    assert share("tab:orange") > 0.005
    assert share("tab:blue") > 0.005
    assert share("tab:gray") > 0.005
