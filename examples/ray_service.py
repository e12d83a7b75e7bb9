"""The transform service (or the model server) on Ray Serve, one runtime per replica.

Run it:  python examples/ray_service.py --backend sim --replicas 2
then:    curl -s localhost:8000/v1/transform -H 'content-type: application/json' \\
              -d '{"values": [1, 2, 3]}'

Each replica serves its own copy of `examples/service.py`'s app (`--app model_server`:
`examples/model_server.py`'s) with its own runtime; with `--backend cuda` or `hip` each
one reserves a GPU (`--gpus-per-replica`, 1 unless the backend is sim), so `--replicas 4`
on a 4-GPU machine puts one runtime on each GPU. Without `--address` it joins the Ray
cluster this machine already runs or starts a local one; `--address auto` insists on an
existing cluster, whose machines need hrx-async installed and this checkout at the same
path. Ctrl-C (or SIGTERM) shuts Serve down: each replica finishes its requests, drains
and closes its runtime and logs "hrx runtime closed: drained=True ..." to its Ray Serve
log. `/healthz`, `/stats` and `/metrics` answer for whichever replica gets the request;
the Ray Serve metrics `hrx_*` cover every replica.

Exit status: 0 after a clean shutdown, 1 when Ray or the backend is missing, 64 usage.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

import hrx_async as hrx
from hrx_async.examples.common import BACKENDS, EXIT_FAILURE, EXIT_OK
from hrx_async.tools.cli import Parser

HERE = Path(__file__).resolve().parent
APPS = {
    "service": (HERE / "service.py", "transform"),
    "model_server": (HERE / "model_server.py", "classify"),
}


def parse(argv: Sequence[str] | None) -> tuple[Parser, object]:
    parser = Parser(prog="ray_service.py", description=__doc__.splitlines()[0])
    parser.add_argument("--app", default="service", choices=sorted(APPS), help="which app")
    parser.add_argument("--backend", default="auto", choices=BACKENDS, help="GPU backend")
    parser.add_argument("--replicas", type=int, default=2, help="replicas, one runtime each")
    parser.add_argument(
        "--gpus-per-replica", type=float, default=None, help="default: 0 on sim, else 1"
    )
    parser.add_argument("--cpus-per-replica", type=float, default=1.0)
    parser.add_argument("--slots", type=int, default=None, help="the app's slots per pool")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--address", default=None, help="Ray cluster to join (auto: existing)")
    args = parser.parse_args(argv)
    if args.replicas < 1:
        parser.error(f"--replicas must be >= 1, got {args.replicas}")
    if args.slots is not None and args.slots < 1:
        parser.error(f"--slots must be >= 1, got {args.slots}")
    if not 1 <= args.port <= 65535:
        parser.error(f"--port must be in 1..65535, got {args.port}")
    for option in ("gpus_per_replica", "cpus_per_replica"):
        value = getattr(args, option)
        if value is not None and value < 0:
            parser.error(f"--{option.replace('_', '-')} must be >= 0, got {value}")
    return parser, args


def stop_on_sigterm(stop: threading.Event) -> None:
    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)


def main(argv: Sequence[str] | None = None) -> int:
    parser, args = parse(argv)
    try:
        from hrx_async.serve.ray import ray_serve, runtime_application

        serve = ray_serve()
    except hrx.HrxError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    import ray

    from hrx_async.backends import resolve

    backend = args.backend
    if args.address is None:
        # The replicas run on this machine: say now, without a traceback, if the backend
        # cannot open here, and never wait for GPUs this machine does not have.
        try:
            backend = resolve(backend)
        except hrx.HrxError as exc:
            print(f"{parser.prog}: error: {exc}", file=sys.stderr)
            return EXIT_FAILURE
    gpus = args.gpus_per_replica
    if gpus is None:
        gpus = 0 if backend == "sim" else 1
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    path, route = APPS[args.app]
    app_options = {} if args.slots is None else {"slots": args.slots}
    ray.init(address=args.address)
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        serve.run(
            runtime_application(
                f"{path}:create_app",
                backend=backend,
                app_options=app_options,
                num_replicas=args.replicas,
                num_gpus=gpus,
                num_cpus=args.cpus_per_replica,
            ),
            name="hrx",
            route_prefix="/",
        )
        base = f"http://{args.host}:{args.port}"
        print(f"serving {args.app} on {base}/v1/{route}: {args.replicas} replica(s), {backend}")
        print("Ctrl-C stops it", flush=True)
        stop = threading.Event()
        stop_on_sigterm(stop)
        try:
            while not stop.wait(1.0):
                pass
        except KeyboardInterrupt:
            pass
        print("shutting down: each replica drains its runtime", flush=True)
        serve.shutdown()
    finally:
        ray.shutdown()
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
