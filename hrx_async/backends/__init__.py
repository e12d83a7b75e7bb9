"""Backend selection. Optional backends are imported only when asked for."""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from typing import Any

from ..errors import BackendUnavailable, ContractError
from .base import Backend

GPU_BACKENDS = ("sim", "cuda", "hip")
_AUTO_ORDER = ("cuda", "hip")


def _open_named(name: str, devices: Sequence[int]) -> Backend:
    """Backend `name` over `devices` (device ordinals; several make a several-GPU backend)."""
    if name == "sim":
        from .sim import SimBackend

        return SimBackend(gpus=len(devices))
    try:
        module = importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
        raise BackendUnavailable(name, "this build of hrx_async has no such backend") from exc
    if len(devices) == 1:
        opened: Backend = module.open_backend(devices[0])
        return opened
    from .multi_gpu import MultiGpuBackend

    backends: list[Any] = []
    try:
        for device in devices:
            backends.append(module.open_backend(device))
        return MultiGpuBackend(backends)
    except BaseException:
        for backend in backends:
            backend.close()
        raise


def requested_backend(name: str) -> str:
    """The backend `name` asks for once HRX_BACKEND is read: "auto" or one of GPU_BACKENDS.

    "auto" defers to HRX_BACKEND when it is set and not empty. ContractError names the
    allowed values, and HRX_BACKEND when the wrong value came from there.
    """
    what = "backend"
    if name == "auto":
        forced = os.environ.get("HRX_BACKEND", "")
        if forced:
            name, what = forced, "HRX_BACKEND"
    if name not in (*GPU_BACKENDS, "auto"):
        raise ContractError(f"{what} must be one of auto, {', '.join(GPU_BACKENDS)}; got {name!r}")
    return name


def open_gpu_backend(name: str, devices: Sequence[int] = (0,)) -> tuple[Backend, list[str]]:
    """The backend for `name` ("auto", "sim", "cuda", "hip") over the device ordinals
    `devices`, and why "auto" skipped others.

    "auto" honours the HRX_BACKEND environment variable, else tries cuda, then
    hip, then falls back to sim.
    """
    name = requested_backend(name)
    if name != "auto":
        return _open_named(name, devices), []
    skipped: list[str] = []
    for candidate in _AUTO_ORDER:
        try:
            return _open_named(candidate, devices), skipped
        except BackendUnavailable as exc:
            skipped.append(str(exc))
    return _open_named("sim", devices), skipped


def resolve(name: str = "auto", reports: dict[str, dict[str, Any]] | None = None) -> str:
    """The backend `open_gpu_backend(name)` opens here, or the error it would raise.

    `reports` maps backend names to `probe` results already taken; a backend missing
    from it is probed now. Nothing stays open.
    """
    known = dict(reports or {})

    def report(backend: str) -> dict[str, Any]:
        if backend not in known:
            known[backend] = probe(backend)
        return known[backend]

    name = requested_backend(name)
    candidates = (*_AUTO_ORDER, "sim") if name == "auto" else (name,)
    for candidate in candidates:
        if report(candidate).get("available"):
            return candidate
    # "auto" ends with sim, so the error is about sim or about the backend asked for.
    found = report(candidates[-1])
    raise BackendUnavailable(
        candidates[-1], found.get("reason", "unknown reason"), found.get("install", "")
    )


def probe(name: str) -> dict[str, Any]:
    """Whether backend `name` can open here, and its description or the reason it cannot."""
    try:
        backend = _open_named(name, (0,))
    except BackendUnavailable as exc:
        return {"backend": name, "available": False, "reason": exc.reason, "install": exc.install}
    try:
        return {"available": True, **backend.describe()}
    finally:
        backend.close()
