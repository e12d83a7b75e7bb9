"""Argument validation at every public entry point, and closing with live host mappings.

* Regression tests for bad input that used to get through: hand-built views outside their
  buffer, bools and floats as sizes, an allocation larger than memory, non-iterables where
  lists are expected, constants that are not bytes, bad `Runtime(...)` arguments.
* Hypothesis feeds each public constructor and method a mix of valid arguments and
  garbage: a call either succeeds or raises an `HrxError` (never a raw `TypeError`,
  `ValueError` or `MemoryError`) and a refused call changes nothing.
* Closing a runtime while mappings are held, on asyncio and trio with the sim backend.

Pure tests make buffers with a tiny owner that stands in for the runtime (a domain and a
way to be released); nothing under test is replaced.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from typing import Any

import anyio
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hrx_async as hrx
from hrx_async._core.contract import Access, Binding, Constants, KernelContract, check_dims
from hrx_async._core.graph import Graph
from hrx_async._core.kernels import GpuKernel, KernelSource, NpuKernel
from hrx_async._core.lane import Lane
from hrx_async._core.memory import (
    GPU_LOCAL,
    HOST_VISIBLE,
    Buffer,
    Domain,
    HostMapping,
    MemoryBudget,
    Placement,
    PlacementKind,
    View,
    npu_local,
    shared,
)
from hrx_async.errors import BackendError, ContractError, HrxError, RuntimeClosed, Unsupported

R, W, RW = Access.READ, Access.WRITE, Access.READ_WRITE


class Owner:
    """The least a buffer needs from a runtime: a domain and a way to be released."""

    def __init__(self, label: str = "test") -> None:
        self.domain = Domain(label)

    def _release_buffer(self, buffer: Buffer) -> None:
        buffer._mark_released()

    def _map(self, view: View, write: bool, wait: bool) -> AbstractAsyncContextManager[memoryview]:
        raise NotImplementedError("pure tests do not map")

    def _map_nowait(self, view: View, write: bool) -> HostMapping:
        raise NotImplementedError("pure tests do not map")


def _no_op(*args: Any) -> None:
    del args


def _kernel_source() -> KernelSource:
    return KernelSource(host=_no_op)


# -- views built directly ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("offset", "nbytes"),
    [(60, 16), (64, 1), (0, 65), (-1, 4), (0, 0), (0, -4), (2**63, 1), (0, 4.0), (1.0, 4)],
)
def test_a_view_built_directly_is_range_checked(offset: object, nbytes: object) -> None:
    buffer = Buffer(Owner(), 64, HOST_VISIBLE, storage=object())
    with pytest.raises(ContractError, match="view"):
        View(buffer, offset, nbytes)  # type: ignore[arg-type]


def test_a_view_needs_a_live_buffer() -> None:
    buffer = Buffer(Owner(), 64, HOST_VISIBLE, storage=object())
    with pytest.raises(ContractError, match="Buffer"):
        View("buffer", 0, 4)  # type: ignore[arg-type]
    buffer.free()
    with pytest.raises(ContractError, match="was freed"):
        View(buffer, 0, 4)


def test_numpy_integers_are_accepted_and_become_ints() -> None:
    buffer = Buffer(Owner(), np.int64(64), HOST_VISIBLE, storage=object())  # type: ignore[arg-type]
    assert type(buffer.nbytes) is int
    for view in (
        View(buffer, np.int64(8), np.uint16(8)),  # type: ignore[arg-type]
        buffer.view(np.int32(8), np.uint64(8)),  # type: ignore[arg-type]
        buffer[np.int8(8) : np.int64(16)],  # type: ignore[misc]
        buffer.view()[np.int64(-56) : np.int16(-48)],  # type: ignore[misc]
    ):
        assert view == View(buffer, 8, 8)
        assert (type(view.offset), type(view.nbytes)) == (int, int)
    assert npu_local(np.int64(1)) == npu_local(1)  # type: ignore[arg-type]
    assert type(shared(np.uint8(2)).npu) is int  # type: ignore[arg-type]
    binding = Binding(np.int64(16), R, alignment=np.uint8(4))  # type: ignore[arg-type]
    assert (binding, type(binding.nbytes)) == (Binding(16, R, 4), int)
    assert check_dims("grid", [np.int32(4), np.uint64(2)]) == (4, 2, 1)
    budget = MemoryBudget(np.int64(100))  # type: ignore[arg-type]
    budget.charge(np.int16(30))  # type: ignore[arg-type]
    budget.release(np.uint8(10))  # type: ignore[arg-type]
    assert (budget.limit, budget.reserved_bytes) == (100, 20)


# -- bools are not sizes, offsets or counts ------------------------------------------------


def _bool_calls() -> list[tuple[str, Callable[[], object]]]:
    buffer = Buffer(Owner(), 64, HOST_VISIBLE, storage=object())
    view = buffer.view()
    domain = Domain("d")
    contract = KernelContract([Binding(4, R)])
    return [
        ("View offset", lambda: View(buffer, True, 4)),
        ("View length", lambda: View(buffer, 0, True)),
        ("view offset", lambda: buffer.view(True)),
        ("view length", lambda: buffer.view(0, True)),
        ("slice offset", lambda: view.slice(True, 4)),
        ("slice length", lambda: view.slice(0, True)),
        ("[True:]", lambda: buffer[True:]),
        ("[:True]", lambda: view[:True]),
        ("[a:b:True]", lambda: view[0:8:True]),
        ("Buffer size", lambda: Buffer(Owner(), True, HOST_VISIBLE, storage=object())),
        ("Placement npu", lambda: Placement(PlacementKind.SHARED, True)),
        ("Binding nbytes", lambda: Binding(True, R)),
        ("Binding alignment", lambda: Binding(4, R, alignment=True)),
        ("grid", lambda: check_dims("grid", (True, 2))),
        ("budget charge", lambda: MemoryBudget(10).charge(True)),
        ("budget release", lambda: MemoryBudget(10).release(True)),
        ("Runtime max_submissions", lambda: hrx.Runtime(max_submissions=True)),
        ("Runtime device", lambda: hrx.Runtime(device=False)),
        ("Runtime sim_npus", lambda: hrx.Runtime(sim_npus=True)),
        ("Runtime memory_budget", lambda: hrx.Runtime(memory_budget=True)),
        (
            "GpuKernel shared_bytes",
            lambda: GpuKernel(
                "k", (1,), (1,), contract, _kernel_source(), "sim", domain, None, True
            ),
        ),
        (
            "NpuKernel columns",
            lambda: NpuKernel("k", 0, True, contract, _kernel_source(), "sim", domain),
        ),
        ("NpuKernel npu", lambda: NpuKernel("k", True, 1, contract, _kernel_source(), "s", domain)),
    ]


@pytest.mark.parametrize("case", range(len(_bool_calls())))
def test_bools_are_refused_as_integers(case: int) -> None:
    what, call = _bool_calls()[case]
    with pytest.raises(ContractError) as info:
        call()
    assert "True" in str(info.value) or "False" in str(info.value), what


# -- non-iterables, unordered collections and other wrong types ---------------------------


@pytest.fixture
def world() -> dict[str, Any]:
    owner = Owner("world")
    gpu = Buffer(owner, 256, GPU_LOCAL, storage=object(), label="gpu")
    host = Buffer(owner, 256, HOST_VISIBLE, storage=object(), label="host")
    npu = Buffer(owner, 256, npu_local(0), storage=object(), label="npu")
    source = _kernel_source()
    contract = KernelContract([Binding(64, R), Binding(64, W)])
    kernel = GpuKernel("k", (1,), (64,), contract, source, "sim", owner.domain)
    npu_kernel = NpuKernel("n", 0, 1, contract, source, "sim-npu", owner.domain)
    graph = Graph(owner.domain, "g")
    graph.fill(gpu.view(), 1)
    return {
        "gpu": gpu,
        "host": host,
        "npu": npu,
        "kernel": kernel,
        "npu_kernel": npu_kernel,
        "graph": graph,
        "domain": owner.domain,
    }


@contextmanager
def unchanged(graph: Graph, match: str = "") -> Iterator[None]:
    """The body must raise `ContractError` (matching `match`) and leave `graph` as it was."""
    before = (len(graph), graph.nodes, graph.plan())
    with pytest.raises(ContractError, match=match):
        yield
    assert (len(graph), graph.nodes, graph.plan()) == before


@pytest.mark.parametrize("bad", [5, None, 1.5, object(), Access.READ])
def test_non_iterables_are_contract_errors(world: dict[str, Any], bad: object) -> None:
    g, kernel, npu_kernel = world["graph"], world["kernel"], world["npu_kernel"]
    with unchanged(g, "iterable"):
        g.gpu(kernel, bad)
    with unchanged(g, "iterable"):
        g.npu(npu_kernel, bad)
    with unchanged(g, "iterable"):
        g.host(_no_op, bad)
    with pytest.raises(ContractError, match="iterable"):
        KernelContract(bad)  # type: ignore[arg-type]
    with pytest.raises(ContractError, match="grid must be 1 to 3 positive integers"):
        check_dims("grid", bad)  # type: ignore[arg-type]


def test_unordered_and_text_collections_are_refused(world: dict[str, Any]) -> None:
    # A set would bind views in hash order; a string or bytes iterates as characters.
    g, gpu, kernel = world["graph"], world["gpu"], world["kernel"]
    with unchanged(g, "ordered collection"):
        g.gpu(kernel, {gpu[0:64], gpu[64:128]})
    with unchanged(g, "ordered collection"):
        g.host(_no_op, {world["host"][0:8]: R})
    with pytest.raises(ContractError, match="ordered collection"):
        KernelContract(frozenset([Binding(4, R)]))
    for dims in (b"\x04", "4", {4}, {4: 1}, (2**31,)):
        with pytest.raises(ContractError, match="grid must be 1 to 3 positive integers"):
            check_dims("grid", dims)  # type: ignore[arg-type]
    # Any other iterable is fine, including iterators.
    assert g.gpu(kernel, iter([gpu[0:64], gpu[64:128]])) == 1


def test_wrong_types_in_graph_calls(world: dict[str, Any]) -> None:
    g, gpu = world["graph"], world["gpu"]
    with unchanged(g, "allow_alias must be True or False"):
        g.gpu(world["kernel"], [gpu[0:64], gpu[64:128]], allow_alias="yes")
    with unchanged(g, "fill value"):
        g.fill(gpu.view(), np.float32(1))
    with unchanged(g, "fill value"):
        g.fill(gpu.view(), np.array([1, 2]))
    with unchanged(g, "upload, compute or download"):
        g.copy(gpu[0:8], world["host"][0:8], lane=np.array([1]))  # type: ignore[arg-type]
    with pytest.raises(ContractError, match="domain"):
        Graph("domain")  # type: ignore[arg-type]
    with pytest.raises(ContractError, match="label"):
        Graph(world["domain"], 5)  # type: ignore[arg-type]
    with pytest.raises(ContractError, match="preparer"):
        Graph(world["domain"], "g", 5)  # type: ignore[arg-type]


def test_contract_constants_must_be_bytes() -> None:
    bindings = [Binding(4, R)]
    for bad in (5, 0, "abc", 1.5, [1, 2], object(), np.int64(5), np.float32(1), True):
        with pytest.raises(ContractError, match="constants"):
            KernelContract(bindings, bad)  # type: ignore[arg-type]
    assert KernelContract(bindings, bytearray(b"\x01\x02")).constants == b"\x01\x02"
    assert KernelContract(bindings, memoryview(b"\x03")).constants == b"\x03"
    assert KernelContract(bindings, np.array([7], np.uint32)).constants == b"\x07\x00\x00\x00"
    assert KernelContract(bindings, Constants().u8(9)).constants == b"\x09"


def test_kernel_sources_and_records_check_their_fields() -> None:
    with pytest.raises(ContractError, match="cxx"):
        KernelSource(cxx=b"__global__ void k() {}")  # type: ignore[arg-type]
    with pytest.raises(ContractError, match="binary"):
        KernelSource(binary=5)  # type: ignore[arg-type]
    with pytest.raises(ContractError, match="binary"):
        KernelSource(binary={"sm_90": 5})  # type: ignore[dict-item]
    with pytest.raises(ContractError, match="callable"):
        KernelSource(host="fn")  # type: ignore[arg-type]
    contract, domain = KernelContract([Binding(4, R)]), Domain("d")
    with pytest.raises(ContractError, match="kernel name"):
        GpuKernel("", (1,), (1,), contract, _kernel_source(), "sim", domain)
    with pytest.raises(ContractError, match="block"):
        GpuKernel("k", (1,), 64, contract, _kernel_source(), "sim", domain)  # type: ignore[arg-type]
    with pytest.raises(ContractError, match="domain"):
        GpuKernel("k", (1,), (1,), contract, _kernel_source(), "sim", "d")  # type: ignore[arg-type]
    with pytest.raises(ContractError, match="NPU columns"):
        NpuKernel("k", 0, 0, contract, _kernel_source(), "sim", domain)
    kernel = GpuKernel("k", [np.int64(2)], (8, 8), contract, _kernel_source(), "sim", domain)  # type: ignore[arg-type]
    assert (kernel.grid, kernel.block) == ((2, 1, 1), (8, 8, 1))


def test_placements_built_directly_are_checked() -> None:
    with pytest.raises(ContractError, match="PlacementKind"):
        Placement("gpu_local")  # type: ignore[arg-type]
    with pytest.raises(ContractError, match="NPU index"):
        Placement(PlacementKind.NPU_LOCAL)
    with pytest.raises(ContractError, match="belongs to no NPU"):
        Placement(PlacementKind.GPU_LOCAL, 0)
    assert Placement(PlacementKind.SHARED, 1) == shared(1)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_submissions": True},
        {"max_submissions": 0},
        {"max_submissions": 2.0},
        {"backend": 5},
        {"backend": ""},
        {"backend": None},
        {"npu": "tpu"},
        {"npu": np.array(["auto", "sim"])},
        {"memory_budget": 0},
        {"memory_budget": 1.5},
        {"device": -1},
        {"device": "0"},
        {"sim_npus": -1},
        {"sim_npus": 65},
        {"sim_npus": None},
        {"label": 5},
    ],
)
def test_runtime_constructor_checks_every_argument(kwargs: dict[str, object]) -> None:
    with pytest.raises(ContractError) as info:
        hrx.Runtime(**kwargs)  # type: ignore[arg-type]
    assert next(iter(kwargs)) in str(info.value)


# -- through a sim runtime ------------------------------------------------------------------


def test_an_unknown_backend_name_is_refused_at_construction() -> None:
    with pytest.raises(
        ContractError, match="backend must be one of auto, sim, cuda, hip; got 'nope'"
    ):
        hrx.Runtime(backend="nope")


@pytest.mark.anyio
async def test_an_unknown_hrx_backend_is_refused_when_opening(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HRX_BACKEND", "opencl")
    runtime = hrx.Runtime()  # "auto" reads HRX_BACKEND when it opens
    with pytest.raises(ContractError, match="HRX_BACKEND must be one of"):
        async with runtime:
            pass


@pytest.mark.anyio
async def test_allocation_beyond_memory_is_a_backend_error_and_changes_nothing() -> None:
    async with hrx.Runtime(backend="sim") as rt:
        before = rt.statistics().to_dict()
        with pytest.raises(BackendError, match="out of memory") as info:
            rt.allocate(2**62, HOST_VISIBLE)
        assert (info.value.backend, info.value.operation) == ("sim", "allocate")
        with pytest.raises(ContractError, match="allocation size"):
            rt.allocate(2**62 + 1, GPU_LOCAL)
        with pytest.raises(ContractError, match="allocation size"):
            rt.allocate(2**64, GPU_LOCAL)
        with pytest.raises(ContractError, match="label"):
            rt.allocate(64, GPU_LOCAL, label=5)  # type: ignore[arg-type]
        assert rt.statistics().to_dict() == before
    async with hrx.Runtime(backend="sim", memory_budget=2**62) as rt:
        with pytest.raises(BackendError, match="out of memory"):
            rt.allocate(2**62, HOST_VISIBLE)
        budget = rt.memory_budget
        assert budget is not None and budget.reserved_bytes == 0
        assert rt.allocate(np.int64(64), HOST_VISIBLE).nbytes == 64  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_mapping_a_hand_built_view_stays_inside_the_buffer() -> None:
    async with hrx.Runtime(backend="sim") as rt:
        first = rt.allocate(64, HOST_VISIBLE)
        second = rt.allocate(64, HOST_VISIBLE)
        with first.map_write_nowait() as memory:
            memory[:] = bytes(64)
        with pytest.raises(ContractError):
            View(first, 32, 64).map_write_nowait()
        with pytest.raises(ContractError):
            async with View(first, 0, 4.5).map_read():  # type: ignore[arg-type]
                pass
        async with second.map_read() as memory:
            assert bytes(memory) == bytes(64)


@pytest.mark.anyio
async def test_load_gpu_kernel_checks_shapes_and_options() -> None:
    async with hrx.Runtime(backend="sim") as rt:
        contract = KernelContract([Binding(4, R)])
        source = _kernel_source()
        for grid, block in ((5, (1,)), ((1,), None), ((True,), (1,)), ((1,), {8})):
            with pytest.raises(ContractError, match=r"grid|block"):
                rt.load_gpu_kernel(source, "k", grid, block, contract)  # type: ignore[arg-type]
        for extra in ({"shared_bytes": True}, {"shared_bytes": -1}, {"defines": 5}):
            with pytest.raises(ContractError, match=next(iter(extra))):
                rt.load_gpu_kernel(source, "k", (1,), (1,), contract, **extra)  # type: ignore[arg-type]
        with pytest.raises(ContractError, match="defines"):
            rt.load_gpu_kernel(source, "k", (1,), (1,), contract, defines={"N": True})
        with pytest.raises(ContractError, match="kernel name"):
            rt.load_gpu_kernel(source, 5, (1,), (1,), contract)  # type: ignore[arg-type]
        kernel = rt.load_gpu_kernel(
            source, "k", (np.int64(2),), [64], contract, defines={"N": np.int32(3)}
        )
        assert (kernel.grid, kernel.block) == ((2, 1, 1), (64, 1, 1))


@pytest.mark.anyio
async def test_foreign_freed_and_misplaced_memory_give_clear_errors() -> None:
    async with hrx.Runtime(backend="sim") as rt, hrx.Runtime(backend="sim") as other:
        host = rt.allocate(64, HOST_VISIBLE)
        device = rt.allocate(64, GPU_LOCAL)
        foreign = other.allocate(64, HOST_VISIBLE)
        contract = KernelContract([Binding(64, R), Binding(32, W)])
        kernel = rt.load_gpu_kernel(_kernel_source(), "k", (1,), (1,), contract)
        npu_kernel = rt.npu(0).load_artifact(_kernel_source(), "n", 1, contract)
        graph = rt.graph("g")
        graph.fill(device.view(), 0)
        with unchanged(graph, "another runtime"):
            graph.copy(device.view(), foreign.view())
        with unchanged(graph, "another runtime"):
            graph.gpu(kernel, [device.view(), foreign[0:32]])
        with unchanged(graph, "at least 32 bytes"):
            graph.gpu(kernel, [device.view(), host[0:16]])
        with unchanged(graph, "takes 2 views"):
            graph.gpu(kernel, [device.view()])
        with unchanged(graph, r"use npu_local\(0\) or shared\(0\)"):
            graph.npu(npu_kernel, [device.view(), host[0:32]])
        with unchanged(graph, "not host-mappable"):
            graph.host(_no_op, [(device.view(), R)])
        with pytest.raises(Unsupported, match="cannot be host-mapped"):
            device.map_read_nowait()
        stale = host[0:8]
        host.free()
        with pytest.raises(ContractError, match="was freed"):
            stale.map_read_nowait()
        with pytest.raises(ContractError, match="was freed"):
            async with stale.map_write():
                pass
        with unchanged(graph, "was freed"):
            graph.fill(stale, 1)
        with pytest.raises(ContractError, match="was freed"):
            host[0:4]
        with pytest.raises(ContractError, match="NPU 3"):
            rt.allocate(64, npu_local(3))
        assert len(graph) == 1


# -- garbage in, HrxError out ---------------------------------------------------------------

GARBAGE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.binary(max_size=4),
    st.lists(st.integers(-3, 300), max_size=4),
    st.tuples(st.integers(-3, 300)),
    st.sets(st.integers(0, 3), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    st.sampled_from(
        [
            object(),
            np.int64(7),
            np.uint8(200),
            np.float32(1.5),
            np.bool_(True),
            np.array([1, 2]),
            np.array(3),
            Access.READ,
            Access.READ_WRITE,
            Lane.COMPUTE,
            Lane.NPU,
            GPU_LOCAL,
            shared(0),
            PlacementKind.SHARED,
            slice(1, 3),
            slice(np.array([1]), None),
            _no_op,
            Binding(4, R),
            Constants().u32(1),
            b"",
            (),
            [],
        ]
    ),
)


def either(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A valid argument most of the time, garbage otherwise."""
    return st.one_of(valid, GARBAGE)


def _is_int(value: object, minimum: int) -> bool:
    return type(value) is int and value >= minimum


def _is_dims(value: object) -> bool:
    return isinstance(value, tuple) and len(value) == 3 and all(_is_int(v, 1) for v in value)


def well_formed(result: object) -> None:
    """What a call that accepted its arguments must have made: canonical, in-range fields."""
    if isinstance(result, View):
        assert _is_int(result.offset, 0) and _is_int(result.nbytes, 1)
        assert result.end <= result.buffer.nbytes and not result.buffer.freed
    elif isinstance(result, Buffer):
        assert _is_int(result.nbytes, 1) and isinstance(result.label, str)
        well_formed(result.placement)
        well_formed(result.domain)
    elif isinstance(result, Placement):
        assert isinstance(result.kind, PlacementKind)
        if result.kind in (PlacementKind.GPU_LOCAL, PlacementKind.HOST_VISIBLE):
            assert result.npu is None
        else:
            assert _is_int(result.npu, 0)
    elif isinstance(result, Domain):
        assert isinstance(result.label, str)
    elif isinstance(result, MemoryBudget):
        assert _is_int(result.limit, 1) and _is_int(result.reserved_bytes, 0)
    elif isinstance(result, Binding):
        assert _is_int(result.nbytes, 1) and isinstance(result.access, Access)
        assert _is_int(result.alignment, 1) and result.alignment & (result.alignment - 1) == 0
        assert isinstance(result.layout, str)
    elif isinstance(result, KernelContract):
        assert result.bindings and all(isinstance(b, Binding) for b in result.bindings)
        assert type(result.constants) is bytes
    elif isinstance(result, KernelSource):
        assert result.cxx is None or isinstance(result.cxx, str)
        assert result.host is None or callable(result.host)
        assert all(isinstance(k, str) for k in result.binary)
    elif isinstance(result, GpuKernel | NpuKernel):
        assert isinstance(result.name, str) and result.name
        well_formed(result.contract)
        well_formed(result.source)
        well_formed(result.domain)
        if isinstance(result, GpuKernel):
            assert _is_dims(result.grid) and _is_dims(result.block)
            assert _is_int(result.shared_bytes, 0)
        else:
            assert _is_int(result.npu, 0) and _is_int(result.columns, 1)
    elif isinstance(result, Graph):
        assert isinstance(result.label, str)
        well_formed(result.domain)
    elif isinstance(result, hrx.Runtime):
        assert _is_int(result.max_submissions, 1)
        assert isinstance(result._backend_name, str) and result._backend_name
        assert result._npu_mode in ("auto", "sim", None)
        assert all(_is_int(d, 0) for d in result._devices) and _is_int(result._sim_npus, 0)
        assert result.memory_budget is None or _is_int(result.memory_budget.limit, 1)
        well_formed(result.domain)
    elif isinstance(result, tuple):
        assert _is_dims(result)


def only_hrx_errors(call: Callable[[], object]) -> bool:
    """Run `call`: True when it raised an HrxError; anything else it raises fails the test,
    and what it returns must be well formed."""
    try:
        result = call()
    except HrxError:
        return True
    except Exception as exc:
        pytest.fail(f"raised {type(exc).__name__}: {exc}")
    well_formed(result)
    return False


GARBAGE_SETTINGS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@given(st.data())
@GARBAGE_SETTINGS
def test_memory_constructors_and_methods_refuse_garbage(data: st.DataObject) -> None:
    owner = Owner()
    buffer = Buffer(owner, 64, HOST_VISIBLE, storage=object())
    draw = data.draw
    small = st.integers(-2, 70)
    calls: list[Callable[[], object]] = [
        lambda: View(draw(either(st.just(buffer))), draw(either(small)), draw(either(small))),
        lambda: buffer.view(draw(either(small)), draw(either(small | st.none()))),
        lambda: buffer.view().slice(draw(either(small)), draw(either(small | st.none()))),
        lambda: buffer[draw(either(st.builds(slice, small | st.none(), small | st.none())))],
        lambda: Buffer(
            draw(either(st.just(owner))),
            draw(either(small)),
            draw(either(st.just(GPU_LOCAL))),
            None,
            draw(either(st.text(max_size=3))),
        ),
        lambda: Placement(draw(either(st.sampled_from(PlacementKind))), draw(either(small))),
        lambda: npu_local(draw(GARBAGE)),
        lambda: shared(draw(GARBAGE)),
        lambda: Domain(draw(either(st.text(max_size=3)))),
    ]
    call = calls[draw(st.integers(0, len(calls) - 1))]
    only_hrx_errors(call)
    budget = MemoryBudget(100)
    budget.charge(40)
    for method in (budget.charge, budget.release):
        if only_hrx_errors(lambda method=method: method(draw(either(st.integers(-5, 120))))):
            assert budget.reserved_bytes == 40
        else:
            assert _is_int(budget.reserved_bytes, 0) and budget.reserved_bytes != 40
        if budget.reserved_bytes:  # back to 40 through the budget's own methods
            budget.release(budget.reserved_bytes)
        budget.charge(40)
    only_hrx_errors(lambda: MemoryBudget(draw(GARBAGE)))


@given(st.data())
@GARBAGE_SETTINGS
def test_contract_and_kernel_constructors_refuse_garbage(data: st.DataObject) -> None:
    draw = data.draw
    domain = Domain("d")
    contract = KernelContract([Binding(4, R)])
    source = _kernel_source()
    dims = st.lists(st.integers(0, 4), min_size=0, max_size=4)
    calls: list[Callable[[], object]] = [
        lambda: Binding(
            draw(either(st.integers(-1, 64))),
            draw(either(st.sampled_from(Access))),
            draw(either(st.sampled_from([1, 2, 3, 4, 16]))),
            draw(either(st.text(max_size=3))),
        ),
        lambda: KernelContract(
            draw(either(st.lists(st.just(Binding(4, W)), max_size=2))),
            draw(either(st.binary(max_size=4))),
        ),
        lambda: check_dims("grid", draw(either(dims))),
        lambda: KernelSource(
            draw(either(st.none() | st.just("k"))),
            draw(either(st.none() | st.just(_no_op))),
            draw(either(st.just({}) | st.just({"sm_90": "k.cubin"}))),
        ),
        lambda: GpuKernel(
            draw(either(st.just("k"))),
            draw(either(dims)),
            draw(either(dims)),
            draw(either(st.just(contract))),
            draw(either(st.just(source))),
            draw(either(st.just("sim"))),
            draw(either(st.just(domain))),
            None,
            draw(either(st.integers(-1, 64))),
        ),
        lambda: NpuKernel(
            draw(either(st.just("k"))),
            draw(either(st.integers(-1, 2))),
            draw(either(st.integers(-1, 9))),
            draw(either(st.just(contract))),
            draw(either(st.just(source))),
            draw(either(st.just("sim-npu"))),
            draw(either(st.just(domain))),
        ),
    ]
    only_hrx_errors(calls[draw(st.integers(0, len(calls) - 1))])


@given(st.data())
@GARBAGE_SETTINGS
def test_graph_methods_refuse_garbage_and_change_nothing(data: st.DataObject) -> None:
    draw = data.draw
    owner = Owner("g")
    gpu = Buffer(owner, 128, GPU_LOCAL, storage=object())
    host = Buffer(owner, 128, HOST_VISIBLE, storage=object())
    npu = Buffer(owner, 128, npu_local(0), storage=object())
    contract = KernelContract([Binding(64, R), Binding(64, W)])
    kernel = GpuKernel("k", (1,), (1,), contract, _kernel_source(), "sim", owner.domain)
    npu_kernel = NpuKernel("n", 0, 1, contract, _kernel_source(), "sim-npu", owner.domain)
    graph = Graph(owner.domain, "g")
    graph.fill(gpu.view(), 3)
    graph.copy(gpu.view(), host.view())
    views = st.sampled_from([gpu[0:64], gpu[64:128], host[0:64], host[64:128], npu[0:64]])
    view_lists = st.lists(views, max_size=3)
    accesses = st.lists(st.tuples(views, st.sampled_from(Access)), max_size=3)
    calls: list[Callable[[], object]] = [
        lambda: graph.fill(draw(either(views)), draw(either(st.integers(-1, 256)))),
        lambda: graph.copy(
            draw(either(views)), draw(either(views)), draw(either(st.sampled_from(Lane)))
        ),
        lambda: graph.gpu(
            draw(either(st.just(kernel))), draw(either(view_lists)), draw(either(st.booleans()))
        ),
        lambda: graph.npu(draw(either(st.just(npu_kernel))), draw(either(view_lists))),
        lambda: graph.host(draw(either(st.just(_no_op))), draw(either(accesses))),
        lambda: Graph(
            draw(either(st.just(owner.domain))),
            draw(either(st.text(max_size=3))),
            draw(either(st.none())),
        ),
    ]
    before = (len(graph), graph.nodes, graph.plan())
    if only_hrx_errors(calls[draw(st.integers(0, len(calls) - 1))]):
        assert (len(graph), graph.nodes, graph.plan()) == before
    else:
        for node in graph.nodes[len(before[1]) :]:
            for view, access in node.accesses:
                well_formed(view)
                assert view.buffer.domain is owner.domain and isinstance(access, Access)


@pytest.mark.parametrize("event_loop", ["asyncio", "trio"])
def test_runtime_entry_points_refuse_garbage(event_loop: str) -> None:
    # Runtime methods are synchronous: hypothesis runs them inside one open runtime.
    async def main() -> None:
        async with hrx.Runtime(backend="sim", memory_budget=1 << 20) as rt:
            contract = KernelContract([Binding(4, R)])
            host = rt.allocate(64, HOST_VISIBLE)

            @given(st.data())
            @GARBAGE_SETTINGS
            def calls(data: st.DataObject) -> None:
                draw = data.draw
                before = rt.statistics().to_dict()
                which = draw(st.integers(0, 4))
                if which == 0:
                    placements = st.sampled_from([GPU_LOCAL, HOST_VISIBLE, npu_local(0)])
                    result: list[Any] = []
                    raised = only_hrx_errors(
                        lambda: result.append(
                            rt.allocate(
                                draw(either(st.integers(-2, 2 << 20))),
                                draw(either(placements)),
                                draw(either(st.text(max_size=3))),
                            )
                        )
                    )
                    if raised:
                        assert rt.statistics().to_dict() == before
                    for buffer in result:
                        buffer.free()
                    assert rt.memory_budget is not None
                    assert rt.memory_budget.reserved_bytes == 64
                elif which == 1:
                    dims = st.lists(st.integers(1, 4), min_size=1, max_size=3)
                    only_hrx_errors(
                        lambda: rt.load_gpu_kernel(
                            draw(either(st.just(_kernel_source()))),
                            draw(either(st.just("k"))),
                            draw(either(dims)),
                            draw(either(dims)),
                            draw(either(st.just(contract))),
                            draw(either(st.none() | st.just({"N": 4}))),
                            draw(either(st.integers(0, 64))),
                        )
                    )
                elif which == 2:
                    graph = rt.graph("g")
                    only_hrx_errors(lambda: graph.fill(draw(GARBAGE), draw(GARBAGE)))
                    assert len(graph) == 0
                elif which == 3:
                    write = draw(st.booleans())
                    target = draw(either(st.just(host.view())))
                    mapping: list[HostMapping] = []

                    def map_nowait() -> None:
                        view = target if isinstance(target, View) else View(target, 0, 1)
                        mapping.append(view.map_write_nowait() if write else view.map_read_nowait())

                    only_hrx_errors(map_nowait)
                    for held in mapping:
                        held.close()
                else:
                    only_hrx_errors(
                        lambda: rt.npu(0).load_artifact(
                            draw(either(st.just(_kernel_source()))),
                            draw(either(st.just("n"))),
                            draw(either(st.integers(1, 8))),
                            draw(either(st.just(contract))),
                        )
                    )
                assert rt._mapping_count == 0

            calls()

    anyio.run(main, backend=event_loop)


@given(
    backend=either(st.sampled_from(["auto", "sim"])),
    npu=either(st.sampled_from(["auto", "sim", None])),
    memory_budget=either(st.none() | st.integers(1, 100)),
    max_submissions=either(st.integers(1, 100)),
    device=either(st.integers(0, 3)),
    sim_npus=either(st.integers(0, 64)),
    label=either(st.text(max_size=3)),
)
@GARBAGE_SETTINGS
def test_runtime_constructor_refuses_garbage(**kwargs: Any) -> None:
    only_hrx_errors(lambda: hrx.Runtime(**kwargs))


# -- closing with live mappings -------------------------------------------------------------


@pytest.mark.anyio
async def test_closing_invalidates_a_held_nowait_mapping() -> None:
    async with hrx.Runtime(backend="sim") as rt:
        buffer = rt.allocate(16, HOST_VISIBLE)
        mapping = buffer.map_write_nowait()
        memory = mapping.memory
        memory[0] = 1
        reader = rt.allocate(16, HOST_VISIBLE)[8:16].map_read_nowait()
    assert buffer.freed
    with pytest.raises(ValueError, match="released memoryview"):
        memory[0] = 2
    with pytest.raises(ValueError, match="released memoryview"):
        bytes(reader.memory)
    with pytest.raises(RuntimeClosed, match="runtime closed"):
        mapping.__enter__()
    mapping.close()  # ending it afterwards is harmless
    mapping.close()
    reader.close()
    with pytest.raises(ContractError, match="was freed"):
        buffer.map_read_nowait()
    with pytest.raises(RuntimeClosed):
        View.map_read_nowait(reader.view)


@pytest.mark.anyio
async def test_storage_reachable_from_a_mapping_is_not_freed_under_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    freed: list[int] = []
    async with hrx.Runtime(backend="sim") as rt:
        backend = rt._backend
        assert backend is not None
        free = backend.free

        def recording_free(storage: Any) -> None:
            freed.append(id(storage))
            free(storage)

        monkeypatch.setattr(backend, "free", recording_free)
        kept = rt.allocate(16, HOST_VISIBLE)
        kept_storage = id(kept.storage)
        part = kept.map_write_nowait().memory[4:8]  # a slice outlives the mapping's release
        other = rt.allocate(16, HOST_VISIBLE)
        with other.map_write_nowait() as memory:
            array = np.frombuffer(memory, dtype=np.uint8)
        other_storage = id(other.storage)
        other.free()
        assert other_storage not in freed, "freed while a numpy array still reaches it"
        del array
        gc.collect()
        assert other_storage in freed
        plain = rt.allocate(16, HOST_VISIBLE)
        plain_storage = id(plain.storage)
        with plain.map_write_nowait() as memory:
            memory[:] = bytes(16)
        plain.free()
        assert plain_storage in freed, "nothing reaches it: freed at once"
    assert kept.freed and kept_storage not in freed
    part[0] = 7  # still the buffer's (unfreed) storage
    del part
    gc.collect()
    assert kept_storage in freed


@pytest.mark.anyio
async def test_leaving_normally_waits_for_mappings_held_by_other_tasks() -> None:
    events: list[str] = []
    completions: list[hrx.Completion] = []
    async with anyio.create_task_group() as tg:
        async with hrx.Runtime(backend="sim") as rt:
            buffer = rt.allocate(16, HOST_VISIBLE)
            graph = rt.graph("fill")
            graph.fill(buffer[8:16], 9)
            prepared = graph.prepare()
            entered = anyio.Event()

            async def writer() -> None:
                async with buffer[0:8].map_write() as memory:
                    entered.set()
                    await anyio.sleep(0.05)
                    memory[:] = bytes(range(8))
                    events.append("written")
                # Work submitted after the mapping ends still runs before the close.
                completions.append(prepared.submit())
                events.append("released")

            tg.start_soon(writer)
            await entered.wait()
        events.append("closed")
        assert buffer.freed
    assert events == ["written", "released", "closed"]
    assert completions[0].done() and completions[0].exception() is None


@pytest.mark.anyio
async def test_leaving_normally_waits_for_a_gpu_access_block() -> None:
    events: list[str] = []
    async with anyio.create_task_group() as tg:
        async with hrx.Runtime(backend="sim") as rt:
            buffer = rt.allocate(16, HOST_VISIBLE)
            entered = anyio.Event()

            async def native() -> None:
                async with rt.gpu_access([(buffer.view(), Access.WRITE)]) as access:
                    entered.set()
                    await anyio.sleep(0.05)
                    events.append("used")
                    del access
                events.append("left")

            tg.start_soon(native)
            await entered.wait()
        events.append("closed")
    assert events == ["used", "left", "closed"]


@pytest.mark.anyio
async def test_leaving_with_an_exception_invalidates_mappings_of_other_tasks() -> None:
    outcome: list[str] = []
    go = anyio.Event()
    entered = anyio.Event()
    async with anyio.create_task_group() as tg:
        with pytest.raises(RuntimeError, match="boom"):
            async with hrx.Runtime(backend="sim") as rt:
                buffer = rt.allocate(16, HOST_VISIBLE)

                async def writer() -> None:
                    async with buffer.map_write() as memory:
                        entered.set()
                        await go.wait()
                        try:
                            memory[0] = 1
                        except ValueError:
                            outcome.append("released")
                    outcome.append("ended")

                tg.start_soon(writer)
                await entered.wait()
                raise RuntimeError("boom")
        assert buffer.freed and outcome == []
        go.set()
    assert outcome == ["released", "ended"]


@pytest.mark.anyio
async def test_cancelling_the_wait_for_mappings_closes_and_invalidates() -> None:
    held = anyio.Event()
    stop = anyio.Event()
    memories: list[memoryview] = []
    async with anyio.create_task_group() as tg:
        with anyio.move_on_after(0.5) as scope:
            async with hrx.Runtime(backend="sim") as rt:
                buffer = rt.allocate(16, HOST_VISIBLE)

                async def holder() -> None:
                    async with buffer.map_read() as memory:
                        memories.append(memory)
                        held.set()
                        await stop.wait()

                tg.start_soon(holder)
                await held.wait()
        assert scope.cancelled_caught and len(memories) == 1
        assert buffer.freed
        with pytest.raises(ValueError, match="released memoryview"):
            bytes(memories[0])
        stop.set()


@pytest.mark.anyio
async def test_an_async_mapping_left_open_by_the_closing_task_does_not_hang_the_close() -> None:
    with anyio.fail_after(5):
        async with hrx.Runtime(backend="sim") as rt:
            buffer = rt.allocate(16, HOST_VISIBLE)
            mapping = buffer.map_write()
            memory = await mapping.__aenter__()
            memory[0] = 1
    with pytest.raises(ValueError, match="released memoryview"):
        memory[0] = 2
    await mapping.__aexit__(None, None, None)


@pytest.mark.anyio
async def test_runtime_queries_refuse_garbage() -> None:
    async with hrx.Runtime(backend="sim") as rt:
        with pytest.raises(ContractError):
            rt.npu(True)  # type: ignore[arg-type]
        with pytest.raises(ContractError):
            rt.owns(5)  # type: ignore[arg-type]
        with pytest.raises(ContractError):
            rt.same_domain(5)  # type: ignore[arg-type]
        with pytest.raises(ContractError):
            async with rt.gpu_access(5):  # type: ignore[arg-type]
                pass


@pytest.mark.anyio
async def test_another_runtime_with_the_same_label_is_named_apart() -> None:
    async with hrx.Runtime(backend="sim") as rt, hrx.Runtime(backend="sim") as other:
        foreign = other.allocate(64, HOST_VISIBLE)
        graph = rt.graph("g")
        with pytest.raises(ContractError) as info:
            graph.fill(foreign.view(), 0)
        message = str(info.value)
        theirs = f"runtime #{other.domain.ident}"
        ours = f"runtime #{rt.domain.ident}"
        assert f"belongs to another runtime ({theirs}); this one is {ours}" in message
    async with (
        hrx.Runtime(backend="sim", label="a") as rt,
        hrx.Runtime(backend="sim", label="b") as other,
    ):
        with pytest.raises(ContractError, match=r"another runtime \(b\); this one is a$"):
            rt.graph("g").fill(other.allocate(64, HOST_VISIBLE).view(), 0)


@pytest.mark.anyio
async def test_a_graph_replayed_before_its_buffer_is_freed_is_refused_after() -> None:
    """Replays look at their buffers again only once some buffer was freed: a graph that
    replayed many times must still be refused the moment one of its buffers goes."""
    async with hrx.Runtime(backend="sim", npu=None) as rt:
        kept = rt.allocate(64, HOST_VISIBLE)
        target = rt.allocate(64, HOST_VISIBLE)
        graph = rt.graph("replayed")
        graph.fill(kept.view(), 1)
        graph.fill(target.view(), 2)
        prepared = graph.prepare()
        for _ in range(3):
            await prepared.submit()
        rt.allocate(16, HOST_VISIBLE).free()  # some other buffer: replays go on
        await prepared.submit()
        submissions = rt.statistics().submissions
        target.free()
        for _ in range(2):  # refused every time, not only on the first look
            with pytest.raises(ContractError, match="was freed"):
                prepared.submit()
        assert rt.statistics().submissions == submissions  # nothing admitted
        other = rt.graph("other")
        other.fill(kept.view(), 3)
        await other.prepare().submit()  # a graph over live buffers only still runs
        async with kept.map_read() as memory:
            assert bytes(memory) == b"\x03" * 64
