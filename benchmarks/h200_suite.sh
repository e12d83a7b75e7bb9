#!/usr/bin/env bash
# The CUDA benchmarks on each event loop (asyncio, uvloop, trio), then the sim overhead once.
#
#   bash benchmarks/h200_suite.sh            # from the repository root
#   OUT=/some/dir bash benchmarks/h200_suite.sh
#
# Each benchmark prints one JSON line (--json); it is echoed and appended to
# ${OUT:-.}/h200_suite.jsonl. A benchmark that fails, times out or prints no JSON line
# adds {"benchmark": ..., "loop": ..., "error": ...} instead, and the suite goes on.
# Standard error of every run goes to ${OUT:-.}/h200_suite.log as well as to the terminal.
# About 4-5 minutes on an H200 with 16 cores. PYTHON (default python3) and
# SUITE_TIMEOUT_S (per benchmark, default 90) may be set. PIN_FASTEST=1 runs each benchmark
# pinned to the CPU that runs Python fastest at its launch (benchmarks/core_speed.py): on a
# virtual machine whose CPUs differ in speed, the ratios then follow the code, not the CPU
# the process happened to land on (each report's host_speed_us says how fast it ran).

set -o pipefail
set -u

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "${OUT:-.}"
OUT_DIR="$(cd "${OUT:-.}" && pwd)"
JSONL="$OUT_DIR/h200_suite.jsonl"
LOG="$OUT_DIR/h200_suite.log"
PYTHON="${PYTHON:-python3}"
LIMIT="${SUITE_TIMEOUT_S:-90}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
cd "$ROOT" || exit 1

# One JSON object from key=value arguments (values are strings, or JSON with key:=value).
json_line() {
    "$PYTHON" - "$@" <<'EOF'
import json, sys
record = {}
for item in sys.argv[1:]:
    key, value = item.split("=", 1)
    if key.endswith(":"):
        record[key[:-1]] = json.loads(value)
    else:
        record[key] = value
print(json.dumps(record, sort_keys=True))
EOF
}

emit() {
    echo "$1"
    echo "$1" >>"$JSONL"
}

# run_one NAME LOOP SCRIPT [ARGS...]: run a benchmark, record its JSON line or its error.
run_one() {
    local name="$1" loop="$2" script="$3"
    shift 3
    local stdout_file stderr_file rc line error
    stdout_file="$(mktemp)"
    stderr_file="$(mktemp)"
    echo "== $name --loop $loop $*" >&2
    echo "== $(date -u +%FT%TZ) $name --loop $loop $*" >>"$LOG"
    local pin=()
    if [ "${PIN_FASTEST:-0}" = 1 ]; then
        pin=(taskset -c "$("$PYTHON" benchmarks/core_speed.py --fastest --tries 2 --rounds 10000)")
    fi
    timeout -k 10 "$LIMIT" ${pin[@]+"${pin[@]}"} "$PYTHON" "$script" --loop "$loop" --json "$@" \
        >"$stdout_file" 2>"$stderr_file"
    rc=$?
    cat "$stderr_file" >&2
    cat "$stderr_file" >>"$LOG"
    line="$(grep '^{' "$stdout_file" | tail -n 1)"
    if [ "$rc" -eq 0 ] && [ -n "$line" ]; then
        emit "$line"
    else
        if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
            error="timed out after ${LIMIT} s"
        else
            error="$(grep -v '^[[:space:]]*$' "$stderr_file" | tail -n 1)"
            [ -n "$error" ] || error="exit status $rc, no JSON line on standard output"
        fi
        emit "$(json_line benchmark="$name" loop="$loop" error="$error" rc:="$rc")"
    fi
    rm -f "$stdout_file" "$stderr_file"
}

started=$(date +%s)
emit "$(json_line benchmark=suite started="$(date -u +%FT%TZ)" \
    commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
    python="$("$PYTHON" -c 'import platform; print(platform.python_version())')" \
    gpu="$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null |
        head -n 1 || echo unknown)" \
    cpus="$(nproc)")"

for loop in asyncio uvloop trio; do
    run_one cuda_floor "$loop" benchmarks/cuda_floor.py --pairs 2000
    run_one cuda_latency "$loop" benchmarks/cuda_latency.py --pairs 2000
    run_one cuda_overhead "$loop" benchmarks/cuda_overhead.py
    run_one cuda_long_region "$loop" benchmarks/cuda_long_region.py --replays 1000 --log-calls
    run_one cuda_replay "$loop" benchmarks/cuda_replay.py --replays 4000
    run_one cuda_single_launch "$loop" benchmarks/cuda_single_launch.py --replays 4000
    run_one cuda_pipeline "$loop" benchmarks/cuda_pipeline.py --replays 8000
    run_one cuda_user_baselines "$loop" benchmarks/cuda_user_baselines.py --pairs 2000
    run_one cuda_throughput "$loop" benchmarks/cuda_throughput.py --seconds 1.5 --rounds 4
    run_one cuda_torch_external "$loop" benchmarks/cuda_torch_external.py --pairs 2000
done

# The sim backend's per-region overhead, once (it prints text lines; kept as one record).
echo "== sim_overhead" >&2
echo "== $(date -u +%FT%TZ) sim_overhead" >>"$LOG"
sim_out="$(mktemp)"
sim_err="$(mktemp)"
timeout -k 10 "$LIMIT" "$PYTHON" benchmarks/sim_overhead.py >"$sim_out" 2>"$sim_err"
rc=$?
cat "$sim_out"
cat "$sim_err" >&2
cat "$sim_err" >>"$LOG"
if [ "$rc" -eq 0 ]; then
    lines="$("$PYTHON" -c 'import json, sys
print(json.dumps([line.rstrip() for line in open(sys.argv[1]) if line.strip()]))' "$sim_out")"
    emit "$(json_line benchmark=sim_overhead loop=asyncio lines:="$lines")"
else
    error="$(grep -v '^[[:space:]]*$' "$sim_err" | tail -n 1)"
    [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || error="timed out after ${LIMIT} s"
    emit "$(json_line benchmark=sim_overhead loop=asyncio error="$error" rc:="$rc")"
fi
rm -f "$sim_out" "$sim_err"

echo "suite finished in $(($(date +%s) - started)) s; results in $JSONL" >&2
