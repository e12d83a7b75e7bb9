"""The runtime layer: the state a `Runtime` opens (`session.Session`), its lanes and
admission (`scheduler`, `region`, `lane_task`, `outcomes`, `poison`, `watch`, `notify`), the
host lane (`host`), completions, prepared graphs, host mappings and interop.

Private: users reach it through `hrx_async.Runtime` and the names `hrx_async` exports. It
builds on `hrx_async._core` and `hrx_async.backends`, and nothing below imports it.
"""
