"""The README's API example runs as written (on the sim backend)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_api_example_runs_and_prints_statistics() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert blocks, "README.md has no python example"
    env = {**os.environ, "HRX_BACKEND": "sim"}
    done = subprocess.run(
        [sys.executable, "-c", blocks[0]], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "'completions': 3" in done.stdout
