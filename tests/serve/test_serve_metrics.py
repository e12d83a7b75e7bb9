"""Metric names: a prefix no Prometheus name may start with is refused, and what is
written reads as the Prometheus text format."""

from __future__ import annotations

import re

import pytest

import hrx_async as hrx
from hrx_async.serve import prometheus_text
from hrx_async.serve.ray_metrics import RuntimeMetrics

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
SAMPLE = re.compile(rf"({NAME}) (-?[0-9]+)")
COMMENT = re.compile(rf"# (HELP|TYPE) ({NAME}) (.+)")
BAD_PREFIXES = ["bad prefix ", "1hrx_", "hrx-", "hrx.", "héx_", "hrx_\n", "hrx_{a=1}", " ", "\t"]


def parsed(text: str) -> dict[str, int]:
    """The samples of a Prometheus text exposition; AssertionError at a line it is not."""
    samples: dict[str, int] = {}
    typed: set[str] = set()
    assert text.endswith("\n")
    for line in text.splitlines():
        comment = COMMENT.fullmatch(line)
        if comment is not None:
            if comment.group(1) == "TYPE":
                assert comment.group(3) in ("counter", "gauge"), line
                typed.add(comment.group(2))
            continue
        sample = SAMPLE.fullmatch(line)
        assert sample is not None, f"not a Prometheus line: {line!r}"
        assert sample.group(1) in typed, line
        samples[sample.group(1)] = int(sample.group(2))
    return samples


@pytest.mark.parametrize("prefix", BAD_PREFIXES)
def test_a_prefix_no_metric_name_may_start_with_is_refused(prefix: str) -> None:
    with pytest.raises(hrx.ContractError, match=r"\[a-zA-Z_:\]\[a-zA-Z0-9_:\]\*"):
        prometheus_text(hrx.Statistics(), healthy=True, prefix=prefix)
    # Refused before Ray is imported, so without Ray too.
    with pytest.raises(hrx.ContractError):
        RuntimeMetrics(prefix)


@pytest.mark.parametrize("prefix", [None, 3, b"hrx_"])
def test_a_prefix_that_is_no_string_is_refused(prefix: object) -> None:
    with pytest.raises(hrx.ContractError):
        prometheus_text(hrx.Statistics(), prefix=prefix)  # type: ignore[arg-type]


@pytest.mark.parametrize("prefix", ["hrx_", "", "_", "ns:sub_", "A9_"])
def test_valid_prefixes_give_valid_text(prefix: str) -> None:
    stats = hrx.Statistics(submissions=3, live_bytes=64)
    samples = parsed(prometheus_text(stats, healthy=False, prefix=prefix))
    assert samples[f"{prefix}submissions_total"] == 3
    assert samples[f"{prefix}live_bytes"] == 64 and samples[f"{prefix}healthy"] == 0


def test_other_bad_arguments_are_refused() -> None:
    with pytest.raises(hrx.ContractError):
        prometheus_text({"submissions": 1})  # type: ignore[arg-type]
    with pytest.raises(hrx.ContractError):
        prometheus_text(hrx.Statistics(), healthy="yes")  # type: ignore[arg-type]
