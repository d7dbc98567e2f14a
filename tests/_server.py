"""Waiting for a vLLM server a test started (shared by the server fixtures)."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from pathlib import Path


def wait_until_healthy(
    process: subprocess.Popen, port: int, log: Path, timeout: float = 300
) -> None:
    """Return once ``/health`` answers 200; ``RuntimeError`` with the log's tail if the
    server exits or does not answer within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"server exited:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"server did not start:\n{log.read_text()[-3000:]}")
        time.sleep(1)
