"""Operations as model fragments: one kernel's inputs, outputs and constants declared as a
`ModelDefinition` of their own, so an operation composes like any model.

    builder = OpFragmentBuilder(ctx, "gather_rows")
    src, ids = builder.region(table_bytes), builder.region(rows * 4)
    out = builder.region(rows * row_bytes, HOST_VISIBLE)
    k = builder.adopt(kernel)                         # a kernel loaded by the operation
    frag = builder.fragment([Dispatch(k, [src.read(), ids.read(), out.write()])],
                            [(src, table_desc), (ids, ids_desc)], [(out, out_desc)])
    model = frag.prepare(3)                           # slots, or frag.record(graph, inputs)

Why: the tensor and image operations (`TensorOps`, `RgbOps`) return leased results from
plans of their own; a service that builds a larger graph wants the same work as part of
it, bound to its tensors in place, or as a prepared model it chains with `submit`. A
fragment form builds exactly what a frozen `ModelSession` would hold, without a session's
buffers: every allocation is declared by size and placement only (memory comes when a
slot or graph uses it, at the extent the commands and IO need), constant data such as a
template is a weight (uploaded once, shared by every slot and graph, counted in
`weight_bytes()`), and the kernel is the operation's own, loaded through the runtime's
`load_gpu_kernel`. All of `ModelDefinition.fragment`'s checks apply.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._core.kernels import GpuKernel
from .._core.memory import GPU_LOCAL, Placement
from ..errors import ContractError
from .context import ModelContext
from .fragment import ModelDefinition, ModelFragment
from .region import Arena, Command, Region
from .session import as_bytes, write_view
from .tensor import TensorDesc


class OpFragmentBuilder:
    """Declared allocations, weights and adopted kernels of one operation's fragment."""

    def __init__(self, context: ModelContext, label: str) -> None:
        if not isinstance(context, ModelContext):
            raise ContractError(f"a fragment is made in a ModelContext, got {context!r}")
        self.context = context
        self.arena = Arena(context.runtime, label)

    def region(self, nbytes: int, placement: Placement = GPU_LOCAL) -> Region:
        """A new allocation of `nbytes` (>= 1) in `placement`, as a whole region."""
        if nbytes < 1:
            raise ContractError(f"a fragment allocation holds at least one byte, got {nbytes}")
        return self.arena.declare(nbytes, placement)

    async def weight(self, data: Any, label: str = "") -> Region:
        """Immutable device memory holding `data`, uploaded now."""
        raw = as_bytes(data, "weight data")
        if raw.nbytes == 0:
            raise ContractError("a weight holds at least one byte")
        runtime = self.context.runtime
        buffer = runtime.allocate(raw.nbytes, GPU_LOCAL, label or f"{self.arena.label}-weight")
        try:
            await write_view(runtime, buffer.view(), raw)
        except BaseException:
            buffer.free()
            raise
        return self.arena.add(buffer, weight=True)

    def adopt(self, kernel: GpuKernel) -> GpuKernel:
        """Let the fragment's dispatches run `kernel` (one of this runtime's)."""
        self.arena.kernels[id(kernel)] = kernel
        return kernel

    def fragment(
        self,
        commands: Sequence[Command],
        inputs: Sequence[tuple[Region, TensorDesc]],
        outputs: Sequence[tuple[Region, TensorDesc]],
    ) -> ModelFragment:
        definition = ModelDefinition(self.context, self.arena)
        return definition.fragment(commands, inputs, outputs)


__all__ = ["OpFragmentBuilder"]
