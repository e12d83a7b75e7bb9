"""The documentation site's code works as written (on the sim backend).

Every ```python block of a page in docs/ carries a marker on the line before it:
`<!-- snippet: run -->` runs the block as a script with HRX_BACKEND=sim (it must exit 0), and
`<!-- snippet: show REASON -->` leaves it unrun, saying why (it needs a GPU, PyTorch, a
service). A block without a marker fails the test, so no example goes unchecked by mistake.
The getting-started page's commands must be the README's, which tests/test_readme.py checks
against .ci/run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SIM_ENV = {**os.environ, "HRX_BACKEND": "sim", "HRX_NPU": "sim"}

_BLOCK = re.compile(
    r"(?:^<!-- snippet: (?P<marker>run|show [^>]*?) -->\n)?"
    r"^```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^```",
    flags=re.DOTALL | re.MULTILINE,
)


def _blocks(page: Path) -> list[tuple[str | None, str, str]]:
    return [
        (match["marker"], match["lang"], match["body"])
        for match in _BLOCK.finditer(page.read_text())
    ]


def _pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def _runnable() -> list[tuple[str, str]]:
    return [
        (f"{page.relative_to(DOCS)}:{number}", body)
        for page in _pages()
        for number, (marker, lang, body) in enumerate(_blocks(page))
        if lang == "python" and marker == "run"
    ]


def test_every_python_block_is_marked() -> None:
    unmarked = [
        f"{page.relative_to(DOCS)}: {body.splitlines()[0] if body else ''}"
        for page in _pages()
        for marker, lang, body in _blocks(page)
        if lang == "python" and marker is None
    ]
    assert not unmarked, "python blocks without a snippet marker:\n" + "\n".join(unmarked)


def test_the_site_has_runnable_snippets() -> None:
    places = {where.split(":")[0] for where, _ in _runnable()}
    assert {"index.md", "concepts.md"} <= places, places


@pytest.mark.parametrize(("where", "code"), _runnable(), ids=[w for w, _ in _runnable()])
def test_snippet_runs(where: str, code: str, tmp_path: Path) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=SIM_ENV,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, f"{where} exited {done.returncode}:\n{done.stderr}"


def _shell_lines(text: str) -> list[str]:
    fence = re.compile(r"^```(?:sh|bash|console|shell)\n(.*?)^```", re.DOTALL | re.MULTILINE)
    return [
        line.strip()
        for body in fence.findall(text)
        for line in body.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]


def test_getting_started_gives_the_readme_commands() -> None:
    readme = _shell_lines((ROOT / "README.md").read_text())
    setup = [line for line in readme if line.startswith("python3 -m venv")]
    page = _shell_lines((DOCS / "index.md").read_text())
    assert setup and all(line in page for line in setup), (setup, page)
