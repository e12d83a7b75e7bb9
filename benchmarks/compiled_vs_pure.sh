#!/usr/bin/env bash
# The CUDA latency and throughput rows on several builds of hrx_async, in turns.
#
#   pip install --target /tmp/compiled .          # a compiled install, anywhere
#   bash benchmarks/compiled_vs_pure.sh /tmp/compiled [OUT_FILE]
#   BUILDS="listed=/tmp/a more=/tmp/b" bash benchmarks/compiled_vs_pure.sh - [OUT_FILE]
#
# By default two builds: "compiled" (COMPILED_SITE) and "pure" (this checkout's source tree);
# BUILDS names others as label=site pairs (site "." is the source tree). Each benchmark line
# gets "build": LABEL and is appended to OUT_FILE (default compiled_vs_pure.jsonl). Two
# rounds over the builds; each benchmark compares against its own baseline in its own process.
set -u
COMPILED_SITE="${1:?usage: compiled_vs_pure.sh COMPILED_SITE [OUT_FILE]}"
OUT_FILE="${2:-compiled_vs_pure.jsonl}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
BUILDS="${BUILDS:-compiled=$COMPILED_SITE pure=.}"
cd "$ROOT" || exit 1
export PYTHONUNBUFFERED=1
tagged() { sed "s/^{/{\"build\": \"$1\", /" >>"$OUT_FILE"; }
for round in 1 2; do
    for pair in $BUILDS; do
        build="${pair%%=*}"
        site="${pair#*=}"
        if [ "$site" = . ]; then path="$ROOT"; else path="$site"; fi
        path="$path${PYTHONPATH:+:$PYTHONPATH}"
        echo "== round $round: $build ($site)" >&2
        for loop in asyncio uvloop trio; do
            PYTHONPATH="$path" timeout 90 "$PYTHON" benchmarks/cuda_floor.py --loop "$loop" \
                --pairs 2000 --json --seconds 0.7 --rounds 2 | tagged "$build"
        done
        for loop in asyncio trio; do
            PYTHONPATH="$path" timeout 60 "$PYTHON" benchmarks/cuda_replay.py --loop "$loop" \
                --json --replays 4000 | tagged "$build"
            PYTHONPATH="$path" timeout 60 "$PYTHON" benchmarks/cuda_pipeline.py --loop "$loop" \
                --json --replays 8000 | tagged "$build"
        done
        PYTHONPATH="$path" timeout 60 "$PYTHON" benchmarks/cuda_overhead.py --loop asyncio --json \
            | tagged "$build"
    done
done
