"""PyTorch work as a region of a graph, over hrx views seen as typed, shaped tensors.

`region(g, fn, reads=[(view, dtype, shape)], writes=[...])` records `fn(*tensors)` on the
compute lane (through `Graph.external`), ordered by byte range with the graph's other work
like any kernel. On CUDA, `fn` runs with the lane's stream `s` current (as inside
`torch.cuda.stream(torch.cuda.ExternalStream(s))`), over CUDA tensors made once when the
graph is prepared; on `sim`, over CPU tensors sharing the runtime's memory, so one graph
runs everywhere.
`captured=True` records the work once into a `torch.cuda.CUDAGraph` when the graph is
prepared, so each replay is one launch on the lane's stream (PyTorch's `graph.replay()` for
work that draws random numbers, else a native launch of the same graph).

Importing this module imports PyTorch; without it, `BackendUnavailable` says what to
install. `import hrx_async` never imports PyTorch.
"""

from __future__ import annotations

from .._core.install import install_hint
from ..errors import BackendUnavailable

try:
    import torch  # noqa: F401  (nothing here works without it: say so on import)
except ImportError as exc:
    raise BackendUnavailable(
        "torch", f"PyTorch cannot be imported ({exc})", install_hint("torch")
    ) from exc

from ._region import region

__all__ = ["region"]
