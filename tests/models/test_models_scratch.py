"""ScratchPlanner: best-fit reuse of private scratch only after its last use."""

from __future__ import annotations

import pytest

import hrx_async as hrx
from hrx_async.models.scratch import ScratchPlanner


def test_scratch_slots_reuse_only_after_the_last_use() -> None:
    """model.rs::scratch_slots_reuse_only_after_the_last_use"""
    planner = ScratchPlanner()
    a, b, c, d = (planner.add(64, first, last) for first, last in ((0, 1), (1, 2), (2, 3), (3, 3)))
    plan = planner.plan()
    assert plan.slot[a] == plan.slot[c] and plan.slot[b] == plan.slot[d]
    assert plan.slot[a] != plan.slot[b] and len(plan.sizes) == 2


def test_best_fit_same_placement_and_bad_requests() -> None:
    planner = ScratchPlanner()
    big = planner.add(1000, 0, 0)
    small = planner.add(100, 0, 0)
    host = planner.add(50, 0, 0, hrx.HOST_VISIBLE)
    fits = planner.add(90, 1, 1)  # both device ones are free: the smaller one fits best
    other = planner.add(40, 1, 1, hrx.HOST_VISIBLE)
    too_big = planner.add(2000, 2, 2)  # none big enough: a new allocation
    plan = planner.plan()
    assert plan.slot[fits] == plan.slot[small] != plan.slot[big]
    assert plan.slot[other] == plan.slot[host]
    assert plan.sizes[plan.slot[too_big]] == 2000 and plan.total_bytes == 3150
    for args in ((0, 0, 0), (8, 2, 1), (8, -1, 0)):
        with pytest.raises(hrx.ContractError):
            planner.add(*args)
