"""The pure core: lanes, byte intervals, the access tracker, kernels and contracts, memory
arithmetic, graph recording and planning, traces and counters.

Nothing here does I/O, runs an event loop or touches a device, and nothing here imports
from above it: only `hrx_async.errors` and the modules of this package. The runtime
(`hrx_async._runtime`) and the backends build on it; users reach its names through
`hrx_async`.
"""
