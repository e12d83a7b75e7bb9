"""Model-based test of ordering, cancellation, failure and poison.

Hypothesis draws whole programs (`tests/stateful_model.py`): a few small buffers of every
placement, a few graphs of fills, copies, GPU kernels, NPU kernels and host functions (plain
and `async def`, some slow, some raising on purpose) over overlapping views, and a list of
steps (submit a graph, reused or prepared afresh, maybe `after=` earlier submissions; cancel
one now or from a background task a moment later; checkpoints, short sleeps, awaits), with a
random `max_submissions`. Each program runs on asyncio and on trio. Host functions and
kernels log their start and end and what they read; after the run settles, `check` replays
the admitted submissions one by one in admission order and fails unless some assignment of
the outcomes the run could not show (which unlogged regions of a cancelled or failed
submission had started) explains the log, every completion's outcome, the final bytes and
every buffer's poison flag. Hangs fail the example: every wait is bounded (generous bounds
that catch hangs, not speed), and the whole run happens in a thread the test gives up on
after a bound.

    pytest tests/runtime/test_stateful.py              # sim (and cuda/hip where usable)
    pytest -m slow tests/runtime/test_stateful.py      # the long run, 2000 examples per loop
    HRX_STATEFUL_EXAMPLES=10000 pytest -m slow tests/runtime/test_stateful.py
    HRX_TEST_BACKENDS=cuda pytest -m cuda tests/runtime/test_stateful.py            # an NVIDIA GPU
    HRX_TEST_BACKENDS=cuda pytest -m "slow and cuda" tests/runtime/test_stateful.py # its long run

HRX_STATEFUL_QUICK_EXAMPLES sets the examples of the short run (60 per loop);
HRX_STATEFUL_SETTLE_S the bound on every wait (10 s; a lower one shrinks hangs faster).
On a GPU backend the GPU kernels are CUDA C++ (they cannot log, so their ordering shows in
the bytes) and failures go through host functions and the sim NPU only.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
import traceback
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import hrx_async as hrx
from tests.stateful_model import (
    BUFFER_NAMES,
    KERNEL_CXX,
    Await,
    Cancel,
    CancelLater,
    Checkpoint,
    InjectedFailure,
    Node,
    Observation,
    Program,
    RunLog,
    Sleep,
    SubmissionRecord,
    Submit,
    V,
    check,
    cut_regions,
    fill_value,
    host_apply,
    kernel_apply,
    opid_of,
    placement,
    programs,
)

SETTLE_S = float(os.environ.get("HRX_STATEFUL_SETTLE_S", "10"))
"""Bound for every wait on the runtime: it catches hangs, it does not measure speed."""
RUN_S = 3 * SETTLE_S
"""Bound for a whole program, leaving the runtime included."""
GRACE_S = 1.0
"""After a hang was seen: how long leaving the runtime may still take before the test stops
waiting for it (a runtime that hung usually cannot drain either)."""
EXAMPLES = int(os.environ.get("HRX_STATEFUL_QUICK_EXAMPLES", "60"))
LONG_EXAMPLES = int(os.environ.get("HRX_STATEFUL_EXAMPLES", "2000"))
SLOW_OP_S = 0.002


class _Stop(Exception):
    """The program stops early; the reason is in `Observation.problems`."""


# -- operations as the runtime runs them ------------------------------------------------------


def _kernel_fn(node: Node, opid: int, log: RunLog) -> Any:
    n = node.src.nbytes if node.src is not None else 0

    def kernel(arrays: list[np.ndarray], constants: bytes) -> None:
        src, dst = arrays
        reads = (bytes(src),) + ((bytes(dst),) if node.rw else ())
        log.record("start", opid, reads)
        if node.kind == "gpu":
            assert np.frombuffer(constants, "<u4").tolist() == [n, opid, int(node.rw)]
        if node.slow:
            time.sleep(SLOW_OP_S)
        if node.fail:
            dst[: max(1, dst.size // 2)] = 0xEE  # what a failed kernel leaves is undefined
            log.record("end", opid, "failed")
            raise InjectedFailure(opid)
        kernel_apply(opid, node.rw, np.frombuffer(reads[0], np.uint8), dst)
        log.record("end", opid, "ok")

    return kernel


def _host_fn(node: Node, opid: int, log: RunLog) -> Any:
    nreads = len(node.reads)
    rws = [rw for _, rw in node.writes]

    def begin(arrays: tuple[np.ndarray, ...]) -> tuple[bytes, ...]:
        reads = tuple(bytes(a) for a in arrays[:nreads]) + tuple(
            bytes(a) for a, rw in zip(arrays[nreads:], rws, strict=True) if rw
        )
        log.record("start", opid, reads)
        return reads

    def end(arrays: tuple[np.ndarray, ...], reads: tuple[bytes, ...]) -> None:
        writes = arrays[nreads:]
        if node.fail:
            writes[0][:] = 0xEE
            log.record("end", opid, "failed")
            raise InjectedFailure(opid)
        host_apply(opid, reads, list(zip(writes, rws, strict=True)))
        log.record("end", opid, "ok")

    if node.is_async:

        async def async_host(*arrays: np.ndarray) -> None:
            reads = begin(arrays)
            if node.slow:
                await anyio.sleep(SLOW_OP_S)
            else:
                await anyio.lowlevel.checkpoint()
            end(arrays, reads)

        return async_host

    def host(*arrays: np.ndarray) -> None:
        reads = begin(arrays)
        if node.slow:
            time.sleep(SLOW_OP_S)
        end(arrays, reads)

    return host


class _Builder:
    """Records and prepares the program's graphs on one runtime."""

    def __init__(
        self,
        rt: hrx.Runtime,
        buffers: dict[str, hrx.Buffer],
        program: Program,
        obs: Observation,
    ) -> None:
        self.rt = rt
        self.buffers = buffers
        self.program = program
        self.obs = obs
        self.kernels: dict[int, Any] = {}
        self.prepared: dict[int, hrx.PreparedGraph] = {}

    def view(self, v: V | None) -> hrx.View:
        assert v is not None
        return self.buffers[v.buf].view(v.offset, v.nbytes)

    def kernel(self, node: Node, opid: int) -> Any:
        if opid in self.kernels:
            return self.kernels[opid]
        assert node.src is not None
        n = node.src.nbytes
        dst_access = hrx.Access.READ_WRITE if node.rw else hrx.Access.WRITE
        bindings = [hrx.Binding(n, hrx.Access.READ, 1), hrx.Binding(n, dst_access, 1)]
        fn = _kernel_fn(node, opid, self.obs.log)
        if node.kind == "gpu":
            kernel: Any = self.rt.load_gpu_kernel(
                hrx.KernelSource(cxx=KERNEL_CXX, host=fn),
                "stateful_mix",
                grid=((n + 31) // 32,),
                block=(32,),
                contract=hrx.KernelContract(
                    bindings, hrx.Constants().u32(n).u32(opid).u32(int(node.rw))
                ),
            )
        else:
            kernel = self.rt.npu(0).load_artifact(
                hrx.KernelSource(host=fn), f"op{opid}", 1, hrx.KernelContract(bindings)
            )
        self.kernels[opid] = kernel
        return kernel

    def get(self, index: int, fresh: bool) -> hrx.PreparedGraph:
        if not fresh and index in self.prepared:
            return self.prepared[index]
        nodes = self.program.graphs[index]
        graph = self.rt.graph(f"g{index}")
        for n, node in enumerate(nodes):
            opid = opid_of(index, n)
            if node.kind == "fill":
                graph.fill(self.view(node.dst), fill_value(opid))
            elif node.kind == "copy":
                graph.copy(self.view(node.dst), self.view(node.src))
            elif node.kind == "gpu":
                graph.gpu(self.kernel(node, opid), [self.view(node.src), self.view(node.dst)])
            elif node.kind == "npu":
                graph.npu(self.kernel(node, opid), [self.view(node.src), self.view(node.dst)])
            else:
                accesses = [(self.view(v), hrx.Access.READ) for v in node.reads] + [
                    (self.view(v), hrx.Access.READ_WRITE if rw else hrx.Access.WRITE)
                    for v, rw in node.writes
                ]
                graph.host(_host_fn(node, opid, self.obs.log), accesses)
        prepared = graph.prepare()
        regions = [tuple(region.nodes) for region in prepared.regions]
        model = cut_regions(nodes, self.program.gpus)
        if regions != model:
            # The model's regions must be the runtime's, or every check below is off.
            self.obs.problems.append(
                f"graph {index}: the runtime cut regions {regions}, the model {model}"
            )
            raise _Stop
        if not fresh:
            self.prepared[index] = prepared
        return prepared


def raw_bytes(rt: hrx.Runtime, buffer: hrx.Buffer) -> bytes:
    """A buffer's bytes as they are, poisoned or not (the public reads refuse poisoned
    buffers). Only after everything settled."""
    backend: Any = rt._backend
    if buffer.placement.host_mappable or backend.name == "sim":
        return bytes(backend.host_array(buffer.storage, 0, buffer.nbytes))
    if hasattr(backend, "devices"):  # several GPUs: read through the device that owns it
        owners = [device.device for device in backend.devices]
        backend = backend.enter(owners.index(buffer.storage.device))
    out = np.zeros(buffer.nbytes, np.uint8)
    stream = backend._setup()
    backend.table.memcpy_async(
        out.ctypes.data, buffer.storage.device_pointer, buffer.nbytes, stream
    )
    backend.table.stream_synchronize(stream)
    return out.tobytes()


async def execute(program: Program, backend: str, obs: Observation) -> None:
    program = program.for_backend(backend)
    async with hrx.Runtime(
        backend=backend,
        max_submissions=program.max_submissions,
        label="stateful",
        devices=range(program.gpus),
    ) as rt:
        obs.stage = "setup"
        size = program.size
        buffers = {
            name: rt.allocate(size[name], placement(name, program.gpus), label=name)
            for name in BUFFER_NAMES
        }
        rng = random.Random(program.seed)
        for name, buffer in buffers.items():
            data = rng.randbytes(buffer.nbytes)
            obs.initial[name] = data
            if buffer.placement.host_mappable:
                async with buffer.map_write() as memory:
                    memory[:] = data
            else:
                staging = rt.allocate(buffer.nbytes, hrx.HOST_VISIBLE)
                async with staging.map_write() as memory:
                    memory[:] = data
                upload = rt.graph("initial-upload")
                upload.copy(buffer.view(), staging.view())
                with anyio.fail_after(SETTLE_S):
                    await upload.prepare().submit()
                staging.free()

        builder = _Builder(rt, buffers, program, obs)
        completions: dict[int, hrx.Completion] = {}
        admitted = obs.admitted

        def pick(target: int) -> int | None:
            return admitted[-1 - target % len(admitted)] if admitted else None

        def cancel(call: int) -> None:
            if completions[call].cancel():
                obs.records[call].cancel_called = True

        async def cancel_later(call: int, delay_ms: int) -> None:
            if delay_ms:
                await anyio.sleep(delay_ms / 1000)
            else:
                await anyio.lowlevel.checkpoint()
            cancel(call)

        obs.stage = "program"
        async with anyio.create_task_group() as tasks:
            for step in program.steps:
                if isinstance(step, Submit):
                    prepared = builder.get(step.graph, step.fresh)
                    after = sorted({c for t in step.after if (c := pick(t)) is not None})
                    record = SubmissionRecord(step.graph, tuple(after))
                    obs.records.append(record)
                    try:
                        completion = prepared.submit(after=[completions[a] for a in after])
                    except Exception as exc:  # checked by the model: PoisonedError may be legal
                        record.raised = exc
                        continue
                    completions[len(obs.records) - 1] = completion
                    admitted.append(len(obs.records) - 1)
                    continue
                if isinstance(step, Checkpoint):
                    for _ in range(step.count):
                        await anyio.lowlevel.checkpoint()
                    continue
                if isinstance(step, Sleep):
                    await anyio.sleep(step.ms / 1000)
                    continue
                target = pick(step.target)
                if target is None:
                    continue  # nothing submitted yet
                if isinstance(step, Cancel):
                    cancel(target)
                elif isinstance(step, CancelLater):
                    tasks.start_soon(cancel_later, target, step.delay_ms)
                else:
                    assert isinstance(step, Await)
                    with anyio.move_on_after(SETTLE_S) as scope:
                        # Its outcome is checked once everything settled.
                        with contextlib.suppress(Exception):
                            await completions[target]
                    if scope.cancelled_caught:
                        obs.problems.append(
                            f"awaiting call {target} did not settle within {SETTLE_S} s"
                        )
                        raise _Stop

        obs.stage = "settle"
        with anyio.move_on_after(SETTLE_S):
            for call in admitted:
                await completions[call].wait_done()
        unsettled = [call for call in admitted if not completions[call].done()]
        if unsettled:
            obs.problems.append(f"calls {unsettled} did not settle within {SETTLE_S} s")
            raise _Stop
        for call in admitted:
            record = obs.records[call]
            record.error = completions[call].exception()
            record.settled = True
        obs.final = {name: raw_bytes(rt, buffer) for name, buffer in buffers.items()}
        obs.poison = {name: buffer.poison for name, buffer in buffers.items()}
        obs.stage = "leaving the runtime"
    obs.closed = True


def run_program(program: Program, backend: str, loop: str) -> Observation:
    """Run `program` in a thread of its own, so that a hang fails the example instead of
    the whole test session."""
    obs = Observation()
    ended = threading.Event()

    def main() -> None:
        try:
            anyio.run(execute, program, backend, obs, backend=loop)
        except _Stop:
            pass
        except BaseException as exc:
            obs.problems.append(
                f"the run raised during {obs.stage}: "
                + "".join(traceback.format_exception(exc)).strip()
            )
        finally:
            ended.set()

    thread = threading.Thread(target=main, name="stateful-program", daemon=True)
    thread.start()
    deadline = time.monotonic() + RUN_S
    while not ended.wait(0.05):
        if obs.problems:  # a hang: give leaving the runtime a moment, not the whole bound
            deadline = min(deadline, time.monotonic() + GRACE_S)
        if time.monotonic() > deadline:
            obs.problems.append(
                f"the run did not end (stuck during {obs.stage}); leaving "
                "`async with Runtime()` must drain and close"
            )
            break
    if ended.is_set() and not obs.closed and not obs.problems:
        obs.problems.append(f"the run stopped during {obs.stage} without an error")
    return obs


def run_and_check(program: Program, backend: str, loop: str) -> None:
    obs = run_program(program, backend, loop)
    check(program, obs, backend)


_HEALTH = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
# Hypothesis stops shrinking a failure after five minutes; the timeouts leave it that time, so a
# failure (above all a hang, which costs SETTLE_S per try) is reported instead of cut off.
_SHRINK_S = 360


@pytest.mark.timeout(120 + _SHRINK_S)
@pytest.mark.parametrize("loop", ["asyncio", "trio"])
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=_HEALTH)
@given(program=programs())
def test_runs_match_sequential_model(hrx_backend: str, loop: str, program: Program) -> None:
    run_and_check(program, hrx_backend, loop)


@pytest.fixture
def long_run(request: pytest.FixtureRequest) -> None:
    selected = "slow" in (request.config.getoption("markexpr") or "")
    if not selected and "HRX_STATEFUL_EXAMPLES" not in os.environ:
        pytest.skip("the long run: select it with -m slow or set HRX_STATEFUL_EXAMPLES")


@pytest.mark.slow
@pytest.mark.timeout(int(LONG_EXAMPLES * 0.5) + 600 + _SHRINK_S)
@pytest.mark.parametrize("loop", ["asyncio", "trio"])
@settings(max_examples=LONG_EXAMPLES, deadline=None, suppress_health_check=_HEALTH)
@given(program=programs(max_steps=32))
def test_runs_match_sequential_model_long(
    long_run: None, hrx_backend: str, loop: str, program: Program
) -> None:
    run_and_check(program, hrx_backend, loop)
