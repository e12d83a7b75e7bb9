"""The image_pipeline example: runs on sim on both loops, prints throughput and p50/p95,
prepares nothing while timing, and rejects bad arguments with its usage."""

from __future__ import annotations

import re

import pytest

from hrx_async.examples import NAMES, spec
from hrx_async.examples.common import EXIT_OK, EXIT_USAGE, main_for


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_image_pipeline_prints_throughput_and_percentiles(
    loop: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "image_pipeline" in NAMES
    code = main_for(spec("image_pipeline"), ["--backend", "sim", "--loop", loop, "12", "64", "8"])
    out = capsys.readouterr().out
    assert code == EXIT_OK
    found = re.search(
        r"^images=12 size=64 patch=8 images_s=(\d+\.\d) p50_ms=(\d+\.\d+) p95_ms=(\d+\.\d+)$",
        out,
        re.M,
    )
    assert found is not None, out
    rate, p50, p95 = (float(v) for v in found.groups())
    assert rate > 0 and 0 < p50 <= p95
    assert "'kernels_loaded': 4" in out  # 3 plans for the first shape, 1 resize for the second


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["0"], "images must be >= 1"),
        (["4", "64", "7"], "patch must divide size"),
        (["x"], "invalid integer"),
        (["1", "2", "3", "4"], "at most three"),
    ],
)
def test_image_pipeline_rejects_bad_arguments(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main_for(spec("image_pipeline"), ["--backend", "sim", *args])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE
    assert message in err
