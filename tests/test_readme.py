"""Every command and code block of the README works as written (on the sim backend).

- ```python blocks run as scripts with HRX_BACKEND=sim; a block that builds a FastAPI app is
  imported instead, and the app is driven through its lifespan with httpx's ASGI transport;
  one that imports PyTorch or CuPy runs where that library is installed (CPU PyTorch will do).
- Shell lines (```sh, ```bash, ```console, ```shell) that run `hrx-async` are run in one
  temporary directory, in README order (so a later command may read what the demo wrote);
  the demo runs with -q, and commands that are slow or touch the user's files with --help.
- Set-up steps (`python3 -m venv`, activating it, `pip install`, `python -m pytest`,
  `git clone`) are not run: they must be the steps `.ci/run` takes, with the same arguments.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CI_RUN = ROOT / ".ci" / "run"
MAX_README_BYTES = 15_300
SHELL_LANGUAGES = {"sh", "bash", "console", "shell"}
# Subcommands run with --help only: they need files or a GPU, or change the user's cache.
HELP_ONLY = {"run", "compile", "gc"}
# Example programs too slow for the test at the sizes a README would show.
HELP_ONLY_BENCHES = {"gemm_pipeline", "shared_bench"}
SIM_ENV = {**os.environ, "HRX_BACKEND": "sim", "HRX_NPU": "sim"}
# A block that imports one of these runs (on sim) only where it is installed.
OPTIONAL_LIBRARIES = ("torch", "cupy")

_FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", flags=re.DOTALL | re.MULTILINE)


def _blocks(language: set[str]) -> list[str]:
    return [body for lang, body in _FENCE.findall(README.read_text()) if lang in language]


def _python_blocks() -> list[str]:
    return _blocks({"python"})


def _is_asgi_app(code: str) -> bool:
    return "FastAPI(" in code


def _shell_commands() -> list[list[str]]:
    """Each `&&`/`;`-separated command of every shell line, as argv lists, in README order."""
    commands: list[list[str]] = []
    for block in _blocks(SHELL_LANGUAGES):
        for raw in block.splitlines():
            line = raw.strip()
            if line.startswith("$ "):
                line = line[2:]
            if not line or line.startswith("#"):
                continue
            lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
            lexer.whitespace_split = True
            lexer.commenters = "#"
            current: list[str] = []
            for token in lexer:
                if token in {"&&", ";", "||"}:
                    commands.append(current)
                    current = []
                else:
                    current.append(token)
            if current:
                commands.append(current)
    return [command for command in commands if command]


def _ci_commands() -> list[list[str]]:
    """The commands of `.ci/run`, as argv lists (a `step` or `timeout` wrapper removed)."""
    commands: list[list[str]] = []
    for raw in CI_RUN.read_text().splitlines():
        try:
            tokens = shlex.split(raw, comments=True)
        except ValueError:
            continue
        pieces: list[list[str]] = [[]]
        for token in tokens:
            if token in {"&&", "||", ";"}:
                pieces.append([])
            else:
                pieces[-1].append(token)
        for argv in pieces:
            while argv and argv[0] in {"step", "timeout"}:
                argv = argv[1:]
                while argv and (argv[0].startswith("-") or argv[0].isdigit()):
                    argv = argv[1:]
            if argv:
                commands.append(argv)
    return commands


def _is_python(word: str) -> bool:
    return (
        word in {"python", "python3", '"$python"', "$python"}
        or re.fullmatch(r"python3(\.\d+)?", word) is not None
    )


def _module_args(argv: list[str], module: str) -> list[str] | None:
    """The arguments after `python -m MODULE` (or the bare MODULE command), else None."""
    if len(argv) >= 3 and _is_python(argv[0]) and argv[1:3] == ["-m", module]:
        return argv[3:]
    if argv and argv[0] == module:
        return argv[1:]
    return None


def _pip_requirements(argv: list[str]) -> list[str] | None:
    args = _module_args(argv, "pip")
    if args is None or not args or args[0] != "install":
        return None
    return [arg for arg in args[1:] if not arg.startswith("-")]


def _hrx_argv(command: list[str]) -> list[str]:
    """How the test runs a README `hrx-async` command."""
    executable = Path(sys.executable).parent / "hrx-async"
    prefix = [str(executable)] if executable.exists() else [sys.executable, "-m", "hrx_async"]
    args = command[1:]
    positional = [arg for arg in args if not arg.startswith("-")]
    subcommand = positional[0] if positional else ""
    if subcommand in HELP_ONLY or (
        subcommand == "bench" and len(positional) > 1 and positional[1] in HELP_ONLY_BENCHES
    ):
        index = args.index(subcommand) + (2 if subcommand == "bench" else 1)
        return [*prefix, *args[:index], "--help"]
    if subcommand == "demo" and "-q" not in args:
        args = ["-q", *args]
    return [*prefix, *args]


def test_readme_is_a_short_guide() -> None:
    size = len(README.read_bytes())
    assert size < MAX_README_BYTES, f"README.md is {size} bytes; keep it under {MAX_README_BYTES}"
    text = README.read_text()
    for heading in ("## Set-up", "## Rules the runtime keeps", "## Backends"):
        assert heading in text
    for link in re.findall(r"\]\(((?!https?:)[^)#]+)\)", text):
        assert (ROOT / link).exists(), f"README links to a missing file: {link}"


def test_readme_has_a_trio_and_a_fastapi_example() -> None:
    blocks = _python_blocks()
    assert any("trio.run(" in block for block in blocks), "no complete trio example"
    assert any(_is_asgi_app(block) for block in blocks), "no complete FastAPI example"


@pytest.mark.parametrize(
    "code",
    [block for block in _python_blocks() if not _is_asgi_app(block)],
    ids=lambda code: code.split("\n", 1)[0][:40],
)
def test_readme_python_block_runs(code: str, tmp_path: Path) -> None:
    for library in OPTIONAL_LIBRARIES:
        if re.search(rf"^import {library}$", code, re.MULTILINE) and not importlib.util.find_spec(
            library
        ):
            pytest.skip(f"the block needs {library}, which is not installed here")
    script = tmp_path / "example.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=SIM_ENV,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    if "statistics()" in code:
        assert "'completions':" in done.stdout


def _import_app(code: str, tmp_path: Path, name: str) -> Any:
    path = tmp_path / f"{name}.py"
    path.write_text(code)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module.app


@pytest.mark.parametrize("async_backend", ["asyncio", "trio"])
def test_readme_fastapi_example_serves(
    async_backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import httpx

    monkeypatch.setenv("HRX_BACKEND", "sim")
    monkeypatch.setenv("HRX_NPU", "sim")
    apps = [block for block in _python_blocks() if _is_asgi_app(block)]
    assert apps
    for number, code in enumerate(apps):
        app = _import_app(code, tmp_path, f"readme_app_{number}")
        posts = [
            route.path
            for route in app.routes
            if "POST" in getattr(route, "methods", ()) and "{" not in route.path
        ]
        assert posts, "the FastAPI example has no POST route"

        async def exercise(app: Any = app, posts: list[str] = posts) -> None:
            transport = httpx.ASGITransport(app=app)
            client = httpx.AsyncClient(transport=transport, base_url="http://app")
            async with app.router.lifespan_context(app), client as c:
                health = await c.get("/healthz")
                assert health.status_code == 200, health.text
                assert health.json()["backend"] == "sim"
                for path in posts:
                    answers = [await c.post(path, json=[1.0, 2.0, 3.0]) for _ in range(3)]
                    for answer in answers:
                        assert answer.status_code == 200, answer.text
                    if path == "/scale":
                        assert answers[-1].json() == [3.0, 5.0, 7.0]
                    too_long = await c.post(path, json=[0.0] * 100_000)
                    assert too_long.status_code == 422
                stats = (await c.get("/stats")).json()
                assert stats["completions"] == stats["submissions"] >= 3

        anyio.run(exercise, backend=async_backend)


def test_readme_setup_steps_are_the_ci_steps() -> None:
    ci = _ci_commands()
    ci_pips = [req for argv in ci if (req := _pip_requirements(argv)) is not None]
    ci_pytests = [args for argv in ci if (args := _module_args(argv, "pytest")) is not None]
    assert ci_pips and ci_pytests, "could not read .ci/run's install and test steps"
    ci_text = CI_RUN.read_text()
    seen = {"pip": 0, "pytest": 0, "hrx-async": 0}
    for command in _shell_commands():
        shown = " ".join(command)
        if command[0] == "hrx-async":
            seen["hrx-async"] += 1
        elif (requirements := _pip_requirements(command)) is not None:
            assert requirements in ci_pips, f"README `{shown}`: .ci/run installs {ci_pips}"
            seen["pip"] += 1
        elif (args := _module_args(command, "pytest")) is not None:
            assert args in ci_pytests, f"README `{shown}`: .ci/run runs pytest with {ci_pytests}"
            seen["pytest"] += 1
        elif _module_args(command, "venv") is not None:
            assert "-m venv" in ci_text, f"README `{shown}`: .ci/run makes no venv"
        elif command[0] in {".", "source"} and command[-1].endswith("bin/activate"):
            assert "bin/activate" in ci_text, f"README `{shown}`: .ci/run activates no venv"
        elif command[:2] == ["git", "clone"]:
            assert "git clone" in ci_text, f"README `{shown}`: .ci/run clones nothing"
        elif len(command) >= 2 and _is_python(command[0]) and command[1].startswith("examples/"):
            # The example runs for real in its own test; here its options must parse.
            done = subprocess.run(
                [sys.executable, str(ROOT / command[1]), "--help"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, f"README `{shown}`: --help exited {done.returncode}"
        else:
            pytest.fail(f"README shell command `{shown}` is neither run nor checked by this test")
    assert seen["pip"] >= 1 and seen["pytest"] >= 1 and seen["hrx-async"] >= 1, seen


def test_readme_hrx_async_commands_exit_0(tmp_path: Path) -> None:
    commands = [command for command in _shell_commands() if command[0] == "hrx-async"]
    assert any("demo" in command for command in commands), "the README does not run the demo"
    for command in commands:
        argv = _hrx_argv(command)
        done = subprocess.run(
            argv, capture_output=True, text=True, env=SIM_ENV, cwd=tmp_path, timeout=180
        )
        assert done.returncode == 0, (
            f"`{' '.join(command)}` exited {done.returncode}: {done.stderr}"
        )
        if "demo" in command:
            assert (tmp_path / "hrx-trace.json").stat().st_size > 0
            assert "Both CPU references match exactly" in done.stdout
