"""How to install an extra, said so that it works wherever the package came from."""

from __future__ import annotations


def install_hint(extra: str) -> str:
    """The pip command that brings the optional extra `extra`: from an index, and from a
    checkout of the source (where `hrx-async[...]` would fetch the released package)."""
    return f'pip install "hrx-async[{extra}]" (from a checkout: pip install ".[{extra}]")'


__all__ = ["install_hint"]
