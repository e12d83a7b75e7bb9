"""Latency of a GPU fill followed by an NPU copy on shared memory.

The program lives in the package (`hrx_async.examples.shared_bench`) so that the
installed `hrx-async bench shared_bench` runs it too; this file runs it from a checkout:

    python examples/shared_bench.py --help
"""

import sys

from hrx_async.examples.shared_bench import main

if __name__ == "__main__":
    sys.exit(main())
