"""`python -m hrx_async` is the `hrx-async` command."""

import sys

from .tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
