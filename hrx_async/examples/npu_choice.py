"""The NPU options of the examples that run an NPU program: `--npu`, `--xclbin`, `--insts`.

    --npu auto|sim|xrt   which NPU backend runs the example's NPU program (default auto)
    --xclbin PATH        the program's xclbin, as mlir-aie/IRON build it (xrt only)
    --insts PATH         its instruction sequence: insts.bin words or insts.txt hex lines
    --npu-kernel NAME    the kernel's name in the xclbin (default MLIR_AIE)

On the sim NPU the example runs its own host program (a numpy reference of the
same computation); the xrt NPU runs the xclbin and instructions given. So
`--npu xrt` needs both paths (a usage error, exit 64, names what is missing), and
`--npu auto` uses the xrt backend only when the paths are given and an NPU opens
(`Runtime(npu="auto")`), else the sim NPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import KernelSource
from ..backends.sim import SIM_NPU_TARGET
from ..backends.xrt import xrt_source
from .common import UsageError

NPU_CHOICES = ("auto", "sim", "xrt")
DEFAULT_KERNEL = "MLIR_AIE"
OPTIONS = ("--npu", "--xclbin", "--insts", "--npu-kernel")
USAGE = "[--npu auto|sim|xrt] [--xclbin PATH --insts PATH] [--npu-kernel NAME]"


@dataclass(frozen=True)
class NpuChoice:
    """Which NPU backend an example asks for, and the xrt program's files when given."""

    npu: str = "auto"
    xclbin: Path | None = None
    insts: Path | None = None
    kernel: str = DEFAULT_KERNEL

    @property
    def has_program(self) -> bool:
        return self.xclbin is not None and self.insts is not None

    @property
    def runtime_npu(self) -> str:
        """The `Runtime(npu=...)` value: "auto" without an xrt program can only be the sim NPU."""
        if self.npu == "auto" and not self.has_program:
            return "sim"
        return self.npu

    def source(self, target: str, host: Any, sim_name: str) -> tuple[KernelSource, str]:
        """The program and kernel name for an NPU of `target`: `host` on sim, else the xclbin."""
        if target == SIM_NPU_TARGET:
            return KernelSource(host=host), sim_name
        if self.xclbin is None or self.insts is None:
            raise UsageError(f"the {target} NPU needs --xclbin PATH and --insts PATH")
        return xrt_source(self.xclbin, self.insts), self.kernel


def split_npu(args: Sequence[str]) -> tuple[NpuChoice, list[str]]:
    """Take the NPU options out of `args`; `UsageError` naming what is wrong or missing."""
    values: dict[str, str] = {}
    rest: list[str] = []
    items = list(args)
    index = 0
    while index < len(items):
        item = items[index]
        name, eq, inline = item.partition("=")
        if name not in OPTIONS:
            rest.append(item)
            index += 1
            continue
        if eq:
            value = inline
        elif index + 1 < len(items):
            index += 1
            value = items[index]
        else:
            raise UsageError(f"{name} needs a value")
        if not value:
            raise UsageError(f"{name} needs a non-empty value")
        values[name] = value
        index += 1
    npu = values.get("--npu", "auto")
    if npu not in NPU_CHOICES:
        raise UsageError(f"--npu must be one of {', '.join(NPU_CHOICES)}, got {npu!r}")
    xclbin, insts = values.get("--xclbin"), values.get("--insts")
    missing = [name for name, value in (("--xclbin", xclbin), ("--insts", insts)) if not value]
    if npu == "xrt" and missing:
        raise UsageError(
            f"--npu xrt needs the NPU program's files: missing {' and '.join(missing)} "
            "(--xclbin PATH --insts PATH, as mlir-aie/IRON build them)"
        )
    if len(missing) == 1:
        given = "--xclbin" if xclbin else "--insts"
        raise UsageError(f"{given} given without {missing[0]}: the xrt NPU needs both")
    choice = NpuChoice(
        npu,
        Path(xclbin) if xclbin else None,
        Path(insts) if insts else None,
        values.get("--npu-kernel", DEFAULT_KERNEL),
    )
    return choice, rest


__all__ = ["DEFAULT_KERNEL", "NPU_CHOICES", "OPTIONS", "USAGE", "NpuChoice", "split_npu"]
