"""The CUDA and HIP driver tables offer the same operations, shaped as `DriverTable` says.

The stream backend is written once over `DriverTable`; an operation added to
one GPU API's table and not the other's would make the two backends drift.
The classes are compared without a GPU and without their bindings: nothing is
instantiated.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

from hrx_async._core.dlpack import DLPACK_CUDA, DLPACK_ROCM
from hrx_async.backends._stream_driver import DriverTable
from hrx_async.backends.cuda import CudaTable
from hrx_async.backends.hip import HipTable

TABLES: dict[str, type[Any]] = {"cuda": CudaTable, "hip": HipTable}
PROTOCOL_ATTRIBUTES = ("name", "dlpack_device_type")


def operations(cls: type[Any]) -> dict[str, Callable[..., Any]]:
    """The public methods a class defines or inherits (protocol machinery excluded)."""
    found: dict[str, Callable[..., Any]] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or klass.__module__ == "typing":
            continue
        for name, value in vars(klass).items():
            if not name.startswith("_") and inspect.isfunction(value):
                found[name] = value
    return found


def parameter_shape(function: Callable[..., Any]) -> tuple[list[str], int]:
    """(parameter kinds after self, how many have defaults): what a call site depends on."""
    params = list(inspect.signature(function).parameters.values())[1:]
    kinds = [param.kind.name for param in params]
    defaults = sum(param.default is not inspect.Parameter.empty for param in params)
    return kinds, defaults


def test_both_tables_offer_exactly_the_same_operations() -> None:
    cuda, hip = operations(CudaTable), operations(HipTable)
    only_cuda = sorted(set(cuda) - set(hip))
    only_hip = sorted(set(hip) - set(cuda))
    assert (only_cuda, only_hip) == ([], [])


def test_every_protocol_operation_is_in_both_tables() -> None:
    protocol = operations(DriverTable)
    assert len(protocol) > 30  # the protocol's methods were found, not nothing
    for backend, table in TABLES.items():
        missing = sorted(set(protocol) - set(operations(table)))
        assert missing == [], f"{backend} table lacks {missing}"


@pytest.mark.parametrize("operation", sorted(operations(DriverTable)))
def test_each_operation_takes_what_the_protocol_passes(operation: str) -> None:
    expected = parameter_shape(operations(DriverTable)[operation])
    for backend, table in TABLES.items():
        got = parameter_shape(operations(table)[operation])
        assert got == expected, f"{backend}.{operation}: {got}, protocol: {expected}"


def test_operations_beyond_the_protocol_have_the_same_shape_in_both() -> None:
    extra = sorted(set(operations(CudaTable)) - set(operations(DriverTable)))
    for operation in extra:
        cuda = parameter_shape(operations(CudaTable)[operation])
        hip = parameter_shape(operations(HipTable)[operation])
        assert cuda == hip, f"{operation}: cuda {cuda}, hip {hip}"


def test_each_table_names_itself_and_its_dlpack_device() -> None:
    for table in TABLES.values():
        for attribute in PROTOCOL_ATTRIBUTES:
            assert attribute in vars(table), f"{table.__name__} lacks {attribute}"
    assert (CudaTable.name, CudaTable.dlpack_device_type) == ("cuda", DLPACK_CUDA)
    assert (HipTable.name, HipTable.dlpack_device_type) == ("hip", DLPACK_ROCM)


def test_the_comparison_notices_an_operation_added_to_one_table() -> None:
    class Grown(HipTable):
        def stream_priority(self, stream: Any) -> int:
            return 0

    class Reshaped(HipTable):
        def event_record(self, event: Any) -> None:  # type: ignore[override]
            pass

    assert set(operations(Grown)) - set(operations(CudaTable)) == {"stream_priority"}
    protocol_shape = parameter_shape(operations(DriverTable)["event_record"])
    assert parameter_shape(operations(Reshaped)["event_record"]) != protocol_shape
