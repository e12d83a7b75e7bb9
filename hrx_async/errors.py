"""The exception hierarchy. Every error the runtime raises derives from `HrxError`.

Messages say what was wrong, with the offending value, and what is allowed.
"""

from __future__ import annotations


class HrxError(Exception):
    """Base class of every error raised by hrx_async."""


class Busy(HrxError):
    """The operation cannot proceed now without waiting; retry later or use the waiting form."""


class Unsupported(HrxError):
    """The operation is not possible for this placement, device or backend."""


class DeviceLost(HrxError):
    """The device hit an unrecoverable (sticky) error; the runtime can run no more work."""


class RuntimeClosed(HrxError):
    """The runtime is closed (or was never entered with `async with`)."""


class ContractError(HrxError, ValueError):
    """An argument breaks a documented rule: a size, an alignment, a placement, a binding."""


class BudgetExceeded(HrxError):
    """A memory charge is larger than the budget's whole limit, so it can never fit."""


class Cancelled(HrxError):
    """The work was cancelled before it ran (`Completion.cancel()` or a cancelled dependency)."""


class BackendError(HrxError):
    """A native call failed.

    `backend` names the backend ("cuda", "hip", ...), `operation` the API call,
    `code` the backend's error name or number and `message` its description.
    """

    def __init__(self, backend: str, operation: str, code: str | int, message: str = "") -> None:
        self.backend = backend
        self.operation = operation
        self.code = code
        self.message = message
        detail = f": {message}" if message else ""
        super().__init__(f"{backend}: {operation} failed with {code}{detail}")


class BackendUnavailable(HrxError):
    """A backend cannot be used here; `reason` says why and `install` what would fix it."""

    def __init__(self, backend: str, reason: str, install: str = "") -> None:
        self.backend = backend
        self.reason = reason
        self.install = install
        hint = f" (install: {install})" if install else ""
        super().__init__(f"backend {backend!r} is unavailable: {reason}{hint}")


class CompileError(HrxError):
    """Kernel source failed to compile; `diagnostics` holds the compiler's log."""

    def __init__(self, message: str, diagnostics: str = "") -> None:
        self.diagnostics = diagnostics
        text = f"{message}\n{diagnostics}" if diagnostics else message
        super().__init__(text)


class ExecutionError(HrxError):
    """A region of a submitted graph failed. The cause is chained (`__cause__`)."""

    def __init__(self, graph: str, region: int, cause: BaseException) -> None:
        self.graph = graph
        self.region = region
        super().__init__(f"executing graph {graph!r} region {region}: {cause}")
        self.__cause__ = cause


class DependencyFailed(HrxError):
    """Work was not run because work it depends on failed or was cancelled (cause chained)."""


class PoisonedError(HrxError):
    """A buffer holds the result of failed work; it is cleared by a full overwrite."""

    def __init__(self, buffer: str, first_failure: BaseException | str) -> None:
        self.buffer = buffer
        self.first_failure = first_failure
        super().__init__(
            f"buffer {buffer} is poisoned by an earlier failure ({first_failure}); "
            "overwrite it completely (fill, copy or map_write of the whole buffer) to clear it"
        )


__all__ = [
    "BackendError",
    "BackendUnavailable",
    "BudgetExceeded",
    "Busy",
    "Cancelled",
    "CompileError",
    "ContractError",
    "DependencyFailed",
    "DeviceLost",
    "ExecutionError",
    "HrxError",
    "PoisonedError",
    "RuntimeClosed",
    "Unsupported",
]
