"""What the per-replay driver calls cost through cuda-bindings and through ctypes.

`cudaGraphLaunch`, `cudaEventRecord` and `cudaEventQuery` through cuda-bindings'
runtime module, against `cuGraphLaunch`, `cuEventRecord` and `cuEventQuery`
called on `libcuda.so.1` with `ctypes.PyDLL` and prepared handles. µs per call,
best of five runs of 20,000 calls; the launch runs against a busy stream.

Then the two ways a region of one 64 KiB copy from pinned host memory to the device can
be issued: `cudaMemcpyAsync` each time, or one launch of a graph that captured the copy.
µs per call, issued in batches of 200 with the stream drained between batches (untimed),
so the rows show the host's cost per call, not the copy engine's.
"""

from __future__ import annotations

import argparse
import ctypes
import time
from collections.abc import Callable
from typing import Any

from cuda_common import Direct, parser


def per_call_us(call: Callable[[], Any], calls: int) -> float:
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter() - started) / calls)
    return round(best * 1e6, 3)


def main(args: argparse.Namespace) -> dict[str, Any]:
    direct = Direct()
    rt = direct.rt
    stream = direct.stream()
    target = direct.malloc(4096)
    graph_exec = direct.capture(stream, lambda s: direct.memset(target, 1, 4096, s))
    event = direct.event()
    libcuda = ctypes.PyDLL("libcuda.so.1")
    for name in ("cuGraphLaunch", "cuEventRecord", "cuEventQuery"):
        getattr(libcuda, name).restype = ctypes.c_int
    exec_handle = ctypes.c_void_p(int(graph_exec))
    stream_handle = ctypes.c_void_p(int(stream))
    event_handle = ctypes.c_void_p(int(event))
    n = args.calls
    report: dict[str, Any] = {"benchmark": "cuda_driver_calls", "calls": n}
    report["event_query_bindings_us"] = per_call_us(lambda: rt.cudaEventQuery(event), n)
    report["event_query_ctypes_us"] = per_call_us(lambda: libcuda.cuEventQuery(event_handle), n)
    report["event_record_bindings_us"] = per_call_us(lambda: rt.cudaEventRecord(event, stream), n)
    report["event_record_ctypes_us"] = per_call_us(
        lambda: libcuda.cuEventRecord(event_handle, stream_handle), n
    )
    rt.cudaStreamSynchronize(stream)
    report["graph_launch_bindings_us"] = per_call_us(
        lambda: rt.cudaGraphLaunch(graph_exec, stream), n
    )
    rt.cudaStreamSynchronize(stream)
    report["graph_launch_ctypes_us"] = per_call_us(
        lambda: libcuda.cuGraphLaunch(exec_handle, stream_handle), n
    )
    rt.cudaStreamSynchronize(stream)
    nbytes = 64 << 10
    source, target = direct.host_alloc(nbytes), direct.malloc(nbytes)
    kind = rt.cudaMemcpyKind.cudaMemcpyDefault
    copy_exec = direct.capture(stream, lambda s: direct.memcpy(target, source, nbytes, s))
    report["copy_64k_memcpy_async_us"] = per_batched_call_us(
        lambda: rt.cudaMemcpyAsync(target, source, nbytes, kind, stream), stream, rt, n
    )
    report["copy_64k_graph_launch_us"] = per_batched_call_us(
        lambda: rt.cudaGraphLaunch(copy_exec, stream), stream, rt, n
    )
    return report


def per_batched_call_us(call: Callable[[], Any], stream: Any, rt: Any, calls: int) -> float:
    """µs per call of `call`, 200 at a time, the stream drained between (not timed)."""
    best = float("inf")
    batch = 200
    for _ in range(5):
        spent = 0.0
        for _ in range(max(1, calls // batch)):
            started = time.perf_counter()
            for _ in range(batch):
                call()
            spent += time.perf_counter() - started
            rt.cudaStreamSynchronize(stream)
        best = min(best, spent / (max(1, calls // batch) * batch))
    return round(best * 1e6, 3)


if __name__ == "__main__":
    import json

    options = parser(__doc__ or "")
    options.add_argument("--calls", type=int, default=20000)
    print(json.dumps(main(options.parse_args()), sort_keys=True))
