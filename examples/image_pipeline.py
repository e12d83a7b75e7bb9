"""Vision preprocessing on the device: resize → normalize → patchify, per request image.

The program lives in the package (`hrx_async.examples.image_pipeline`) so that the
installed `hrx-async bench image_pipeline` runs it too; this file runs it from a checkout:

    python examples/image_pipeline.py --help
"""

import sys

from hrx_async.examples.image_pipeline import main

if __name__ == "__main__":
    sys.exit(main())
