"""A disk cache of compiled GPU code, and the `compile` and `gc` commands that manage it.

Entries are keyed by the SHA-256 of (source, compiler options, target,
compiler version), so a change to any of them compiles anew. Each entry is one
file: a JSON header line holding the payload's length and SHA-256, then the
payload. Every load checks both; a tampered or truncated entry is deleted and
rebuilt. Files are written to a temporary name and renamed into place, so
concurrent writers never expose half an entry. A hit refreshes the entry's
modification time, which is what `gc(days)` goes by.

The cache lives under `$XDG_CACHE_HOME/hrx_async` (default `~/.cache/hrx_async`).
The compiler is passed in, so this module needs no GPU library.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .errors import ContractError, HrxError

FORMAT = 1
SUFFIX = ".kernel"
EX_USAGE = 64
EX_FAILURE = 1
DEFAULT_GC_DAYS = 30.0


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/hrx_async`, or `~/.cache/hrx_async` when the variable is unset."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hrx_async"


def cache_key(source: str, options: Sequence[str], target: str, compiler: str) -> str:
    """The entry name for this source compiled with these options for this target."""
    material = json.dumps(
        {"source": source, "options": list(options), "target": target, "compiler": compiler},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(material.encode()).hexdigest()


class KernelCache:
    """Compiled code on disk, verified on every load. Counts hits, misses and rebuilds."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root is not None else default_cache_dir()
        self.hits = 0
        self.misses = 0
        self.rebuilds = 0
        """Entries found corrupt (hash or length mismatch) and compiled again."""

    @property
    def directory(self) -> Path:
        return self.root / "kernels"

    def path(self, key: str) -> Path:
        return self.directory / f"{key}{SUFFIX}"

    def load(self, key: str) -> bytes | None:
        """The verified payload of `key`, or None (a corrupt entry is deleted)."""
        path = self.path(key)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        payload = _verified_payload(raw)
        if payload is None:
            self.rebuilds += 1
            path.unlink(missing_ok=True)
            return None
        with contextlib.suppress(OSError):  # a read-only cache still serves hits
            os.utime(path)
        return payload

    def store(self, key: str, payload: bytes, info: dict[str, Any] | None = None) -> Path:
        """Write an entry atomically and return its path."""
        if not isinstance(payload, bytes | bytearray) or not payload:
            raise ContractError(
                f"a cache entry needs non-empty bytes, got {type(payload).__name__}"
            )
        header = {
            "format": FORMAT,
            "sha256": hashlib.sha256(payload).hexdigest(),
            "bytes": len(payload),
            **(info or {}),
        }
        directory = self.directory
        directory.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=SUFFIX)
        try:
            with os.fdopen(handle, "wb") as stream:
                stream.write(json.dumps(header, sort_keys=True).encode() + b"\n")
                stream.write(bytes(payload))
            final = self.path(key)
            os.replace(temporary, final)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        return final

    def get_or_build(
        self,
        source: str,
        options: Sequence[str],
        target: str,
        compiler: str,
        build: Callable[[], bytes],
    ) -> bytes:
        """The cached code for this source, options, target and compiler, built on a miss."""
        key = cache_key(source, options, target, compiler)
        payload = self.load(key)
        if payload is not None:
            self.hits += 1
            return payload
        self.misses += 1
        payload = build()
        # An unwritable cache costs a compile next time, nothing more.
        with contextlib.suppress(OSError):
            self.store(key, payload, {"target": target, "compiler": compiler})
        return payload

    def entries(self) -> list[Path]:
        try:
            return sorted(self.directory.glob(f"*{SUFFIX}"))
        except OSError:
            return []

    def gc(self, days: float = DEFAULT_GC_DAYS) -> int:
        """Remove entries not used for `days` days (and stale temporaries); returns how many."""
        if isinstance(days, bool) or not isinstance(days, int | float) or not days >= 0:
            raise ContractError(f"gc days must be a number >= 0, got {days!r}")
        cutoff = time.time() - float(days) * 86400.0
        removed = 0
        for path in self.entries():
            try:
                if path.stat().st_mtime < cutoff:
                    path.unlink()
                    removed += 1
            except FileNotFoundError:
                continue
        return removed


def _verified_payload(raw: bytes) -> bytes | None:
    newline = raw.find(b"\n")
    if newline < 0:
        return None
    try:
        header = json.loads(raw[:newline])
    except ValueError:
        return None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        return None
    payload = raw[newline + 1 :]
    if header.get("bytes") != len(payload):
        return None
    if header.get("sha256") != hashlib.sha256(payload).hexdigest():
        return None
    return payload


# -- command line --------------------------------------------------------------------------


def register_cli(subparsers: Any) -> None:
    """Add `compile SOURCE SYMBOL key=value...` and `gc [DAYS]` to an argparse subparsers.

    Each sets `handler`, a function of the parsed namespace returning the exit status
    (0 success, 64 usage error, 1 failure).
    """
    compile_parser = subparsers.add_parser(
        "compile",
        help="compile a CUDA C++ kernel into the kernel cache",
        description="Compile SOURCE for the GPU (NVRTC), with key=value pairs as -D defines, "
        "and store the code in the kernel cache that load_gpu_kernel uses.",
    )
    compile_parser.add_argument("source", help="CUDA C++ source file")
    compile_parser.add_argument("symbol", help='the kernel\'s extern "C" name')
    compile_parser.add_argument("defines", nargs="*", metavar="key=value", help="-D defines")
    compile_parser.add_argument(
        "--arch", default=None, help="target such as sm_90 (default: the GPU's own)"
    )
    compile_parser.set_defaults(handler=compile_command)
    gc_parser = subparsers.add_parser(
        "gc",
        help="remove cached kernels unused for DAYS days",
        description="Remove kernel-cache entries unused for DAYS days "
        f"(default {DEFAULT_GC_DAYS:g}).",
    )
    gc_parser.add_argument("days", nargs="?", default=str(DEFAULT_GC_DAYS), metavar="DAYS")
    gc_parser.set_defaults(handler=gc_command)


def parse_defines(items: Sequence[str]) -> dict[str, str]:
    """`key=value` strings as a dict; ContractError for anything else."""
    defines: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ContractError(f"defines are key=value, got {item!r}")
        defines[key] = value
    return defines


def compile_command(args: argparse.Namespace) -> int:
    try:
        defines = parse_defines(args.defines)
    except ContractError as exc:
        print(f"hrx-async compile: {exc}", file=sys.stderr)
        return EX_USAGE
    try:
        source = Path(args.source).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        print(f"hrx-async compile: cannot read {args.source!r}: {exc}", file=sys.stderr)
        return EX_FAILURE
    try:
        from .backends import cuda

        target = args.arch or cuda.detect_target()
        options = cuda.compile_options(target, defines)
        compiler = cuda.nvrtc_version()
        cache = KernelCache()
        key = cache_key(source, options, target, compiler)
        cached = cache.load(key) is not None
        payload = cache.get_or_build(
            source,
            options,
            target,
            compiler,
            lambda: cuda.compile_cxx(source, args.symbol, options),
        )
    except ContractError as exc:
        print(f"hrx-async compile: {exc}", file=sys.stderr)
        return EX_USAGE
    except HrxError as exc:
        print(f"hrx-async compile: {exc}", file=sys.stderr)
        return EX_FAILURE
    if args.symbol.encode() + b"\0" not in payload:
        print(
            f"hrx-async compile: symbol {args.symbol!r} is not in the compiled code; "
            'declare the kernel extern "C"',
            file=sys.stderr,
        )
        return EX_FAILURE
    print(
        json.dumps(
            {
                "symbol": args.symbol,
                "target": target,
                "compiler": compiler,
                "key": key,
                "path": str(cache.path(key)),
                "bytes": len(payload),
                "cached": cached,
            }
        )
    )
    return 0


def gc_command(args: argparse.Namespace) -> int:
    try:
        days = float(args.days)
        removed = KernelCache().gc(days)
    except (ValueError, ContractError):
        print(f"hrx-async gc: DAYS must be a number >= 0, got {args.days!r}", file=sys.stderr)
        return EX_USAGE
    except OSError as exc:
        print(f"hrx-async gc: {exc}", file=sys.stderr)
        return EX_FAILURE
    print(json.dumps({"removed": removed, "days": days, "cache": str(KernelCache().root)}))
    return 0


__all__ = [
    "DEFAULT_GC_DAYS",
    "KernelCache",
    "cache_key",
    "compile_command",
    "default_cache_dir",
    "gc_command",
    "parse_defines",
    "register_cli",
]
