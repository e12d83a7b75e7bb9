"""Native sessions: a synchronous third-party stage (a library with its own streams,
graphs and allocations) run in the runtime's order on a GPU's compute lane.

`Runtime.native_session(state, fence)` makes one. `await session.run(stage)` waits until
everything submitted before it has finished and the compute lane is its own, then runs
`stage(state)` and always `fence(state)` on a worker thread (the loop stays free), and
gives the lane back: compute work submitted later cannot overtake it, upload, download
and NPU work go on meanwhile. The fence must drain every stream the state uses, after a
failed stage too. A failing fence quarantines the session: its state is kept alive on
purpose (memory or graphs may still be in use on the device) and every later `run` raises
`DeviceLost`; the runtime and other sessions stay usable.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import anyio

from .._core import validate as _validate
from .._core.lane import Lane
from ..errors import Busy, ContractError, DeviceLost
from .hold import LaneHold
from .scheduler import Scheduler

T = TypeVar("T")
R = TypeVar("R")

_QUARANTINED: list[Any] = []
"""The states of quarantined sessions: never dropped, as work may still use what they own."""
_running = threading.local()
"""Per thread: the runtimes whose native stage this thread is running (recursion guard)."""


def running_stage_of(runtime_key: int) -> bool:
    """Whether this thread runs a native stage of that runtime now (a nested `run` of the
    same runtime from inside a stage would wait for itself)."""
    keys: set[int] | None = getattr(_running, "keys", None)
    return keys is not None and runtime_key in keys


class NativeSession(Generic[T]):
    """A third-party stage's state and fence, run in the runtime's order (module docstring).
    Made by `Runtime.native_session`."""

    def __init__(
        self,
        scheduler: Callable[[], Scheduler],
        runtime_key: int,
        state: T,
        fence: Callable[[T], Any],
        gpu: int,
        label: str,
    ) -> None:
        if not callable(fence):
            raise ContractError(f"the fence must be callable, got {_validate.shown(fence)}")
        self._scheduler = scheduler
        self._runtime_key = runtime_key
        self._state = state
        self._fence = fence
        self._key = (Lane.COMPUTE, gpu)
        self.label = label
        self._quarantined: BaseException | None = None

    @property
    def quarantined(self) -> bool:
        """A fence failed: the session refuses every stage from now on."""
        return self._quarantined is not None

    @property
    def state(self) -> T:
        """The state stages run on; `DeviceLost` once the session is quarantined."""
        self._refuse_quarantined()
        return self._state

    def in_own_stage(self) -> bool:
        """Whether the calling thread runs a stage of this session's runtime now."""
        return running_stage_of(self._runtime_key)

    def _refuse_quarantined(self) -> None:
        if self._quarantined is not None:
            raise DeviceLost(
                f"native session {self.label!r} is quarantined: its fence failed "
                f"({self._quarantined}); open a new session"
            )

    async def run(self, stage: Callable[[T], R]) -> R:
        """Run `stage(state)`, then `fence(state)`, in the runtime's order; return what the
        stage returned (a value that stands for a client error is returned as it is).

        Raises, without calling the stage: `DeviceLost` once quarantined, `Busy` for a nested
        run of this runtime from inside one of its stages or when `max_submissions` stages and
        submissions are pending. A stage that raises: its exception, after the fence ran. A
        fence that raises: `ExecutionError` caused by it, and the session is quarantined.
        Cancelling the caller while it waits skips the stage if it has not started; a
        started stage always runs to its end (with its fence).
        """
        self._refuse_quarantined()
        if not callable(stage):
            raise ContractError(f"run() takes a callable stage, got {_validate.shown(stage)}")
        if self.in_own_stage():
            raise Busy(
                f"recursive native session run on the runtime of {self.label!r}: a stage "
                "cannot wait for a stage of its own runtime"
            )
        outcome: dict[str, Any] = {}
        completion = self._scheduler().submit_hold(
            self.label, self._key, LaneHold(lambda: self._work(stage, outcome))
        )
        try:
            await completion.wait_done()
        except anyio.get_cancelled_exc_class():
            completion.cancel()  # skips it if it has not started; a started one finishes
            raise
        if "stage_error" in outcome:
            raise outcome["stage_error"]
        error = completion.exception()
        if error is not None:
            raise error
        result: R = outcome["value"]
        return result

    def _work(self, stage: Callable[[T], R], outcome: dict[str, Any]) -> BaseException | None:
        """On the worker thread: the stage, then always the fence; the region's failure."""
        keys: set[int] | None = getattr(_running, "keys", None)
        if keys is None:
            keys = _running.keys = set()
        keys.add(self._runtime_key)
        try:
            try:
                outcome["value"] = stage(self._state)
            except BaseException as exc:
                outcome["stage_error"] = exc
            try:
                self._fence(self._state)
            except BaseException as exc:
                self._quarantined = exc
                _QUARANTINED.append(self._state)
                return exc  # the region's failure: `ExecutionError` caused by it
        finally:
            keys.discard(self._runtime_key)
        stage_error: BaseException | None = outcome.get("stage_error")
        return stage_error

    def __repr__(self) -> str:
        state = "quarantined" if self.quarantined else "healthy"
        return f"<NativeSession {self.label!r} {state}>"
