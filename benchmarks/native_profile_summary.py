"""Where the loop thread's time goes, from a native sampling profile (py-spy's raw format).

`py-spy record --native -f raw` writes one line per distinct stack: frames from the
outermost, separated by ';', then the number of samples. This keeps the samples taken
while the event loop ran a replay workload (stacks through asyncio's
`BaseEventLoop._run_once` or trio's `unrolled_run`, without the runtime's start-up,
graph preparation and shutdown) and charges each to the
deepest frame of the runtime or of the program's own Python above any driver call: a
compiled function (mypyc's `CPyDef_module___Class___method`), or a Python function. A
sample inside the CUDA driver or cuda-bindings counts as "driver" under the function that
made the call. Prints the driver share and the owners by share.

    python benchmarks/native_profile_summary.py PROFILE.txt [--top 40]
"""

from __future__ import annotations

import argparse
import collections
import re

SETUP = ("__aenter__", "__aexit__", "mix_replay", "Graph.prepare", "load_gpu_kernel")
"""Frames of work that is not the replays: opening, preparing, closing."""
LOOP_FRAMES = ("BaseEventLoop._run_once", "unrolled_run")
"""An event loop's pass: asyncio's, and trio's run loop."""
DRIVER = ("libcuda", "cyruntime", "cydriver", "bindings/", "runtime.cpython")
"""Frames inside the CUDA driver or cuda-bindings."""


def owner(frames: list[str]) -> str:
    """The deepest compiled or Python function among `frames` (outermost first)."""
    for frame in reversed(frames):
        compiled = re.match(r"CPyDef_(\S+)", frame)
        if compiled:
            return compiled.group(1).split("_____mypyc")[0]
        if ".py:" in frame:
            return frame.split(" (")[0] + " [py]"
    return "?"


def summarize(path: str) -> tuple[int, collections.Counter[tuple[str, bool]]]:
    shares: collections.Counter[tuple[str, bool]] = collections.Counter()
    total = 0
    with open(path) as lines:
        for line in lines:
            stack, count = line.rsplit(" ", 1)
            frames = stack.split(";")
            loop = [i for i, frame in enumerate(frames) if frame.startswith(LOOP_FRAMES)]
            if not loop or any(word in stack for word in SETUP):
                continue
            frames = frames[loop[0] :]
            cut = next(
                (i for i, frame in enumerate(frames) if any(d in frame for d in DRIVER)),
                len(frames),
            )
            shares[(owner(frames[:cut]), cut < len(frames))] += int(count)
            total += int(count)
    return total, shares


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("profile", help="py-spy raw output")
    options.add_argument("--top", type=int, default=40)
    args = options.parse_args()
    total, shares = summarize(args.profile)
    if not total:
        raise SystemExit(f"{args.profile}: no samples inside the event loop")
    driver = sum(count for (_, in_driver), count in shares.items() if in_driver)
    print(
        f"{total} samples in the event loop; in the driver or cuda-bindings: "
        f"{100 * driver / total:.1f}%"
    )
    for (name, in_driver), count in shares.most_common(args.top):
        print(f"{100 * count / total:5.1f}%  {'driver' if in_driver else '      '}  {name}")


if __name__ == "__main__":
    main()
