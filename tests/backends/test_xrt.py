"""The xrt NPU backend against the fake pyxrt (tests/fake_pyxrt.py), on asyncio and trio.

The fake keeps a host and a device copy of every buffer, so results are right
only when the backend syncs the right byte ranges; its `run.wait()` records
any call made from an event loop's thread.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import hrx_async as hrx
from hrx_async.backends import xrt as xrt_backend
from hrx_async.errors import (
    BackendUnavailable,
    ContractError,
    DeviceLost,
    ExecutionError,
)

sys.path.insert(0, str(Path(__file__).parent.parent))
import fake_pyxrt
from fake_pyxrt import affine

pytestmark = pytest.mark.anyio
N = 64


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.delenv("HRX_NPU", raising=False)
    with fake_pyxrt.installed({"MLIR_AIE": affine}) as module:
        yield module


@pytest.fixture
def artifacts(tmp_path: Path) -> dict[str, Path]:
    xclbin = fake_pyxrt.write_xclbin(tmp_path / "final.xclbin", {"MLIR_AIE": 8, "SMALL": 4})
    insts = tmp_path / "insts.bin"
    np.arange(1, 33, dtype=np.uint32).tofile(insts)
    text = tmp_path / "insts.txt"
    text.write_text("\n".join(f"{w:08x}" for w in range(1, 33)) + "\n")
    return {"xclbin": xclbin, "insts": insts, "insts_txt": text, "dir": tmp_path}


def contract(n: int = N) -> hrx.KernelContract:
    return hrx.KernelContract([hrx.Binding(n, hrx.Access.READ), hrx.Binding(n, hrx.Access.WRITE)])


def load(rt: hrx.Runtime, art: dict[str, Path], name: str = "MLIR_AIE", n: int = N) -> Any:
    source = xrt_backend.xrt_source(art["xclbin"], art["insts"])
    return rt.npu(0).load_artifact(source, name, 1, contract(n))


async def write(view: hrx.View, values: np.ndarray[Any, Any]) -> None:
    async with view.map_write() as memory:
        np.frombuffer(memory, values.dtype)[:] = values


async def read(view: hrx.View) -> np.ndarray[Any, Any]:
    async with view.map_read() as memory:
        return np.frombuffer(memory, np.int32).copy()


async def test_runs_and_syncs_only_the_ranges_used(fake: ModuleType, artifacts: dict) -> None:
    async with hrx.Runtime(backend="sim", npu="xrt") as rt:
        assert rt.npu(0).target == "npu1"
        kernel = load(rt, artifacts, n=N // 2)
        a = rt.allocate(N, hrx.npu_local(0))
        c = rt.allocate(N, hrx.shared(0))
        graph = rt.graph()
        graph.npu(kernel, [a.view(N // 2, N // 2), c.view(0, N // 2)])
        step = graph.prepare()
        before = (fake_pyxrt.FAKE.bos_created, fake_pyxrt.FAKE.runs_created)
        for seed in range(4):
            values = np.arange(N // 8, dtype=np.int32) + seed
            await write(a.view(), np.concatenate([values * 0 - 7, values]))
            fake_pyxrt.FAKE.syncs.clear()
            await step.submit()
            out = await read(c.view())
            assert np.array_equal(out[: N // 8], values * 2 + 1)
            assert np.array_equal(out[N // 8 :], np.zeros(N // 8, np.int32))
            # The upper half of `a` goes to the device, the lower half of `c` comes back.
            assert [(d, size, off) for _, d, size, off in fake_pyxrt.FAKE.syncs] == [
                (0, N // 2, N // 2),
                (1, N // 2, 0),
            ]
        # Replay is run.start() only: no buffer objects, no runs.
        assert (fake_pyxrt.FAKE.bos_created, fake_pyxrt.FAKE.runs_created) == before
        assert fake_pyxrt.FAKE.starts == 4
        assert rt.statistics().cache_maintenance_bytes == 4 * N


async def test_one_hw_context_per_xclbin_and_text_instructions(
    fake: ModuleType, artifacts: dict
) -> None:
    async with hrx.Runtime(backend="sim", npu="xrt") as rt:
        load(rt, artifacts)
        text = xrt_backend.xrt_source(artifacts["xclbin"], artifacts["insts_txt"])
        again = rt.npu(0).load_artifact(text, "MLIR_AIE", 2, contract())
        small = rt.npu(0).load_artifact(
            text, "SMALL", 1, hrx.KernelContract([hrx.Binding(N, hrx.Access.READ_WRITE)])
        )
        assert fake_pyxrt.FAKE.contexts_created == 1
        assert again.native.count == 32 and small.native.num_args == 4


async def test_pipelined_replays_and_polling_thread(fake: ModuleType, artifacts: dict) -> None:
    fake_pyxrt.FAKE.latency_s = 0.004  # longer than the loop polls: the queue's thread finishes
    async with hrx.Runtime(backend="sim", npu="xrt") as rt:
        kernel = load(rt, artifacts)
        pairs = [
            (rt.allocate(N, hrx.npu_local(0)), rt.allocate(N, hrx.npu_local(0))) for _ in range(3)
        ]
        steps = []
        for index, (a, c) in enumerate(pairs):
            await write(a.view(), np.full(N // 4, index, np.int32))
            graph = rt.graph()
            graph.npu(kernel, [a.view(), c.view()])
            steps.append(graph.prepare())
        completions = [step.submit() for step in steps]
        for completion in completions:
            await completion
        for index, (_, c) in enumerate(pairs):
            assert np.all(await read(c.view()) == index * 2 + 1)


async def test_error_state_is_an_execution_error(fake: ModuleType, artifacts: dict) -> None:
    async with hrx.Runtime(backend="sim", npu="xrt") as rt:
        kernel = load(rt, artifacts)
        a, c = rt.allocate(N, hrx.npu_local(0)), rt.allocate(N, hrx.npu_local(0))
        graph = rt.graph("npu-step")
        graph.npu(kernel, [a.view(), c.view()])
        step = graph.prepare()
        fake_pyxrt.FAKE.faults.append(fake_pyxrt.ert_cmd_state.ERT_CMD_STATE_ERROR)
        with pytest.raises(ExecutionError) as caught:
            await step.submit()
        assert "npu-step" in str(caught.value) and "ERROR (5)" in str(caught.value)
        assert rt.healthy
        await write(c.view(), np.zeros(N // 4, np.int32))  # clears the poison
        await step.submit()
        assert np.all(await read(c.view()) == 1)


@pytest.mark.parametrize("state", ["ERT_CMD_STATE_NORESPONSE", "ERT_CMD_STATE_SKCRASHED"])
async def test_sticky_states_lose_the_device(fake: ModuleType, artifacts: dict, state: str) -> None:
    async with hrx.Runtime(backend="sim", npu="xrt") as rt:
        kernel = load(rt, artifacts)
        a, c = rt.allocate(N, hrx.npu_local(0)), rt.allocate(N, hrx.npu_local(0))
        graph = rt.graph()
        graph.npu(kernel, [a.view(), c.view()])
        step = graph.prepare()
        fake_pyxrt.FAKE.faults.append(getattr(fake_pyxrt.ert_cmd_state, state))
        with pytest.raises(ExecutionError, match=state.removeprefix("ERT_CMD_STATE_")):
            await step.submit()
        assert not rt.healthy
        with pytest.raises(DeviceLost):
            step.submit()


async def test_watchdog_quarantines_until_the_run_ends(fake: ModuleType, artifacts: dict) -> None:
    async with hrx.Runtime(backend="sim", npu="xrt") as rt:
        rt._npu_backend.watchdog_s = 0.05
        kernel = load(rt, artifacts)
        a, c = rt.allocate(N, hrx.npu_local(0)), rt.allocate(N, hrx.npu_local(0))
        other = rt.allocate(N, hrx.npu_local(0))
        graph = rt.graph()
        graph.npu(kernel, [a.view(), c.view()])
        step = graph.prepare()
        neighbour = rt.graph()
        neighbour.npu(kernel, [a.view(), other.view()])
        uses_a = neighbour.prepare()
        fake_pyxrt.FAKE.hang_next = 1
        with pytest.raises(ExecutionError, match="watchdog"):
            await step.submit()
        assert rt._npu_backend.quarantined(c.storage) and rt._npu_backend.quarantined(a.storage)
        with pytest.raises(ExecutionError, match="quarantined"):
            await uses_a.submit()
        fake_pyxrt.FAKE.release_hung()  # the timed-out command finally ends
        await uses_a.submit()
        assert not rt._npu_backend.quarantined(a.storage)
        assert np.all(await read(other.view()) == 1)


async def test_bad_input_is_typed_and_changes_nothing(fake: ModuleType, artifacts: dict) -> None:
    tmp = artifacts["dir"]
    (tmp / "bad.xclbin").write_bytes(b"not an xclbin")
    (tmp / "odd.bin").write_bytes(b"\x01\x02\x03")
    (tmp / "bad.txt").write_text("0000000f\nzz\n")
    (tmp / "empty.bin").write_bytes(b"")
    source = xrt_backend.xrt_source
    cases = [
        (
            source(tmp / "missing.xclbin", artifacts["insts"]),
            "MLIR_AIE",
            1,
            contract(),
            "does not exist",
        ),
        (
            source(tmp / "bad.xclbin", artifacts["insts"]),
            "MLIR_AIE",
            1,
            contract(),
            "not a readable",
        ),
        (
            source(artifacts["xclbin"], tmp / "missing.bin"),
            "MLIR_AIE",
            1,
            contract(),
            "cannot read",
        ),
        (source(artifacts["xclbin"], tmp / "odd.bin"), "MLIR_AIE", 1, contract(), "whole 32-bit"),
        (source(artifacts["xclbin"], tmp / "bad.txt"), "MLIR_AIE", 1, contract(), "line 2"),
        (
            source(artifacts["xclbin"], tmp / "empty.bin"),
            "MLIR_AIE",
            1,
            contract(),
            "no instructions",
        ),
        (
            source(artifacts["xclbin"], artifacts["insts"]),
            "NOPE",
            1,
            contract(),
            "no kernel 'NOPE'",
        ),
        (
            source(artifacts["xclbin"], artifacts["insts"]),
            "SMALL",
            1,
            contract(),
            "takes 4 arguments",
        ),
        (
            source(artifacts["xclbin"], artifacts["insts"]),
            "MLIR_AIE",
            5,
            contract(),
            "1..4 columns",
        ),
        (source(artifacts["xclbin"], artifacts["insts"]), "MLIR_AIE", 0, contract(), "columns"),
        (hrx.KernelSource(host=affine), "MLIR_AIE", 1, contract(), "binary"),
        (
            source(artifacts["xclbin"], artifacts["insts"]),
            "MLIR_AIE",
            1,
            hrx.KernelContract([hrx.Binding(N, hrx.Access.READ)], constants=b"\x01\x00\x00\x00"),
            "constants",
        ),
    ]
    async with hrx.Runtime(backend="sim", npu="xrt") as rt:
        state = fake_pyxrt.FAKE
        before = (state.contexts_created, state.bos_created, state.registered, rt.statistics())
        for src, name, columns, con, message in cases:
            with pytest.raises(ContractError, match=re.escape(message)):
                rt.npu(0).load_artifact(src, name, columns, con)
        assert (
            state.contexts_created,
            state.bos_created,
            state.registered,
            rt.statistics(),
        ) == before
        kernel = load(rt, artifacts)
        host = rt.allocate(N, hrx.HOST_VISIBLE)
        c = rt.allocate(N, hrx.npu_local(0))
        graph = rt.graph()
        with pytest.raises(ContractError, match="npu_local"):
            graph.npu(kernel, [host.view(), c.view()])


async def test_foreign_memory_group_goes_through_staging(fake: ModuleType, artifacts: dict) -> None:
    fake_pyxrt.FAKE.groups = {3: 7, 4: 7}  # the kernel's buffers live in another memory group
    async with hrx.Runtime(backend="sim", npu="xrt") as rt:
        a, c = rt.allocate(N, hrx.npu_local(0)), rt.allocate(N, hrx.npu_local(0))
        kernel = load(rt, artifacts)
        graph = rt.graph()
        graph.npu(kernel, [a.view(), c.view()])
        step = graph.prepare()
        await write(a.view(), np.arange(N // 4, dtype=np.int32))
        await step.submit()
        assert np.array_equal(await read(c.view()), np.arange(N // 4, dtype=np.int32) * 2 + 1)


# -- choosing the NPU backend ------------------------------------------------------------


async def test_auto_picks_xrt_when_it_opens(fake: ModuleType) -> None:
    async with hrx.Runtime(backend="sim") as rt:
        assert rt._npu_backend.name == "xrt" and rt.npu(0).target == "npu1"
        assert not [r for r in rt.fallback_reasons if "xrt" in r]


async def test_hrx_npu_overrides_auto(fake: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HRX_NPU", "sim")
    async with hrx.Runtime(backend="sim") as rt:
        assert rt.npu(0).target == "sim-npu"
    monkeypatch.setenv("HRX_NPU", "bogus")
    with pytest.raises(ContractError, match="HRX_NPU"):
        async with hrx.Runtime(backend="sim"):
            pass


async def test_auto_falls_back_when_no_device_opens(fake: ModuleType) -> None:
    fake_pyxrt.FAKE.devices = 0
    async with hrx.Runtime(backend="sim") as rt:
        assert rt.npu(0).target == "sim-npu"
        assert any("xrt.device(0) does not open" in r for r in rt.fallback_reasons)
    with pytest.raises(BackendUnavailable, match="does not open"):
        async with hrx.Runtime(backend="sim", npu="xrt"):
            pass


async def test_without_pyxrt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HRX_NPU", raising=False)
    monkeypatch.setitem(sys.modules, "pyxrt", None)  # import fails as if not installed
    async with hrx.Runtime(backend="sim") as rt:
        assert rt.npu(0).target == "sim-npu"
        reason = " ".join(rt.fallback_reasons)
        assert "setup.sh" in reason and "not from PyPI" in reason
    with pytest.raises(BackendUnavailable, match=r"setup\.sh"):
        async with hrx.Runtime(backend="sim", npu="xrt"):
            pass
    monkeypatch.setenv("HRX_NPU", "xrt")
    with pytest.raises(BackendUnavailable):
        async with hrx.Runtime(backend="sim"):
            pass
    with pytest.raises(ContractError):
        hrx.Runtime(npu="npu")


async def test_wait_on_the_loop_thread_is_caught(fake: ModuleType, artifacts: dict) -> None:
    device = fake.device(0)
    xclbin = fake.xclbin(str(artifacts["xclbin"]))
    context = fake.hw_context(device, device.register_xclbin(xclbin))
    run = fake.run(fake.kernel(context, "MLIR_AIE"))
    with pytest.raises(AssertionError):
        run.wait()
    assert fake_pyxrt.FAKE.loop_waits
    fake_pyxrt.FAKE.loop_waits.clear()


def test_doctor_lines(fake: ModuleType) -> None:
    lines = xrt_backend.doctor_lines()
    text = "\n".join(line for line, _ in lines)
    assert "pyxrt:" in text and "XRT version" in text and "/dev/accel" in text
    assert any(line.startswith("NPU self-test: RyzenAI-npu1") and ok for line, ok in lines)


def test_doctor_lines_without_pyxrt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyxrt", None)
    lines = xrt_backend.doctor_lines()
    assert lines[0][1] is False and "setup.sh" in lines[0][0]


def test_insts_unit_and_targets() -> None:
    assert xrt_backend.target_of("RyzenAI-npu4") == "npu4"
    assert xrt_backend.target_of("Some FPGA") == "xrt-npu"
