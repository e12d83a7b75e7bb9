"""`hrx_async.torch.region`: PyTorch work over typed views, checked against eager PyTorch.

On `sim` (CPU PyTorch over the runtime's memory) and, marked `cuda`, on a GPU through the
`hrx_backend` fixture: results, order with the hrx copies and kernels around a region,
failures and poison, and the captured form (one launch per replay). Skipped
where PyTorch is missing; what needs no PyTorch is in test_adapter_imports.py and
tests/core/test_typed.py.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

import hrx_async as hrx
from tests.helpers import read_bytes, write_bytes

torch = pytest.importorskip("torch")
hrx_torch = pytest.importorskip("hrx_async.torch")

pytestmark = pytest.mark.anyio
F32 = np.float32

PLUS3_CXX = r"""
extern "C" __global__ void plus3(const float* src, float* dst, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i] + 3.0f;
}
"""


def plus3_host(arrays: list[Any], constants: bytes) -> None:
    src, dst = (a.view(F32) for a in arrays)
    dst[:] = src + F32(3)


def needs_torch_for(backend: str) -> None:
    """Skip unless this PyTorch drives `backend`'s GPU (sim needs only CPU PyTorch)."""
    if backend == "sim":
        return
    if backend == "hip" and not torch.version.hip:
        pytest.skip("this PyTorch is not a ROCm build")
    if backend == "cuda" and not torch.version.cuda:
        pytest.skip("this PyTorch is not a CUDA build")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no GPU")


def floats(values: np.ndarray[Any, Any]) -> bytes:
    return np.ascontiguousarray(values, dtype=F32).tobytes()


async def read_floats(rt: hrx.Runtime, buffer: hrx.Buffer) -> np.ndarray[Any, Any]:
    return np.frombuffer(await read_bytes(rt, buffer), F32)


@pytest.mark.parametrize("captured", [False, True], ids=["eager", "captured"])
async def test_a_region_computes_what_eager_pytorch_does_between_hrx_work(
    hrx_backend: str, captured: bool
) -> None:
    """upload -> torch region (temporaries inside) -> hrx kernel -> download, replayed
    with new inputs and pipelined: each result is eager PyTorch's."""
    needs_torch_for(hrx_backend)
    n = 1 << 14  # 64 KiB of float32
    async with hrx.Runtime(backend=hrx_backend, npu=None) as rt:
        host_in, host_out = (rt.allocate(n * 4, hrx.HOST_VISIBLE) for _ in range(2))
        x, y, z = (rt.allocate(n * 4, hrx.GPU_LOCAL) for _ in range(3))
        kernel = rt.load_gpu_kernel(
            hrx.KernelSource(cxx=PLUS3_CXX, host=plus3_host),
            "plus3",
            grid=(n // 256,),
            block=(256,),
            contract=hrx.KernelContract(
                [hrx.Binding(n * 4, hrx.Access.READ), hrx.Binding(n * 4, hrx.Access.WRITE)],
                hrx.Constants().u32(n),
            ),
        )

        def work(source: Any, target: Any) -> None:
            target.copy_(torch.relu(source * 2 - 1).sqrt())

        graph = rt.graph("torch-between")
        graph.copy(x.view(), host_in.view())
        hrx_torch.region(
            graph,
            work,
            reads=[(x.view(), torch.float32, (128, 128))],
            writes=[(y.view(), torch.float32, (128, 128))],
            captured=captured,
        )
        graph.gpu(kernel, [y.view(), z.view()])
        graph.copy(host_out.view(), z.view())
        prepared = graph.prepare()
        rng = np.random.default_rng(7)
        for _ in range(3):
            values = rng.standard_normal(n).astype(F32)
            await write_bytes(host_in, floats(values))
            for completion in [prepared.submit() for _ in range(4)]:
                await completion
            expected = torch.relu(torch.from_numpy(values) * 2 - 1).sqrt() + 3
            np.testing.assert_allclose(await read_floats(rt, host_out), expected.numpy(), 1e-6)


@pytest.mark.parametrize("captured", [False, True], ids=["eager", "captured"])
async def test_a_matmul_region_is_ordered_before_the_download_that_reads_it(
    hrx_backend: str, captured: bool
) -> None:
    """A matmul long enough on a GPU that a download not ordered after it would read what
    was there before; `torch.matmul(..., out=c)` writes the region's own memory."""
    needs_torch_for(hrx_backend)
    m = 1024 if hrx_backend != "sim" else 128
    async with hrx.Runtime(backend=hrx_backend, npu=None) as rt:
        host_a, host_b, host_c = (rt.allocate(m * m * 4, hrx.HOST_VISIBLE) for _ in range(3))
        a, b, c = (rt.allocate(m * m * 4, hrx.GPU_LOCAL) for _ in range(3))
        graph = rt.graph("matmul")
        graph.copy(a.view(), host_a.view())
        graph.copy(b.view(), host_b.view())
        hrx_torch.region(
            graph,
            lambda left, right, out: torch.matmul(left, right, out=out),
            reads=[(a.view(), torch.float32, (m, m)), (b.view(), torch.float32, (m, m))],
            writes=[(c.view(), torch.float32, (m, m))],
            captured=captured,
        )
        graph.copy(host_c.view(), c.view())
        prepared = graph.prepare()
        rng = np.random.default_rng(3)
        for _ in range(2):
            left = rng.uniform(-1, 1, (m, m)).astype(F32)
            right = rng.uniform(-1, 1, (m, m)).astype(F32)
            await write_bytes(host_a, floats(left))
            await write_bytes(host_b, floats(right))
            await write_bytes(host_c, bytes(m * m * 4))
            await prepared.submit()
            expected = torch.matmul(torch.from_numpy(left), torch.from_numpy(right)).numpy()
            got = (await read_floats(rt, host_c)).reshape(m, m)
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-3)


async def test_updates_are_read_and_written_in_place(hrx_backend: str) -> None:
    needs_torch_for(hrx_backend)
    async with hrx.Runtime(backend=hrx_backend, npu=None) as rt:
        host = rt.allocate(4096, hrx.HOST_VISIBLE)
        scale = rt.allocate(4, hrx.GPU_LOCAL)
        data = rt.allocate(4096, hrx.GPU_LOCAL)
        graph = rt.graph("in-place")
        graph.copy(data.view(), host.view())
        graph.fill(scale.view(), 0)
        hrx_torch.region(
            graph,
            lambda s, d: (s.add_(2), d.mul_(s)),
            updates=[(scale.view(), torch.int32, ()), (data.view(), torch.int32, (32, 32))],
        )
        graph.copy(host.view(), data.view())
        await write_bytes(host, np.arange(1024, dtype=np.int32).tobytes())
        await graph.prepare().submit()
        got = np.frombuffer(await read_bytes(rt, host), np.int32)
        np.testing.assert_array_equal(got, np.arange(1024) * 2)


async def test_a_failing_region_fails_with_execution_error_and_poisons_its_writes(
    hrx_backend: str,
) -> None:
    needs_torch_for(hrx_backend)
    async with hrx.Runtime(backend=hrx_backend, npu=None) as rt:
        x, y = rt.allocate(1024, hrx.GPU_LOCAL), rt.allocate(1024, hrx.GPU_LOCAL)
        out = rt.allocate(1024, hrx.HOST_VISIBLE)

        def broken(source: Any, target: Any) -> None:
            target.copy_(source.view(3, -1))  # 256 elements are no 3 rows: PyTorch raises

        graph = rt.graph("broken-torch")
        index = hrx_torch.region(
            graph, broken, reads=[(x.view(), torch.float32)], writes=[(y.view(), torch.float32)]
        )
        with pytest.raises(hrx.ExecutionError, match="broken-torch") as caught:
            await graph.prepare().submit()
        assert caught.value.region == graph.prepare().regions[index].index
        assert isinstance(caught.value.__cause__, RuntimeError)
        assert y.poison is not None and x.poison is None
        read = rt.graph("read")
        read.copy(out.view(), y.view())
        with pytest.raises(hrx.PoisonedError):
            read.prepare().submit()


async def test_bad_declarations_are_refused_at_record_time_and_record_nothing() -> None:
    async def later(x: Any) -> None:
        pass

    def fine(*tensors: Any) -> None:
        pass

    async with hrx.Runtime(backend="sim", npu=None) as rt:
        x = rt.allocate(4096, hrx.GPU_LOCAL)
        host = rt.allocate(4096, hrx.HOST_VISIBLE)
        graph = rt.graph("refusals")
        graph.fill(x.view(), 0)
        cases: list[tuple[Any, Any, dict[str, Any], str]] = [
            (graph, fine, {"writes": [(x.view(), torch.float32, (1000,))]}, "4096 bytes"),
            (graph, fine, {"writes": [(x.view(), np.float32)]}, "not a dtype it knows"),
            (graph, fine, {"reads": [(x.view(1, 8), torch.int16, 4)]}, "not a multiple of 2"),
            (graph, fine, {"reads": [(host.view(), torch.uint8)]}, "GPU_LOCAL memory"),
            (graph, fine, {}, "at least one of reads, updates or writes"),
            (graph, later, {"writes": [(x.view(), torch.uint8)]}, "plain function"),
            (graph, "fn", {"writes": [(x.view(), torch.uint8)]}, "plain function"),
            (
                graph,
                fine,
                {"writes": [(x.view(), torch.uint8)], "captured": "yes"},
                "captured must be True or False",
            ),
            (
                graph,
                fine,
                {
                    "reads": [(x.view(0, 64), torch.uint8)],
                    "writes": [(x.view(32, 64), torch.uint8)],
                },
                "overlap",
            ),
            (rt, fine, {"writes": [(x.view(), torch.uint8)]}, "records into a Graph"),
        ]
        for target, fn, options, message in cases:
            with pytest.raises(hrx.ContractError, match=message):
                hrx_torch.region(target, fn, **options)
        assert len(graph) == 1


async def test_read_tensors_on_sim_share_memory_without_a_warning() -> None:
    async with hrx.Runtime(backend="sim", npu=None) as rt:
        x, y = rt.allocate(64, hrx.GPU_LOCAL), rt.allocate(64, hrx.GPU_LOCAL)
        seen: list[Any] = []

        def keep(source: Any, target: Any) -> None:
            seen.append(source)
            target.copy_(source + 1)

        graph = rt.graph("sim-tensors")
        graph.fill(x.view(), 1)
        hrx_torch.region(
            graph, keep, reads=[(x.view(), torch.uint8)], writes=[(y.view(), torch.uint8)]
        )
        prepared = graph.prepare()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            await prepared.submit()
            await prepared.submit()
        assert not [w for w in caught if "not writable" in str(w.message)]
        assert seen[0] is seen[1] and seen[0].device.type == "cpu"
        assert await read_bytes(rt, y) == bytes([2]) * 64


# -- CUDA only -------------------------------------------------------------------------------


def cuda_torch() -> None:
    needs_torch_for("cuda")
    from tests.conftest import usable_backends

    if "cuda" not in usable_backends():
        pytest.skip("no CUDA device answers here")


@pytest.mark.cuda
async def test_a_captured_region_launches_its_cuda_graph_once_per_replay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`fn` runs twice when the graph is prepared (a warm-up on zeroed scratch tensors, then
    the capture over the region's own) and never again; the first replay is one
    `CUDAGraph.replay()` on the lane's stream, and as the work draws no random numbers every
    later one is a native launch of the same graph, reading the memory as it is then."""
    cuda_torch()
    replays: list[Any] = []
    original = torch.cuda.CUDAGraph.replay

    def counting(self: Any) -> None:
        replays.append(torch.cuda.current_stream().cuda_stream)
        original(self)

    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", counting)
    n = 1 << 14
    async with hrx.Runtime(backend="cuda", npu=None) as rt:
        host = rt.allocate(n * 4, hrx.HOST_VISIBLE)
        x, y = rt.allocate(n * 4, hrx.GPU_LOCAL), rt.allocate(n * 4, hrx.GPU_LOCAL)
        calls: list[tuple[int, bool, bool]] = []

        def add(source: Any, target: Any) -> None:
            capturing = torch.cuda.is_current_stream_capturing()
            # Reading values back synchronises: only outside the capture.
            zeros = not capturing and bool((source == 0).all())
            calls.append((source.data_ptr(), capturing, zeros))
            torch.add(source, 1, out=target)

        graph = rt.graph("captured-add")
        graph.copy(x.view(), host.view())
        hrx_torch.region(
            graph,
            add,
            reads=[(x.view(), torch.float32)],
            writes=[(y.view(), torch.float32)],
            captured=True,
        )
        graph.copy(host.view(), y.view())
        prepared = graph.prepare()
        assert len(calls) == 2 and replays == []
        (scratch, warm_capturing, zeroed), (own, capturing, _) = calls
        assert scratch != own and zeroed and not warm_capturing  # the warm-up
        assert own == prepared.programs[1].tensors[0].pointer and capturing  # the capture
        default = torch.cuda.current_stream().cuda_stream
        work = prepared.programs[1].fn
        assert not work.native
        for replay in range(5):
            await write_bytes(host, floats(np.full(n, replay, F32)))
            await prepared.submit()
            np.testing.assert_array_equal(await read_floats(rt, host), np.full(n, replay + 1))
        assert len(calls) == 2 and len(replays) == 1 and work.native
        assert replays[0] != default
        assert torch.cuda.current_stream().cuda_stream == default  # restored after each


@pytest.mark.cuda
async def test_a_captured_region_that_draws_random_numbers_draws_new_ones_each_replay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PyTorch's replay advances the generator the capture used; a bare launch would not, and
    every replay would repeat the first one's numbers. Such a region keeps PyTorch's replay."""
    cuda_torch()
    replays: list[int] = []
    original = torch.cuda.CUDAGraph.replay

    def counting(self: Any) -> None:
        replays.append(1)
        original(self)

    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", counting)
    n = 1 << 12
    async with hrx.Runtime(backend="cuda", npu=None) as rt:
        host = rt.allocate(n * 4, hrx.HOST_VISIBLE)
        y = rt.allocate(n * 4, hrx.GPU_LOCAL)

        def draw(target: Any) -> None:
            target.uniform_()

        graph = rt.graph("captured-random")
        hrx_torch.region(graph, draw, writes=[(y.view(), torch.float32)], captured=True)
        graph.copy(host.view(), y.view())
        prepared = graph.prepare()
        draws = []
        for _ in range(3):
            await prepared.submit()
            draws.append(await read_floats(rt, host))
        assert not prepared.programs[0].fn.native and len(replays) == 3
        for earlier, later in ((0, 1), (1, 2), (0, 2)):
            assert not np.array_equal(draws[earlier], draws[later])
        assert all(((d >= 0) & (d <= 1)).all() for d in draws)


@pytest.mark.cuda
async def test_a_region_that_cannot_be_captured_fails_prepare_and_changes_nothing() -> None:
    cuda_torch()
    async with hrx.Runtime(backend="cuda", npu=None) as rt:
        x, y = rt.allocate(4096, hrx.GPU_LOCAL), rt.allocate(4096, hrx.GPU_LOCAL)

        def syncs(source: Any, target: Any) -> None:
            if float(source.sum()) >= 0:  # a host read: synchronises, so cannot be captured
                target.copy_(source)

        graph = rt.graph("uncapturable")
        hrx_torch.region(
            graph,
            syncs,
            reads=[(x.view(), torch.float32)],
            writes=[(y.view(), torch.float32)],
            captured=True,
        )
        before = rt.statistics().to_dict()
        with pytest.raises(hrx.ContractError, match="capturing it into a CUDA graph failed"):
            graph.prepare()
        assert rt.statistics().to_dict() == before and len(graph) == 1
        eager = rt.graph("eager-after")
        eager.fill(x.view(), 0)
        hrx_torch.region(
            eager,
            lambda s, t: torch.add(s, 2, out=t),
            reads=[(x.view(), torch.float32)],
            writes=[(y.view(), torch.float32)],
        )
        await eager.prepare().submit()
        assert np.frombuffer(await read_bytes(rt, y), F32).tolist() == [2.0] * 1024
        assert rt.healthy


@pytest.mark.cuda
async def test_an_eager_region_runs_on_the_lane_stream_and_gives_the_callers_back() -> None:
    """Each replay makes the lane's stream current for `fn` and the caller's current stream
    current again after it: the default stream, a stream the caller made current, and after
    `fn` raised."""
    cuda_torch()
    n = 1 << 12
    async with hrx.Runtime(backend="cuda", npu=None) as rt:
        x, y = rt.allocate(n * 4, hrx.GPU_LOCAL), rt.allocate(n * 4, hrx.GPU_LOCAL)
        seen: list[int] = []
        failing: list[bool] = []

        def add(source: Any, target: Any) -> None:
            seen.append(torch.cuda.current_stream().cuda_stream)
            torch.add(source, 1, out=target)
            if failing:
                raise RuntimeError("the region's own failure")

        graph = rt.graph("eager-add")
        hrx_torch.region(
            graph, add, reads=[(x.view(), torch.float32)], writes=[(y.view(), torch.float32)]
        )
        prepared = graph.prepare()
        default = torch.cuda.current_stream().cuda_stream
        mine = torch.cuda.Stream()
        await prepared.submit()
        assert torch.cuda.current_stream().cuda_stream == default
        with torch.cuda.stream(mine):
            await prepared.submit()
            assert torch.cuda.current_stream().cuda_stream == mine.cuda_stream
        assert torch.cuda.current_stream().cuda_stream == default
        failing.append(True)
        with pytest.raises(hrx.ExecutionError, match="eager-add"):
            await prepared.submit()
        assert torch.cuda.current_stream().cuda_stream == default
        assert len(seen) == 3 and len(set(seen)) == 1
        assert seen[0] not in (default, mine.cuda_stream)  # the lane's own stream
