"""What the two shared-memory examples have in common: the arguments and the NPU copy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .. import Access, Binding, KernelContract, NpuDevice, NpuKernel
from .common import UsageError, parse_count
from .kernels import npu_copy
from .npu_choice import NpuChoice, split_npu

DEFAULT_BYTES = 1 << 20
PACKET = 4096
MAX_BYTES = 64 << 20
RANGE = "bytes must be a multiple of 4096 with 4096 <= bytes <= 67108864"


@dataclass(frozen=True)
class SharedParams:
    """The size of the buffers and the NPU the copy runs on."""

    size: int = DEFAULT_BYTES
    npu: NpuChoice = field(default_factory=NpuChoice)


def parse_shared(args: Sequence[str], usage: str) -> SharedParams:
    """The NPU options and the optional `bytes` argument."""
    npu, rest = split_npu(args)
    return SharedParams(parse_bytes(rest, usage), npu)


def parse_bytes(args: Sequence[str], usage: str) -> int:
    """The optional `bytes` argument: a multiple of 4096 up to 64 MiB."""
    if len(args) > 1:
        raise UsageError(f"{usage.removeprefix('usage: ')} takes at most one argument")
    size = parse_count(args[0], "bytes") if args else DEFAULT_BYTES
    if size <= 0 or size % PACKET or size > MAX_BYTES:
        raise UsageError(f"{RANGE}, got {size}")
    return size


def load_copy(npu: NpuDevice, size: int, layout: str, choice: NpuChoice | None = None) -> NpuKernel:
    """The NPU passthrough program for `size` bytes (size / 4096 packets on one column):
    the host copy on the sim NPU, the xclbin and instructions of `choice` on xrt."""
    source, name = (choice or NpuChoice()).source(npu.target, npu_copy, "copy")
    return npu.load_artifact(
        source,
        name,
        1,
        KernelContract(
            [
                Binding(size, Access.READ, alignment=4, layout=layout),
                Binding(size, Access.WRITE, alignment=4, layout=layout),
            ]
        ),
    )
