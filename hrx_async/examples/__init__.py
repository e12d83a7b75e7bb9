"""The example programs, importable from the installed package.

Each runs as `python -m hrx_async.examples.NAME [args]` or `hrx-async bench NAME
[args]`; the repository's `examples/NAME.py` files are thin wrappers around them.
"""

from __future__ import annotations

import importlib
from typing import Any

from .common import ExampleResult, ExampleSpec, Report, UsageError

NAMES = (
    "gpu_npu_parallel",
    "shared_roundtrip",
    "shared_bench",
    "gemm_pipeline",
    "graph_prepare",
    "image_pipeline",
    "align",
)


def spec(name: str) -> ExampleSpec[Any]:
    """The example called `name`, or `UsageError` listing the ones that exist."""
    if name not in NAMES:
        raise UsageError(f"no example named {name!r}; choose one of {', '.join(NAMES)}")
    module = importlib.import_module(f"{__name__}.{name}")
    found: ExampleSpec[Any] = module.SPEC
    return found


__all__ = ["NAMES", "ExampleResult", "ExampleSpec", "Report", "UsageError", "spec"]
