"""Apps built where they serve: a named app factory, and an ASGI app that builds itself.

A process that hosts a web app somewhere else (a Ray Serve replica, a worker on another
machine) should not receive a pickled app: an app holds a `RuntimeService`, and a service
opens once, in the process that runs it. What travels is the factory's name,

    "examples/service.py:create_app"      a file, loaded under a name of its own
    "my_package.app:create_app"           an importable module

or the factory itself when it is importable by reference, with its keyword arguments.
`ReplicaApp` is the ASGI app that travels: on its first ASGI event (the lifespan startup)
it calls the factory and hands every event to the app it got. The app must keep its
`RuntimeService` in `app.state.service`, as the example apps do, so the host can read
the runtime's health and counters, and, once the lifespan has closed the runtime, log
its `ShutdownReport` where the host's logs go.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import logging
import sys
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from ..errors import ContractError
from .asgi import RuntimeService

AppFactory = str | Callable[..., Any]
"""`"module:function"`, `"path/to/file.py:function"`, or the function itself."""

Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]


def _split(spec: str) -> tuple[str, str]:
    target, colon, attribute = spec.rpartition(":")
    if not colon or not target or not attribute:
        raise ContractError(
            f"an app factory is 'module:function' or 'path/to/file.py:function', got {spec!r}"
        )
    return target, attribute


def _is_file(target: str) -> bool:
    return target.endswith(".py") or "/" in target or "\\" in target


def resolve_factory(factory: AppFactory) -> AppFactory:
    """Check `factory` where it is named, so a typo fails here rather than in every replica.

    A file path becomes absolute (the hosting process may start in another directory); a
    module name must be importable here. Callables are returned as they are.
    """
    if callable(factory):
        return factory
    if not isinstance(factory, str):
        raise ContractError(f"an app factory is a string or a callable, got {factory!r}")
    target, attribute = _split(factory)
    if _is_file(target):
        path = Path(target).expanduser().resolve()
        if not path.is_file():
            raise ContractError(f"app factory {factory!r}: no file {path}")
        return f"{path}:{attribute}"
    if importlib.util.find_spec(target) is None:
        raise ContractError(f"app factory {factory!r}: no module named {target!r}")
    return factory


def _load_file(path: Path) -> Any:
    # One module per file and process, under a name no other file gets; registered before
    # it runs, so dataclasses and pickling inside it find their module.
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:12]
    name = f"hrx_app_{path.stem}_{digest}"
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ContractError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_factory(factory: AppFactory) -> Callable[..., Any]:
    """The callable `factory` names (imports its module or loads its file)."""
    if callable(factory):
        return factory
    target, attribute = _split(factory)
    module = _load_file(Path(target)) if _is_file(target) else importlib.import_module(target)
    found: Any = module
    for part in attribute.split("."):
        found = getattr(found, part, None)
        if found is None:
            raise ContractError(f"app factory {factory!r}: {target} has no {attribute!r}")
    if not callable(found):
        raise ContractError(f"app factory {factory!r} is not callable: {found!r}")
    result: Callable[..., Any] = found
    return result


def service_of(app: Any) -> RuntimeService[Any]:
    """The `RuntimeService` an app keeps in `app.state.service`."""
    service = getattr(getattr(app, "state", None), "service", None)
    if not isinstance(service, RuntimeService):
        raise ContractError(
            f"the app {app!r} keeps no RuntimeService in app.state.service; a served app "
            "sets it, as create_app in examples/service.py does"
        )
    return service


LIFESPAN_ENDS = frozenset({"lifespan.shutdown.complete", "lifespan.shutdown.failed"})


class ReplicaApp:
    """An ASGI app that calls `factory(**options)` on its first event and serves what it got.

    It pickles as the factory, options and logger name alone, so each process that
    unpickles it builds its own app (and its own runtime). Exception handlers added before
    the app exists are added to it once it does (a host may register some before the first
    event). With `report_logger`, the end of the lifespan logs the runtime's
    `ShutdownReport` there ("hrx runtime closed: drained=True ...").
    """

    def __init__(
        self,
        factory: AppFactory,
        options: Mapping[str, Any] | None = None,
        report_logger: str | None = None,
    ) -> None:
        self.factory = resolve_factory(factory)
        self.options = dict(options or {})
        self.report_logger = report_logger
        self._app: Any = None
        self._handlers: list[tuple[Any, Any]] = []

    def __getstate__(self) -> dict[str, Any]:
        return {"factory": self.factory, "options": self.options, "logger": self.report_logger}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.factory = state["factory"]
        self.options = state["options"]
        self.report_logger = state["logger"]
        self._app = None
        self._handlers = []

    @property
    def built(self) -> bool:
        return self._app is not None

    @property
    def app(self) -> Any:
        """The app the factory built; `ContractError` before the first event."""
        if self._app is None:
            raise ContractError("the app is built on its first ASGI event, which has not come")
        return self._app

    @property
    def service(self) -> RuntimeService[Any]:
        return service_of(self.app)

    def build(self) -> Any:
        """Build the app now (once); the first event does this when nobody did."""
        if self._app is None:
            app = load_factory(self.factory)(**self.options)
            service_of(app)  # refuse an app whose runtime nobody could watch, before serving
            for exception, handler in self._handlers:
                app.add_exception_handler(exception, handler)
            self._handlers.clear()
            self._app = app
        return self._app

    def add_exception_handler(self, exception: Any, handler: Any) -> None:
        if self._app is None:
            self._handlers.append((exception, handler))
        else:
            self._app.add_exception_handler(exception, handler)

    async def __call__(self, scope: Mapping[str, Any], receive: Receive, send: Send) -> None:
        app = self.build()
        if scope["type"] != "lifespan" or self.report_logger is None:
            await app(scope, receive, send)
            return

        async def send_after_report(message: Mapping[str, Any]) -> None:
            # The app says its lifespan ended only after its runtime closed, and the host
            # may end the process as soon as it hears so: log first.
            if message["type"] in LIFESPAN_ENDS:
                self._log_shutdown()
            await send(message)

        await app(scope, receive, send_after_report)

    def _log_shutdown(self) -> None:
        log = logging.getLogger(self.report_logger)
        report = self.service.shutdown_report
        if report is None:
            log.warning("hrx runtime was not closed by the app's lifespan")
        else:
            log.info("hrx runtime closed: %s", report.summary())

    def __repr__(self) -> str:
        state = "built" if self.built else "not built"
        return f"<ReplicaApp {self.factory!r} {state}>"


__all__ = [
    "AppFactory",
    "ReplicaApp",
    "load_factory",
    "resolve_factory",
    "service_of",
]
