"""The plugin behind vLLM's OpenAI-compatible server, queried with the ``openai`` client.

Run: python examples/vllm_server.py
It starts the server on 127.0.0.1 (as you would from a shell)::

    python -m vllm.entrypoints.openai.api_server --model <checkpoint> \
        --logits-processors semsoft_plugin.engines.vllm:SemanticSoftmaxLogitsProcessor --max-logprobs 50 \
        --middleware semsoft_plugin.engines.vllm.admission

sends one opted-in and one ordinary request, and stops the server.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request

import openai

from semsoft_plugin.engines import models
from semsoft_plugin.engines.openai import openai_label_probs, openai_request
from semsoft_plugin.engines.vllm.params import ENTRY_POINT

LABELS = ["positive", "negative"]


def main() -> None:
    checkpoint = str(models.resolve("default"))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", checkpoint, "--served-model-name", "smollm2",
        "--host", "127.0.0.1", "--port", str(port),
        "--logits-processors", ENTRY_POINT, "--max-logprobs", "50",
        "--middleware", "semsoft_plugin.engines.vllm.admission",
        "--max-model-len", "512", "--enforce-eager",
    ]  # fmt: skip
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    server = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                if server.poll() is not None:
                    raise SystemExit(
                        "the server exited; run the command above to see why"
                    ) from None
                time.sleep(1)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        messages = [
            {"role": "user", "content": "Review: 'I loved every minute.' Positive or negative?"},
            {"role": "assistant", "content": "Sentiment:"},
        ]
        # Opted in: labels and options travel in vllm_xargs; top_logprobs=50 carries the scores.
        request = openai_request(
            LABELS, extra_body={"continue_final_message": True, "add_generation_prompt": False}
        )
        response = client.chat.completions.create(model="smollm2", messages=messages, **request)
        print("label:", response.choices[0].message.content.strip())
        # The request object knows its labels and options: they are not passed again.
        print("probs:", openai_label_probs(response, request, checkpoint))
        # Not opted in: served exactly as without the plugin.
        plain = client.completions.create(
            model="smollm2", prompt="The capital of France is", max_tokens=6
        )
        print("plain:", repr(plain.choices[0].text))
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
