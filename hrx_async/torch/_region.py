"""`region`: a PyTorch function over typed views, recorded as external work.

The function given to `Graph.external` is a `TorchWork`. On `sim` the runtime calls it
with `(None, uint8 numpy arrays)` and it runs the user's function over CPU tensors made
from those arrays. On a stream backend its `prepare` hook is called once per prepared
graph with the lane's stream handle and the runtime's `ExternalTensor`s; it makes the
typed CUDA tensors and the `torch.cuda.ExternalStream` once, and returns what each replay
calls: the user's function inside that stream (eager), or one launch of the work captured
there and then (captured, `CapturedReplay`).
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch

from .._core import validate as _validate
from .._core.contract import Access
from .._core.dlpack import DLPACK_CUDA, DLPACK_ROCM
from .._core.graph import Graph
from .._core.ops import enqueued_only
from .._core.typed import TypedView, check_region_call, typed_views
from ..errors import BackendError, ContractError, HrxError

WHO = "torch region"

Replay = Callable[[Any, Any], object]


def region(
    graph: Graph[Any],
    fn: Callable[..., object],
    *,
    reads: Iterable[tuple[Any, ...]] = (),
    updates: Iterable[tuple[Any, ...]] = (),
    writes: Iterable[tuple[Any, ...]] = (),
    captured: bool = False,
) -> int:
    """Record `fn(*reads, *updates, *writes)`, PyTorch work over typed tensors, as a region
    of `graph` on the compute lane; returns its node index (as `Graph.external` does).

    Each declaration is `(view, dtype)` (a 1-D tensor over the whole view) or `(view, dtype,
    shape)`: the view's bytes seen as a contiguous tensor of that `torch.dtype` and shape,
    zero-copy. `reads` are `Access.READ`, `updates` `Access.READ_WRITE`, `writes`
    `Access.WRITE`; the tensors come to `fn` in that order. Views are GPU_LOCAL memory of one
    GPU, not overlapping; each view's size must be the dtype's item size times the shape's
    product and its offset a multiple of the item size, else `ContractError`, and nothing
    is recorded.

    Results must land in the write (or update) tensors themselves, in place:
    `torch.add(x, 1, out=y)`, `y.copy_(x @ w)`, `torch.matmul(a, b, out=c)`; a tensor `fn`
    returns or rebinds is dropped. `fn` must only enqueue work: no `.item()`, `.cpu()`,
    `print(tensor)` or other host synchronisation (each would block the event loop, and a
    captured region cannot contain one). Temporaries `fn` allocates come from PyTorch's
    caching allocator on the lane's stream, so their memory is reused only by work queued
    after them on that stream: stream-ordered, with no host wait.

    On CUDA, `fn` runs on the event loop's thread when the region is issued, with the lane's
    stream current as inside `torch.cuda.stream(torch.cuda.ExternalStream(stream))` (and the
    caller's current stream current again after it), over CUDA tensors made once when the
    graph is prepared. `captured=True` (fixed shapes, no host-side decisions in `fn`)
    records the work instead, once, when the graph is prepared: `fn` runs once on
    zero-filled scratch tensors of the same dtypes and shapes (a warm-up that initialises
    libraries such as cuBLAS; nothing orders work on the region's own memory at that time),
    then is captured over the region's tensors into a `torch.cuda.CUDAGraph` with its own
    memory pool, on a side stream. The first replay is `graph.replay()` on the lane's
    stream; when it leaves PyTorch's default CUDA generator where it was (the work draws no
    random numbers, so there is no generator state for PyTorch's replay to advance), every
    later replay is one `cudaGraphLaunch` of the same captured graph onto the lane's stream,
    with no PyTorch call in between (on CUDA builds of PyTorch with `keep_graph` support and
    cuda-bindings installed; otherwise, and for work that draws random numbers, every replay
    is `graph.replay()`). A warm-up or capture that fails makes `prepare()` raise
    `ContractError` (PyTorch's allocator may keep the memory pool of a capture that failed,
    as after any failed `torch.cuda.graph`: fix the function, do not retry).

    On `sim`, `fn` runs on the compute lane's worker thread over CPU tensors sharing the
    runtime's memory (`torch.from_numpy`), the captured form eagerly, so the same graph
    runs everywhere. An exception from `fn` fails the region with `ExecutionError` and
    poisons what it writes.
    """
    check_region_call(WHO, graph, fn, "PyTorch")
    _validate.flag(captured, f"{WHO} captured")
    specs = typed_views(
        WHO,
        ((Access.READ, reads), (Access.READ_WRITE, updates), (Access.WRITE, writes)),
        _dtype_of,
    )
    work = TorchWork(fn, specs, captured)
    return graph.external(work, [(s.view, s.access) for s in specs], prepare=work.prepare)


def _dtype_of(given: object) -> tuple[Any, int] | None:
    if not isinstance(given, torch.dtype):
        return None
    size: int = torch.empty(0, dtype=given).element_size()
    return given, size


class TorchWork:
    """The external function of a torch region (see `region`): `self(stream, tensors)` runs
    it where no prepare hook was called (sim), `prepare` makes the per-replay form."""

    __slots__ = ("_host", "captured", "fn", "specs")

    def __init__(self, fn: Callable[..., object], specs: tuple[TypedView, ...], captured: bool):
        self.fn = fn
        self.specs = specs
        self.captured = captured
        self._host: tuple[object, list[Any]] | None = None
        """The last arrays the runtime passed on sim, and the CPU tensors over them."""

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", None) or repr(self.fn)
        return f"<{WHO} {name}{' (captured)' if self.captured else ''}>"

    def __call__(self, stream: Any, tensors: list[Any]) -> object:
        if stream is None:
            return self.fn(*self._host_tensors(tensors))
        # A stream backend calls `prepare` first; this is the same work made afresh, for a
        # backend that does not.
        with torch.cuda.stream(torch.cuda.ExternalStream(stream, device=_device(tensors))):
            return self.fn(*self._device_tensors(tensors))

    def _host_tensors(self, arrays: list[Any]) -> list[Any]:
        """CPU tensors over the sim backend's arrays, made once per prepared graph: the
        runtime passes the same list to every replay of it."""
        host = self._host
        if host is not None and host[0] is arrays:
            return host[1]
        with warnings.catch_warnings():
            # READ arrays are read-only numpy arrays, and PyTorch, which has no read-only
            # tensors, warns about each. The tensors share the memory instead of copying it,
            # as on CUDA, where a read tensor is writable device memory too: writing one is
            # the caller's bug on both, and a copy per replay would hide it here only.
            warnings.filterwarnings(
                "ignore", message="The given NumPy array is not writable", category=UserWarning
            )
            typed = [
                _shaped(torch.from_numpy(array), spec)
                for array, spec in zip(arrays, self.specs, strict=True)
            ]
        self._host = (arrays, typed)
        return typed

    def _device_tensors(self, tensors: list[Any]) -> list[Any]:
        return [
            _shaped(torch.from_dlpack(tensor), spec)
            for tensor, spec in zip(tensors, self.specs, strict=True)
        ]

    def prepare(self, stream: int, tensors: list[Any]) -> Replay:
        """The per-replay function for the lane stream `stream` and the runtime's tensors
        (the `prepare` hook of `Graph.external`)."""
        device = _device(tensors)
        try:
            typed = self._device_tensors(tensors)
            lane = torch.cuda.ExternalStream(stream, device=device)
        except HrxError:
            raise
        except Exception as exc:
            raise ContractError(f"{self!r}: PyTorch cannot use the region's memory: {exc}") from exc
        # One context for every replay: replays of a region are issued one at a time, from
        # the loop's thread, and entering it again restores what was current before.
        on_lane = LaneStream(lane, device.index)
        if self.captured:
            return _captured(self, typed, device, stream, on_lane)
        fn = self.fn

        def run(stream: Any, tensors: Any) -> object:
            with on_lane:
                return fn(*typed)

        return run


class LaneStream:
    """What `torch.cuda.stream(lane)` does around each replay, for less: the lane's stream
    made current on its device, and the device's previous stream made current again after.

    PyTorch's context asks for the current device's stream through a chain of Python calls
    that looks up the device (availability checks, environment variables) on every entry,
    a few microseconds per replay. This one knows its device: while that device is the
    current one (the usual case) it only swaps that device's current stream, which is all
    PyTorch's context does then. Where this PyTorch has them, it swaps it through the three
    functions `torch.cuda.current_device`, `current_stream` and `set_stream` end in (each
    stream as its `(stream_id, device_index, device_type)`, no `Stream` object made per
    replay); otherwise through those public functions. Another current device gets
    PyTorch's own context, which restores both devices' streams and the current device."""

    __slots__ = ("_full", "_index", "_lane", "_lane_ids", "_native", "_previous")

    def __init__(self, lane: Any, index: int) -> None:
        self._lane = lane
        self._index = index
        self._lane_ids = (lane.stream_id, lane.device_index, lane.device_type)
        self._native = _native_stream_calls(index)
        self._previous: Any = None
        self._full: Any = None

    def __enter__(self) -> None:
        native = self._native
        if native is not None:
            get_device, get_stream, set_stream = native
            if get_device() == self._index:
                self._previous = get_stream(self._index)
                set_stream(*self._lane_ids)
                return
        elif torch.cuda.current_device() == self._index:
            self._previous = torch.cuda.current_stream(self._index)
            torch.cuda.set_stream(self._lane)
            return
        full = torch.cuda.stream(self._lane)
        full.__enter__()
        self._full = full

    def __exit__(self, *exc: object) -> None:
        full = self._full
        if full is not None:
            self._full = None
            full.__exit__(*exc)
            return
        previous, self._previous = self._previous, None
        native = self._native
        if native is not None:
            native[2](*previous)
        else:
            torch.cuda.set_stream(previous)


def _native_stream_calls(index: int) -> tuple[Any, Any, Any] | None:
    """PyTorch's native current-device, current-stream and set-stream functions, when this
    build has them in the form `LaneStream` uses (the current stream as a 3-tuple); else
    None. Checked once per prepared region, with CUDA already initialised."""
    native = torch._C
    calls = (
        getattr(native, "_cuda_getDevice", None),
        getattr(native, "_cuda_getCurrentStream", None),
        getattr(native, "_cuda_setStream", None),
    )
    if calls[0] is None or calls[1] is None or calls[2] is None:
        return None
    try:
        current = calls[1](index)
    except Exception:
        return None
    if not isinstance(current, tuple) or len(current) != 3:
        return None
    return calls


def _captured(work: TorchWork, typed: list[Any], device: Any, stream: int, on_lane: Any) -> Replay:
    """Capture `work` over `typed` into a CUDA graph; the replay that launches it on the lane
    stream `stream` (inside `on_lane`, its context, where PyTorch's replay is used)."""
    fn = work.fn
    side = torch.cuda.Stream(device=device)
    stage = "its warm-up run"
    try:
        with torch.cuda.device(device), torch.cuda.stream(side):
            # Allocated on the side stream, so the warm-up's memory is reused only after it.
            scratch = [torch.zeros_like(tensor) for tensor in typed]
            enqueued_only(fn, fn(*scratch))
            stage = "capturing it into a CUDA graph"
            graph, kept = _new_cuda_graph()
            # Thread-local, as the runtime's own captures are: in the global mode a call CUDA
            # counts as potentially unsafe during a capture fails in every thread, and the
            # runtime's waiter threads keep calling into CUDA meanwhile.
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                enqueued_only(fn, fn(*typed))
            except BaseException:
                # End the capture so the stream is usable again; the partial graph is dropped.
                with contextlib.suppress(Exception):
                    graph.capture_end()
                raise
            graph.capture_end()
            stage = "instantiating its CUDA graph"
            native = None
            if kept:
                graph.instantiate()  # PyTorch's own, for the replays that go through it
                native = _native_launch(graph, stream)
    except HrxError:
        raise
    except Exception as exc:
        raise ContractError(f"{work!r}: {stage} failed: {exc}") from exc
    generator = torch.cuda.default_generators[device.index]
    if not hasattr(generator, "get_offset"):
        native = None
    return CapturedReplay(graph, on_lane, native, generator)


class CapturedReplay:
    """Each replay of a captured region (see `region`): PyTorch's `CUDAGraph.replay()` in the
    lane stream's context at first, then the native launch where the first replay showed it
    does the same.

    `CUDAGraph.replay()` advances the RNG state of the generators the capture used, then
    launches the graph on the current stream. Work that draws no random numbers leaves the
    generator's offset where it was, and then a bare launch of the graph is all a replay
    is: about 5 µs less of PyTorch's Python and C++ per replay."""

    __slots__ = ("_generator", "_graph", "_native", "_on_lane", "launch")

    def __init__(
        self,
        graph: Any,
        on_lane: Any,
        native: Callable[[], None] | None,
        generator: Any,
    ) -> None:
        self._graph = graph  # keeps the capture's memory pool, which the native launch uses
        self._on_lane = on_lane
        self._native = native
        self._generator = generator
        self.launch: Callable[[], None] = self._first if native is not None else self._torch
        """What the next replay runs (on the lane stream the region was prepared for)."""

    @property
    def native(self) -> bool:
        """Whether replays are the bare native launch now."""
        return self.launch is self._native

    def __call__(self, stream: int, tensors: Any) -> None:
        self.launch()

    def _torch(self) -> None:
        with self._on_lane:
            self._graph.replay()

    def _first(self) -> None:
        before = self._generator.get_offset()
        self._torch()
        native = self._native
        self.launch = (
            native if native is not None and self._generator.get_offset() == before else self._torch
        )


def _new_cuda_graph() -> tuple[Any, bool]:
    """A `torch.cuda.CUDAGraph` that keeps its captured graph where PyTorch can (2.8 and
    later: `keep_graph`), so it can be launched natively too; and whether it does."""
    try:
        return torch.cuda.CUDAGraph(keep_graph=True), True
    except TypeError:
        return torch.cuda.CUDAGraph(), False


def _native_launch(graph: Any, stream: int) -> Callable[[], None] | None:
    """A function launching the captured `graph` on the raw CUDA stream handle `stream`: an
    executable graph of our own, made from PyTorch's captured one, launched through
    cuda-bindings.
    None when that cannot be done here: a ROCm build of PyTorch, or no cuda-bindings (then
    PyTorch's own replay is used)."""
    raw_graph = getattr(graph, "raw_cuda_graph", None)
    if torch.version.hip is not None or torch.version.cuda is None or raw_graph is None:
        return None
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        return None
    handle = int(raw_graph())
    if not handle:
        return None
    status, graph_exec = cudart.cudaGraphInstantiate(cudart.cudaGraph_t(init_value=handle), 0)
    if status:
        raise BackendError("cuda", "cudaGraphInstantiate", status.name)
    weakref.finalize(graph, cudart.cudaGraphExecDestroy, graph_exec)
    lane = cudart.cudaStream_t(init_value=stream)
    launch_graph = cudart.cudaGraphLaunch

    def launch() -> None:
        status = launch_graph(graph_exec, lane)[0]
        if status:
            raise BackendError("cuda", "cudaGraphLaunch", status.name)

    return launch


def _device(tensors: list[Any]) -> Any:
    """The CUDA device of the runtime's tensors (all on one GPU, as `Graph.external` checks)."""
    kind, index = tensors[0].__dlpack_device__()
    if kind not in (DLPACK_CUDA, DLPACK_ROCM):
        raise ContractError(f"{WHO}: the region's memory is not GPU memory (DLPack device {kind})")
    if not torch.cuda.is_available():
        raise ContractError(
            f"{WHO}: the runtime runs on a GPU, but this PyTorch sees none "
            "(torch.cuda.is_available() is False: a CPU-only build?)"
        )
    return torch.device("cuda", int(index))


def _shaped(raw: Any, spec: TypedView) -> Any:
    """`raw`, 1-D uint8 over a view's bytes, as the declared dtype and shape (no copy)."""
    return raw.view(spec.dtype).view(spec.shape)


__all__ = ["TorchWork", "region"]
