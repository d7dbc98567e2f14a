"""Starting a vLLM server in a test: a free port, then waiting until it answers (shared by
the server fixtures)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
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


@contextlib.contextmanager
def plugin_server(
    checkpoint: Path,
    log: Path,
    processor: str,
    extra: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> Iterator[str]:
    """A vLLM OpenAI server subprocess of `checkpoint` (float32, the test engine's
    settings) with the logits processor `processor`, the admission middleware and the
    arguments `extra`; yields its ``/v1`` base URL and stops it on exit."""
    root = Path(__file__).resolve().parents[1]
    port = free_port()
    environ = {**os.environ, **(env or {})}
    environ["PYTHONPATH"] = f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(checkpoint), "--served-model-name", "smollm2",
        "--host", "127.0.0.1", "--port", str(port),
        "--logits-processors", processor,
        "--max-logprobs", "50", "--max-model-len", "512", "--enforce-eager",
        "--dtype", "float32", "--max-num-batched-tokens", "32",
        "--middleware", "semsoft_plugin.engines.vllm.admission", *extra,
    ]  # fmt: skip
    with open(log, "w") as sink:
        process = subprocess.Popen(command, env=environ, stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_until_healthy(process, port, log)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
