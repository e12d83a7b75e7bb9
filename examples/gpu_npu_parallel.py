"""GPU and NPU work on disjoint buffers, sequentially and in parallel.

The program lives in the package (`hrx_async.examples.gpu_npu_parallel`) so that the
installed `hrx-async bench gpu_npu_parallel` runs it too; this file runs it from a checkout:

    python examples/gpu_npu_parallel.py --help
"""

import sys

from hrx_async.examples.gpu_npu_parallel import main

if __name__ == "__main__":
    sys.exit(main())
