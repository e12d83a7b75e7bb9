"""A GPU → NPU → GPU inference step on shared memory, for latency and pipelining.

The program lives in the package (`hrx_async.examples.gemm_pipeline`) so that the
installed `hrx-async bench gemm_pipeline` runs it too; this file runs it from a checkout:

    python examples/gemm_pipeline.py --help
"""

import sys

from hrx_async.examples.gemm_pipeline import main

if __name__ == "__main__":
    sys.exit(main())
