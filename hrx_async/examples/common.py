"""What every example shares: argument handling, output, exit codes.

An example module defines `NAME`, `USAGE`, `parse(args) -> params` (raising
`UsageError`) and `async run(params, backend, report) -> ExampleResult`. The
same module then runs as a script (`python -m hrx_async.examples.NAME`), from
the thin wrappers in the repository's `examples/` folder, and from
`hrx-async bench NAME`.

Exit codes follow the command line's: 0 success, 1 a failure (a wrong result,
an unavailable backend), 64 a usage error.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import anyio

from .._core.install import install_hint
from .._core.trace import ExecutionTrace
from ..errors import HrxError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 64

LOOPS = ("asyncio", "trio", "uvloop")
BACKENDS = ("auto", "sim", "cuda", "hip")
LOOP_MODULES = {"trio": "trio", "uvloop": "uvloop"}
"""The package each event loop other than plain asyncio needs; its extra has the loop's name."""
EXAMPLE_OPTIONS = ("--npu", "--xclbin", "--insts", "--npu-kernel")
"""Options that take a value and belong to an example's own `parse` (kept in its arguments)."""

P = TypeVar("P")
T = TypeVar("T")


class UsageError(HrxError, ValueError):
    """The command line is wrong; the message says what is allowed."""


def check_output_file(path: str | os.PathLike[str], what: str) -> Path:
    """`path` as a file that can be written: UsageError if it is a directory or its folder
    does not exist (or cannot be written to). Checked before the work that would write it."""
    shown = os.fspath(path)
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"{what} {shown!r} is a directory, not a file")
    parent = target.parent
    if not parent.is_dir():
        raise UsageError(f"{what} {shown!r}: no such directory {os.fspath(parent)!r}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{what} {shown!r}: the directory {os.fspath(parent)!r} is not writable")
    return target


class ExampleFailed(HrxError):
    """The example ran but its result is wrong (a check failed)."""


class LoopUnavailable(HrxError):
    """The event loop asked for is not installed; the message names the extra that brings it."""


def run_on_loop(func: Callable[..., Awaitable[T]], *args: Any, loop: str = "asyncio") -> T:
    """`anyio.run(func, *args)` on `loop`: "asyncio", "trio" or "uvloop" (asyncio on uvloop).

    A loop whose package is missing raises `LoopUnavailable` saying which extra to install.
    """
    if loop not in LOOPS:
        raise UsageError(f"--loop must be one of {', '.join(LOOPS)}, got {loop!r}")
    module = LOOP_MODULES.get(loop)
    if module is not None:
        try:
            importlib.import_module(module)
        except ImportError:
            raise LoopUnavailable(
                f"--loop {loop} needs {module}, which is not installed: {install_hint(loop)}"
            ) from None
    if loop == "uvloop":
        return anyio.run(func, *args, backend="asyncio", backend_options={"use_uvloop": True})
    return anyio.run(func, *args, backend=loop)


def parse_count(text: str, what: str) -> int:
    """A decimal integer argument, or `UsageError` naming the argument."""
    try:
        return int(text, 10)
    except ValueError:
        raise UsageError(f"{what}: invalid integer: {text!r}") from None


class Report:
    """Where an example's output goes: result lines, and progress for long runs.

    Lines are kept (`lines`) and passed to `emit`; progress goes to `progress_to`
    at most every `progress_interval` seconds, so a tight loop can call it freely.
    """

    def __init__(
        self,
        emit: Callable[[str], None] | None = print,
        progress_to: Callable[[str], None] | None = None,
        progress_interval: float = 0.5,
    ) -> None:
        self.lines: list[str] = []
        self._emit = emit
        self._progress_to = progress_to
        self._interval = progress_interval
        self._last_progress = 0.0

    def line(self, text: str) -> None:
        self.lines.append(text)
        if self._emit is not None:
            self._emit(text)

    def progress(self, text: str, force: bool = False) -> None:
        if self._progress_to is None:
            return
        now = time.monotonic()
        if force or now - self._last_progress >= self._interval:
            self._last_progress = now
            self._progress_to(text)


def stderr_progress(text: str) -> None:
    print(f"[hrx-async] {text}", file=sys.stderr, flush=True)


@dataclass
class ExampleResult:
    """An example's measured values (JSON-ready) and, where it took one, its trace."""

    values: dict[str, Any]
    trace: ExecutionTrace | None = None
    lines: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CommonOptions:
    """Options every example takes besides its own positional arguments."""

    backend: str = "auto"
    loop: str = "asyncio"
    help: bool = False
    json: bool = False


def split_common(argv: Sequence[str]) -> tuple[CommonOptions, list[str]]:
    """Take `--backend NAME`, `--loop asyncio|trio|uvloop`, `--json` and `--help` out of `argv`.

    The options in `EXAMPLE_OPTIONS` stay in the rest, with their values, for the example's
    own `parse`.
    """
    backend, loop, wants_help, wants_json = "auto", "asyncio", False, False
    rest: list[str] = []
    items = list(argv)
    index = 0
    while index < len(items):
        item = items[index]
        name, eq, inline = item.partition("=")
        if name in ("--backend", "--loop"):
            if eq:
                value = inline
            elif index + 1 < len(items):
                index += 1
                value = items[index]
            else:
                raise UsageError(f"{name} needs a value")
            if name == "--backend":
                if value not in BACKENDS:
                    raise UsageError(
                        f"--backend must be one of {', '.join(BACKENDS)}, got {value!r}"
                    )
                backend = value
            else:
                if value not in LOOPS:
                    raise UsageError(f"--loop must be one of {', '.join(LOOPS)}, got {value!r}")
                loop = value
        elif name in EXAMPLE_OPTIONS:
            rest.append(item)
            if not eq and index + 1 < len(items):
                index += 1
                rest.append(items[index])
        elif item in ("--help", "-h"):
            wants_help = True
        elif item == "--json":
            wants_json = True
        elif item.startswith("--") and item != "--":
            raise UsageError(f"unknown option {item!r}")
        else:
            rest.append(item)
        index += 1
    return CommonOptions(backend, loop, wants_help, wants_json), rest


@dataclass(frozen=True)
class ExampleSpec(Generic[P]):
    """An example's name, usage line, argument parser and body."""

    name: str
    usage: str
    parse: Callable[[Sequence[str]], P]
    run: Callable[[P, str, Report], Awaitable[ExampleResult]]


COMMON_USAGE = (
    "options: --backend auto|sim|cuda|hip (default auto), --loop asyncio|trio|uvloop "
    "(default asyncio), "
    "--json (print the results as one JSON object)"
)


def main_for(
    spec: ExampleSpec[Any],
    argv: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
    prog: str | None = None,
) -> int:
    """Run an example as a program: parse, run on the chosen loop, map errors to exit codes.

    Progress goes to `progress` (by default to stderr when it is a terminal). With
    `--json` the result lines are not printed; one JSON object with the measured values
    and the lines is printed instead. Errors are printed as `PROG: error: MESSAGE`, where
    `prog` (the example's name by default) is how the program was started.
    """
    prog = prog or spec.name
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        options, rest = split_common(args)
        if options.help:
            print(spec.usage)
            print(COMMON_USAGE)
            return EXIT_OK
        params = spec.parse(rest)
    except UsageError as exc:
        return _usage_failure(spec, prog, exc)
    if progress is None and sys.stderr.isatty():
        progress = stderr_progress
    report = Report(emit=None if options.json else print, progress_to=progress)
    start = time.perf_counter()
    try:
        result = run_on_loop(spec.run, params, options.backend, report, loop=options.loop)
    except UsageError as exc:
        return _usage_failure(spec, prog, exc)
    except (HrxError, OSError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    if options.json:
        document = {
            "example": spec.name,
            "args": rest,
            "backend": result.values.get("backend", options.backend),
            "loop": options.loop,
            "wall_s": round(time.perf_counter() - start, 3),
            "results": result.values,
            "output": report.lines,
        }
        print(json.dumps(document))
    return EXIT_OK


def _usage_failure(spec: ExampleSpec[Any], prog: str, error: UsageError) -> int:
    print(f"{prog}: error: {error}", file=sys.stderr)
    print(spec.usage, file=sys.stderr)
    return EXIT_USAGE


__all__ = [
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "ExampleFailed",
    "ExampleResult",
    "ExampleSpec",
    "LoopUnavailable",
    "Report",
    "UsageError",
    "check_output_file",
    "main_for",
    "parse_count",
    "run_on_loop",
    "split_common",
]
