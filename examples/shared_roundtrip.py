"""GPU → NPU → GPU on shared memory, with every byte checked.

The program lives in the package (`hrx_async.examples.shared_roundtrip`) so that the
installed `hrx-async bench shared_roundtrip` runs it too; this file runs it from a checkout:

    python examples/shared_roundtrip.py --help
"""

import sys

from hrx_async.examples.shared_roundtrip import main

if __name__ == "__main__":
    sys.exit(main())
