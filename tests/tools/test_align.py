"""The align benchmark program: runs on sim on both loops, agrees with OpenCV's crops,
prints crops/s per pipeline, and rejects bad arguments with its usage."""

from __future__ import annotations

import re

import pytest

from hrx_async.examples import NAMES, spec
from hrx_async.examples.common import EXIT_OK, EXIT_USAGE, main_for


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_align_prints_crops_per_second(loop: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert "align" in NAMES
    code = main_for(spec("align"), ["--backend", "sim", "--loop", loop, "2", "3"])
    out = capsys.readouterr().out
    assert code == EXIT_OK, out
    found = re.search(r"^hrx: requests=2 faces=3 crops_s=(\d+\.\d) p50_ms=(\d+\.\d+)$", out, re.M)
    assert found is not None, out
    assert float(found.group(1)) > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [(["0"], "requests must be >= 1"), (["1", "0"], "faces 1..1024"), (["1", "2", "3"], "at most")],
)
def test_align_rejects_bad_arguments(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main_for(spec("align"), ["--backend", "sim", *args])
    assert code == EXIT_USAGE
    assert message in capsys.readouterr().err
