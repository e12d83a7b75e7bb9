#!/usr/bin/env bash
# The face-alignment benchmark and the CUDA tests of the tensor and RGB operations on one
# H200 (or any CUDA GPU), from the repository root:
#
#   bash benchmarks/align_h200.sh            # OUT=/some/dir to choose where logs go
#
# Writes ${OUT:-.}/align_cuda.json (hrx-async bench align --json: hrx, PyTorch on the
# GPU, OpenCV on the CPU, crops/s each) and ${OUT:-.}/align_cuda_tests.log. The tests
# need trio beside the image's packages (pip install trio, or carried wheels).
set -u
set -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "${OUT:-.}"
OUT_DIR="$(cd "${OUT:-.}" && pwd)"
PYTHON="${PYTHON:-python3}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
cd "$ROOT" || exit 1
HRX_TEST_BACKENDS=sim,cuda timeout "${TEST_TIMEOUT_S:-130}" "$PYTHON" -m pytest -q -p no:cacheprovider -o addopts="" \
    tests/tensor/test_tensor_ops.py tests/image/test_image_rgb.py 2>&1 | tee "$OUT_DIR/align_cuda_tests.log"
timeout "${BENCH_TIMEOUT_S:-90}" "$PYTHON" -m hrx_async bench align --backend cuda --json 200 16 \
    | tee "$OUT_DIR/align_cuda.json"
