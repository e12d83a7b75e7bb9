"""Face alignment per request: letterbox → similarity fit → packed affine crops → normalize,
against PyTorch on the GPU and OpenCV on the CPU.

The program lives in the package (`hrx_async.examples.align`) so that the installed
`hrx-async bench align` runs it too; this file runs it from a checkout:

    python examples/align.py --help
"""

import sys

from hrx_async.examples.align import main

if __name__ == "__main__":
    sys.exit(main())
