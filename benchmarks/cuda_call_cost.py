"""What one CUDA call costs from Python: cuda-bindings' runtime and driver modules, and ctypes.

The hot calls of a replay (event query, event record, stream wait, graph launch) through
`cuda.bindings.runtime` (what the cuda backend uses), `cuda.bindings.driver`, and ctypes
straight into libcuda; best of five rounds of a tight loop, ns per call. Also says whether
libcudart is loaded (cuda-bindings' runtime module is its own implementation over the
driver) and whether driver calls work on a thread that never touched CUDA.

    python benchmarks/cuda_call_cost.py
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cuda.bindings import driver as dr
from cuda.bindings import runtime as rt


def ok(result: tuple[Any, ...]) -> Any:
    assert int(result[0]) == 0, result
    return result[1] if len(result) > 1 else None


def best_ns(fn: Callable[[], object], n: int = 200_000) -> float:
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - started) / n * 1e9)
    return best


def main() -> None:
    ok(rt.cudaSetDevice(0))
    ok(rt.cudaFree(0))
    stream = ok(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking))
    other = ok(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking))
    event = ok(rt.cudaEventCreateWithFlags(rt.cudaEventDisableTiming))
    target = ok(rt.cudaMalloc(4096))
    mode = rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
    ok(rt.cudaStreamBeginCapture(stream, mode))
    ok(rt.cudaMemsetAsync(target, 1, 4096, stream))
    graph_exec = ok(rt.cudaGraphInstantiate(ok(rt.cudaStreamEndCapture(stream)), 0))
    ok(rt.cudaStreamSynchronize(stream))
    maps = Path("/proc/self/maps").read_text()
    print("libcudart loaded:", "libcudart" in maps, "| libcuda loaded:", "libcuda.so" in maps)

    lib = ctypes.CDLL("libcuda.so.1")
    pointer = ctypes.c_void_p
    functions = {}
    for name, argtypes in [
        ("cuEventQuery", [pointer]),
        ("cuEventRecord", [pointer, pointer]),
        ("cuStreamWaitEvent", [pointer, pointer, ctypes.c_uint]),
        ("cuGraphLaunch", [pointer, pointer]),
        ("cuStreamSynchronize", [pointer]),
    ]:
        function = getattr(lib, name)
        function.argtypes, function.restype = argtypes, ctypes.c_int
        functions[name] = function
    query, record = functions["cuEventQuery"], functions["cuEventRecord"]
    wait, launch = functions["cuStreamWaitEvent"], functions["cuGraphLaunch"]
    sync = functions["cuStreamSynchronize"]
    e, s, o, g = int(event), int(stream), int(other), int(graph_exec)

    fresh: dict[str, int] = {}

    def on_fresh_thread() -> None:
        fresh.update(query=query(e), record=record(e, s), launch=launch(g, s))

    thread = threading.Thread(target=on_fresh_thread)
    thread.start()
    thread.join()
    print("driver calls on a fresh thread (0: success):", fresh)
    ok(rt.cudaStreamSynchronize(stream))

    not_ready = rt.cudaError_t.cudaErrorNotReady

    def checked_query() -> bool:
        status = rt.cudaEventQuery(event)[0]
        return True if not status else status == not_ready

    rows: list[tuple[str, Callable[[], object], int]] = [
        ("rt.cudaEventQuery + status checks", checked_query, 200_000),
        ("rt.cudaEventQuery", lambda: rt.cudaEventQuery(event), 200_000),
        ("dr.cuEventQuery", lambda: dr.cuEventQuery(event), 200_000),
        ("ctypes cuEventQuery", lambda: query(e), 200_000),
        ("rt.cudaEventRecord", lambda: rt.cudaEventRecord(event, other), 200_000),
        ("ctypes cuEventRecord", lambda: record(e, o), 200_000),
        ("rt.cudaStreamWaitEvent", lambda: rt.cudaStreamWaitEvent(other, event, 0), 200_000),
        ("ctypes cuStreamWaitEvent", lambda: wait(o, e, 0), 200_000),
    ]
    for name, fn, n in rows:
        print(f"{name:45s} {best_ns(fn, n):7.0f} ns")
    ok(rt.cudaStreamSynchronize(other))

    def launch_sync_rt() -> None:
        rt.cudaGraphLaunch(graph_exec, stream)
        rt.cudaStreamSynchronize(stream)

    def launch_sync_ctypes() -> None:
        launch(g, s)
        sync(s)

    print(f"{'rt launch + sync':45s} {best_ns(launch_sync_rt, 20_000):7.0f} ns")
    print(f"{'ctypes launch + sync':45s} {best_ns(launch_sync_ctypes, 20_000):7.0f} ns")
    launches = best_ns(lambda: rt.cudaGraphLaunch(graph_exec, stream), 20_000)
    print(f"{'rt.cudaGraphLaunch (the queue fills)':45s} {launches:7.0f} ns")
    ok(rt.cudaStreamSynchronize(stream))
    launches = best_ns(lambda: launch(g, s), 20_000)
    print(f"{'ctypes cuGraphLaunch (the queue fills)':45s} {launches:7.0f} ns")
    ok(rt.cudaStreamSynchronize(stream))


if __name__ == "__main__":
    main()
