"""A disk cache of compiled GPU code, and the `compile` and `gc` commands that manage it.

The cache lives in `default_cache_dir()`, entries in its `kernels` subdirectory.
It may sit on a disk other users can reach, so it trusts nothing it finds there:

- **Names.** Any string is a key. `cache_key` gives a SHA-256 hex digest of
  (source, options, target, compiler version), which names its file directly;
  any other key is hashed (SHA-256 of its UTF-8) into the name. A file name is
  always 64 hex digits and `.kernel`, so no key can reach outside the root.
- **Entries.** One file each: a JSON header line holding the key, the payload's
  length and SHA-256 (and the caller's `info`), then the payload. A load checks
  all of them, so a corrupt, truncated, swapped or foreign entry is a miss: it
  is counted in `rebuilds`, removed when it is a regular file, and the caller
  compiles again. Only a regular file with one link, owned by the effective
  user, is read; it is opened with `O_NOFOLLOW | O_NONBLOCK` and checked with
  `fstat` before any read, so a symlink, directory, FIFO or device is never
  followed, read or blocked on.
- **Directories.** Every directory the cache creates (missing parents of the
  root included) is made 0700. The root and `kernels` are opened without
  following a symlink and checked through their descriptors, which every later
  operation uses. One owned by the effective user with group or other
  permissions is tightened to 0700 (with a warning); one that is a symlink, not
  a directory, or owned by someone else is not used: a `RuntimeWarning` says
  why, loads miss, `get_or_build` compiles every time and `store` raises
  `KernelCacheError`.
- **Writes.** An entry is written to a fresh 0600 temporary in `kernels`,
  synced, and renamed over its name, so readers never see half an entry.
- **Failures.** No `OSError` reaches the caller: `load` misses, `store`
  raises `KernelCacheError` (an `HrxError`), `gc` and `entries` skip what they
  cannot handle. A hit refreshes the entry's modification time, which is what
  `gc(days)` goes by.

The compiler is passed in (`get_or_build`'s `build`, `register_cli`'s `compiler`),
so this module imports no backend and no GPU library.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import hashlib
import json
import os
import re
import secrets
import stat
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from ..errors import ContractError, HrxError

FORMAT = 2
"""Entry format; entries of any other format are misses (format 1 held no key)."""
SUFFIX = ".kernel"
EX_USAGE = 64
EX_FAILURE = 1
DEFAULT_GC_DAYS = 30.0
MAX_ENTRY_BYTES = 1 << 30
"""A larger entry is rejected unread."""
TEMPORARY_GRACE_S = 3600.0
"""`gc` removes temporaries older than this (a writer takes milliseconds), whatever `days` is,
and leaves younger ones to the writer that may own them."""

_ENTRY_NAME = re.compile(r"[0-9a-f]{64}")
_TEMPORARY_NAME = re.compile(r"\.tmp-[0-9A-Za-z_]+\.kernel")
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOCTTY = getattr(os, "O_NOCTTY", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_SUPPORTED = (
    bool(_O_NOFOLLOW and _O_DIRECTORY and _O_NONBLOCK)
    # os.replace is not listed but takes dir_fd wherever os.rename does
    and {os.open, os.stat, os.mkdir, os.unlink, os.rename} <= os.supports_dir_fd
    and {os.listdir, os.utime} <= os.supports_fd
)
"""Whether this platform can do all of the above without following links (POSIX can)."""
_DIRECTORY_FLAGS = os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_NOCTTY | _O_CLOEXEC
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_NOCTTY | _O_CLOEXEC
_PRIVATE_BITS = 0o077

_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


class KernelCacheError(HrxError):
    """The kernel cache could not store an entry (its directory is unusable or unwritable)."""


class Compiler(Protocol):
    """What the `compile` command needs of a GPU compiler (the backends' driver tables fit)."""

    def compile_options(self, target: str, defines: dict[str, str]) -> list[str]: ...

    def compiler_version(self) -> str: ...

    def compile(self, source: str, name: str, options: list[str]) -> bytes: ...


CompilerFactory = Callable[[str | None], tuple[Compiler, str]]
"""Given `--arch` (None: the GPU's own), the compiler and the target to compile for."""


def default_cache_dir() -> Path:
    """The user's cache directory for hrx_async, from platformdirs (the `cache` extra).

    That is `$XDG_CACHE_HOME/hrx_async` or `~/.cache/hrx_async` on Linux,
    `~/Library/Caches/hrx_async` on macOS and `%LOCALAPPDATA%\\hrx_async\\Cache` on
    Windows. Without platformdirs, the XDG rule is used on every system.
    """
    try:
        from platformdirs import user_cache_dir
    except ImportError:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return Path(base) / "hrx_async"
    return Path(user_cache_dir("hrx_async", appauthor=False))


def cache_key(source: str, options: Sequence[str], target: str, compiler: str) -> str:
    """The key for this source compiled with these options for this target."""
    material = json.dumps(
        {"source": source, "options": list(options), "target": target, "compiler": compiler},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(material.encode()).hexdigest()


def entry_name(key: str) -> str:
    """The file name of `key`'s entry: 64 hex digits and `.kernel`, whatever the key."""
    if not isinstance(key, str):
        raise ContractError(f"a kernel cache key is a str, got {type(key).__name__}")
    if _ENTRY_NAME.fullmatch(key):
        return key + SUFFIX
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest() + SUFFIX


class _Unusable(Exception):
    """The cache directory must not be used (a symlink, not a directory, another owner)."""


class KernelCache:
    """Compiled code on disk, verified on every load. Counts hits, misses and rebuilds."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        if root is not None and not isinstance(root, str | os.PathLike):
            raise ContractError(f"a kernel cache root is a path or None, got {type(root).__name__}")
        self.root = Path(root) if root is not None else default_cache_dir()
        self.hits = 0
        self.misses = 0
        self.rebuilds = 0
        """Entries found unusable (corrupt, swapped, foreign, not a file) and compiled again."""

    @property
    def directory(self) -> Path:
        return self.root / "kernels"

    def path(self, key: str) -> Path:
        """Where `key`'s entry lives (inside `directory`, whatever the key)."""
        return self.directory / entry_name(key)

    # -- entries -----------------------------------------------------------------------------

    def load(self, key: str) -> bytes | None:
        """The verified payload of `key`, or None (a rejected regular file is removed)."""
        name = entry_name(key)
        with self._directory(create=False) as directory:
            if directory is None:
                return None
            try:
                seen = os.stat(name, dir_fd=directory, follow_symlinks=False)
            except FileNotFoundError:
                return None
            except OSError:
                self.rebuilds += 1
                return None
            if not stat.S_ISREG(seen.st_mode):  # a symlink, directory, FIFO, device: not opened
                self.rebuilds += 1
                return None
            try:
                fd = os.open(name, _READ_FLAGS, dir_fd=directory)
            except FileNotFoundError:
                return None
            except OSError:  # replaced by a symlink meanwhile (ELOOP), unreadable, ...
                self.rebuilds += 1
                return None
            info: os.stat_result | None = None
            try:
                info = os.fstat(fd)
                if (info.st_dev, info.st_ino) != (seen.st_dev, seen.st_ino):
                    info = None  # replaced since the lstat: a miss, and not ours to remove
                    payload = None
                else:
                    payload = _read_entry(fd, info, key)
                if payload is not None:
                    with contextlib.suppress(OSError):  # a read-only cache still serves hits
                        os.utime(fd)
                    return payload
            except OSError:
                info = None
            finally:
                os.close(fd)
            self.rebuilds += 1
            if info is not None and stat.S_ISREG(info.st_mode):
                _remove_if_same(directory, name, info)
            return None

    def store(self, key: str, payload: bytes, info: dict[str, Any] | None = None) -> Path:
        """Write `key`'s entry atomically and return its path; `KernelCacheError` if it cannot."""
        name = entry_name(key)
        if not isinstance(payload, bytes | bytearray) or not payload:
            raise ContractError(
                f"a cache entry needs non-empty bytes, got {type(payload).__name__}"
            )
        if info is not None and (
            not isinstance(info, dict) or not all(isinstance(k, str) for k in info)
        ):
            raise ContractError(f"cache entry info is a dict with str keys, got {info!r}")
        payload = bytes(payload)
        header = {
            "format": FORMAT,
            "key": key,
            "bytes": len(payload),
            "sha256": hashlib.sha256(payload).hexdigest(),
            "info": info or {},
        }
        try:
            line = json.dumps(header, sort_keys=True, allow_nan=False).encode() + b"\n"
        except (TypeError, ValueError) as exc:
            raise ContractError(f"cache entry info must be plain JSON data: {exc}") from None
        with self._directory(create=True) as directory:
            if directory is None:  # _directory(create=True) raises instead
                raise KernelCacheError(f"kernel cache {str(self.directory)!r} is unusable")
            try:
                _write_entry(directory, name, line + payload)
            except OSError as exc:
                raise KernelCacheError(
                    f"cannot write kernel cache entry in {str(self.directory)!r}: "
                    f"{exc.strerror or exc}"
                ) from None
        return self.directory / name

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
        # An unusable cache costs a compile next time, nothing more.
        with contextlib.suppress(KernelCacheError):
            self.store(key, payload, {"target": target, "compiler": compiler})
        return payload

    def entries(self) -> list[Path]:
        """The entry files (regular files named like entries), sorted; unverified."""
        with self._directory(create=False) as directory:
            if directory is None:
                return []
            return sorted(
                self.directory / name
                for name, info in _listing(directory)
                if _is_entry_name(name) and stat.S_ISREG(info.st_mode)
            )

    def gc(self, days: float = DEFAULT_GC_DAYS) -> int:
        """Remove entries not used for `days` days (and stale temporaries); returns how many."""
        if isinstance(days, bool) or not isinstance(days, int | float) or not days >= 0:
            raise ContractError(f"gc days must be a number >= 0, got {days!r}")
        now = time.time()
        cutoff = now - float(days) * 86400.0
        temporary_cutoff = now - TEMPORARY_GRACE_S
        removed = 0
        with self._directory(create=False) as directory:
            if directory is None:
                return 0
            for name, info in _listing(directory):
                if not stat.S_ISREG(info.st_mode):
                    continue
                if _is_entry_name(name):
                    limit = cutoff
                elif _TEMPORARY_NAME.fullmatch(name):
                    limit = temporary_cutoff
                else:
                    continue
                if info.st_mtime < limit and _remove_if_same(directory, name, info):
                    removed += 1
        return removed

    # -- directories -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _directory(self, create: bool) -> Iterator[int | None]:
        """A descriptor of the checked `kernels` directory, or None when it cannot be used.

        With `create`, missing directories are made and a failure raises
        `KernelCacheError`; without, None stands for "nothing cached here".
        """
        fd: int | None = None
        try:
            fd = self._open_kernels(create)
        except _Unusable as exc:
            _warn_once(str(self.root), f"kernel cache not used: {exc}", stacklevel=4)
            if create:
                raise KernelCacheError(f"kernel cache not used: {exc}") from None
        except OSError as exc:
            if create:
                raise KernelCacheError(
                    f"cannot open kernel cache {str(self.directory)!r}: {exc.strerror or exc}"
                ) from None
        try:
            yield fd
        finally:
            if fd is not None:
                os.close(fd)

    def _open_kernels(self, create: bool) -> int | None:
        if not _SUPPORTED:
            raise _Unusable("this platform cannot open files without following symlinks")
        root = self.root
        if create:
            _make_parents(root.parent)
        root_fd = _open_directory(str(root), None, create)
        if root_fd is None:
            return None
        try:
            return _open_directory("kernels", root_fd, create, shown=str(self.directory))
        finally:
            os.close(root_fd)


def _open_directory(
    name: str, parent: int | None, create: bool, shown: str | None = None
) -> int | None:
    """Open (making it 0700 with `create`) and check one cache directory; None if missing."""
    shown = shown or name
    try:
        fd = os.open(name, _DIRECTORY_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            return None
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=parent)
        try:
            fd = os.open(name, _DIRECTORY_FLAGS, dir_fd=parent)
        except OSError as exc:
            _reject_directory(exc, shown)
            raise
    except OSError as exc:
        _reject_directory(exc, shown)
        raise
    try:
        _check_directory(fd, shown)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _reject_directory(exc: OSError, shown: str) -> None:
    if exc.errno == errno.ELOOP:
        raise _Unusable(f"{shown!r} is a symlink") from None
    if exc.errno == errno.ENOTDIR:
        raise _Unusable(f"{shown!r} is not a directory (or lies below a file)") from None


def _check_directory(fd: int, shown: str) -> None:
    info = os.fstat(fd)
    owner = os.geteuid()
    if info.st_uid != owner:
        raise _Unusable(f"{shown!r} belongs to uid {info.st_uid}, not to uid {owner}")
    mode = stat.S_IMODE(info.st_mode)
    if mode & _PRIVATE_BITS or (mode & 0o700) != 0o700:
        try:
            os.fchmod(fd, 0o700)
        except OSError as exc:
            raise _Unusable(
                f"{shown!r} has mode {mode:04o} and cannot be made 0700 ({exc.strerror})"
            ) from None
        if mode & _PRIVATE_BITS:
            message = f"kernel cache: tightened {shown!r} from mode {mode:04o} to 0700"
            _warn_once(shown, message, stacklevel=7)


def _make_parents(directory: Path) -> None:
    """Make the missing directories of `directory`, each 0700 (XDG asks the same)."""
    missing: list[Path] = []
    current = directory
    while not os.path.lexists(current) and current != current.parent:
        missing.append(current)
        current = current.parent
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        with contextlib.suppress(OSError):  # a stricter umask may have taken more
            os.chmod(path, 0o700)


def _listing(directory: int) -> list[tuple[str, os.stat_result]]:
    """(name, lstat) of what `directory` holds; names that vanish or fail are skipped."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = []
    for name in names:
        try:
            found.append((name, os.stat(name, dir_fd=directory, follow_symlinks=False)))
        except OSError:
            continue
    return found


def _is_entry_name(name: str) -> bool:
    return name.endswith(SUFFIX) and _ENTRY_NAME.fullmatch(name[: -len(SUFFIX)]) is not None


def _remove_if_same(directory: int, name: str, seen: os.stat_result) -> bool:
    """Unlink `name` if it is still the regular file `seen` (not a newer entry)."""
    try:
        now = os.stat(name, dir_fd=directory, follow_symlinks=False)
        if stat.S_ISREG(now.st_mode) and (now.st_dev, now.st_ino) == (seen.st_dev, seen.st_ino):
            os.unlink(name, dir_fd=directory)
            return True
    except OSError:
        pass
    return False


def _read_entry(fd: int, info: os.stat_result, key: str) -> bytes | None:
    """The payload of the open entry `fd` if it is a sound entry for `key`, else None."""
    if (
        not stat.S_ISREG(info.st_mode)
        or info.st_uid != os.geteuid()
        or info.st_nlink != 1
        or not 0 < info.st_size <= MAX_ENTRY_BYTES
    ):
        return None
    chunks = []
    total = 0
    while total <= info.st_size:  # one byte past the size shows a file that grew
        chunk = os.read(fd, info.st_size + 1 - total)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    raw = b"".join(chunks)
    newline = raw.find(b"\n")
    if newline < 0:
        return None
    try:
        header = json.loads(raw[:newline])
    except ValueError:
        return None
    payload = raw[newline + 1 :]
    # Numbers must be ints as written: 2.0 == 2 in Python, yet it is no format this code knows.
    sound = (
        isinstance(header, dict)
        and type(header.get("format")) is int
        and header["format"] == FORMAT
        and header.get("key") == key
        and payload
        and type(header.get("bytes")) is int
        and header["bytes"] == len(payload)
        and header.get("sha256") == hashlib.sha256(payload).hexdigest()
    )
    return payload if sound else None


def _write_entry(directory: int, name: str, data: bytes) -> None:
    """Write `data` to a fresh 0600 temporary in `directory`, then rename it to `name`."""
    for _ in range(8):
        temporary = f".tmp-{secrets.token_hex(8)}{SUFFIX}"
        try:
            fd = os.open(temporary, _WRITE_FLAGS, 0o600, dir_fd=directory)
        except FileExistsError:
            continue
        break
    else:
        raise FileExistsError(errno.EEXIST, "no free temporary name")
    try:
        try:
            os.fchmod(fd, 0o600)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, name, src_dir_fd=directory, dst_dir_fd=directory)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=directory)
        raise


def _warn_once(where: str, message: str, stacklevel: int) -> None:
    """Warn once per process about `where`; `stacklevel` points at the caller of the cache."""
    with _warned_lock:
        if (where, message) in _warned:
            return
        _warned.add((where, message))
    warnings.warn(message, RuntimeWarning, stacklevel=stacklevel + 1)


# -- command line --------------------------------------------------------------------------


def register_cli(subparsers: Any, compiler: CompilerFactory | None = None) -> None:
    """Add `compile SOURCE SYMBOL key=value...` and `gc [DAYS]` to an argparse subparsers.

    `compiler` gives the `compile` command its compiler and target (see
    `CompilerFactory`); without one, `compile` says that none is configured.
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
    compile_parser.set_defaults(handler=functools.partial(compile_command, compiler=compiler))
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


def _error(command: str, message: str, status: int) -> int:
    print(f"hrx-async {command}: error: {message}", file=sys.stderr)
    return status


def compile_command(args: argparse.Namespace, compiler: CompilerFactory | None = None) -> int:
    """`compile`: the cached code for SOURCE, compiled with `compiler` on a miss and stored."""
    try:
        defines = parse_defines(args.defines)
    except ContractError as exc:
        return _error("compile", str(exc), EX_USAGE)
    try:
        source = Path(args.source).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        return _error("compile", f"cannot read {args.source!r}: {exc}", EX_FAILURE)
    if compiler is None:
        return _error("compile", "no GPU compiler is configured for this command", EX_FAILURE)
    cache = KernelCache()
    try:
        tool, target = compiler(args.arch)
        options = tool.compile_options(target, defines)
        version = tool.compiler_version()
        key = cache_key(source, options, target, version)
        payload = cache.load(key)
        cached = payload is not None
        if payload is None:
            payload = tool.compile(source, args.symbol, options)
    except ContractError as exc:
        return _error("compile", str(exc), EX_USAGE)
    except HrxError as exc:
        return _error("compile", str(exc), EX_FAILURE)
    if args.symbol.encode() + b"\0" not in payload:
        missing = f"symbol {args.symbol!r} is not in the compiled code"
        return _error("compile", missing + '; declare the kernel extern "C"', EX_FAILURE)
    if not cached:
        try:
            cache.store(key, payload, {"target": target, "compiler": version})
        except HrxError as exc:
            return _error("compile", str(exc), EX_FAILURE)
    print(
        json.dumps(
            {
                "symbol": args.symbol,
                "target": target,
                "compiler": version,
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
        cache = KernelCache()
        removed = cache.gc(days)
    except (ValueError, ContractError):
        return _error("gc", f"DAYS must be a number >= 0, got {args.days!r}", EX_USAGE)
    print(json.dumps({"removed": removed, "days": days, "cache": str(cache.root)}))
    return 0


__all__ = [
    "DEFAULT_GC_DAYS",
    "Compiler",
    "CompilerFactory",
    "KernelCache",
    "KernelCacheError",
    "cache_key",
    "compile_command",
    "default_cache_dir",
    "entry_name",
    "gc_command",
    "parse_defines",
    "register_cli",
]
