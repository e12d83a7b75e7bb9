"""The benchmark harness: percentiles, distributions, paired runs, loop lag and stage timing."""

import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from hrx_async.errors import ContractError
from hrx_async.tools.benchmark import Distribution, LoopLag, StageTimer, paired, percentile


@pytest.mark.parametrize("p", [0, 101, -5, 0.5, 100.01, float("nan"), True])
def test_percentile_rejects_p_outside_1_to_100(p: Any) -> None:
    with pytest.raises(ContractError, match=r"\[1, 100\]"):
        percentile([1.0, 2.0], p)


def test_percentile_rejects_empty() -> None:
    with pytest.raises(ContractError, match="empty"):
        percentile([], 50)


def test_percentile_rejects_unsorted() -> None:
    with pytest.raises(ContractError, match="sorted"):
        percentile([3.0, 1.0, 2.0], 50)


def test_percentile_is_nearest_rank() -> None:
    samples = [float(v) for v in range(1, 21)]  # 1..20
    for p in (1, 5, 50, 51, 95, 99, 100):
        expected = samples[math.ceil(len(samples) * p / 100) - 1]
        assert percentile(samples, p) == expected
    # Hand-checked ranks: ceil(20*0.5)=10 -> 10.0; ceil(20*0.51)=11 -> 11.0.
    assert percentile(samples, 50) == 10.0
    assert percentile(samples, 51) == 11.0
    assert percentile(samples, 1) == 1.0
    assert percentile(samples, 100) == 20.0


def test_percentile_single_sample() -> None:
    for p in (1, 50, 100):
        assert percentile([7.5], p) == 7.5


@pytest.mark.parametrize(
    ("samples", "message"),
    [
        ([], "at least one"),
        ([1.0, float("nan")], "nan"),
        ([float("inf")], "inf"),
        ([1.0, -0.5], r"-0\.5"),
    ],
)
def test_distribution_rejects_bad_samples(samples: list[float], message: str) -> None:
    with pytest.raises(ContractError, match=message):
        Distribution.from_samples(samples)


def test_distribution_single_sample() -> None:
    dist = Distribution.from_samples([3.0])
    assert dist == Distribution(count=1, median=3.0, p95=3.0, min=3.0, max=3.0, mean=3.0)


def test_distribution_even_count_median_is_lower_middle() -> None:
    # Nearest rank never interpolates: the median of 4 samples is the 2nd smallest.
    dist = Distribution.from_samples([4.0, 1.0, 3.0, 2.0])
    assert dist.count == 4
    assert dist.median == 2.0
    assert dist.p95 == 4.0
    assert (dist.min, dist.max) == (1.0, 4.0)
    assert dist.mean == pytest.approx(2.5)


def test_distribution_accepts_any_iterable_and_zero() -> None:
    dist = Distribution.from_samples(x * 0.5 for x in range(5))
    assert (dist.count, dist.min, dist.max) == (5, 0.0, 2.0)


@pytest.mark.anyio
async def test_paired_alternates_ab_ba() -> None:
    calls: list[str] = []

    async def variant_a() -> float:
        calls.append("A")
        return 0.002

    async def variant_b() -> float:
        calls.append("B")
        return 0.001

    result = await paired(variant_a, variant_b, pairs=5)
    assert result.order == ["AB", "BA", "AB", "BA", "AB"]
    assert "".join(calls) == "".join(result.order)
    assert result.a_samples == [0.002] * 5
    assert result.b_samples == [0.001] * 5
    assert result.ratios == pytest.approx([2.0] * 5)
    assert result.ratio.median == pytest.approx(2.0)
    assert result.a.count == result.b.count == 5


@pytest.mark.anyio
async def test_paired_times_calls_that_return_none() -> None:
    async def sleeps() -> None:
        await anyio.sleep(0.002)

    async def reports() -> float:
        return 1.0

    result = await paired(sleeps, reports, pairs=2)
    # Self-timed samples are real positive durations; reported ones are taken as given.
    assert all(sample > 0 for sample in result.a_samples)
    assert result.b_samples == [1.0, 1.0]
    assert result.ratios == pytest.approx(result.a_samples)


@pytest.mark.anyio
@pytest.mark.parametrize("pairs", [0, -1, True])
async def test_paired_rejects_bad_pair_count(pairs: Any) -> None:
    async def noop() -> None:
        return None

    with pytest.raises(ContractError, match="pairs"):
        await paired(noop, noop, pairs=pairs)


@pytest.mark.anyio
async def test_paired_rejects_bad_reported_seconds() -> None:
    async def negative() -> float:
        return -1.0

    async def zero() -> float:
        return 0.0

    async def fine() -> float:
        return 1.0

    with pytest.raises(ContractError, match=r"-1\.0"):
        await paired(negative, fine, pairs=1)
    with pytest.raises(ContractError, match="ratio"):
        await paired(fine, zero, pairs=1)


@pytest.mark.anyio
async def test_loop_lag_sees_a_blocking_call() -> None:
    async with LoopLag(interval=0.001) as lag:
        await anyio.sleep(0.02)
        time.sleep(0.05)  # blocks the whole loop, as a careless sync call would
        await anyio.sleep(0.02)
    dist = lag.distribution()
    assert dist.count >= 2
    assert dist.max >= 40.0
    assert lag.p99_ms >= dist.median


@pytest.mark.anyio
async def test_loop_lag_in_an_existing_task_group() -> None:
    lag = LoopLag()
    async with anyio.create_task_group() as group:
        group.start_soon(lag.run)
        await anyio.sleep(0.01)
        time.sleep(0.05)
        await anyio.sleep(0.01)
        group.cancel_scope.cancel()
    assert lag.distribution().max >= 40.0


@pytest.mark.anyio
async def test_loop_lag_passes_body_exceptions_through_unwrapped() -> None:
    with pytest.raises(KeyError, match="boom"):
        async with LoopLag():
            await anyio.sleep(0)
            raise KeyError("boom")


def test_loop_lag_rejects_bad_interval_and_empty_report() -> None:
    for bad in (0, -0.001, float("inf")):
        with pytest.raises(ContractError, match="interval"):
            LoopLag(interval=bad)
    with pytest.raises(ContractError, match="no wake-ups"):
        LoopLag().distribution()


@pytest.mark.anyio
async def test_stage_timer_records_stages_and_syncs_at_boundaries() -> None:
    events: list[str] = []

    async def sync() -> None:
        events.append("sync")

    timer = StageTimer(sync=sync)
    for _ in range(3):
        async with timer.stage("upload"):
            events.append("upload")
            await anyio.sleep(0.001)
        async with timer.stage("compute"):
            events.append("compute")
    assert events[:6] == ["sync", "upload", "sync", "sync", "compute", "sync"]
    assert len(events) == 18

    report = timer.report()
    assert list(report) == ["upload", "compute"]
    assert report["upload"].count == 3
    assert report["compute"].count == 3
    assert len(timer.samples("upload")) == 3
    assert all(seconds > 0 for seconds in timer.samples("upload"))


@pytest.mark.anyio
async def test_stage_timer_skips_failed_stage_and_rejects_bad_names() -> None:
    timer = StageTimer()
    with pytest.raises(RuntimeError):
        async with timer.stage("broken"):
            raise RuntimeError("device fault")
    assert timer.report() == {}
    with pytest.raises(ContractError, match="no stage named 'broken'"):
        timer.samples("broken")
    with pytest.raises(ContractError, match="non-empty"):
        async with timer.stage(""):
            pass


BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_sim_calls_reports_calls_per_replay_of_each_scenario(loop: str) -> None:
    command = [sys.executable, str(BENCHMARKS / "sim_calls.py"), "--loop", loop, "--json"]
    command += ["--replays", "16", "--warmup", "8", "--repeat", "1", "--top", "3"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["loop"] == loop
    for scenario in ("one_node", "three_region", "three_region_8_in_flight"):
        assert isinstance(report[scenario], float)
        assert report[scenario] > 0
        assert len(report["detail"][scenario]["top"]) == 3


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_timed_driver_reports_the_end_of_a_region_in_order(loop: str) -> None:
    command = [sys.executable, str(BENCHMARKS / "timed_driver.py"), "--loop", loop]
    command += ["--replays", "20", "--warmup", "5", "--region-us", "100"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["loop"] == loop and report["replays"] == 20
    moments = report["from_the_end_us"]
    # The driver answers by the clock: "not ready" before the end, "ready" after it, and the
    # completion can only resolve (and its task resume) after that.
    assert moments["last_not_ready"] < 0 <= moments["first_ready"]
    assert moments["first_ready"] <= moments["resolved"] <= moments["resumed"]
    assert report["queries_per_replay"] >= 2


def test_native_profile_summary_charges_samples_to_the_deepest_runtime_frame(
    tmp_path: Path,
) -> None:
    loop = "BaseEventLoop._run_once (asyncio/base_events.py:1987)"
    submit = "CPyDef_scheduler___Scheduler___submit (__native__compiled.c:1)"
    stacks = {
        # in the driver, called from compiled admission through an interpreted wrapper
        f"<module> (x.py:1);{loop};{submit};CudaTable.graph_launch (cuda.py:381);"
        "0x1 (libcuda.so.1)": 6,
        # compiled code of its own
        f"<module> (x.py:1);{loop};{submit};CPy_DECREF (mypyc_util.h:1)": 3,
        # start-up, and samples outside the loop: not counted
        f"<module> (x.py:1);{loop};Runtime.__aenter__ (runtime.py:1)": 50,
        "<module> (x.py:1);_find_and_load (<frozen importlib._bootstrap>:1)": 40,
        f"<module> (x.py:1);{loop};main (x.py:2)": 1,
    }
    profile = tmp_path / "profile.txt"
    profile.write_text("".join(f"{stack} {count}\n" for stack, count in stacks.items()))
    command = [sys.executable, str(BENCHMARKS / "native_profile_summary.py"), str(profile)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "10 samples in the event loop; in the driver or cuda-bindings: 60.0%"
    assert lines[1].split() == ["60.0%", "driver", "CudaTable.graph_launch", "[py]"]
    assert lines[2].split() == ["30.0%", "scheduler___Scheduler___submit"]
    assert lines[3].split() == ["10.0%", "main", "[py]"]


def test_loop_lag_is_not_rounded_to_the_loops_clock_on_uvloop() -> None:
    pytest.importorskip("uvloop")

    async def measure() -> list[float]:
        async with LoopLag(interval=0.001) as lag:
            for _ in range(20):
                await anyio.sleep(0.001)
                time.sleep(0.0003)  # some work between the ticks
        return lag.samples_ms

    samples = anyio.run(measure, backend="asyncio", backend_options={"use_uvloop": True})
    assert samples
    # uvloop's clock counts whole milliseconds: timed with it, every lag would be 0 or 1 ms.
    assert any(abs(sample - round(sample)) > 1e-3 for sample in samples)
