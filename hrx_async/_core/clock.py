"""The clock and the thread identity the compiled core reads on every replay.

Bound to final names here, so compiled modules that import them call them straight from a
native static: an ordinary imported name is a dictionary lookup in the module's globals on
every use (`from time import perf_counter` included), several times per replay.
"""

from __future__ import annotations

import threading
import time
from typing import Final

perf_counter: Final = time.perf_counter
get_ident: Final = threading.get_ident
