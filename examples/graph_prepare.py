"""What dependency inference costs when a graph is recorded and prepared.

The program lives in the package (`hrx_async.examples.graph_prepare`) so that the
installed `hrx-async bench graph_prepare` runs it too; this file runs it from a checkout:

    python examples/graph_prepare.py --help
"""

import sys

from hrx_async.examples.graph_prepare import main

if __name__ == "__main__":
    sys.exit(main())
