#!/usr/bin/env bash
# The checks a change to the core must pass on a CUDA machine, against one installed build:
# the cuda tests, the stateful test's long form on cuda (600 examples per loop) and the
# cancellation tests with DeprecationWarning as an error.
#
#   pip install --target /tmp/compiled .                  # a compiled install, anywhere
#   bash benchmarks/cuda_checks.sh /tmp/compiled [OUT_DIR]
#
# SITE "." checks the source tree (pure Python). Each check's log goes to OUT_DIR (default
# .), and one summary line per check to standard output; the exit status is the number of
# checks that failed. HRX_STATEFUL_EXAMPLES and CHECK_TIMEOUT_S (per check, default 300)
# may be set.
set -u
SITE="${1:?usage: cuda_checks.sh SITE [OUT_DIR]}"
OUT_DIR="${2:-.}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
LIMIT="${CHECK_TIMEOUT_S:-300}"
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
cd "$ROOT" || exit 1
if [ "$SITE" = . ]; then
    build=pure
    path="$ROOT"
else
    build=compiled
    path="$(cd "$SITE" && pwd):$ROOT"
fi
export PYTHONUNBUFFERED=1 HRX_ASYNC_EXPECT_BUILD="$build"
export PYTHONPATH="$path${PYTHONPATH:+:$PYTHONPATH}"
failed=0

# check NAME PYTEST_ARGS...: run pytest so that the build under test is the one imported
# (-P: the working directory does not go first on sys.path; pythonpath= overrides
# pyproject.toml's, which would put the source tree first).
check() {
    local name="$1"
    shift
    timeout -k 10 "$LIMIT" "$PYTHON" -P -m pytest -o pythonpath= -p no:cacheprovider -q -rs \
        "$@" >"$OUT_DIR/$name.log" 2>&1
    local rc=$?
    echo "$name: rc=$rc $(tail -1 "$OUT_DIR/$name.log")"
    [ "$rc" -eq 0 ] || failed=$((failed + 1))
}

check cuda_tests -m cuda
HRX_TEST_BACKENDS=cuda HRX_STATEFUL_EXAMPLES="${HRX_STATEFUL_EXAMPLES:-600}" \
    check stateful_cuda -m "slow and cuda" tests/runtime/test_stateful.py
check cancel -W error::DeprecationWarning tests/runtime/test_cancel_points.py \
    tests/runtime/test_cancel_warnings.py
exit "$failed"
