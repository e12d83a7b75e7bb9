"""ModelSession: regions, fills and dispatches recorded under keys, replay, upload,
read_many with one wait, refusal after a failure, and freeze into a ModelDefinition whose
weights every plan and slot shares."""

from __future__ import annotations

from typing import Any

import pytest

import hrx_async as hrx
from hrx_async.models import ModelContext, ModelSession, TensorDesc
from hrx_async.models.region import Dispatch, Fill

pytestmark = pytest.mark.anyio
U8_64 = TensorDesc("u8", (64,))


def _copy(arrays: list[Any], constants: bytes) -> None:
    arrays[1][:] = arrays[0]


def _fail(arrays: list[Any], constants: bytes) -> None:
    raise RuntimeError("the kernel faulted")


def copy_kernel(session: ModelSession, nbytes: int = 64, host: Any = _copy) -> hrx.GpuKernel:
    contract = hrx.KernelContract(
        [hrx.Binding(nbytes, hrx.Access.READ, 1), hrx.Binding(nbytes, hrx.Access.WRITE, 1)]
    )
    return session.load_kernel(hrx.KernelSource(host=host), "copy", (1,), (64,), contract)


async def test_record_replay_upload_and_read_many() -> None:
    """model.rs: record(key, cmds) infers dependencies per byte region; replay, upload,
    read_many (one wait). Replays are not awaited in between: the byte ranges order them."""
    async with hrx.Runtime("sim") as rt:
        s = ModelSession(ModelContext(rt))
        a, b, c = s.allocate(64), s.allocate_shared(64), s.allocate(64)
        k = copy_kernel(s)
        s.record("fill", [Fill(a, 3), Fill(c.slice(0, 8), 9)])
        s.record("copy", [Dispatch(k, [a.read(), b.write()]), Dispatch(k, [b.read(), c.write()])])
        data = bytes(range(64))
        await s.upload(a, data)
        s.replay("copy")
        assert await s.read_many([a, b, c.slice(8, 8)]) == [data, data, data[8:16]]
        s.replay("fill")
        s.replay("copy")
        copied = rt.statistics().copied_bytes
        assert await s.read_many([b, c, a.slice(0, 0)]) == [bytes([3]) * 64, bytes([3]) * 64, b""]
        assert rt.statistics().copied_bytes - copied == 64  # only device c went through staging
        assert s.keys == ("fill", "copy")


async def test_record_rejects_empty_duplicate_empty_fill_foreign_and_weight_writes() -> None:
    """model.rs record errors: empty list, duplicate key, empty fill, foreign region or
    kernel; weights are immutable. A refused record keeps nothing."""
    async with hrx.Runtime("sim") as rt:
        s, other = ModelSession(rt, "s"), ModelSession(rt, "other")
        a, theirs = s.allocate(64), other.allocate(64)
        w = await s.weight(bytes(64))
        k, their_kernel = copy_kernel(s), copy_kernel(other)
        s.record("one", [Fill(a, 1)])
        cases: list[tuple[Any, str]] = [
            ([], "at least one command"),
            ([Fill(a.slice(8, 0), 1)], "empty fill"),
            ([Fill(theirs, 1)], "another session"),
            ([Dispatch(their_kernel, [a.read(), a.slice(0, 64).write()])], "not loaded"),
            ([Dispatch(k, [a.write(), w.read()])], "declares read"),
            ([Dispatch(k, [a.read(), w.write()])], "weight"),
            ([Fill(w, 0)], "weight"),
            ([Fill(a, 256)], "byte"),
        ]
        for commands, message in cases:
            with pytest.raises(hrx.ContractError, match=message):
                s.record("two", commands)
        with pytest.raises(hrx.ContractError, match="already has"):
            s.record("one", [Fill(a, 2)])
        assert s.keys == ("one",)
        with pytest.raises(hrx.ContractError, match="no graph"):
            s.replay("two")
        with pytest.raises(hrx.ContractError, match="past"):
            a.slice(60, 8)
        with pytest.raises(hrx.ContractError, match="holds 64 bytes"):
            await s.upload(a, bytes(63))
        with pytest.raises(hrx.ContractError, match="immutable"):
            await s.upload(w, bytes(64))
        assert await s.read_many([w.slice(0, 4)]) == [bytes(4)]


async def test_session_refuses_everything_after_a_failure() -> None:
    """model.rs: after any native failure the session refuses everything."""
    async with hrx.Runtime("sim") as rt:
        s = ModelSession(rt)
        a, b = s.allocate(64), s.allocate(64)
        bad = copy_kernel(s, host=_fail)
        s.record("bad", [Dispatch(bad, [a.read(), b.write()])])
        done = s.replay("bad")
        with pytest.raises(hrx.HrxError):
            await done
        for attempt in (lambda: s.allocate(8), lambda: s.replay("bad"), lambda: s.record(1, [])):
            with pytest.raises(hrx.ContractError, match="refuses"):
                attempt()


async def test_freeze_adopts_weights_once_for_every_plan_and_slot() -> None:
    """definition.rs freeze(ctx): drain, the device must match, graphs dropped, weights
    adopted and shared by all plans and slots (weight_bytes), only (size, placement) kept
    for the rest; kernels are kept."""
    async with hrx.Runtime("sim") as rt, hrx.Runtime("sim") as elsewhere:
        ctx = ModelContext(rt)
        s = ModelSession(ctx)
        w = await s.weight(bytes([5]) * 64)
        x, y = s.allocate(64), s.allocate_shared(64)
        k = copy_kernel(s)
        s.record("step", [Dispatch(k, [w.read(), x.write()])])
        s.replay("step")  # left running: freeze drains it
        live = rt.statistics().live_bytes
        with pytest.raises(hrx.ContractError, match="device"):
            await s.freeze(ModelContext(elsewhere))
        definition = await s.freeze(ctx)
        assert definition.weight_bytes() == 64
        assert rt.statistics().live_bytes == live - 128  # x and y are sizes now
        with pytest.raises(hrx.ContractError, match="frozen"):
            s.allocate(8)
        before = rt.statistics()
        commands = [Dispatch(k, [w.read(), y.write()])]
        plans = [definition.prepare(commands, [], [(y, U8_64)], n) for n in (2, 3)]
        after = rt.statistics()
        assert after.allocations - before.allocations == 5  # one output each, no weight copy
        assert after.live_bytes - before.live_bytes == 5 * 64
        for plan in plans:
            inference = await plan.submit([])
            assert await inference.download() == [bytes([5]) * 64]
