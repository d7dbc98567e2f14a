"""vLLM adapter benchmarks (run on demand): plugin overhead and the server under load.

1. **Throughput with and without the plugin**, measured in one run on two in-process
   engines with the same settings: the plugin engine classifies N opted-in SST-2
   prompts (``logprobs=k``, label constraint); the reference engine, which has no
   plugin, runs the same prompts with the same log-probabilities and exactly the same
   number of generated tokens per prompt (``min_tokens = max_tokens``), so the only
   difference is the processor. Reported: the median of interleaved repeats and their
   ratio. Also reported, as the price of the score-return mechanism rather than of the
   processor: the reference engine without log-probabilities.

2. **Concurrent HTTP requests** against ``python -m vllm.entrypoints.openai.api_server``
   started on 127.0.0.1 with ``--logits-processors``: R requests at once, every other
   one opted in, each with a client timeout, and the whole run bounded by a deadline.
   Checked: every request answered, none lost (one response per request id), each
   opted-in response's label is one of the labels and its scores equal the offline
   engine's for the same prompt (max absolute difference reported).

Usage::

    python benchmarks/bench_vllm.py --prompts 64 --requests 200 [--dtype float32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from semsoft_plugin.core.result import LabelResult

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "sst2" / "dev.txt"
LABELS = ["positive", "negative"]


def sst2_prompts(n: int) -> list[list[dict[str, str]]]:
    """The first ``n`` SST-2 dev sentences as chat prompts with a pre-filled answer."""
    if not DATA.is_file():
        raise SystemExit(f"data file not found: {DATA}")
    lines = DATA.read_text().splitlines()
    if n > len(lines):
        raise SystemExit(f"--prompts {n} exceeds the {len(lines)} sentences in {DATA}")
    return [
        [
            {
                "role": "user",
                "content": f"Review: {line.split(' ', 1)[1]}\nIs the sentiment positive or negative?",
            },
            {"role": "assistant", "content": "Sentiment:"},
        ]
        for line in lines[:n]
    ]


def engines(checkpoint: str, dtype: str):
    """The plugin engine and a reference engine that cannot load the plugin."""
    import vllm.v1.sample.logits_processor as v1_loader
    from vllm import LLM

    from semsoft_plugin.engines import vllm as sv

    args = dict(enforce_eager=True, max_logprobs=50, max_model_len=512, dtype=dtype, seed=0)
    plugin = LLM(checkpoint, logits_processors=[sv.SemanticSoftmaxLogitsProcessor], **args)
    loader = v1_loader._load_logitsprocs_plugins
    v1_loader._load_logitsprocs_plugins = lambda: []  # an installed entry point too
    try:
        reference = LLM(checkpoint, **args)
    finally:
        v1_loader._load_logitsprocs_plugins = loader
    return plugin, reference


def throughput(plugin, reference, prompts, repeats: int) -> dict[str, float]:
    from vllm import SamplingParams

    from semsoft_plugin.engines import vllm as sv
    from semsoft_plugin.engines.prompting import format_prompt

    tokenizer = plugin.get_tokenizer()
    inputs = []
    for item in prompts:
        text, _ = format_prompt(tokenizer, item)
        inputs.append({"prompt_token_ids": tokenizer.encode(text, add_special_tokens=False)})
    opted = sv.sampling_params(LABELS)
    warm = plugin.generate(inputs, opted, use_tqdm=False)
    lengths = [len(o.outputs[0].token_ids) for o in warm]
    same = [
        SamplingParams(temperature=0, max_tokens=n, min_tokens=n, ignore_eos=True, logprobs=50)
        for n in lengths
    ]
    bare = [
        SamplingParams(temperature=0, max_tokens=n, min_tokens=n, ignore_eos=True) for n in lengths
    ]
    reference.generate(inputs, same, use_tqdm=False)
    times: dict[str, list[float]] = {"plugin": [], "reference": [], "reference_no_logprobs": []}
    for _ in range(repeats):
        for name, engine, params in (
            ("plugin", plugin, opted),
            ("reference", reference, same),
            ("reference_no_logprobs", reference, bare),
        ):
            start = time.perf_counter()
            out = engine.generate(inputs, params, use_tqdm=False)
            times[name].append(time.perf_counter() - start)
            assert [len(o.outputs[0].token_ids) for o in out] == lengths
    median = {name: statistics.median(values) for name, values in times.items()}
    return {
        "prompts": len(prompts),
        "generated_tokens": sum(lengths),
        "plugin_s": median["plugin"],
        "reference_s": median["reference"],
        "reference_no_logprobs_s": median["reference_no_logprobs"],
        "plugin_over_reference": median["plugin"] / median["reference"],
        "logprobs_k50_over_none": median["reference"] / median["reference_no_logprobs"],
        "repeats": repeats,
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(checkpoint: str, dtype: str, log: Path) -> tuple[subprocess.Popen, str]:
    from semsoft_plugin.core import request as sreq

    port = _free_port()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", checkpoint, "--served-model-name", "model",
        "--host", "127.0.0.1", "--port", str(port), "--logits-processors", sreq.ENTRY_POINT,
        "--max-logprobs", "50", "--max-model-len", "512", "--enforce-eager", "--dtype", dtype,
    ]  # fmt: skip
    with open(log, "w") as sink:
        process = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"server exited:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
                if reply.status == 200:
                    return process, f"http://127.0.0.1:{port}/v1"
        except OSError:
            time.sleep(1)
    process.terminate()
    raise SystemExit(f"server did not start within 300 s:\n{log.read_text()[-3000:]}")


async def concurrent_requests(
    url: str, prompts, offline: list[LabelResult], checkpoint: str, timeout: float
):
    import openai

    from semsoft_plugin.engines import openai as sopenai

    client = openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=timeout)
    continue_answer = {"continue_final_message": True, "add_generation_prompt": False}

    async def one(i: int):
        messages = prompts[i % len(prompts)]
        if i % 2 == 0:  # opted in
            kwargs = sopenai.openai_request(LABELS, extra_body=continue_answer)
        else:  # opted out: an ordinary short completion
            kwargs = {"max_tokens": 8, "temperature": 0.0, "extra_body": continue_answer}
        response = await client.chat.completions.create(model="model", messages=messages, **kwargs)
        return i, response

    start = time.perf_counter()
    results = await asyncio.wait_for(
        asyncio.gather(*(one(i) for i in range(len(offline))), return_exceptions=True),
        timeout=timeout,
    )
    elapsed = time.perf_counter() - start
    failures = [r for r in results if isinstance(r, BaseException)]
    answered = {i: r for i, r in (x for x in results if not isinstance(x, BaseException))}
    ids = {r.id for r in answered.values()}
    max_diff = 0.0
    wrong_labels = 0
    for i, response in answered.items():
        if i % 2:
            continue
        scores = sopenai.openai_label_scores(response, LABELS, checkpoint)
        if response.choices[0].message.content.strip() not in LABELS:
            wrong_labels += 1
        want = offline[i].probs
        max_diff = max(max_diff, *(abs(scores.probs[k] - want[k]) for k in LABELS))
    return {
        "requests": len(offline),
        "answered": len(answered),
        "failed": len(failures),
        "first_failure": repr(failures[0])[:300] if failures else None,
        "distinct_response_ids": len(ids),
        "opted_in_not_a_label": wrong_labels,
        "max_abs_diff_vs_offline": max_diff,
        "wall_s": elapsed,
        "requests_per_s": len(answered) / elapsed,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--dtype", default="float32", help="float32 lets the HTTP scores be compared tightly"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="bound on the HTTP run (s)")
    parser.add_argument("--skip-server", action="store_true")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()

    from semsoft_plugin.engines import models
    from semsoft_plugin.engines import vllm as sv

    checkpoint = str(models.resolve(args.model))
    prompts = sst2_prompts(max(args.prompts, 1))
    plugin, reference = engines(checkpoint, args.dtype)
    report: dict[str, object] = {"model": args.model, "dtype": args.dtype}
    report["throughput"] = throughput(plugin, reference, prompts, args.repeats)
    print(json.dumps(report["throughput"], indent=2), flush=True)
    if not args.skip_server:
        # The offline scores every HTTP response is compared with.
        offline = sv.classify_vllm(
            plugin, [prompts[i % len(prompts)] for i in range(args.requests)], LABELS
        )
        del plugin, reference
        with tempfile.TemporaryDirectory() as tmp:
            process, url = start_server(checkpoint, args.dtype, Path(tmp) / "server.log")
            try:
                report["http"] = asyncio.run(
                    concurrent_requests(url, prompts, offline, checkpoint, args.timeout)
                )
            finally:
                process.terminate()
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        print(json.dumps(report["http"], indent=2), flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    http = report.get("http")
    ok = http is None or (http["failed"] == 0 and http["answered"] == http["requests"]
                          and http["distinct_response_ids"] == http["requests"])  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
