"""The `hrx-async` command (also `python -m hrx_async`).

    hrx-async demo                 GPU + NPU in parallel on this machine, with a trace and a picture
    hrx-async info | doctor        versions, backends, devices (doctor also self-tests)
    hrx-async bench NAME [ARGS]    one of the example programs, optionally as JSON
    hrx-async run --kernel ...     launch one kernel on files and dump its buffers
    hrx-async trace-plot T -o PNG  draw a saved (Chrome trace-event) trace as a lane timeline

Exit status: 0 success, 1 failure, 64 usage error. Errors read `hrx-async COMMAND: error: ...`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from .. import __version__
from .._core.install import install_hint
from ..errors import ContractError, HrxError, Unsupported
from ..examples import NAMES, spec
from ..examples.common import (
    BACKENDS,
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    LOOPS,
    Report,
    UsageError,
    check_output_file,
    run_on_loop,
    stderr_progress,
)

DEMO_ELEMENTS = 6 << 20
DEMO_MATRICES = 16384
DEMO_SAMPLES = 101
DEMO_TRACE = "hrx-trace.json"
DEMO_TIMELINE = "hrx-timeline.png"

QUIET_HELP = "no progress messages on stderr"

Handler = Callable[[argparse.Namespace], int]


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors exit 64 (EX_USAGE) rather than 2."""

    def error(self, message: str) -> NoReturn:
        message = _only_required(self, message)
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _only_required(parser: argparse.ArgumentParser, message: str) -> str:
    """argparse's "arguments are required" list, less the positionals that may be empty."""
    head = "the following arguments are required: "
    if not message.startswith(head):
        return message
    optional = {
        action.metavar or action.dest
        for action in parser._actions
        if not action.option_strings and action.nargs in ("*", "?", argparse.REMAINDER)
    }
    names = [name for name in message[len(head) :].split(", ") if name not in optional]
    return head + ", ".join(names) if names else message


def _progress(args: argparse.Namespace) -> Callable[[str], None] | None:
    return None if args.quiet else stderr_progress


# -- demo --------------------------------------------------------------------------------------


def demo_command(args: argparse.Namespace) -> int:
    from ..examples import gpu_npu_parallel
    from .plot import check_picture_path

    # Both files are written after seconds of work: a path that cannot be written to is a
    # usage error now, not a failure then.
    check_output_file(args.trace, "--trace")
    check_output_file(args.timeline, "--timeline")
    try:
        check_picture_path(args.timeline)
    except ContractError as exc:
        raise UsageError(str(exc)) from None
    except Unsupported:
        pass  # no matplotlib: the demo runs and says why there is no picture
    params = gpu_npu_parallel.parse(
        [str(args.elements), str(args.matrices), str(args.samples), str(args.trace)]
    )
    report = Report(progress_to=_progress(args))
    report.progress(
        f"demo: {args.elements} GPU elements + {args.matrices} NPU matrices, "
        f"{args.samples} samples on backend {args.backend!r}",
        force=True,
    )
    result = run_on_loop(gpu_npu_parallel.run, params, args.backend, report, loop=args.loop)
    if result.trace is None:
        raise HrxError("the demo recorded no trace")
    try:
        from .plot import plot_timeline

        plot_timeline(
            result.trace,
            args.timeline,
            title=f"gpu_npu_parallel: {result.values['backend']} GPU + NPU lanes, four replays",
        )
    except Unsupported as exc:
        print(f"Timeline: not drawn: {exc}")
        print(f"The trace {args.trace} is written; open it in Perfetto or chrome://tracing.")
        return EXIT_OK
    print(f"Timeline: {args.timeline}")
    return EXIT_OK


# -- info and doctor ---------------------------------------------------------------------------


def _describe_backend(report: dict[str, Any]) -> str:
    name = report.get("backend", "?")
    if not report.get("available"):
        install = f" (install: {report['install']})" if report.get("install") else ""
        return f"  {name}: unavailable: {report.get('reason', 'unknown reason')}{install}"
    details = ", ".join(
        f"{key} {value}" for key, value in report.items() if key not in ("backend", "available")
    )
    return f"  {name}: available ({details})"


def _print_info(data: dict[str, Any]) -> None:
    print(f"hrx-async {data['hrx_async']} on Python {data['python']} ({data['platform']})")
    print(f"cpus: {data['cpus']}")
    print(f"build: {_describe_build(data['build'])}")
    print("packages:")
    for name, version in data["packages"].items():
        print(f"  {name}: {version or 'not installed'}")
    print("backends:")
    for report in data["backends"]:
        print(_describe_backend(report))
    forced = f" (HRX_BACKEND={data['HRX_BACKEND']})" if data["HRX_BACKEND"] else ""
    if data["auto_error"]:
        print(f"Runtime() fails here{forced}: {data['auto_error']}")
    else:
        print(f"Runtime() opens: {data['auto']}{forced}")
    npu = data["npu"]
    print("npu (xrt):")
    for check in npu.get("xrt", ()):
        print(f"  {'ok' if check['ok'] else '--'} {check['check']}")
    npu_forced = f" (HRX_NPU={npu['HRX_NPU']})" if npu["HRX_NPU"] else ""
    if npu["error"]:
        print(f"Runtime() fails here{npu_forced}: {npu['error']}")
    else:
        print(f"Runtime() NPU: {npu['opens']}{npu_forced}")


def _describe_build(build: dict[str, Any]) -> str:
    if build["kind"] == "pure":
        return "pure Python"
    compiled = ", ".join(build["compiled"])
    if build["kind"] == "compiled":
        return f"compiled (mypyc): {compiled}"
    return f"partly compiled (mypyc): {compiled}; pure: {', '.join(build['pure'])}"


def _runtime_failure(command: str, data: dict[str, Any]) -> int:
    """EXIT_FAILURE, said on stderr, when `Runtime()` would fail here; else EXIT_OK."""
    problem = data["auto_error"] or data["npu"]["error"]
    if not problem:
        return EXIT_OK
    print(f"hrx-async {command}: error: Runtime() fails here: {problem}", file=sys.stderr)
    return EXIT_FAILURE


def info_command(args: argparse.Namespace) -> int:
    from .doctor import info

    data = info()
    if args.json:
        print(json.dumps(data, default=str))
    else:
        _print_info(data)
    return _runtime_failure("info", data)


def doctor_command(args: argparse.Namespace) -> int:
    from .doctor import device_nodes, info, run_self_tests

    data = info()
    data["device_nodes"] = device_nodes()
    usable = [r["backend"] for r in data["backends"] if r.get("available")]
    if not args.json:
        _print_info(data)
        print("device nodes:")
        for kind, paths in data["device_nodes"].items():
            print(f"  {kind}: {', '.join(paths) if paths else 'none'}")
        print(f"self-test on {', '.join(usable)} ...", flush=True)
    data["self_test"] = run_self_tests(usable)
    failures = {name: problem for name, problem in data["self_test"].items() if problem}
    if args.json:
        print(json.dumps(data, default=str))
    else:
        for name, problem in data["self_test"].items():
            print(f"  {name}: {'ok' if problem is None else 'FAILED: ' + problem}")
        if failures:
            print(f"{len(failures)} backend(s) failed")
        elif data["auto_error"]:
            print("self-tests passed, but Runtime() fails here")
        else:
            print("all checks passed")
    status = _runtime_failure("doctor", data)
    return EXIT_FAILURE if failures else status


# -- bench -------------------------------------------------------------------------------------


def bench_command(args: argparse.Namespace) -> int:
    from ..examples.common import main_for

    # Global options may also follow NAME, among the program's own arguments.
    forwarded = [item for item in args.args if item not in ("-q", "--quiet")]
    if len(forwarded) != len(args.args):
        args.quiet = True
    if args.backend is not None:
        forwarded += ["--backend", args.backend]
    if args.loop is not None:
        forwarded += ["--loop", args.loop]
    if args.json:
        forwarded.append("--json")
    return main_for(spec(args.name), forwarded, progress=_progress(args), prog="hrx-async bench")


# -- run ---------------------------------------------------------------------------------------


class _Ordered(argparse.Action):
    """Appends (option kind, value) to one shared list, keeping the command line's order.
    The kind is the option's `const` (its name without dashes)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        items = list(getattr(namespace, self.dest) or [])
        items.append((self.const, values))
        setattr(namespace, self.dest, items)


def run_command(args: argparse.Namespace) -> int:
    from .runner import (
        RunSpec,
        buffer_args,
        parse_dims,
        parse_rotate,
        report_line,
        run_kernel,
        scalar_constants,
    )

    try:
        if args.repeat < 1:
            raise ContractError(f"--repeat must be >= 1, got {args.repeat}")
        buffers = buffer_args(args.buffers or [])
        scalars: list[tuple[str, float]] = []
        for kind, text in args.scalars or []:
            try:
                value = int(text, 10) if kind == "i32" else float(text)
            except ValueError:
                raise ContractError(f"--{kind} needs a number, got {text!r}") from None
            if not math.isfinite(value):
                raise ContractError(f"--{kind} needs a finite number, got {text!r} ({value})")
            try:
                scalar_constants(((kind, value),))  # it fits its type
            except ContractError as exc:
                raise ContractError(f"--{kind} {text!r}: {exc}") from None
            scalars.append((kind, value))
        run_spec = RunSpec(
            kernel=args.kernel,
            grid=parse_dims(args.grid, "--grid"),
            block=parse_dims(args.block, "--block"),
            repeat=args.repeat,
            buffers=buffers,
            scalars=tuple(scalars),
            rotate=parse_rotate(args.rotate_input, buffers) if args.rotate_input else None,
            backend=args.backend,
        )
    except ContractError as exc:
        print(f"hrx-async run: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    result = run_on_loop(run_kernel, run_spec, loop=args.loop)
    print(report_line(result))
    return EXIT_OK


# -- trace-plot --------------------------------------------------------------------------------


def trace_plot_command(args: argparse.Namespace) -> int:
    from .plot import check_picture_path, plot_timeline, read_trace_text, timeline_from_text

    check_output_file(args.output, "-o")
    try:
        check_picture_path(args.output)
        # A trace argument naming no text file (a picture, a directory, a FIFO) is a
        # usage error, as `run` says of its input files; a damaged trace is a failure.
        text = read_trace_text(args.trace)
    except ContractError as exc:
        raise UsageError(str(exc)) from None
    timeline = timeline_from_text(text, args.trace)
    plot_timeline(timeline, args.output, title=args.title or Path(args.trace).name)
    print(f"Timeline: {args.output} ({len(timeline.spans)} bars on {len(timeline.rows)} rows)")
    return EXIT_OK


# -- parser ------------------------------------------------------------------------------------


def _add_backend_options(parser: argparse.ArgumentParser, default: str | None = "auto") -> None:
    parser.add_argument(
        "--backend", choices=BACKENDS, default=default, help="GPU backend (default: auto)"
    )
    parser.add_argument(
        "--loop",
        choices=LOOPS,
        default=None if default is None else "asyncio",
        help="event loop (default asyncio; trio and uvloop need the extra of that name)",
    )


def build_parser() -> Parser:
    parser = Parser(
        prog="hrx-async",
        description="Coordinate GPU and NPU work from async Python: demo, info, benchmarks.",
    )
    parser.add_argument("--version", action="version", version=f"hrx-async {__version__}")
    parser.add_argument("-q", "--quiet", action="store_true", help=QUIET_HELP)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    commands.required = True

    demo = commands.add_parser(
        "demo",
        help="run GPU and NPU work in parallel; write hrx-trace.json and hrx-timeline.png",
        description="Runs gpu_npu_parallel at a size that takes a few seconds on the sim "
        "backend, prints its results, writes the trace of four parallel replays and draws "
        f"their lane timeline (needs matplotlib: {install_hint('plot')}).",
    )
    _add_backend_options(demo)
    demo.add_argument("--elements", type=int, default=DEMO_ELEMENTS, help="GPU int32 elements")
    demo.add_argument("--matrices", type=int, default=DEMO_MATRICES, help="NPU 8x8 matrices")
    demo.add_argument("--samples", type=int, default=DEMO_SAMPLES, help="paired samples")
    demo.add_argument("--trace", default=DEMO_TRACE, help=f"trace file (default {DEMO_TRACE})")
    demo.add_argument(
        "--timeline", default=DEMO_TIMELINE, help=f"picture file (default {DEMO_TIMELINE})"
    )
    demo.set_defaults(handler=demo_command)

    for name, handler, text in (
        ("info", info_command, "versions, backends and why a backend is unavailable"),
        ("doctor", doctor_command, "info, device nodes and a self-test of each usable backend"),
    ):
        sub = commands.add_parser(name, help=text, description=text)
        sub.add_argument("--json", action="store_true", help="print one JSON object")
        sub.set_defaults(handler=handler)

    bench = commands.add_parser(
        "bench",
        help="run an example program (its own arguments follow NAME)",
        description=f"Run one of the example programs: {', '.join(NAMES)}. Arguments after "
        "NAME are the program's own (see `hrx-async bench NAME --help`).",
    )
    bench.add_argument("name", choices=NAMES, metavar="NAME", help=" | ".join(NAMES))
    _add_backend_options(bench, default=None)
    bench.add_argument("--json", action="store_true", help="print the results as one JSON object")
    bench.add_argument("args", nargs=argparse.REMAINDER, help="the program's arguments")
    bench.set_defaults(handler=bench_command)

    run = commands.add_parser(
        "run",
        help="launch one kernel on files and dump its buffers",
        description="Launch one kernel and dump its buffers. On sim the kernel is "
        "module:function (or file.py:function), called as function(arrays, constants): "
        "arrays are the buffers as uint8 numpy arrays, in the order given; constants are "
        "the --i32/--f32 scalars packed little-endian in the order given (bytes; e.g. "
        "struct.unpack('<if', constants) for --i32 then --f32). On GPU backends the kernel "
        "is FILE[:SYMBOL] (C++ source or a code object) and the scalars follow the "
        "buffers as arguments. Prints one JSON line: launches, total_ms, per_launch_us, "
        "input_copies.",
    )
    _add_backend_options(run)
    run.add_argument(
        "--kernel",
        required=True,
        metavar="MODULE:FUNCTION|FILE[:SYMBOL]",
        help="module:function or file.py:function on sim; FILE[:SYMBOL] on GPU backends",
    )
    run.add_argument("--grid", required=True, metavar="X[,Y[,Z]]", help="missing parts are 1")
    run.add_argument("--block", required=True, metavar="X[,Y[,Z]]", help="missing parts are 1")
    run.add_argument(
        "--repeat", type=int, default=1, metavar="N", help="launches (>= 1; warm-up when > 1)"
    )
    for option, kind, metavar in (("--i32", "i32", "INT"), ("--f32", "f32", "FLOAT")):
        run.add_argument(
            option,
            dest="scalars",
            action=_Ordered,
            const=kind,
            metavar=metavar,
            help=f"an {kind} scalar argument (repeatable; order kept)",
        )
    for option, kind, metavar, text in (
        ("--in", "in", "FILE", "input file"),
        ("--inout", "inout", "FILE", "file read, then overwritten with the result"),
        ("--out", "out", "PATH:BYTES", "output file of BYTES bytes"),
    ):
        run.add_argument(
            option, dest="buffers", action=_Ordered, const=kind, metavar=metavar, help=text
        )
    run.add_argument(
        "--rotate-input",
        metavar="INDEX:COUNT",
        help="COUNT device copies (2 <= COUNT <= 64) of the INDEX-th buffer, an --in",
    )
    run.set_defaults(handler=run_command)

    plot = commands.add_parser(
        "trace-plot",
        help="draw a trace JSON file as a lane timeline picture",
        description="Draw a Chrome trace-event file (from ExecutionTrace.write, the demo, or "
        "any tool: a traceEvents object or a plain list of events) as a picture: one row per "
        "lane or thread, one labelled bar per region, failed regions hatched red.",
    )
    plot.add_argument("trace", help="trace JSON file")
    plot.add_argument("-o", "--output", required=True, help="picture file (.png, .svg, ...)")
    plot.add_argument("--title", help="picture title (default: the trace file's name)")
    plot.set_defaults(handler=trace_plot_command)

    from ..backends import kernel_cache

    kernel_cache.register_cli(commands, compiler=_cuda_compiler)
    # `-q` also after the command (`hrx-async demo -q`), as the README writes it. SUPPRESS
    # keeps a `-q` given before the command when none follows it.
    for sub in commands.choices.values():
        sub.add_argument(
            "-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help=QUIET_HELP
        )
    return parser


def _cuda_compiler(arch: str | None) -> tuple[Any, str]:
    """The `compile` command's compiler: NVRTC through the cuda backend's driver table.

    Making the table opens no device, so `--arch` works on a machine without a GPU.
    """
    from ..backends import cuda

    return cuda.CudaTable(), arch or cuda.detect_target()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    handler: Handler = args.handler
    try:
        return handler(args)
    except UsageError as exc:
        print(f"hrx-async {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ContractError as exc:
        print(f"hrx-async {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE if args.command == "run" else EXIT_FAILURE
    except (HrxError, OSError) as exc:
        print(f"hrx-async {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except MemoryError as exc:
        # The last resort: sizes are checked before allocating, but memory can still run out.
        detail = f": {exc}" if str(exc) else ""
        print(f"hrx-async {args.command}: error: out of memory{detail}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print(f"hrx-async {args.command}: interrupted", file=sys.stderr)
        return 130


__all__ = ["build_parser", "main"]
