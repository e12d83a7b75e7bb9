"""The compiled-kernel disk cache, with an injected compiler (the cache is not hardware)."""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import hrx_async.backends.kernel_cache as kernel_cache_module
from hrx_async.backends.kernel_cache import (
    KernelCache,
    KernelCacheError,
    cache_key,
    default_cache_dir,
    parse_defines,
    register_cli,
)
from hrx_async.errors import CompileError, ContractError, HrxError

SOURCE = 'extern "C" __global__ void k(int* p) { p[0] = VALUE; }'
OPTIONS = ["--gpu-architecture=sm_90", "-DVALUE=3"]


class FakeCompiler:
    """Returns bytes derived from its inputs and counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def build(self, source: str, options: list[str]) -> bytes:
        self.calls += 1
        return f"code for {source!r} with {options}".encode() * 4


def _get(cache: KernelCache, fake: FakeCompiler, /, **changes: object) -> bytes:
    args: dict[str, object] = {
        "source": SOURCE,
        "options": OPTIONS,
        "target": "sm_90",
        "compiler": "nvrtc-13.0",
    }
    args.update(changes)
    source, options = str(args["source"]), list(args["options"])  # type: ignore[call-overload]
    return cache.get_or_build(
        source,
        options,
        str(args["target"]),
        str(args["compiler"]),
        lambda: fake.build(source, options),
    )


def test_miss_then_hit_returns_the_same_code_without_compiling(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path)
    compiler = FakeCompiler()
    first = _get(cache, compiler)
    reopened = KernelCache(tmp_path)
    second = _get(reopened, compiler)
    assert first == second == FakeCompiler().build(SOURCE, OPTIONS)
    assert compiler.calls == 1
    assert (cache.misses, cache.hits, reopened.misses, reopened.hits) == (1, 0, 0, 1)
    assert len(cache.entries()) == 1


@pytest.mark.parametrize(
    "change",
    [
        {"source": SOURCE + " "},
        {"options": [*OPTIONS, "-DOTHER=1"]},
        {"target": "sm_80"},
        {"compiler": "nvrtc-13.1"},
    ],
    ids=["source", "options", "target", "compiler"],
)
def test_every_key_part_separates_entries(tmp_path: Path, change: dict[str, object]) -> None:
    cache = KernelCache(tmp_path)
    compiler = FakeCompiler()
    _get(cache, compiler)
    _get(cache, compiler, **change)
    assert compiler.calls == 2
    assert cache.misses == 2 and cache.hits == 0
    assert len(cache.entries()) == 2


def _entry(cache: KernelCache) -> Path:
    (path,) = cache.entries()
    return path


@pytest.mark.parametrize("damage", ["flip", "truncate", "header", "empty"])
def test_damaged_entries_are_rejected_and_rebuilt(tmp_path: Path, damage: str) -> None:
    cache = KernelCache(tmp_path)
    compiler = FakeCompiler()
    good = _get(cache, compiler)
    path = _entry(cache)
    raw = bytearray(path.read_bytes())
    if damage == "flip":
        raw[-1] ^= 0x01
    elif damage == "truncate":
        raw = raw[:-5]
    elif damage == "header":
        raw[:1] = b"#"
    else:
        raw = bytearray()
    path.write_bytes(bytes(raw))

    again = _get(cache, compiler)
    assert again == good
    assert compiler.calls == 2
    assert cache.rebuilds == 1
    assert KernelCache(tmp_path).load(path.stem) == good  # rewritten whole


def test_hit_refreshes_use_time_and_gc_removes_only_old_entries(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path)
    compiler = FakeCompiler()
    _get(cache, compiler)
    _get(cache, compiler, target="sm_80")
    used = cache.path(cache_key(SOURCE, OPTIONS, "sm_90", "nvrtc-13.0"))
    unused = cache.path(cache_key(SOURCE, OPTIONS, "sm_80", "nvrtc-13.0"))
    ancient = time.time() - 40 * 86400
    for path in (used, unused):
        os.utime(path, (ancient, ancient))
    _get(cache, compiler)  # a hit makes the entry recent again
    assert cache.hits == 1 and compiler.calls == 2
    assert cache.gc(30) == 1
    assert cache.entries() == [used]
    assert cache.gc(30) == 0


def test_gc_rejects_bad_days_and_store_rejects_empty_code(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path)
    for days in (-1, float("nan"), "7", True):
        with pytest.raises(ContractError, match="days"):
            cache.gc(days)  # type: ignore[arg-type]
    with pytest.raises(ContractError, match="non-empty"):
        cache.store("k", b"")
    assert cache.entries() == []


def test_key_is_stable_and_cache_dir_follows_xdg(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert cache_key(SOURCE, OPTIONS, "sm_90", "c") == cache_key(SOURCE, OPTIONS, "sm_90", "c")
    assert len(cache_key(SOURCE, OPTIONS, "sm_90", "c")) == 64
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "hrx_async"
    assert KernelCache().root == tmp_path / "hrx_async"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == Path.home() / ".cache" / "hrx_async"


def test_parse_defines() -> None:
    assert parse_defines(["A=1", "B=x=y", "C="]) == {"A": "1", "B": "x=y", "C": ""}
    for bad in (["A"], ["=1"]):
        with pytest.raises(ContractError, match="key=value"):
            parse_defines(bad)


def _cli(argv: list[str], compiler: Any = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="hrx-async")
    register_cli(parser.add_subparsers(dest="command", required=True), compiler=compiler)
    return parser.parse_args(argv)


def test_cli_gc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache = KernelCache()
    _get(cache, FakeCompiler())
    args = _cli(["gc", "nope"])
    assert args.handler(args) == 64
    assert len(cache.entries()) == 1
    args = _cli(["gc"])
    assert args.handler(args) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["removed"] == 0
    args = _cli(["gc", "0"])
    os.utime(_entry(cache), (1.0, 1.0))
    assert args.handler(args) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["removed"] == 1
    assert cache.entries() == []


def test_cli_compile_usage_and_io_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "k.cu"
    source.write_text(SOURCE)
    args = _cli(["compile", str(source), "k", "VALUE"])
    assert args.handler(args) == 64
    assert "key=value" in capsys.readouterr().err
    args = _cli(["compile", str(tmp_path / "missing.cu"), "k"])
    assert args.handler(args) == 1
    assert "cannot read" in capsys.readouterr().err


# -- a cache on a shared disk ----------------------------------------------------------------

PAYLOAD = b"\x7fELF compiled code " * 8


def _tree(top: Path, skip: Path | None = None) -> dict[str, tuple[int, int, int, bytes]]:
    """(mode, mtime_ns, links, content) of everything under `top`, outside `skip`."""
    found: dict[str, tuple[int, int, int, bytes]] = {}
    for path in sorted(top.rglob("*")):
        if skip is not None and (path == skip or skip in path.parents):
            continue
        info = path.lstat()
        content = path.read_bytes() if stat.S_ISREG(info.st_mode) else b""
        found[str(path.relative_to(top))] = (info.st_mode, info.st_mtime_ns, info.st_nlink, content)
    return found


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_swapped_entries_are_misses_not_the_other_code(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path / "cache")
    path_a = cache.store("A", b"code of A")
    path_b = cache.store("B", b"code of B")
    raw_a, raw_b = path_a.read_bytes(), path_b.read_bytes()
    path_a.write_bytes(raw_b)
    path_b.write_bytes(raw_a)
    assert cache.load("A") is None
    assert cache.load("B") is None
    assert cache.rebuilds == 2
    assert cache.entries() == []  # both removed, so the caller's rebuild replaces them
    cache.store("A", b"code of A")
    assert cache.load("A") == b"code of A"


def test_get_or_build_rebuilds_an_entry_swapped_in_from_another_key(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path)
    compiler = FakeCompiler()
    good = _get(cache, compiler)
    other_options = [*OPTIONS, "-DOTHER=1"]
    other = _get(cache, compiler, options=other_options)
    mine = cache.path(cache_key(SOURCE, OPTIONS, "sm_90", "nvrtc-13.0"))
    theirs = cache.path(cache_key(SOURCE, other_options, "sm_90", "nvrtc-13.0"))
    mine.write_bytes(theirs.read_bytes())
    assert _get(cache, compiler) == good != other
    assert compiler.calls == 3 and cache.rebuilds == 1


def test_a_symlinked_entry_is_not_followed_or_touched(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    cache = KernelCache(root)
    entry = cache.store("k", PAYLOAD)
    outside = tmp_path / "elsewhere.kernel"
    os.replace(entry, outside)  # a sound entry for "k", but outside the cache
    os.utime(outside, (1_000_000.0, 1_000_000.0))
    entry.symlink_to(outside)
    before = _tree(tmp_path, skip=root)

    assert cache.load("k") is None
    assert cache.rebuilds == 1
    assert _tree(tmp_path, skip=root) == before  # not read through, not touched, not removed
    assert cache.gc(0) == 0  # gc neither follows nor removes it
    assert _tree(tmp_path, skip=root) == before

    cache.store("k", PAYLOAD)  # the rebuild replaces the link itself
    assert stat.S_ISREG(entry.lstat().st_mode)
    assert cache.load("k") == PAYLOAD
    assert _tree(tmp_path, skip=root) == before


def test_a_hard_linked_entry_is_rejected_and_the_other_name_left_alone(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    cache = KernelCache(root)
    entry = cache.store("k", PAYLOAD)
    outside = tmp_path / "linked.kernel"
    os.link(entry, outside)
    os.utime(outside, (1_000_000.0, 1_000_000.0))
    content = outside.read_bytes()
    assert cache.load("k") is None
    assert not entry.exists()
    assert outside.read_bytes() == content
    assert outside.stat().st_mtime == 1_000_000.0


VICTIM_KEYS = [
    "../../victim/important",
    "../../x",
    "/absolute/key",
    "a/b",
    "",
    ".",
    "..",
    "nul\0byte",
    "lone \ud800 surrogate",
    "x" * 5000,
    "0" * 64 + "/../..",
]


@pytest.mark.parametrize("key", VICTIM_KEYS, ids=range(len(VICTIM_KEYS)))
def test_any_string_key_stays_inside_the_root(tmp_path: Path, key: str) -> None:
    root = tmp_path / "cache"
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "important.kernel").write_bytes(b"precious")
    (tmp_path / "absolute").mkdir()
    cache = KernelCache(root)
    cache.store("warm", PAYLOAD)  # `kernels` exists, so `..` could resolve
    if key.startswith("/"):
        key = str(tmp_path / key.lstrip("/"))
    before = _tree(tmp_path, skip=root)

    assert cache.load(key) is None
    path = cache.store(key, PAYLOAD + b"!")
    assert path.parent == cache.directory
    assert kernel_cache_module._is_entry_name(path.name)
    assert cache.load(key) == PAYLOAD + b"!"
    assert KernelCache(root).load(key) == PAYLOAD + b"!"
    assert len(cache.entries()) == 2
    assert cache.gc(0) == 2
    assert _tree(tmp_path, skip=root) == before


def test_a_key_aimed_at_a_file_outside_does_not_delete_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim" / "important.kernel"
    victim.parent.mkdir()
    victim.write_bytes(b"not an entry, and not the cache's")
    cache = KernelCache(tmp_path / "cache")
    cache.store("warm", PAYLOAD)
    assert cache.load("../../victim/important") is None
    assert victim.read_bytes() == b"not an entry, and not the cache's"


def test_directories_are_0700_and_entries_0600_even_under_umask_000(tmp_path: Path) -> None:
    root = tmp_path / "made" / "by" / "cache"
    old = os.umask(0)
    try:
        cache = KernelCache(root)
        path = cache.store("k", PAYLOAD)
    finally:
        os.umask(old)
    for directory in (tmp_path / "made", tmp_path / "made" / "by", root, cache.directory):
        assert _mode(directory) == 0o700, directory
    assert _mode(path) == 0o600
    assert [p.name for p in cache.directory.iterdir()] == [path.name]  # no temporaries left


def test_a_loose_directory_we_own_is_tightened(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    (root / "kernels").mkdir(parents=True)
    os.chmod(root, 0o777)
    os.chmod(root / "kernels", 0o775)
    cache = KernelCache(root)
    with pytest.warns(RuntimeWarning, match="tightened"):
        cache.store("k", PAYLOAD)
    assert _mode(root) == 0o700
    assert _mode(root / "kernels") == 0o700
    assert cache.load("k") == PAYLOAD


def _give_away(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `path` belong to another user (for real when we are root)."""
    if os.geteuid() == 0:
        os.chown(path, 65534, 65534)
    else:
        me = os.geteuid()
        monkeypatch.setattr(os, "geteuid", lambda: me + 1)


@pytest.mark.parametrize("which", ["root", "kernels"])
def test_a_directory_of_another_user_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, which: str
) -> None:
    root = tmp_path / "cache"
    cache = KernelCache(root)
    cache.store("planted", PAYLOAD)
    (root / "kernels").chmod(0o777)
    _give_away(root if which == "root" else root / "kernels", monkeypatch)
    before = _tree(tmp_path)
    compiler = FakeCompiler()
    with pytest.warns(RuntimeWarning, match="belongs to uid"):
        assert cache.load("planted") is None
    with pytest.raises(KernelCacheError, match="belongs to uid"):
        cache.store("k", PAYLOAD)
    assert _get(cache, compiler) == _get(cache, compiler)
    assert compiler.calls == 2  # no caching, but working
    assert cache.entries() == [] and cache.gc(0) == 0
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("which", ["root", "kernels"])
def test_a_symlinked_cache_directory_is_not_used(tmp_path: Path, which: str) -> None:
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "kernels").mkdir(parents=True, mode=0o700)
    elsewhere.chmod(0o700)
    root = tmp_path / "cache"
    if which == "root":
        root.symlink_to(elsewhere)
    else:
        root.mkdir(mode=0o700)
        (root / "kernels").symlink_to(elsewhere / "kernels")
    cache = KernelCache(root)
    compiler = FakeCompiler()
    with pytest.warns(RuntimeWarning, match="symlink"):
        assert _get(cache, compiler) == FakeCompiler().build(SOURCE, OPTIONS)
    with pytest.raises(KernelCacheError, match="symlink"):
        cache.store("k", PAYLOAD)
    assert list((elsewhere / "kernels").iterdir()) == []


def test_a_directory_entry_is_a_miss_not_an_error(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path)
    compiler = FakeCompiler()
    key = cache_key(SOURCE, OPTIONS, "sm_90", "nvrtc-13.0")
    cache.directory.mkdir(mode=0o700)
    cache.path(key).mkdir()
    assert cache.load(key) is None
    assert _get(cache, compiler) == FakeCompiler().build(SOURCE, OPTIONS)
    assert cache.path(key).is_dir()  # not a regular file, so not removed
    assert cache.rebuilds == 2


def test_a_fifo_entry_is_a_miss_and_never_blocks(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path)
    cache.store("warm", PAYLOAD)
    fifo = cache.path("k")
    os.mkfifo(fifo)
    result: dict[str, object] = {}

    def load() -> None:
        try:
            result["value"] = cache.load("k")
        except BaseException as exc:
            result["error"] = exc

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(5)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # let the stuck reader go
        thread.join(5)
        pytest.fail("load blocked on a FIFO")
    assert result == {"value": None}
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    cache.store("k", PAYLOAD)  # the rebuild replaces it
    assert cache.load("k") == PAYLOAD


def test_an_entry_of_another_user_is_removed_and_rebuilt(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file away needs root")
    cache = KernelCache(tmp_path)
    path = cache.store("k", PAYLOAD)
    os.chown(path, 65534, 65534)
    assert cache.load("k") is None
    assert not path.exists()


def test_an_unusable_root_never_raises_oserror(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    root.write_bytes(b"a file where the cache should be")
    cache = KernelCache(root)
    compiler = FakeCompiler()
    with pytest.warns(RuntimeWarning, match="not a directory"):
        assert cache.load("k") is None
    assert cache.entries() == []
    assert cache.gc(0) == 0
    with pytest.raises(KernelCacheError, match="not a directory"):
        cache.store("k", PAYLOAD)
    assert _get(cache, compiler) == FakeCompiler().build(SOURCE, OPTIONS)
    assert root.read_bytes() == b"a file where the cache should be"
    nested = KernelCache(root / "below")
    with pytest.raises(KernelCacheError), pytest.warns(RuntimeWarning, match="below a file"):
        nested.store("k", PAYLOAD)
    assert nested.load("k") is None


def test_old_format_entries_are_rebuilt(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path)
    path = cache.path("k")
    path.parent.mkdir(mode=0o700)

    header = {"format": 1, "sha256": hashlib.sha256(PAYLOAD).hexdigest(), "bytes": len(PAYLOAD)}
    path.write_bytes(json.dumps(header).encode() + b"\n" + PAYLOAD)
    assert cache.load("k") is None
    assert cache.rebuilds == 1 and not path.exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("format", lambda n: 3),
        ("format", lambda n: 2.0),  # equal to 2 in Python, but no format this code writes
        ("format", lambda n: True),
        ("format", lambda n: "2"),
        ("format", lambda n: None),
        ("bytes", float),
        ("bytes", str),
    ],
    ids=["3", "2.0", "true", "string", "null", "float length", "string length"],
)
def test_entries_of_a_format_this_code_does_not_know_are_rebuilt(
    tmp_path: Path, field: str, value: Callable[[int], object]
) -> None:
    cache = KernelCache(tmp_path)
    compiler = FakeCompiler()
    code = _get(cache, compiler)
    (path,) = cache.entries()
    raw = path.read_bytes()
    newline = raw.index(b"\n")
    header = json.loads(raw[:newline])
    assert header["format"] == 2 and header["bytes"] == len(code)
    header[field] = value(header[field])
    path.write_bytes(json.dumps(header).encode() + raw[newline:])
    assert _get(cache, compiler) == code
    assert compiler.calls == 2 and cache.rebuilds == 1 and cache.hits == 0
    assert _get(cache, compiler) == code  # the rebuilt entry is sound
    assert compiler.calls == 2 and cache.hits == 1


def test_bad_input_raises_contract_error_and_writes_nothing(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path / "cache")
    for bad_key in (None, 3, b"k", Path("k")):
        with pytest.raises(ContractError, match="key is a str"):
            cache.store(bad_key, PAYLOAD)  # type: ignore[arg-type]
        with pytest.raises(ContractError, match="key is a str"):
            cache.load(bad_key)  # type: ignore[arg-type]
    for bad_info in ([1], {1: "x"}, {"x": object()}, {"x": float("nan")}):
        with pytest.raises(ContractError, match="info"):
            cache.store("k", PAYLOAD, bad_info)  # type: ignore[arg-type]
    with pytest.raises(ContractError, match="non-empty bytes"):
        cache.store("k", "text")  # type: ignore[arg-type]
    with pytest.raises(ContractError, match="root"):
        KernelCache(3)  # type: ignore[arg-type]
    assert not (tmp_path / "cache").exists()


def test_info_cannot_overrule_the_header(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path)
    cache.store("k", PAYLOAD, {"sha256": "0" * 64, "bytes": 1, "key": "other", "format": 9})
    assert cache.load("k") == PAYLOAD


def test_gc_removes_stale_temporaries_only(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path)
    cache.store("k", PAYLOAD)
    stale = cache.directory / ".tmp-deadbeef.kernel"
    fresh = cache.directory / ".tmp-cafef00d.kernel"
    other = cache.directory / "notes.txt"
    for path in (stale, fresh, other):
        path.write_bytes(b"partial")
    ancient = time.time() - 7200
    os.utime(stale, (ancient, ancient))
    os.utime(other, (ancient, ancient))
    assert cache.gc(30) == 1
    assert not stale.exists() and fresh.exists() and other.exists()
    assert cache.gc(0) == 1  # the entry; the fresh temporary may belong to a writer
    assert fresh.exists() and cache.entries() == []


def test_concurrent_writers_and_readers_see_whole_entries(tmp_path: Path) -> None:
    payloads = [bytes([n]) * (4096 + n) for n in range(1, 5)]
    seen: list[bytes | None] = []
    errors: list[BaseException] = []

    def work(payload: bytes) -> None:
        cache = KernelCache(tmp_path)
        try:
            for _ in range(40):
                cache.store("shared", payload)
                seen.append(cache.load("shared"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(p,)) for p in payloads]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert seen and all(value is None or value in payloads for value in seen)
    assert len(KernelCache(tmp_path).entries()) == 1


def test_kernel_cache_imports_no_backend() -> None:
    source = Path(kernel_cache_module.__file__).read_text()
    imported = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            imported.append("." * node.level + (node.module or ""))
            imported.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            imported.extend(alias.name for alias in node.names)
    assert not [name for name in imported if "backend" in name or "cuda" in name]
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, hrx_async\n"
            "before = set(sys.modules)\n"
            "import hrx_async.backends.kernel_cache\n"
            "print(sorted(m for m in set(sys.modules) - before\n"
            "             if 'backends' in m and m != 'hrx_async.backends.kernel_cache'))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "[]"


class FakeToolchain:
    """A compiler for the `compile` command: code that names the symbol, and a call count."""

    def __init__(self) -> None:
        self.calls = 0
        self.targets: list[str | None] = []

    def factory(self, arch: str | None) -> tuple[FakeToolchain, str]:
        self.targets.append(arch)
        return self, arch or "sm_90"

    def compile_options(self, target: str, defines: dict[str, str]) -> list[str]:
        if not target.startswith("sm_"):
            raise ContractError(f"a CUDA target looks like 'sm_90', got {target!r}")
        return [f"--gpu-architecture={target}", *(f"-D{k}={v}" for k, v in sorted(defines.items()))]

    def compiler_version(self) -> str:
        return "fake-1.0"

    def compile(self, source: str, name: str, options: list[str]) -> bytes:
        self.calls += 1
        if "broken" in source:
            raise CompileError("does not compile", "line 1: broken")
        return b"code\0" + ("k" if "k(" in source else "other").encode() + b"\0" + source.encode()


def test_cli_compile_fills_the_cache_with_the_given_compiler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    source = tmp_path / "k.cu"
    source.write_text(SOURCE)
    tools = FakeToolchain()
    args = _cli(["compile", str(source), "k", "VALUE=3"], tools.factory)
    assert args.handler(args) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["cached"] is False and first["target"] == "sm_90"
    key = cache_key(SOURCE, ["--gpu-architecture=sm_90", "-DVALUE=3"], "sm_90", "fake-1.0")
    assert first["key"] == key and first["path"] == str(KernelCache().path(key))
    assert KernelCache().load(key) == tools.compile(SOURCE, "k", [])
    assert args.handler(args) == 0
    assert json.loads(capsys.readouterr().out)["cached"] is True
    assert tools.calls == 2  # one compile by the command, one by this test

    args = _cli(["compile", str(source), "k", "--arch", "sm_80"], tools.factory)
    assert args.handler(args) == 0
    assert json.loads(capsys.readouterr().out)["target"] == "sm_80"
    assert tools.targets[-1] == "sm_80"
    assert len(KernelCache().entries()) == 2

    args = _cli(["compile", str(source), "k", "--arch", "gfx90a"], tools.factory)
    assert args.handler(args) == 64
    assert "sm_90" in capsys.readouterr().err

    args = _cli(["compile", str(source), "missing"], tools.factory)
    source.write_text("void other() {}")
    assert args.handler(args) == 1
    assert "not in the compiled code" in capsys.readouterr().err
    source.write_text("broken")
    assert args.handler(args) == 1
    assert "does not compile" in capsys.readouterr().err
    assert len(KernelCache().entries()) == 2  # neither failure stored anything


def test_cli_compile_without_a_compiler_or_a_usable_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "k.cu"
    source.write_text(SOURCE)
    args = _cli(["compile", str(source), "k"])
    assert args.handler(args) == 1
    assert "no GPU compiler" in capsys.readouterr().err
    (tmp_path / "xdg").write_bytes(b"")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    args = _cli(["compile", str(source), "k"], FakeToolchain().factory)
    with pytest.warns(RuntimeWarning):
        assert args.handler(args) == 1
    assert "kernel cache not used" in capsys.readouterr().err


def test_errors_are_hrx_errors() -> None:
    assert issubclass(KernelCacheError, HrxError)
