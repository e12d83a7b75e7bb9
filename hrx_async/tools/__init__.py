"""Tools over the runtime: the `hrx-async` command (`cli`), its environment report and
self-tests (`doctor`), running one kernel from the command line (`runner`), timing helpers
(`benchmark`) and timeline pictures of traces (`plot`).

Nothing in the package below imports this: each tool uses only what `hrx_async` exports
and the layers under it.
"""
