"""The compiled-kernel disk cache, with an injected compiler (the cache is not hardware)."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import pytest

from hrx_async.errors import ContractError
from hrx_async.kernel_cache import (
    KernelCache,
    cache_key,
    default_cache_dir,
    parse_defines,
    register_cli,
)

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


def _cli(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="hrx-async")
    register_cli(parser.add_subparsers(dest="command", required=True))
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
