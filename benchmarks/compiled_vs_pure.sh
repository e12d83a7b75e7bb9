#!/usr/bin/env bash
# The CUDA latency and throughput rows on the compiled core and on pure Python, in turns.
#
#   pip install --target /tmp/compiled .          # a compiled install, anywhere
#   bash benchmarks/compiled_vs_pure.sh /tmp/compiled [OUT_FILE]
#
# The pure build is this checkout's source tree. Each benchmark line gets "build": "compiled"
# or "pure" and is appended to OUT_FILE (default compiled_vs_pure.jsonl). Two rounds of
# compiled, pure; each benchmark compares against its own baseline in its own process.
set -u
COMPILED_SITE="${1:?usage: compiled_vs_pure.sh COMPILED_SITE [OUT_FILE]}"
OUT_FILE="${2:-compiled_vs_pure.jsonl}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
cd "$ROOT" || exit 1
export PYTHONUNBUFFERED=1
tagged() { sed "s/^{/{\"build\": \"$1\", /" >>"$OUT_FILE"; }
for build in compiled pure compiled pure; do
    if [ "$build" = compiled ]; then path="$COMPILED_SITE"; else path="$ROOT"; fi
    path="$path${PYTHONPATH:+:$PYTHONPATH}"
    for loop in asyncio uvloop trio; do
        PYTHONPATH="$path" timeout 90 "$PYTHON" benchmarks/cuda_floor.py --loop "$loop" \
            --pairs 2000 --json --seconds 0.7 --rounds 2 | tagged "$build"
    done
    PYTHONPATH="$path" timeout 60 "$PYTHON" benchmarks/cuda_replay.py --loop asyncio --json \
        --replays 4000 | tagged "$build"
    PYTHONPATH="$path" timeout 60 "$PYTHON" benchmarks/cuda_pipeline.py --loop asyncio --json \
        --replays 8000 | tagged "$build"
    PYTHONPATH="$path" timeout 60 "$PYTHON" benchmarks/cuda_overhead.py --loop asyncio --json \
        | tagged "$build"
done
