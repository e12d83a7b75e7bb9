"""`examples/ray_service.py` as a user runs it: started, asked, interrupted (`-m ray` only).

The example starts a local Ray cluster of its own (`--address local`), serves the
transform service on one replica, answers a request correctly over HTTP, and on SIGINT
shuts Serve and Ray down and exits 0.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import free_port, load_module, require_ray

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ray_service.py"


def test_the_example_serves_until_interrupted(request: pytest.FixtureRequest) -> None:
    require_ray(request.config)
    import httpx

    port = free_port()
    command = [sys.executable, str(EXAMPLE), "--backend", "sim", "--replicas", "1"]
    command += ["--cpus-per-replica", "0.5", "--port", str(port), "--address", "local"]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT
    )
    lines: list[str] = []
    serving = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if line.startswith("serving service on "):
                serving.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 150
        while not serving.wait(0.5):
            assert process.poll() is None, "".join(lines)
            assert time.monotonic() < deadline, "".join(lines)
        assert f"http://127.0.0.1:{port}/v1/transform: 1 replica(s), sim" in "".join(lines)
        values = np.linspace(-2, 4, 3000, dtype=np.float32)
        response = httpx.post(
            f"http://127.0.0.1:{port}/v1/transform", json={"values": values.tolist()}, timeout=30
        )
        assert response.status_code == 200, response.text
        expected = load_module(ROOT / "examples" / "service.py", "hrx_example_service_ray")
        got = np.asarray(response.json()["values"], np.float32)
        assert np.array_equal(got, expected.transform_reference(values))
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=30).json()["ok"] is True
    finally:
        process.send_signal(signal.SIGINT)
        try:
            code = process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        reader.join(timeout=10)
    output = "".join(lines)
    assert code == 0, output
    assert "shutting down: each replica drains its runtime" in output
