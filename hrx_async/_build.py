"""Which build of hrx_async is running: the mypyc-compiled core, or pure Python.

`COMPILED` is the one list of the modules an install compiles with mypyc; setup.py reads it
from this file as a literal (so it must stay a tuple of strings). The compile is optional:
where it is not built (no C compiler, no mypy, ``HRX_ASYNC_PURE=1`` at build time, an
editable install) the same modules run as plain Python, and behave the same. `build()` says
which one this interpreter imports, from where each listed module is loaded.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
from typing import Any

COMPILED: tuple[str, ...] = (
    "hrx_async._core.clock",
    "hrx_async._core.intervals",
    "hrx_async._core.counters",
    "hrx_async._core.chains",
    "hrx_async._core.tracker",
    "hrx_async._core.segments",
    "hrx_async._runtime.notify",
    "hrx_async._runtime.completion",
    "hrx_async._runtime.poison",
    "hrx_async._runtime.region",
    "hrx_async._runtime.region_owner",
    "hrx_async._runtime.replay",
    "hrx_async._runtime.lane_task",
    "hrx_async._runtime.outcomes",
    "hrx_async._runtime.scheduler",
    "hrx_async._runtime.watch",
    "hrx_async.backends.fence",
    "hrx_async.backends.watched",
    "hrx_async.backends._stream_calls",
    "hrx_async.backends._stream_fences",
    "hrx_async.backends._stream_programs",
    "hrx_async.backends._stream",
    "hrx_async.backends.worker",
)
"""The modules mypyc compiles when it can: the clock the others read, the replay path's
admission, lane tasks, tracker, settling, fence sweeps and completions, the stream queues,
the programs they launch for each region and the driver calls they make, and the worker
threads that run the sim backend's lanes and the host lane.
Each must pass mypy --strict and the whole test suite compiled; none may be an entry point
users call with unchecked arguments (compiled code raises TypeError for an argument of the
wrong type, the public API ContractError).

Left out: everything users call directly."""


def is_compiled(module: str) -> bool:
    """Whether `module` would be (or was) loaded from an extension module, not from source.

    Finding the spec does not run the module, only the packages above it.
    """
    spec = importlib.util.find_spec(module)
    origin = spec.origin if spec is not None else None
    return origin is not None and origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def build() -> dict[str, Any]:
    """``kind``: "compiled" (every listed module is), "pure" (none is) or "partial" (some are:
    a stale extension left next to the sources, say); and the modules on each side."""
    compiled = [module for module in COMPILED if is_compiled(module)]
    pure = [module for module in COMPILED if module not in compiled]
    if not compiled:
        kind = "pure"
    elif not pure:
        kind = "compiled"
    else:
        kind = "partial"
    return {"kind": kind, "compiled": compiled, "pure": pure}
