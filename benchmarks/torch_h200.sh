#!/usr/bin/env bash
# The PyTorch classifier (examples/torch_classifier.py) on one H200, or any CUDA GPU with
# PyTorch and torchvision: its tests on sim (CPU PyTorch) and cuda, then the load benchmark
# against the two PyTorch services users write today. From the repository root:
#
#   bash benchmarks/torch_h200.sh            # OUT=/some/dir to choose where logs go
#
# Writes ${OUT:-.}/torch_classifier_tests.log, ${OUT:-.}/torch_service_load.jsonl (one JSON
# line per server and client count) and ${OUT:-.}/torch_service_load.md (the whole output:
# command line, machine, JSON lines, markdown table). The tests run on asyncio and, where
# trio is installed, on trio too. About 3 minutes; PYTHON (default python3),
# TEST_TIMEOUT_S and BENCH_TIMEOUT_S may be set, and BENCH_ARGS replaces the benchmark's
# options (default: 1, 8 and 64 clients, 3 s phases, 2 rounds).
set -u
set -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "${OUT:-.}"
OUT_DIR="$(cd "${OUT:-.}" && pwd)"
PYTHON="${PYTHON:-python3}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
cd "$ROOT" || exit 1
select=()
"$PYTHON" -c "import trio" 2>/dev/null || select=(-k "not trio")
HRX_TEST_BACKENDS=sim,cuda timeout "${TEST_TIMEOUT_S:-300}" "$PYTHON" -m pytest -q -rs \
    -p no:cacheprovider -o addopts="" "${select[@]}" tests/serve/test_torch_classifier.py \
    2>&1 | tee "$OUT_DIR/torch_classifier_tests.log"
tests=$?
# shellcheck disable=SC2086
timeout "${BENCH_TIMEOUT_S:-420}" "$PYTHON" benchmarks/torch_service_load.py --backend cuda \
    ${BENCH_ARGS:---clients 1 8 64 --seconds 3 --rounds 2} \
    --json "$OUT_DIR/torch_service_load.jsonl" 2>&1 | tee "$OUT_DIR/torch_service_load.md"
bench=$?
echo "tests exit $tests, benchmark exit $bench"
[[ $tests -eq 0 && $bench -eq 0 ]]
