"""The driver calls a stream backend makes on every replay, checked without an interpreted frame.

CUDA's and HIP's bindings return a tuple from every call whose first item is the call's
status, falsy on success. `ReplayCalls` holds the five functions a replay calls (graph
launch, copy, event record, stream wait, event query), as a driver table hands them over
(`DriverTable.replay_calls`), and checks their status itself. The module is compiled, so
each of those calls is one native call into the bindings; through a driver table's method
it would be an interpreted frame around the same call, on every region of every replay.
A failed call raises the table's own error for it (`error`), as the table's methods do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import BackendError

StatusCall = Callable[..., tuple[Any, ...]]
"""A bindings function: its result's first item is the status (falsy: success)."""


class ReplayCalls:
    """The per-replay calls of one GPU API's bindings, each checked for its status."""

    __slots__ = (
        "_error",
        "_names",
        "event_query_call",
        "event_record_call",
        "graph_launch_call",
        "memcpy_async_call",
        "memcpy_kind",
        "not_ready",
        "stream_wait_event_call",
    )

    def __init__(
        self,
        error: Callable[[str, Any], BackendError],
        prefix: str,
        graph_launch: StatusCall,
        memcpy_async: StatusCall,
        memcpy_kind: Any,
        event_record: StatusCall,
        stream_wait_event: StatusCall,
        event_query: StatusCall,
        not_ready: Any,
    ) -> None:
        """`prefix` names the API's calls in errors ("cuda": cudaGraphLaunch, ...);
        `memcpy_kind` is the copy direction passed to every copy (the API's "default",
        worked out from the addresses); `not_ready` is the status of an event query
        while the work before the event runs."""
        self._error = error
        self._names = tuple(
            prefix + name
            for name in ("GraphLaunch", "MemcpyAsync", "EventRecord", "StreamWaitEvent")
        )
        self._names += (prefix + "EventQuery",)
        self.graph_launch_call = graph_launch
        self.memcpy_async_call = memcpy_async
        self.memcpy_kind = memcpy_kind
        self.event_record_call = event_record
        self.stream_wait_event_call = stream_wait_event
        self.event_query_call = event_query
        self.not_ready = not_ready

    def graph_launch(self, graph_exec: Any, stream: Any) -> None:
        status = self.graph_launch_call(graph_exec, stream)[0]
        if status:
            raise self._error(self._names[0], status)

    def memcpy_async(self, dst: int, src: int, nbytes: int, stream: Any) -> None:
        """A copy between any two addresses (the API works out the direction)."""
        status = self.memcpy_async_call(dst, src, nbytes, self.memcpy_kind, stream)[0]
        if status:
            raise self._error(self._names[1], status)

    def event_record(self, event: Any, stream: Any) -> None:
        status = self.event_record_call(event, stream)[0]
        if status:
            raise self._error(self._names[2], status)

    def stream_wait_event(self, stream: Any, event: Any) -> None:
        status = self.stream_wait_event_call(stream, event, 0)[0]
        if status:
            raise self._error(self._names[3], status)

    def event_query(self, event: Any) -> bool:
        """True once the work before `event` finished, False while it runs."""
        status = self.event_query_call(event)[0]
        if not status:
            return True
        if status == self.not_ready:
            return False
        raise self._error(self._names[4], status)


__all__ = ["ReplayCalls", "StatusCall"]
