"""The example programs, imported by the benchmarks that serve them.

The examples are not a package: each is imported from its file, once per process, under
the name given. A file that fails to import is not left half made in `sys.modules`.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load_example(file: str, name: str) -> ModuleType:
    """examples/`file`, imported once as `name`."""
    found = sys.modules.get(name)
    if found is not None:
        return found
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
