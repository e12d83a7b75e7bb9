"""The stream backend's logic (lanes, fences, graphs, argument packing) on any machine.

`_stream.StreamBackend` is written against a driver table; here it drives a
host-memory driver whose streams are worker threads, so the runtime's ordering,
fence and capture logic runs on CI without a GPU. The CUDA table itself is
tested on hardware in test_cuda_backend.py.
"""

from __future__ import annotations

import ctypes
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import numpy as np
import pytest

import hrx_async as hrx
import hrx_async._runtime.session as runtime_module
from hrx_async._runtime.completion import YIELD_EVERY
from hrx_async._runtime.watch import SWEEP_LIMIT
from hrx_async.backends._stream import StreamBackend
from hrx_async.backends._stream_calls import ReplayCalls
from hrx_async.backends._stream_driver import make_error
from hrx_async.backends.kernel_cache import KernelCache
from hrx_async.errors import BackendError, ContractError

pytestmark = pytest.mark.anyio

Op = Callable[[], None]


class FakeStream:
    """An in-order queue run by a thread, like a device stream."""

    def __init__(self, table: HostTable) -> None:
        self.table = table
        self.items: queue.SimpleQueue[Op | None] = queue.SimpleQueue()
        self.capture: list[Op] | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def put(self, op: Op) -> None:
        if self.capture is not None:
            self.capture.append(op)
        else:
            self.items.put(op)

    def _run(self) -> None:
        while True:
            op = self.items.get()
            if op is None:
                return
            self.table.running.wait()
            if self.table.delay:
                time.sleep(self.table.delay)
            try:
                op()
            except BaseException as exc:
                self.table.fault = exc


class FakeEvent:
    def __init__(self) -> None:
        self.recorded = 0
        self.completed = 0
        self.condition = threading.Condition()

    def complete(self, generation: int) -> None:
        with self.condition:
            self.completed = max(self.completed, generation)
            self.condition.notify_all()

    def wait(self, generation: int) -> None:
        with self.condition:
            self.condition.wait_for(lambda: self.completed >= generation)


FAKE_NOT_READY = "fakeErrorNotReady"


def _status(call: Callable[..., Any], *args: Any) -> tuple[Any]:
    """What a binding returns for `call(*args)` of the table: its status first (0 when it
    succeeded; a query that answers False is not ready; a failure its error's code)."""
    try:
        answer = call(*args)
    except BackendError as exc:
        return (exc.code,)
    return (FAKE_NOT_READY,) if answer is False else (0,)


class HostTable:
    """A driver table over host memory; kernels are Python functions of raw argument bytes."""

    name = "fake"
    dlpack_device_type = 1

    def __init__(self) -> None:
        self.memory: dict[int, np.ndarray[Any, Any]] = {}
        self.streams: dict[int, FakeStream] = {}
        self.kernels: dict[str, tuple[list[int], Callable[[list[bytes]], None]]] = {}
        self.fault: BaseException | None = None
        self.delay = 0.0
        self.running = threading.Event()
        """Cleared, the device runs nothing until it is set again."""
        self.running.set()
        self.calls: dict[str, int] = {}
        # The per-replay calls as bindings make them: a status first. They call this
        # table's methods by name at every call, so a test can replace one.
        self.replay_calls = ReplayCalls(
            self.error,
            "fake",
            lambda graph_exec, stream: _status(self.graph_launch, graph_exec, stream),
            lambda dst, src, nbytes, kind, stream: _status(
                self.memcpy_async, dst, src, nbytes, stream
            ),
            "fakeMemcpyDefault",
            lambda event, stream: _status(self.event_record, event, stream),
            lambda stream, event, flags: _status(self.stream_wait_event, stream, event),
            lambda event: _status(self.event_query, event),
            FAKE_NOT_READY,
        )

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def error(self, operation: str, status: Any) -> BackendError:
        return make_error(
            "fake", operation, status, "boom", frozenset({"fakeErrorIllegalAddress"})
        )

    def _check_fault(self, operation: str) -> None:
        if self.fault is not None:
            raise self.error(operation, "fakeErrorIllegalAddress")

    def set_device(self, device: int) -> None:
        pass

    def describe(self, device: int) -> dict[str, Any]:
        return {"name": "host"}

    def malloc(self, nbytes: int) -> int:
        self._count("malloc")
        array = np.full(nbytes, 0xAB, dtype=np.uint8)  # not zeroed: the backend must zero it
        self.memory[array.ctypes.data] = array
        return int(array.ctypes.data)

    def free(self, pointer: int) -> None:
        if pointer:
            self.memory.pop(pointer)

    host_alloc = malloc
    host_free = free

    def host_device_pointer(self, pointer: int) -> int:
        return pointer

    def pointer_kind(self, pointer: int) -> tuple[str, int]:
        return ("host", 0)

    def memset_async(self, pointer: int, value: int, nbytes: int, stream: FakeStream) -> None:
        stream.put(lambda: ctypes.memset(pointer, value, nbytes))

    def memcpy_async(self, dst: int, src: int, nbytes: int, stream: FakeStream) -> None:
        self._count("memcpy")
        stream.put(lambda: ctypes.memmove(dst, src, nbytes))

    def stream_create(self) -> FakeStream:
        stream = FakeStream(self)
        self.streams[id(stream)] = stream
        return stream

    def _stream(self, stream: Any) -> FakeStream:
        return self.streams[stream] if isinstance(stream, int) else stream

    def stream_destroy(self, stream: Any) -> None:
        self._stream(stream).items.put(None)

    def stream_synchronize(self, stream: Any) -> None:
        done = threading.Event()
        self._stream(stream).put(done.set)
        done.wait()

    def stream_handle(self, stream: Any) -> int:
        return id(stream)

    def event_create(self, blocking: bool) -> FakeEvent:
        self._count("event_create")
        return FakeEvent()

    def event_destroy(self, event: FakeEvent) -> None:
        pass

    def event_record(self, event: FakeEvent, stream: Any) -> None:
        event.recorded += 1
        generation = event.recorded
        self._stream(stream).put(lambda: event.complete(generation))

    def event_query(self, event: FakeEvent) -> bool:
        self._check_fault("eventQuery")
        return event.completed >= event.recorded

    def event_synchronize(self, event: FakeEvent) -> None:
        event.wait(event.recorded)
        self._check_fault("eventSynchronize")

    def stream_wait_event(self, stream: Any, event: FakeEvent) -> None:
        self._count("stream_wait_event")
        generation = event.recorded
        self._stream(stream).put(lambda: event.wait(generation))

    def begin_capture(self, stream: FakeStream) -> None:
        stream.capture = []

    def end_capture(self, stream: FakeStream) -> list[Op]:
        captured, stream.capture = stream.capture, None
        assert captured is not None
        return captured

    def abort_capture(self, stream: FakeStream) -> None:
        stream.capture = None

    def graph_instantiate(self, graph: list[Op]) -> tuple[Op, ...]:
        return tuple(graph)

    def graph_launch(self, graph_exec: tuple[Op, ...], stream: FakeStream) -> None:
        self._count("graph_launch")
        self._check_fault("graphLaunch")
        for op in graph_exec:
            stream.put(op)

    def graph_destroy(self, graph: Any) -> None:
        pass

    def graph_exec_destroy(self, graph_exec: Any) -> None:
        pass

    def module_load(self, image: bytes) -> bytes:
        return image

    def module_unload(self, module: Any) -> None:
        pass

    def module_function(self, module: bytes, name: str) -> str:
        if name not in self.kernels or module != name.encode():
            raise ContractError(f"kernel {name!r} is not in the loaded code")
        return name

    def function_param_sizes(self, function: str) -> list[int]:
        return self.kernels[function][0]

    def function_max_threads(self, function: str) -> int:
        return 1024

    def function_set_dynamic_shared(self, function: Any, nbytes: int) -> None:
        pass

    def launch(
        self,
        function: str,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_bytes: int,
        stream: FakeStream,
        params_address: int,
    ) -> None:
        sizes, body = self.kernels[function]
        pointers = (ctypes.c_uint64 * len(sizes)).from_address(params_address)
        # Like a driver, the argument bytes are copied at launch (capture) time.
        values = [ctypes.string_at(pointers[i], size) for i, size in enumerate(sizes)]
        stream.put(lambda: body(values))

    def compile_options(self, target: str, defines: dict[str, str]) -> list[str]:
        return [f"--target={target}", *(f"-D{k}={v}" for k, v in sorted(defines.items()))]

    def compiler_version(self) -> str:
        return "fake-1"

    def compile(self, source: str, name: str, options: list[str]) -> bytes:
        self._count("compile")
        return name.encode()


def _affine(values: list[bytes]) -> None:
    """y = x * a + b over n int32 (pointers x, y; scalars n: u32, a: i32, b: i64)."""
    x, y = (int.from_bytes(v, "little") for v in values[:2])
    n = int.from_bytes(values[2], "little")
    a = int.from_bytes(values[3], "little", signed=True)
    b = int.from_bytes(values[4], "little", signed=True)
    src = np.ctypeslib.as_array((ctypes.c_int32 * n).from_address(x))
    dst = np.ctypeslib.as_array((ctypes.c_int32 * n).from_address(y))
    dst[:] = src * a + b


@pytest.fixture
def host_table(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> HostTable:
    table = HostTable()
    table.kernels["affine"] = ([8, 8, 4, 4, 8], _affine)

    def open_fake(name: str, devices: Sequence[int] = (0,)) -> tuple[StreamBackend, list[str]]:
        return StreamBackend(table, devices[0], "fake_1", cache=KernelCache(tmp_path)), []

    monkeypatch.setattr(runtime_module, "open_gpu_backend", open_fake)
    return table


def _affine_kernel(rt: hrx.Runtime, n: int, a: int = 3, b: int = 7) -> hrx.GpuKernel:
    contract = hrx.KernelContract(
        [hrx.Binding(n * 4, hrx.Access.READ), hrx.Binding(n * 4, hrx.Access.WRITE)],
        hrx.Constants().u32(n).i32(a).i64(b),
    )
    return rt.load_gpu_kernel(hrx.KernelSource(cxx="// fake"), "affine", (1,), (64,), contract)


async def test_pipeline_runs_in_native_graphs_with_packed_arguments(host_table: HostTable) -> None:
    n = 1024
    async with hrx.Runtime(backend="cuda") as rt:  # the fake table
        host = rt.allocate(n * 4, hrx.HOST_VISIBLE)
        x = rt.allocate(n * 4, hrx.GPU_LOCAL)
        y = rt.allocate(n * 4, hrx.GPU_LOCAL)
        async with host.map_read() as memory:  # zeroed although the driver's memory is not
            assert bytes(memory) == bytes(n * 4)
        kernel = _affine_kernel(rt, n)
        graph = rt.graph("step")
        graph.copy(x.view(), host.view())
        graph.gpu(kernel, [x.view(), y.view()])
        graph.copy(host.view(), y.view())
        step = graph.prepare()
        stats = rt.statistics()
        assert stats.native_graphs_prepared == 1
        for round_ in range(5):
            async with host.map_write() as memory:
                np.frombuffer(memory, np.int32)[:] = np.arange(n) + round_
            completions = [step.submit() for _ in range(3)]
            for completion in completions:
                await completion
            async with host.map_read() as memory:
                expected = np.arange(n) + round_
                for _ in range(3):
                    expected = expected * 3 + 7
                np.testing.assert_array_equal(np.frombuffer(memory, np.int32), expected)
        assert rt.statistics().copy_streams_created == 2
        # An event returns to the pool once its waiter thread has passed it. With the loop's
        # poll off, waiters finish every fence, so the pool keeps up with the replays.
        rt._backend_or_raise().poll_budget_us = 0.0
        await step.submit()
        events = host_table.calls["event_create"]
        launches = host_table.calls["graph_launch"]
        for _ in range(20):
            await step.submit()
        assert host_table.calls["event_create"] - events <= 1  # pooled, not one per replay
        assert host_table.calls["graph_launch"] == launches + 20
        assert host_table.calls["compile"] == 1


async def test_kernel_load_uses_the_cache_and_checks_metadata(host_table: HostTable) -> None:
    async with hrx.Runtime(backend="cuda") as rt:  # the fake table
        _affine_kernel(rt, 16)
        _affine_kernel(rt, 16, a=5)  # same source and options: cached code
        assert host_table.calls["compile"] == 1
        wrong = hrx.KernelContract(
            [hrx.Binding(64, hrx.Access.READ), hrx.Binding(64, hrx.Access.WRITE)],
            hrx.Constants().u32(16).i32(1),
        )
        with pytest.raises(hrx.ContractError, match="metadata and contract disagree"):
            rt.load_gpu_kernel(hrx.KernelSource(cxx="// fake"), "affine", (1,), (64,), wrong)
        with pytest.raises(hrx.ContractError, match="at most 1024"):
            _ = rt.load_gpu_kernel(hrx.KernelSource(cxx="// fake"), "affine", (1,), (2048,), wrong)


async def test_device_side_waits_order_lanes_without_the_host(host_table: HostTable) -> None:
    host_table.delay = 0.002  # every device operation is slow
    n = 4096
    async with hrx.Runtime(backend="cuda") as rt:  # the fake table
        device = rt.allocate(n, hrx.GPU_LOCAL)
        outs = [rt.allocate(n, hrx.HOST_VISIBLE) for _ in range(5)]
        graphs = []
        for value, out in enumerate(outs, start=1):
            graph = rt.graph(f"v{value}")
            for quarter in range(4):  # a compute region slower than the download after it
                graph.fill(device.view(quarter * n // 4, n // 4), value)
            graph.copy(out.view(), device.view())
            graphs.append(graph.prepare())
        completions = [g.submit() for g in graphs]
        for completion in completions:
            await completion
        for value, out in enumerate(outs, start=1):
            async with out.map_read() as memory:
                assert bytes(memory) == bytes([value]) * n


async def test_work_launched_before_its_bookkeeping_still_orders_later_work(
    host_table: HostTable,
) -> None:
    # A lone region on an idle stream whose bytes nothing else uses is launched before
    # its submission is recorded; the record must still follow, or the copy below would
    # not wait for the fill.
    n = 4096
    async with hrx.Runtime(backend="cuda") as rt:  # the fake table
        device = rt.allocate(n, hrx.GPU_LOCAL)
        out = rt.allocate(n, hrx.HOST_VISIBLE)
        fills = []
        for value in (1, 2):
            graph = rt.graph(f"fill{value}")
            graph.fill(device.view(), value)
            fills.append(graph.prepare())
        copy = rt.graph("copy")
        copy.copy(out.view(), device.view())
        download = copy.prepare()
        for prepared in (*fills, download):  # every lane exists and is idle
            await prepared.submit()
        both = []
        for value in (3, 4):  # the first region launches early, the second depends on it
            graph = rt.graph(f"fill{value}-copy")
            graph.fill(device.view(), value)
            graph.copy(out.view(), device.view())
            both.append(graph.prepare())
        host_table.delay = 0.003  # the fill is slower than the copy after it
        for round_ in range(4):
            value = 1 + round_ % 2
            fills[value - 1].submit()
            await download.submit()
            async with out.map_read() as memory:
                assert bytes(memory) == bytes([value]) * n
            await both[round_ % 2].submit()
            async with out.map_read() as memory:
                assert bytes(memory) == bytes([3 + round_ % 2]) * n


async def test_a_launch_that_fails_before_its_bookkeeping_fails_only_its_submission(
    host_table: HostTable,
) -> None:
    async with hrx.Runtime(backend="cuda") as rt:  # the fake table
        target = rt.allocate(64, hrx.GPU_LOCAL)
        out = rt.allocate(64, hrx.HOST_VISIBLE)
        fill = rt.graph("fill")
        fill.fill(target.view(), 5)
        prepared = fill.prepare()
        read = rt.graph("read")
        read.copy(out.view(), target.view())
        reader = read.prepare()
        await prepared.submit()
        launch = host_table.graph_launch

        def failing_launch(graph_exec: tuple[Op, ...], stream: FakeStream) -> None:
            host_table.graph_launch = launch  # type: ignore[method-assign]
            raise make_error(
                "fake", "graphLaunch", "fakeErrorLaunchOutOfResources", "", frozenset()
            )

        host_table.graph_launch = failing_launch  # type: ignore[method-assign]
        with pytest.raises(hrx.ExecutionError) as caught:
            await prepared.submit()
        assert "fakeErrorLaunchOutOfResources" in str(caught.value.__cause__)
        assert rt.healthy
        with pytest.raises(hrx.PoisonedError):
            reader.submit()  # what the failed fill wrote is undefined
        await prepared.submit()  # a full overwrite makes it defined again
        await reader.submit()
        async with out.map_read() as memory:
            assert bytes(memory) == bytes([5]) * 64


async def test_cancelled_and_refused_regions_get_finished_fences(host_table: HostTable) -> None:
    host_table.delay = 0.01
    async with hrx.Runtime(backend="cuda") as rt:  # the fake table
        a = rt.allocate(64, hrx.GPU_LOCAL)
        graph = rt.graph("fills")
        graph.fill(a.view(), 1)
        graph.copy(rt.allocate(64, hrx.HOST_VISIBLE).view(), a.view())
        prepared = graph.prepare()
        first = prepared.submit()
        # after= keeps it queued on the host until `first` finishes, so it can be cancelled
        # (a replay that only follows `first` on this device is issued at once).
        second = prepared.submit(after=[first])
        second.cancel()
        await first
        with pytest.raises(hrx.Cancelled):
            await second


async def test_a_replay_behind_one_on_the_same_device_is_issued_at_submit(
    host_table: HostTable,
) -> None:
    """What a replay waits for is all on its device, so it goes to the streams at once,
    behind device-side waits, instead of waiting on its lanes: too late to skip."""
    host_table.delay = 0.01
    async with hrx.Runtime(backend="cuda") as rt:  # the fake table
        a = rt.allocate(64, hrx.GPU_LOCAL)
        out = rt.allocate(64, hrx.HOST_VISIBLE)
        prepared = []
        for value in (7, 9):
            graph = rt.graph(f"fill-{value}-read")
            graph.fill(a.view(), value)
            graph.copy(out.view(), a.view())
            prepared.append(graph.prepare())
        first = prepared[0].submit()
        second = prepared[1].submit()
        second.cancel()
        await first
        await second  # nothing was left to skip
        async with out.map_read() as memory:
            assert bytes(memory) == bytes([9]) * 64


async def test_a_stream_waits_once_per_other_stream_and_never_for_itself(
    host_table: HostTable,
) -> None:
    """Streams run in issue order: of what a region follows, only the latest fence of each
    other stream costs a device-side wait."""
    host_table.delay = 0.01
    async with hrx.Runtime(backend="cuda") as rt:  # the fake table
        a = rt.allocate(64, hrx.GPU_LOCAL)
        out = rt.allocate(64, hrx.HOST_VISIBLE)
        graph = rt.graph("fill-read")
        graph.fill(a.view(), 7)
        graph.copy(out.view(), a.view())
        prepared = graph.prepare()
        first = prepared.submit()
        waits = host_table.calls.get("stream_wait_event", 0)
        second = prepared.submit()
        # Its fill follows the first fill (same stream: no wait) and the first copy (one
        # wait); its copy follows the first copy (same stream) and its own fill (one wait).
        assert host_table.calls.get("stream_wait_event", 0) - waits == 2
        await first
        await second
        async with out.map_read() as memory:
            assert bytes(memory) == bytes([7]) * 64


async def test_external_work_enqueues_on_the_lane_stream_through_dlpack_tensors(
    host_table: HostTable,
) -> None:
    """`Graph.external` on a stream backend: the function gets the compute lane's raw stream
    handle and one DLPack tensor per access, and what it enqueues there is ordered between
    the upload before it and the download after it, replay after replay."""
    host_table.delay = 0.002
    async with hrx.Runtime(backend="cuda") as rt:  # the fake table
        host_in = rt.allocate(64, hrx.HOST_VISIBLE)
        host_out = rt.allocate(64, hrx.HOST_VISIBLE)
        x = rt.allocate(64, hrx.GPU_LOCAL)
        y = rt.allocate(64, hrx.GPU_LOCAL)
        seen: list[Any] = []

        def triple(stream: int, tensors: list[Any]) -> None:
            source, target = tensors
            seen.append((stream in host_table.streams, source.readonly, target.readonly))
            src, dst = np.from_dlpack(source), np.from_dlpack(target)
            host_table.streams[stream].put(lambda: np.multiply(src, 3, out=dst))

        graph = rt.graph("upload-external-download")
        graph.copy(x.view(), host_in.view())
        graph.external(triple, [(x.view(), hrx.Access.READ), (y.view(), hrx.Access.WRITE)])
        graph.copy(host_out.view(), y.view())
        prepared = graph.prepare()
        for value in (2, 7):
            async with host_in.map_write() as memory:
                memory[:] = bytes([value]) * 64
            await prepared.submit()
            async with host_out.map_read() as memory:
                assert bytes(memory) == bytes([value * 3]) * 64
        assert seen == [(True, True, False)] * 2
        tensor = prepared.programs[1].tensors[1]
        assert tensor.__dlpack_device__() == (1, 0) and tensor.nbytes == 64


async def test_failing_external_work_on_a_stream_fails_its_region(host_table: HostTable) -> None:
    async with hrx.Runtime(backend="cuda") as rt:  # the fake table
        y = rt.allocate(64, hrx.GPU_LOCAL)

        def broken(stream: int, tensors: list[Any]) -> None:
            raise RuntimeError("the library failed")

        graph = rt.graph("broken-external")
        graph.external(broken, [(y.view(), hrx.Access.WRITE)])
        with pytest.raises(hrx.ExecutionError, match="broken-external"):
            await graph.prepare().submit()
        assert y.poison is not None
        assert rt.healthy


async def test_an_external_prepare_hook_builds_the_work_once_on_the_lane_stream(
    host_table: HostTable,
) -> None:
    """`Graph.external(..., prepare=hook)`: the hook is called once per `prepare()`, with the
    lane stream every replay is launched on and the tensors replays get; each replay calls
    what it returned, never `fn`; another `prepare()` calls the hook again."""
    async with hrx.Runtime(backend="cuda") as rt:  # the fake table
        host_in = rt.allocate(64, hrx.HOST_VISIBLE)
        host_out = rt.allocate(64, hrx.HOST_VISIBLE)
        x = rt.allocate(64, hrx.GPU_LOCAL)
        y = rt.allocate(64, hrx.GPU_LOCAL)
        hooked: list[tuple[int, list[Any]]] = []
        replays: list[tuple[int, list[Any]]] = []

        def never(stream: int, tensors: list[Any]) -> None:
            raise AssertionError("a stream backend replays what the hook returned")

        def hook(stream: int, tensors: list[Any]) -> Callable[[int, list[Any]], None]:
            hooked.append((stream, tensors))
            src, dst = np.from_dlpack(tensors[0]), np.from_dlpack(tensors[1])

            def work(stream_now: int, tensors_now: list[Any]) -> None:
                replays.append((stream_now, tensors_now))
                host_table.streams[stream_now].put(lambda: np.add(src, 5, out=dst))

            return work

        graph = rt.graph("hooked")
        graph.copy(x.view(), host_in.view())
        accesses = [(x.view(), hrx.Access.READ), (y.view(), hrx.Access.WRITE)]
        graph.external(never, accesses, prepare=hook)
        graph.copy(host_out.view(), y.view())
        prepared = graph.prepare()
        assert len(hooked) == 1 and hooked[0][0] in host_table.streams
        for value in (1, 9):
            async with host_in.map_write() as memory:
                memory[:] = bytes([value]) * 64
            await prepared.submit()
            async with host_out.map_read() as memory:
                assert bytes(memory) == bytes([value + 5]) * 64
        assert [stream for stream, _ in replays] == [hooked[0][0]] * 2
        assert all(tensors is hooked[0][1] for _, tensors in replays)
        graph.prepare()
        assert len(hooked) == 2


async def test_a_failing_external_prepare_hook_fails_prepare_and_changes_nothing(
    host_table: HostTable,
) -> None:
    async def later() -> None:
        pass

    def work(stream: int, tensors: list[Any]) -> None:
        pass

    def broken(stream: int, tensors: list[Any]) -> Any:
        raise RuntimeError("no plan for this shape")

    async with hrx.Runtime(backend="cuda") as rt:  # the fake table
        y = rt.allocate(64, hrx.GPU_LOCAL)
        cases: list[tuple[Callable[..., Any], str]] = [
            (broken, "no plan for this shape"),
            (lambda stream, tensors: 7, "plain function each replay calls, got 7"),
            (lambda stream, tensors: later(), "returned an awaitable"),
            (lambda stream, tensors: later, "plain function each replay calls"),
        ]
        for hook, message in cases:
            graph = rt.graph("refused")
            graph.external(work, [(y.view(), hrx.Access.WRITE)], prepare=hook)
            before = rt.statistics().to_dict()
            with pytest.raises(ContractError, match=message) as caught:
                graph.prepare()
            assert len(graph) == 1
            assert rt.statistics().to_dict() == before
            if hook is broken:
                assert isinstance(caught.value.__cause__, RuntimeError)
        graph = rt.graph("fine")
        graph.external(work, [(y.view(), hrx.Access.WRITE)], prepare=lambda s, t: work)
        await graph.prepare().submit()
        assert y.poison is None


async def test_sticky_fault_loses_the_device(host_table: HostTable) -> None:
    def crash(values: list[bytes]) -> None:
        raise RuntimeError("illegal address")

    host_table.kernels["crash"] = ([8], crash)
    async with hrx.Runtime(backend="cuda") as rt:  # the fake table
        target = rt.allocate(64, hrx.GPU_LOCAL)
        kernel = rt.load_gpu_kernel(
            hrx.KernelSource(cxx="// fake"),
            "crash",
            (1,),
            (1,),
            hrx.KernelContract([hrx.Binding(64, hrx.Access.WRITE)]),
        )
        graph = rt.graph("crash")
        graph.gpu(kernel, [target.view()])
        prepared = graph.prepare()
        with pytest.raises(hrx.HrxError) as caught:
            await prepared.submit()
        cause = caught.value.__cause__ or caught.value
        assert "fakeErrorIllegalAddress" in str(cause)
        assert not rt.healthy
        with pytest.raises(hrx.DeviceLost, match="fakeErrorIllegalAddress"):
            prepared.submit()


async def test_gpu_access_orders_later_work_after_its_stream(host_table: HostTable) -> None:
    host_table.delay = 0.005
    n = 256
    async with hrx.Runtime(backend="cuda") as rt:  # the fake table
        device = rt.allocate(n, hrx.GPU_LOCAL)
        out = rt.allocate(n, hrx.HOST_VISIBLE)
        read = rt.graph("read")
        read.copy(out.view(), device.view())
        prepared = read.prepare()
        async with rt.gpu_access([(device.view(), hrx.Access.WRITE)]) as access:
            assert access.stream is not None
            stream = host_table.streams[access.stream]
            pointer = access.pointers[0]
            stream.put(lambda: ctypes.memset(pointer, 0x5A, n))
            with pytest.raises(hrx.Busy):
                prepared.submit()
        await prepared.submit()
        async with out.map_read() as memory:
            assert bytes(memory) == bytes([0x5A]) * n


async def test_fences_poll_and_wait_from_other_threads(host_table: HostTable) -> None:
    host_table.delay = 0.001
    async with hrx.Runtime(backend="cuda") as rt:  # the fake table
        backend = rt._backend_or_raise()
        assert isinstance(backend, StreamBackend) and backend.poll_budget_us > 0
        a = rt.allocate(64, hrx.GPU_LOCAL)
        graph = rt.graph("fill")
        graph.fill(a.view(), 2)
        prepared = graph.prepare()
        queue_ = backend.queue((hrx.Lane.COMPUTE, 0))
        fences = [queue_.submit(prepared.programs[0], [], lambda: None) for _ in range(30)]
        seen: list[Any] = []
        for fence in fences:
            fence.add_done_callback(seen.append)
        assert await anyio.to_thread.run_sync(fences[-1].wait, 5.0)
        while not all(f.query() for f in fences):
            await anyio.sleep(0.001)
        while len(seen) < 30:
            await anyio.sleep(0.001)
        assert seen == fences  # in order, each once
        starts = [f.started_at for f in fences]
        finishes = [f.finished_at for f in fences]
        assert all(
            s is not None and f is not None and s <= f
            for s, f in zip(starts, finishes, strict=True)
        )


async def test_a_submit_await_loop_never_starves_the_event_loop(host_table: HostTable) -> None:
    """The awaiting task finishes fast fences itself, yet the loop gets its turns: at least
    every YIELD_EVERY + 1-th await yields."""

    def finished_query(event: Any) -> bool:
        host_table.event_synchronize(event)  # a device so fast that every query finds it done
        return True

    host_table.event_query = finished_query  # type: ignore[method-assign]
    async with hrx.Runtime(backend="cuda") as rt:  # the fake table
        a = rt.allocate(64, hrx.GPU_LOCAL)
        graph = rt.graph("fill")
        graph.fill(a.view(), 1)
        prepared = graph.prepare()
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await anyio.lowlevel.checkpoint()

        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            for _ in range(200):
                await prepared.submit()
            tg.cancel_scope.cancel()
        # Fewer would starve the loop; one tick per await would cost each replay an iteration.
        assert 200 // (YIELD_EVERY + 1) - 1 <= ticks < 150


async def test_awaiting_a_finished_completion_is_a_cancel_point_on_trio(
    host_table: HostTable, anyio_backend: str
) -> None:
    """It returns without yielding, but a cancelled caller still gets its cancellation there,
    as from any of trio's own awaits. (On asyncio it behaves as a finished future does:
    cancellation arrives at the next await that suspends.)"""
    if anyio_backend != "trio":
        pytest.skip("trio's rule")
    async with hrx.Runtime(backend="cuda") as rt:  # the fake table
        a = rt.allocate(64, hrx.GPU_LOCAL)
        graph = rt.graph("fill")
        graph.fill(a.view(), 1)
        completion = graph.prepare().submit()
        await completion
        reached = False
        with anyio.CancelScope() as scope:
            scope.cancel()
            await completion
            reached = True
        assert not reached and scope.cancelled_caught


def _instant_device(host_table: HostTable) -> None:
    """Every query finds the work done (a device far faster than the host)."""

    def finished_query(event: Any) -> bool:
        host_table.event_synchronize(event)
        return True

    host_table.event_query = finished_query  # type: ignore[method-assign]


def _posts(rt: hrx.Runtime) -> int:
    """How many callbacks other threads have handed to the loop (a fence finished off it)."""
    return rt._scheduler_or_raise().notifier.posted


def _fill_graphs(rt: hrx.Runtime, count: int) -> list[hrx.PreparedGraph]:
    graphs = []
    for index in range(count):
        graph = rt.graph(f"fill-{index}")
        graph.fill(rt.allocate(64, hrx.GPU_LOCAL).view(), index)
        graphs.append(graph.prepare())
    return graphs


@pytest.mark.parametrize("budget_us", [30.0, 0.0])
async def test_watched_streams_finish_on_the_loop_without_a_thread(
    host_table: HostTable, budget_us: float
) -> None:
    _instant_device(host_table)
    async with hrx.Runtime(backend="cuda") as rt:  # the fake table
        rt._backend_or_raise().poll_budget_us = budget_us
        (prepared,) = _fill_graphs(rt, 1)
        posts = _posts(rt)
        for _ in range(50):
            await prepared.submit()
        if budget_us:
            assert _posts(rt) == posts  # every fence was swept by the loop itself
        else:
            assert _posts(rt) == posts + 50  # unwatched: each came back from the waiter


async def test_an_idle_loop_hands_overdue_work_to_the_waiter(host_table: HostTable) -> None:
    async with hrx.Runtime(backend="cuda") as rt:  # the fake table
        (prepared,) = _fill_graphs(rt, 1)
        scheduler = rt._scheduler_or_raise()
        posts = _posts(rt)
        host_table.running.clear()  # the fill does not finish until the loop has let go
        try:
            completion = prepared.submit()
            assert scheduler.watch.watched
            # The first replay's watch window is its budget alone (30 µs), and an idle loop's
            # passes take microseconds: the hand-back comes within a millisecond. Waited for
            # with a wide bound, as a machine that stalls the process for a while makes the
            # loop's next passes look busy (gaps as long as the stall) until it is idle again.
            with anyio.fail_after(5):
                while scheduler.watch.watched:  # the loop stops spinning on it
                    await anyio.sleep(0.001)
            assert not completion.done()
        finally:
            host_table.running.set()
        await completion
        assert _posts(rt) == posts + 1  # finished by the stream's waiter thread


async def test_a_busy_loop_keeps_sweeping_overdue_work(host_table: HostTable) -> None:
    host_table.delay = 0.06
    async with hrx.Runtime(backend="cuda") as rt:  # the fake table
        (prepared,) = _fill_graphs(rt, 1)
        scheduler = rt._scheduler_or_raise()
        completion = prepared.submit()
        stop = anyio.Event()

        async def busy() -> None:
            while not stop.is_set():
                time.sleep(0.0003)  # each loop iteration takes a while
                await anyio.lowlevel.checkpoint()

        async with anyio.create_task_group() as tg:
            tg.start_soon(busy)
            await anyio.sleep(0.03)
            watched_while_busy = bool(scheduler.watch.watched)
            stop.set()
        assert not completion.done()
        assert watched_while_busy  # a thread could not have finished it any sooner
        await completion


async def test_a_finished_fence_finishes_what_its_stream_waited_for(
    host_table: HostTable,
) -> None:
    """A stream passes a device-side wait only once what it waited for has finished, so a
    replay chained over three streams (upload, kernel, download) finishes with one query:
    the loop sweeps the stream launched last first, and its fence proves the other two."""
    _instant_device(host_table)
    instant = host_table.event_query
    queries: list[Any] = []

    def counted(event: Any) -> bool:
        queries.append(event)
        return instant(event)

    host_table.event_query = counted  # type: ignore[method-assign]
    n = 256
    async with hrx.Runtime(backend="cuda", max_submissions=16) as rt:  # the fake table
        host_in = rt.allocate(n * 4, hrx.HOST_VISIBLE)
        host_out = rt.allocate(n * 4, hrx.HOST_VISIBLE)
        x = rt.allocate(n * 4, hrx.GPU_LOCAL)
        y = rt.allocate(n * 4, hrx.GPU_LOCAL)
        async with host_in.map_write() as memory:
            np.frombuffer(memory, np.int32)[:] = np.arange(n)
        graph = rt.graph("chain")
        graph.copy(x.view(), host_in.view())
        graph.gpu(_affine_kernel(rt, n), [x.view(), y.view()])
        graph.copy(host_out.view(), y.view())
        prepared = graph.prepare()
        backend = rt._backend_or_raise()
        for in_flight in (8, 1):
            proven = backend.describe()["fences_finished_by_proof"]
            queries.clear()
            for _ in range(24 // in_flight):
                completions = [prepared.submit() for _ in range(in_flight)]
                for completion in completions:
                    await completion
            assert len(queries) == 24  # one per replay: its download's
            assert backend.describe()["fences_finished_by_proof"] - proven == 2 * 24
        async with host_out.map_read() as memory:
            assert np.array_equal(np.frombuffer(memory, np.int32), np.arange(n) * 3 + 7)


async def test_one_loop_pass_finishes_a_bounded_number_of_fences(
    host_table: HostTable, anyio_backend: str
) -> None:
    _instant_device(host_table)
    # trio runs a batch's tasks in any order, so the sweeping task may run twice between
    # two checkpoints of this one.
    limit = SWEEP_LIMIT if anyio_backend == "asyncio" else 2 * SWEEP_LIMIT
    # More fences than two passes of either loop may finish, so the bound shows on both.
    count = 3 * 2 * SWEEP_LIMIT
    async with hrx.Runtime(backend="cuda", max_submissions=count) as rt:
        graphs = _fill_graphs(rt, count)
        completions = [graph.submit() for graph in graphs]
        finished_per_pass = []
        done = 0
        while done < len(completions):
            await anyio.lowlevel.checkpoint()
            now = sum(completion.done() for completion in completions)
            finished_per_pass.append(now - done)
            done = now
        assert max(finished_per_pass) <= limit, finished_per_pass[:20]
        assert len(finished_per_pass) >= len(completions) // limit
        for completion in completions:
            await completion


async def test_awaiting_tasks_share_one_pass_budget(
    host_table: HostTable, anyio_backend: str
) -> None:
    # Every task sweeps once before it suspends; those sweeps spend the pass's budget
    # instead of each finishing up to the limit, so the loop stays responsive however
    # many tasks await.
    _instant_device(host_table)
    # The observer's passes need not line up with the budget's refills, so one of its
    # windows may see the end of one budget and the start of the next.
    limit = 2 * SWEEP_LIMIT if anyio_backend == "asyncio" else 4 * SWEEP_LIMIT
    tasks = 96
    async with hrx.Runtime(backend="cuda", max_submissions=tasks) as rt:
        graphs = _fill_graphs(rt, tasks)
        finished_per_pass: list[int] = []
        count = 0
        replays = 5

        async def worker(graph: hrx.PreparedGraph) -> None:
            nonlocal count
            for _ in range(replays):
                await graph.submit()
                count += 1

        async def observer() -> None:
            seen = 0
            while seen < tasks * replays:
                await anyio.lowlevel.checkpoint()
                finished_per_pass.append(count - seen)
                seen = count

        async with anyio.create_task_group() as tg:
            tg.start_soon(observer)
            for graph in graphs:
                tg.start_soon(worker, graph)
        assert count == tasks * replays
        assert max(finished_per_pass) <= limit, finished_per_pass[:20]


async def test_single_launch_is_one_graph_launch_per_replay(host_table: HostTable) -> None:
    """`prepare(single_launch=True)`: the upload, fill, kernel and download are captured into
    one graph; each replay is one graph launch on the compute stream, and it is ordered by
    device-side waits against default-mode replays on the copy streams."""
    n = 1024
    async with hrx.Runtime(backend="cuda") as rt:  # the fake table
        host_in = rt.allocate(n * 4, hrx.HOST_VISIBLE)
        host_out = rt.allocate(n * 4, hrx.HOST_VISIBLE)
        x, y = rt.allocate(n * 4, hrx.GPU_LOCAL), rt.allocate(n * 4, hrx.GPU_LOCAL)
        kernel = _affine_kernel(rt, n)
        graph = rt.graph("single")
        graph.copy(x.view(), host_in.view())
        graph.fill(y.view(), 0)
        graph.gpu(kernel, [x.view(), y.view()])
        graph.copy(host_out.view(), y.view())
        step = graph.prepare(single_launch=True)
        assert rt.statistics().native_graphs_prepared == 1
        assert [p.native_graph for p in step.programs] == [True]
        copies = host_table.calls["memcpy"]
        launches = host_table.calls.get("graph_launch", 0)
        values = np.arange(n, dtype=np.int32)
        for round_ in range(3):
            async with host_in.map_write() as memory:
                np.frombuffer(memory, np.int32)[:] = values + round_
            await step.submit()
            async with host_out.map_read() as memory:
                expected = (values + round_) * 3 + 7
                np.testing.assert_array_equal(np.frombuffer(memory, np.int32), expected)
        assert host_table.calls["graph_launch"] == launches + 3
        assert host_table.calls["memcpy"] == copies  # the copies replay inside the graph
        stats = rt.statistics()
        assert stats.copy_streams_created == 0
        assert stats.uploaded_bytes == stats.downloaded_bytes == 3 * n * 4

        back = rt.graph("default")  # host_out -> kernel -> host_in, on three lanes
        back.copy(x.view(), host_out.view())
        back.gpu(kernel, [x.view(), y.view()])
        back.copy(host_in.view(), y.view())
        other = back.prepare()
        host_table.delay = 0.001  # slow device: only device-side waits keep the order
        pending = [c for _ in range(4) for c in (step.submit(), other.submit())]
        for completion in pending:
            await completion
        expected = values + 2
        for _ in range(8):
            expected = expected * 3 + 7
        async with host_in.map_read() as memory:
            np.testing.assert_array_equal(np.frombuffer(memory, np.int32), expected)
