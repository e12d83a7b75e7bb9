"""Tests of placements, buffers, views and the memory budget.

Most tests need no event loop: buffers are made directly with a tiny owner that stands in
for the runtime (it owns a domain and marks buffers released; nothing under test is
replaced). The last tests open a sim `Runtime` to check the same rules where users meet them.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hrx_async as hrx
from hrx_async._core.memory import (
    GPU_LOCAL,
    HOST_VISIBLE,
    Buffer,
    Domain,
    HostMapping,
    MemoryBudget,
    Placement,
    View,
    npu_local,
    shared,
)
from hrx_async.errors import BudgetExceeded, Busy, ContractError, Unsupported


class Owner:
    """The least a buffer needs from a runtime: a domain and a way to be released."""

    def __init__(self, label: str = "test") -> None:
        self.domain = Domain(label)
        self.released: list[Buffer] = []

    def _release_buffer(self, buffer: Buffer) -> None:
        self.released.append(buffer)
        buffer._mark_released()

    def _map(self, view: View, write: bool, wait: bool) -> AbstractAsyncContextManager[memoryview]:
        raise NotImplementedError("pure tests do not map")

    def _map_nowait(self, view: View, write: bool) -> HostMapping:
        raise NotImplementedError("pure tests do not map")


def make_buffer(nbytes: int = 64, placement: Placement = GPU_LOCAL) -> Buffer:
    return Buffer(Owner(), nbytes, placement, storage=object())


# -- placements --------------------------------------------------------------------------


def test_placement_rules() -> None:
    npu0, sh0 = npu_local(0), shared(0)
    assert [p.host_mappable for p in (GPU_LOCAL, HOST_VISIBLE, npu0, sh0)] == [
        False,
        True,
        True,
        True,
    ]
    assert [p.gpu_bindable for p in (GPU_LOCAL, HOST_VISIBLE, npu0, sh0)] == [
        True,
        True,
        False,
        True,
    ]
    assert [p.npu_bindable(0) for p in (GPU_LOCAL, HOST_VISIBLE, npu0, sh0)] == [
        False,
        False,
        True,
        True,
    ]
    assert not npu0.npu_bindable(1) and not sh0.npu_bindable(1)
    assert [p.host_side for p in (GPU_LOCAL, HOST_VISIBLE, npu0, sh0)] == [
        False,
        True,
        True,
        False,
    ]
    assert [p.tracked_whole for p in (GPU_LOCAL, HOST_VISIBLE, npu0, sh0)] == [
        False,
        False,
        False,
        True,
    ]


def test_placement_identity_and_names() -> None:
    assert npu_local(2) == npu_local(2) and npu_local(2) != npu_local(1)
    assert npu_local(0) != shared(0)
    assert str(GPU_LOCAL) == "gpu_local" and str(shared(3)) == "shared(3)"
    assert hrx.GPU_LOCAL is GPU_LOCAL and hrx.npu_local is npu_local


@pytest.mark.parametrize("index", [-1, 1.0, True, "0", None])
@pytest.mark.parametrize("factory", [npu_local, shared])
def test_placement_rejects_bad_npu_index(factory: object, index: object) -> None:
    with pytest.raises(ContractError, match="NPU index") as info:
        factory(index)  # type: ignore[operator]
    assert repr(index) in str(info.value)


# -- views -------------------------------------------------------------------------------


def test_whole_view_and_explicit_ranges() -> None:
    buffer = make_buffer(64)
    whole = buffer.view()
    assert (whole.buffer, whole.offset, whole.nbytes, whole.end) == (buffer, 0, 64, 64)
    assert buffer.view(16) == View(buffer, 16, 48)
    assert buffer.view(16, 8) == View(buffer, 16, 8)
    assert buffer.view(nbytes=4) == View(buffer, 0, 4)


def test_slices_are_relative_to_the_parent_view() -> None:
    buffer = make_buffer(64)
    parent = buffer.view(16, 32)
    assert parent.slice(4, 8) == View(buffer, 20, 8)
    assert parent.slice(4) == View(buffer, 20, 28)
    assert parent.slice(4, 8).slice(2, 2) == View(buffer, 22, 2)
    assert parent[4:12] == View(buffer, 20, 8)
    assert parent[:8] == View(buffer, 16, 8)
    assert parent[24:] == View(buffer, 40, 8)
    assert parent[-8:] == View(buffer, 40, 8)
    assert parent[2:-2] == View(buffer, 18, 28)
    assert parent[:] == parent


def test_buffer_byte_slicing() -> None:
    buffer = make_buffer(64)
    assert buffer[8:24] == View(buffer, 8, 16)
    assert buffer[:] == buffer.view()
    assert buffer[-4:] == View(buffer, 60, 4)
    assert buffer[0:64].nbytes == 64


@pytest.mark.parametrize(
    ("offset", "nbytes"),
    [(-1, None), (0, 0), (0, -4), (0, 33), (32, None), (33, None), (31, 2), (1.0, 4), (0, 2.0)],
)
def test_slice_out_of_bounds_or_empty_raises(offset: object, nbytes: object) -> None:
    parent = make_buffer(64).view(16, 32)
    with pytest.raises(ContractError, match="slice") as info:
        parent.slice(offset, nbytes)  # type: ignore[arg-type]
    shown = offset if not isinstance(offset, int) or not 0 <= offset <= 32 else nbytes
    if shown is not None:
        assert repr(shown) in str(info.value)


@pytest.mark.parametrize("nbytes", [0, -8, 65])
def test_buffer_view_bounds(nbytes: int) -> None:
    buffer = make_buffer(64)
    with pytest.raises(ContractError, match="slice length"):
        buffer.view(0, nbytes)
    with pytest.raises(ContractError, match="slice offset"):
        buffer.view(65)


@pytest.mark.parametrize("key", [slice(0, 0), slice(8, 4), slice(0, 65), slice(-65, None)])
def test_byte_slicing_is_bounds_checked_not_clamped(key: slice) -> None:
    # A view names device bytes: silently shortening an out-of-range slice would hand a
    # kernel fewer bytes than the caller asked for, so it is an error instead.
    buffer = make_buffer(64)
    with pytest.raises(ContractError):
        buffer[key]


@pytest.mark.parametrize("key", [slice(0, 8, 2), slice(8, 0, -1), 3, "a"])
def test_byte_slicing_only_contiguous_ranges(key: object) -> None:
    with pytest.raises(ContractError, match="contiguous byte ranges"):
        make_buffer(64).view()[key]  # type: ignore[index]


def test_overlaps() -> None:
    a, b = make_buffer(64), make_buffer(64)
    assert a[0:16].overlaps(a[8:24]) and a[8:24].overlaps(a[0:16])
    assert a[0:16].overlaps(a[0:16])
    assert not a[0:16].overlaps(a[16:32]), "touching ranges do not overlap"
    assert not a[0:16].overlaps(b[0:16]), "ranges of different buffers never overlap"


@given(st.integers(1, 96), st.data())
@settings(max_examples=200, deadline=None)
def test_nested_slices_match_absolute_arithmetic(size: int, data: st.DataObject) -> None:
    buffer = make_buffer(size)
    view = buffer.view()
    start = 0
    for _ in range(data.draw(st.integers(1, 4))):
        offset = data.draw(st.integers(0, view.nbytes - 1))
        nbytes = data.draw(st.integers(1, view.nbytes - offset))
        view = view.slice(offset, nbytes)
        start += offset
        assert (view.offset, view.nbytes) == (start, nbytes)
        assert view.offset >= 0 and view.end <= size


# -- buffers -----------------------------------------------------------------------------


def test_buffer_record() -> None:
    owner = Owner("rt")
    buffer = Buffer(owner, 128, shared(0), storage="native", label="weights")
    other = Buffer(owner, 8, HOST_VISIBLE, storage=None)
    assert (buffer.nbytes, buffer.placement, buffer.storage) == (128, shared(0), "native")
    assert buffer.domain is owner.domain
    assert buffer.ident != other.ident
    assert buffer.label == "weights" and other.label == f"buffer#{other.ident}"
    assert "weights" in repr(buffer) and "128" in repr(buffer)


def test_free_releases_once_and_later_use_is_an_error() -> None:
    owner = Owner()
    buffer = Buffer(owner, 64, GPU_LOCAL, storage=object())
    buffer.check_alive()
    buffer.free()
    buffer.free()
    assert owner.released == [buffer]
    assert buffer.freed and buffer.storage is None
    assert "freed" in repr(buffer)
    with pytest.raises(ContractError, match="was freed"):
        buffer.check_alive()


# -- memory budget -----------------------------------------------------------------------


@pytest.mark.parametrize("limit", [0, -1, True, 1.5, None])
def test_budget_limit_must_be_positive_integer(limit: object) -> None:
    with pytest.raises(ContractError, match="memory budget") as info:
        MemoryBudget(limit)  # type: ignore[arg-type]
    assert repr(limit) in str(info.value)


def test_budget_charge_and_release() -> None:
    budget = MemoryBudget(100)
    budget.charge(60)
    budget.charge(40)
    assert (budget.reserved_bytes, budget.available_bytes) == (100, 0)
    budget.release(30)
    assert (budget.reserved_bytes, budget.available_bytes) == (70, 30)
    budget.charge(30)
    budget.release(100)
    assert budget.reserved_bytes == 0


def test_budget_never_fits_is_budget_exceeded_and_changes_nothing() -> None:
    budget = MemoryBudget(100)
    budget.charge(10)
    with pytest.raises(BudgetExceeded, match="101") as info:
        budget.charge(101)
    assert not isinstance(info.value, Busy)
    assert budget.reserved_bytes == 10


def test_budget_not_now_is_busy_and_changes_nothing() -> None:
    budget = MemoryBudget(100)
    budget.charge(70)
    with pytest.raises(Busy, match="31") as info:
        budget.charge(31)
    assert not isinstance(info.value, BudgetExceeded)
    assert budget.reserved_bytes == 70
    budget.release(1)
    budget.charge(31)
    assert budget.reserved_bytes == 100


@pytest.mark.parametrize("nbytes", [0, -1, -100, 1.5, True, None])
def test_budget_rejects_bad_amounts_and_changes_nothing(nbytes: object) -> None:
    budget = MemoryBudget(100)
    budget.charge(50)
    with pytest.raises(ContractError) as info:
        budget.charge(nbytes)  # type: ignore[arg-type]
    assert repr(nbytes) in str(info.value)
    with pytest.raises(ContractError) as info:
        budget.release(nbytes)  # type: ignore[arg-type]
    assert repr(nbytes) in str(info.value)
    assert budget.reserved_bytes == 50


def test_budget_release_more_than_reserved() -> None:
    budget = MemoryBudget(100)
    budget.charge(20)
    with pytest.raises(ContractError, match="only 20 are reserved"):
        budget.release(21)
    assert budget.reserved_bytes == 20


@given(st.lists(st.tuples(st.booleans(), st.integers(1, 150)), max_size=40))
@settings(max_examples=200, deadline=None)
def test_budget_against_a_counter(steps: list[tuple[bool, int]]) -> None:
    budget = MemoryBudget(100)
    reserved = 0
    for charge, nbytes in steps:
        if charge:
            if nbytes > 100:
                with pytest.raises(BudgetExceeded):
                    budget.charge(nbytes)
            elif reserved + nbytes > 100:
                with pytest.raises(Busy):
                    budget.charge(nbytes)
            else:
                budget.charge(nbytes)
                reserved += nbytes
        elif nbytes > reserved:
            with pytest.raises(ContractError):
                budget.release(nbytes)
        else:
            budget.release(nbytes)
            reserved -= nbytes
        assert budget.reserved_bytes == reserved
        assert budget.available_bytes == 100 - reserved


# -- the same rules through a runtime ----------------------------------------------------


@pytest.mark.anyio
async def test_allocate_rejects_bad_sizes_and_counts_nothing() -> None:
    async with hrx.Runtime(backend="sim") as rt:
        before = rt.statistics().to_dict()
        for nbytes in (0, -1, 1.5, True):
            with pytest.raises(ContractError, match="allocation size") as info:
                rt.allocate(nbytes, GPU_LOCAL)  # type: ignore[arg-type]
            assert repr(nbytes) in str(info.value)
        with pytest.raises(ContractError, match="placement"):
            rt.allocate(64, "gpu_local")  # type: ignore[arg-type]
        with pytest.raises(ContractError, match="NPU 5"):
            rt.allocate(64, npu_local(5))
        assert rt.statistics().to_dict() == before


@pytest.mark.anyio
async def test_allocate_charges_the_budget_and_free_releases_it() -> None:
    async with hrx.Runtime(backend="sim", memory_budget=1000) as rt:
        budget = rt.memory_budget
        assert budget is not None
        first = rt.allocate(600, GPU_LOCAL)
        assert budget.reserved_bytes == 600
        allocations = rt.statistics().allocations
        with pytest.raises(BudgetExceeded):
            rt.allocate(1001, HOST_VISIBLE)
        with pytest.raises(Busy):
            rt.allocate(401, HOST_VISIBLE)
        assert budget.reserved_bytes == 600
        assert rt.statistics().allocations == allocations
        first.free()
        assert budget.reserved_bytes == 0
        assert first.freed
        second = rt.allocate(1000, HOST_VISIBLE)
        assert budget.reserved_bytes == 1000 and rt.owns(second)


@pytest.mark.anyio
async def test_gpu_local_memory_cannot_be_host_mapped() -> None:
    async with hrx.Runtime(backend="sim") as rt:
        device = rt.allocate(64, GPU_LOCAL)
        with pytest.raises(Unsupported, match="cannot be host-mapped"):
            device.map_read_nowait()
        with pytest.raises(Unsupported, match="cannot be host-mapped"):
            async with device.map_write():
                pass
        host = rt.allocate(64, HOST_VISIBLE)
        with host.map_write_nowait() as memory:
            memory[:] = bytes(range(64))
        async with host[8:12].map_read() as memory:
            assert bytes(memory) == bytes(range(8, 12))


@pytest.mark.anyio
async def test_views_of_another_runtime_are_not_owned() -> None:
    async with hrx.Runtime(backend="sim") as first, hrx.Runtime(backend="sim") as second:
        buffer = first.allocate(64, GPU_LOCAL)
        assert first.owns(buffer[0:8]) and not second.owns(buffer[0:8])
        assert not first.same_domain(second) and first.same_domain(first)
