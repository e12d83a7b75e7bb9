"""What the three per-replay driver calls cost through cuda-bindings and through ctypes.

`cudaGraphLaunch`, `cudaEventRecord` and `cudaEventQuery` through cuda-bindings'
runtime module, against `cuGraphLaunch`, `cuEventRecord` and `cuEventQuery`
called on `libcuda.so.1` with `ctypes.PyDLL` and prepared handles. µs per call,
best of five runs of 20,000 calls; the launch runs against a busy stream.
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
    return report


if __name__ == "__main__":
    import json

    options = parser(__doc__ or "")
    options.add_argument("--calls", type=int, default=20000)
    print(json.dumps(main(options.parse_args()), sort_keys=True))
