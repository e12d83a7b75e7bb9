"""Statistics snapshots and the Counters helpers the runtime relies on."""

import dataclasses
import json

import pytest

from hrx_async._core.counters import Counters
from hrx_async._core.lane import Lane
from hrx_async._core.stats import FIELD_NAMES, Statistics
from hrx_async.errors import ContractError

EXPECTED_ORDER = [
    "native_graphs_prepared",
    "copy_streams_created",
    "allocations",
    "imports",
    "submissions",
    "completions",
    "copied_bytes",
    "uploaded_bytes",
    "downloaded_bytes",
    "device_copied_bytes",
    "cache_maintenance_bytes",
    "live_bytes",
    "peak_bytes",
    "host_copied_bytes",
]


def distinct_statistics() -> Statistics:
    # Distinct values per field, so a swapped key/value pair cannot go unnoticed.
    return Statistics(**{name: (index + 1) * 10 for index, name in enumerate(EXPECTED_ORDER)})


def test_fields_are_the_14_counters_in_order() -> None:
    assert [field.name for field in dataclasses.fields(Statistics)] == EXPECTED_ORDER
    assert list(FIELD_NAMES) == EXPECTED_ORDER


def test_statistics_is_frozen() -> None:
    stats = Statistics()
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.allocations = 1  # type: ignore[misc]


def test_to_dict_keeps_order_and_values() -> None:
    stats = distinct_statistics()
    as_dict = stats.to_dict()
    assert list(as_dict) == EXPECTED_ORDER
    for name in EXPECTED_ORDER:
        assert as_dict[name] == getattr(stats, name)


def test_to_json_is_compact_and_ordered() -> None:
    stats = distinct_statistics()
    text = stats.to_json()
    assert " " not in text
    decoded = json.loads(text)
    assert list(decoded) == EXPECTED_ORDER
    assert decoded == stats.to_dict()
    positions = [text.index(f'"{name}"') for name in EXPECTED_ORDER]
    assert positions == sorted(positions)


def test_counters_start_at_zero_and_use_slots() -> None:
    counters = Counters()
    assert counters.snapshot() == Statistics()
    assert not hasattr(counters, "__dict__")
    with pytest.raises(AttributeError):
        counters.not_a_counter = 1  # type: ignore[attr-defined]


def test_allocated_and_released_track_live_and_peak() -> None:
    counters = Counters()
    counters.allocated(100)
    counters.allocated(50)
    counters.released(100)
    counters.allocated(20)
    stats = counters.snapshot()
    assert stats.allocations == 3
    assert stats.live_bytes == 70
    assert stats.peak_bytes == 150


def test_release_of_more_than_live_is_rejected() -> None:
    counters = Counters()
    counters.allocated(10)
    with pytest.raises(ContractError, match="11"):
        counters.released(11)
    assert counters.live_bytes == 10


@pytest.mark.parametrize("bad", [-1, 1.5, True, "8"])
def test_bad_byte_counts_are_rejected(bad: object) -> None:
    counters = Counters()
    with pytest.raises(ContractError, match="byte count"):
        counters.allocated(bad)  # type: ignore[arg-type]
    with pytest.raises(ContractError, match="byte count"):
        counters.copied(Lane.UPLOAD, bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("lane", "field"),
    [
        (Lane.UPLOAD, "uploaded_bytes"),
        (Lane.DOWNLOAD, "downloaded_bytes"),
        (Lane.COMPUTE, "device_copied_bytes"),
        (Lane.NPU, "device_copied_bytes"),
        (Lane.HOST, "host_copied_bytes"),
    ],
)
def test_copied_attributes_bytes_by_lane(lane: Lane, field: str) -> None:
    counters = Counters()
    counters.copied(lane, 4096)
    counters.copied(lane, 1)
    stats = counters.snapshot().to_dict()
    assert stats["copied_bytes"] == 4097
    assert stats[field] == 4097
    others = {
        "uploaded_bytes",
        "downloaded_bytes",
        "device_copied_bytes",
        "host_copied_bytes",
    } - {field}
    assert all(stats[name] == 0 for name in others)


def test_snapshot_is_detached_from_later_updates() -> None:
    counters = Counters()
    counters.submissions += 1
    before = counters.snapshot()
    counters.submissions += 1
    assert before.submissions == 1
    assert counters.snapshot().submissions == 2


def test_every_counter_reaches_the_snapshot_under_its_own_name() -> None:
    counters = Counters()
    for value, name in enumerate(FIELD_NAMES, start=1):
        setattr(counters, name, value)
    assert counters.snapshot().to_dict() == {
        name: value for value, name in enumerate(FIELD_NAMES, start=1)
    }
    assert repr(counters).startswith("Counters(native_graphs_prepared=1, ")
