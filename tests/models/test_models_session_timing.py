"""ModelSession.benchmark(key, n >= 10) (graph replay vs the commands run directly) and
profile_commands(key): the shape of what they report and that they leave the session's
values as one replay would; no timing is compared here (benchmarks/ measure)."""

from __future__ import annotations

import math
from typing import Any

import pytest

import hrx_async as hrx
from hrx_async.models import ModelContext, ModelSession
from hrx_async.models.region import Dispatch, Fill
from hrx_async.models.session import SessionTimings

pytestmark = pytest.mark.anyio


def _copy(arrays: list[Any], constants: bytes) -> None:
    arrays[1][:] = arrays[0]


async def test_benchmark_and_profile_report_per_run_and_per_command_means() -> None:
    """model.rs benchmark(key, n >= 10) and profile_commands: both run the recorded
    commands in order, so the session holds the values one replay gives."""
    async with hrx.Runtime("sim") as rt:
        s = ModelSession(ModelContext(rt))
        a, b = s.allocate(64), s.allocate_shared(64)
        contract = hrx.KernelContract(
            [hrx.Binding(64, hrx.Access.READ, 1), hrx.Binding(64, hrx.Access.WRITE, 1)]
        )
        k = s.load_kernel(hrx.KernelSource(host=_copy), "copy", (1,), (64,), contract)
        s.record("step", [Fill(a, 5), Fill(a.slice(8, 8), 6), Dispatch(k, [a.read(), b.write()])])
        timings = await s.benchmark("step", 10)
        assert isinstance(timings, SessionTimings) and timings.runs == 10
        assert timings.commands == ()
        assert all(math.isfinite(v) and v >= 0 for v in (timings.graph, timings.direct))
        want = bytes([5]) * 8 + bytes([6]) * 8 + bytes([5]) * 48
        assert await s.read_many([b]) == [want]
        profile = await s.profile_commands("step", 2)
        assert profile.runs == 2 and len(profile.commands) == 3
        assert all(math.isfinite(v) and v >= 0 for v in profile.commands)
        assert await s.read_many([b]) == [want]
        for call in (
            lambda: s.benchmark("step", 9),
            lambda: s.benchmark("other", 10),
            lambda: s.profile_commands("step", 0),
            lambda: s.profile_commands("missing"),
        ):
            with pytest.raises(hrx.ContractError):
                await call()
        await s.freeze(ModelContext(rt))
        with pytest.raises(hrx.ContractError, match="refuses"):
            await s.benchmark("step", 10)
