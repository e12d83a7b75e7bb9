"""The checks behind the PyTorch and CuPy adapters' typed views (`_core.typed`), without
either library: dtypes here are numpy's, asked for their item size as the adapters ask
theirs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import hrx_async as hrx
from hrx_async._core.typed import TypedView, typed_views

R, RW, W = hrx.Access.READ, hrx.Access.READ_WRITE, hrx.Access.WRITE
pytestmark = pytest.mark.anyio


def numpy_dtype(given: object) -> tuple[np.dtype[Any], int] | None:
    return (given, given.itemsize) if isinstance(given, np.dtype) else None


F32, F64, I16, C128 = (np.dtype(t) for t in ("float32", "float64", "int16", "complex128"))


def check(*groups: tuple[hrx.Access, Any]) -> tuple[TypedView, ...]:
    return typed_views("test region", groups, numpy_dtype)


async def test_declarations_become_typed_views_in_order() -> None:
    async with hrx.Runtime(backend="sim", npu=None) as rt:
        a, b, c = (rt.allocate(4096, hrx.GPU_LOCAL) for _ in range(3))
        views = check(
            (R, [(a.view(), F32), (a.view(0, 64), F64, (2, 4))]),
            (RW, [(b[0:6], I16, 3)]),
            (W, [(c.view(), F32, [32, np.int64(32)])]),
        )
        assert [(v.access, v.dtype, v.shape) for v in views] == [
            (R, F32, (1024,)),
            (R, F64, (2, 4)),
            (RW, I16, (3,)),
            (W, F32, (32, 32)),
        ]
        assert views[3].count == 1024 and views[3].itemsize == 4
        scalar = check((W, [(c.view(0, 8), F64, ())]))
        assert scalar[0].shape == () and scalar[0].count == 1


async def test_bad_declarations_are_refused_with_what_is_wrong() -> None:
    async with hrx.Runtime(backend="sim", npu=None) as rt:
        x = rt.allocate(4096, hrx.GPU_LOCAL)
        host = rt.allocate(4096, hrx.HOST_VISIBLE)
        cases: list[tuple[Any, str]] = [
            ([(x.view(), F32, (1000,))], r"4096 bytes, but float32 of shape \(1000,\) is 4000"),
            ([(x.view(0, 6), F32)], "not a whole number of float32 elements"),
            ([(x.view(2, 8), F32, 2)], "starts at byte 2, not a multiple of 4"),
            ([(x.view(8, 16), C128, 1)], "starts at byte 8, not a multiple of 16"),
            ([(x.view(), "float32")], "'float32' is not a dtype it knows"),
            ([(x.view(), F32, (-1,))], "a shape is an int or a tuple of ints >= 0"),
            ([(x.view(), F32, (1024.0,))], "a shape is an int or a tuple of ints >= 0"),
            ([(x.view(), F32, True)], "a shape is an int or a tuple of ints >= 0"),
            ([(x.view(), F32, "1024")], "a shape is an int or a tuple of ints >= 0"),
            ([x.view()], r"\(view, dtype\) or \(view, dtype, shape\) tuples"),
            ([(x.view(), F32, (1024,), "extra")], r"\(view, dtype, shape\) tuples"),
            ([(b"bytes", F32)], "is not a View"),
            ([(host.view(), F32)], "is host_visible memory, which other libraries see as host"),
            ({(x.view(), F32)}, "ordered collection"),
            (5, "iterable"),
        ]
        for declarations, message in cases:
            with pytest.raises(hrx.ContractError, match=message):
                check((W, declarations))
        with pytest.raises(hrx.ContractError, match="at least one of reads, updates or writes"):
            check((R, []), (W, ()))
        with pytest.raises(hrx.ContractError, match="test region updates"):
            check((RW, [(x.view(), F32, 3)]))
