"""What the two shared-memory examples have in common: the size argument and the NPU copy."""

from __future__ import annotations

from collections.abc import Sequence

from .. import Access, Binding, KernelContract, KernelSource, NpuDevice, NpuKernel
from .common import UsageError, parse_count
from .kernels import npu_copy

DEFAULT_BYTES = 1 << 20
PACKET = 4096
MAX_BYTES = 64 << 20
RANGE = "bytes must be a multiple of 4096 in 4096..=67108864"


def parse_bytes(args: Sequence[str], usage: str) -> int:
    """The optional `bytes` argument: a multiple of 4096 up to 64 MiB."""
    if len(args) > 1:
        raise UsageError(f"{usage.removeprefix('usage: ')} takes at most one argument")
    size = parse_count(args[0], "bytes") if args else DEFAULT_BYTES
    if size <= 0 or size % PACKET or size > MAX_BYTES:
        raise UsageError(f"{RANGE}, got {size}")
    return size


def load_copy(npu: NpuDevice, size: int, layout: str) -> NpuKernel:
    """The NPU passthrough program for `size` bytes (size / 4096 packets on one column)."""
    return npu.load_artifact(
        KernelSource(host=npu_copy),
        "copy",
        1,
        KernelContract(
            [
                Binding(size, Access.READ, alignment=4, layout=layout),
                Binding(size, Access.WRITE, alignment=4, layout=layout),
            ]
        ),
    )
