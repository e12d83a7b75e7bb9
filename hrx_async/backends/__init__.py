"""Backend selection. Optional backends are imported only when asked for."""

from __future__ import annotations

import importlib
import os
from typing import Any

from ..errors import BackendUnavailable, ContractError
from .base import Backend

GPU_BACKENDS = ("sim", "cuda", "hip")
_AUTO_ORDER = ("cuda", "hip")


def _open_named(name: str, device: int) -> Backend:
    if name == "sim":
        from .sim import SimBackend

        return SimBackend()
    try:
        module = importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
        raise BackendUnavailable(name, "this build of hrx_async has no such backend") from exc
    opened: Backend = module.open_backend(device)
    return opened


def open_gpu_backend(name: str, device: int = 0) -> tuple[Backend, list[str]]:
    """The backend for `name` ("auto", "sim", "cuda", "hip"), and why "auto" skipped others.

    "auto" honours the HRX_BACKEND environment variable, else tries cuda, then
    hip, then falls back to sim.
    """
    if name == "auto":
        name = os.environ.get("HRX_BACKEND", "auto") or "auto"
    if name not in (*GPU_BACKENDS, "auto"):
        raise ContractError(f"backend must be one of auto, {', '.join(GPU_BACKENDS)}; got {name!r}")
    if name != "auto":
        return _open_named(name, device), []
    skipped: list[str] = []
    for candidate in _AUTO_ORDER:
        try:
            return _open_named(candidate, device), skipped
        except BackendUnavailable as exc:
            skipped.append(str(exc))
    return _open_named("sim", device), skipped


def probe(name: str) -> dict[str, Any]:
    """Whether backend `name` can open here, and its description or the reason it cannot."""
    try:
        backend = _open_named(name, 0)
    except BackendUnavailable as exc:
        return {"backend": name, "available": False, "reason": exc.reason, "install": exc.install}
    try:
        return {"available": True, **backend.describe()}
    finally:
        backend.close()
