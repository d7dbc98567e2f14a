"""Starting a vLLM server in a test: a free port, then waiting until it answers (shared by
the server fixtures)."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    """A loopback port nothing listens on now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
