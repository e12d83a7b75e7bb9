"""CuPy work as a region of a graph, over hrx views seen as typed, shaped arrays.

`region(g, fn, reads=[(view, dtype, shape)], writes=[...])` records `fn(*arrays)` on the
compute lane (through `Graph.external`), as `hrx_async.torch.region` does for PyTorch: on
CUDA on CuPy's stream over the lane's stream (`Stream.from_external`, or `ExternalStream`
where CuPy lacks it), over CuPy arrays made once when the graph is prepared; on `sim` over
numpy arrays sharing the runtime's memory (read-only for reads), so code written with
`xp = cupy.get_array_module(x)` runs on both.

Importing this module imports CuPy; without it, `BackendUnavailable` says what to
install. `import hrx_async` never imports CuPy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ._core.contract import Access
from ._core.dlpack import DLPACK_CUDA
from ._core.graph import Graph
from ._core.typed import TypedView, check_region_call, typed_views
from .errors import BackendUnavailable, ContractError, HrxError

INSTALL = "pip install cupy-cuda12x (cupy-cuda13x for CUDA 13: the CuPy wheel of your CUDA)"

try:
    import cupy
except ImportError as exc:
    raise BackendUnavailable("cupy", f"CuPy cannot be imported ({exc})", INSTALL) from exc

WHO = "cupy region"


def region(
    graph: Graph[Any],
    fn: Callable[..., object],
    *,
    reads: Iterable[tuple[Any, ...]] = (),
    updates: Iterable[tuple[Any, ...]] = (),
    writes: Iterable[tuple[Any, ...]] = (),
) -> int:
    """Record `fn(*reads, *updates, *writes)`, CuPy work over typed arrays, as a region of
    `graph` on the compute lane; returns its node index (as `Graph.external` does).

    Declarations are those of `hrx_async.torch.region`, with numpy dtypes (`np.float32`,
    `"float32"`, `cupy.float32`): `(view, dtype)` or `(view, dtype, shape)` over GPU_LOCAL
    views, checked at once (`ContractError`, nothing recorded). Results must land in the
    write (or update) arrays in place (`cupy.add(x, 1, out=y)`, `y[...] = x @ w`); `fn`
    must only enqueue work (no `.get()`, no synchronisation). Temporaries come from CuPy's
    memory pool on the lane's stream, which reuses their memory only for work queued after
    them there.

    On CUDA, `fn` runs on the event loop's thread when the region is issued, inside the
    region's device and CuPy's stream over the lane's stream, over CuPy arrays
    made once when the graph is prepared. On `sim`, over numpy arrays sharing the runtime's
    memory, read-only for reads. An exception from `fn` fails the region with
    `ExecutionError` and poisons what it writes. (There is no captured form for CuPy.)
    """
    check_region_call(WHO, graph, fn, "CuPy")
    specs = typed_views(
        WHO,
        ((Access.READ, reads), (Access.READ_WRITE, updates), (Access.WRITE, writes)),
        _dtype_of,
    )
    work = CupyWork(fn, specs)
    return graph.external(work, [(s.view, s.access) for s in specs], prepare=work.prepare)


def _dtype_of(given: object) -> tuple[Any, int] | None:
    if given is None:  # np.dtype(None) is float64: never what a missing dtype meant
        return None
    try:
        dtype = np.dtype(given)  # type: ignore[call-overload]
    except TypeError:
        return None
    return dtype, int(dtype.itemsize)


class CupyWork:
    """The external function of a CuPy region (see `region`): `self(stream, arrays)` runs it
    where no prepare hook was called (sim), `prepare` makes the per-replay form."""

    __slots__ = ("fn", "specs")

    def __init__(self, fn: Callable[..., object], specs: tuple[TypedView, ...]) -> None:
        self.fn = fn
        self.specs = specs

    def __repr__(self) -> str:
        return f"<{WHO} {getattr(self.fn, '__qualname__', None) or self.fn!r}>"

    def __call__(self, stream: Any, tensors: list[Any]) -> object:
        if stream is None:
            arrays = zip(tensors, self.specs, strict=True)
            return self.fn(*(_shaped(array, spec) for array, spec in arrays))
        # A stream backend calls `prepare` first; this is the same work made afresh, for a
        # backend that does not.
        return self.prepare(stream, tensors)(stream, tensors)

    def prepare(self, stream: int, tensors: list[Any]) -> Callable[[Any, Any], object]:
        """The per-replay function for the lane stream `stream` and the runtime's tensors
        (the `prepare` hook of `Graph.external`)."""
        kind, index = tensors[0].__dlpack_device__()
        if kind != DLPACK_CUDA:
            raise ContractError(f"{self!r}: the region's memory is not CUDA memory")
        try:
            device = cupy.cuda.Device(int(index))
            with device:
                arrays = [
                    _shaped(cupy.from_dlpack(tensor), spec)
                    for tensor, spec in zip(tensors, self.specs, strict=True)
                ]
                lane = _lane_stream(stream, int(index))
        except HrxError:
            raise
        except Exception as exc:
            raise ContractError(f"{self!r}: CuPy cannot use the region's memory: {exc}") from exc
        fn = self.fn

        def run(stream: Any, tensors: Any) -> object:
            with device, lane:
                return fn(*arrays)

        return run


class _StreamHandle:
    """A raw stream handle offered through the CUDA stream protocol (`__cuda_stream__`)."""

    __slots__ = ("handle",)

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


def _lane_stream(handle: int, device: int) -> Any:
    """CuPy's stream object over the lane's stream `handle` on `device` (made while that
    device is current): `Stream.from_external` through the CUDA stream protocol where CuPy
    has it (it deprecates `ExternalStream` in its favour, with a warning on every use), else
    `ExternalStream`."""
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is None:
        return cupy.cuda.ExternalStream(handle, device)
    return from_external(_StreamHandle(handle))


def _shaped(raw: Any, spec: TypedView) -> Any:
    """`raw`, 1-D uint8 over a view's bytes (numpy or CuPy), as the declared dtype and shape
    (no copy)."""
    return raw.view(spec.dtype).reshape(spec.shape)


__all__ = ["region"]
