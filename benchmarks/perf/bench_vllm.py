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

3. **vLLM's own label scoring against the plugin** (``--generative``, issue 36), on the
   same server, model, prompts and items: ``POST /generative_scoring``
   (``apply_softmax: true``; it returns the first label token's probability normalised
   over the label tokens sent, so ``L`` labels take ``L - 1`` requests, each with another
   label first), sent as one request holding every row and as one request per row; the
   plugin with ``max_tokens=1`` (its default, the constrained softmax, and the ``pooled``
   preset); the plugin generating the label. Rows per second count
   every HTTP request the reader needs for exact scores (the plugin reader's follow-ups
   for label tokens outside the top-``k`` included), every row sent at once, the prefix
   cache emptied before each timed pass; ECE / NLL / macro-F1 of each path's scores,
   of ``/generative_scoring``'s after batch calibration over the rows and of the pooled
   preset's after the file mode (both label-free, from the rows being scored).

Usage::

    python benchmarks/perf/bench_vllm.py --prompts 64 --requests 200 [--dtype float32]
    python benchmarks/perf/bench_vllm.py --model smollm2-135m --prompts 128 --skip-offline \
        --generative --out benchmarks/results/generative-vs-plugin.json
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
from typing import TYPE_CHECKING, Any

import numpy as np

from semsoft_eval.benchmarking import LABELS, sst2_prompts, sst2_targets

if TYPE_CHECKING:
    from semsoft_plugin.core.result import LabelResult

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[2]


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
    """The server with the plugin; dev mode for ``POST /reset_prefix_cache``, so each
    timed pass of :func:`compare_paths` starts from an empty prefix cache."""
    from semsoft_plugin.engines.vllm.params import ENTRY_POINT

    port = _free_port()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    env["VLLM_SERVER_DEV_MODE"] = "1"
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", checkpoint, "--served-model-name", "model",
        "--host", "127.0.0.1", "--port", str(port), "--logits-processors", ENTRY_POINT,
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


def _post_json(client, url: str, body: dict) -> dict:
    reply = client.post(url, json=body)
    if reply.status_code != 200:
        raise RuntimeError(f"{url}: HTTP {reply.status_code}: {reply.text[:300]}")
    return reply.json()


def generative_scoring(client, root: str, query, items, label_ids) -> np.ndarray:
    """``[len(items), L]`` from ``POST /generative_scoring``: one request per label but
    the last, each with that label's token first (the server returns only the first
    label's probability); the last label's is what the others leave."""
    out = np.zeros((len(items), len(label_ids)))
    for j in range(max(1, len(label_ids) - 1)):
        first = [label_ids[j], *label_ids[:j], *label_ids[j + 1 :]]
        body = {"model": "model", "query": query, "items": items, "label_token_ids": first}
        reply = _post_json(client, f"{root}/generative_scoring", {**body, "apply_softmax": True})
        out[:, j] = [d["score"] for d in sorted(reply["data"], key=lambda d: d["index"])]
    out[:, -1] = 1.0 - out[:, :-1].sum(1)
    return out


def _every_row(run, rows: int) -> list:
    """``run(i)`` for every row at once, one thread each (a client with ``rows`` users)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=rows) as pool:
        return list(pool.map(run, range(rows)))


def compare_paths(url: str, checkpoint: str, prompts, targets, repeats: int) -> dict:
    """Section 3 of the module docstring: scores and rows per second of each path."""
    import httpx
    import openai

    from semsoft_eval.metrics import classification_metrics
    from semsoft_plugin.core.calibration import FileCalibration, batch_calibrate
    from semsoft_plugin.core.config import SemsoftConfig
    from semsoft_plugin.core.labels import LabelSet
    from semsoft_plugin.engines import openai as sopenai
    from semsoft_plugin.engines.prompting import encode_prompts, format_prompt
    from semsoft_plugin.engines.scoring import client_model

    root, rows = url.removesuffix("/v1"), len(prompts)
    tokenizer = client_model(checkpoint).tokenizer
    encoded = encode_prompts(tokenizer, [format_prompt(tokenizer, p) for p in prompts])
    shared = 0  # the chat template's head every prompt starts with: the query
    while all(len(e) > shared + 1 and e[shared] == encoded[0][shared] for e in encoded):
        shared += 1
    query, items = encoded[0][:shared], [e[shared:] for e in encoded]
    label_ids = list(LabelSet(LABELS, tokenizer).answer_token_ids)
    sent: list[str] = []  # every HTTP request, the readers' follow-ups included
    hooks = {"request": [lambda request: sent.append(request.url.path)]}
    limits = httpx.Limits(max_connections=rows + 8, max_keepalive_connections=rows + 8)
    http = httpx.Client(timeout=600, limits=limits, event_hooks=hooks)
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, http_client=http)
    continue_answer = {"continue_final_message": True, "add_generation_prompt": False}

    def plugin(max_tokens: int | None, preset: str = "constrained"):
        config = SemsoftConfig.preset(preset)
        request = sopenai.openai_request(LABELS, config=config, extra_body=continue_answer)
        if max_tokens is not None:
            request["max_tokens"] = max_tokens

        def run(i: int):
            reply = client.chat.completions.create(model="model", messages=prompts[i], **request)
            return sopenai.openai_label_scores(reply, request, checkpoint, client=client)

        return run

    def per_row(i: int) -> np.ndarray:
        return generative_scoring(http, root, query, [items[i]], label_ids)[0]

    paths = {  # each: rows -> the scores of the first ``rows`` rows
        "generative_scoring (one request, all rows)": lambda n: generative_scoring(
            http, root, query, items[:n], label_ids
        ),
        "generative_scoring (one request per row)": lambda n: _every_row(per_row, n),
        "plugin max_tokens=1": lambda n: _every_row(plugin(1), n),
        "plugin generating the label": lambda n: _every_row(plugin(None), n),
        "plugin max_tokens=1, preset pooled": lambda n: _every_row(plugin(1, "pooled"), n),
    }
    for run in paths.values():  # warm every path (and the reader's cached embeddings)
        run(min(rows, 4))
    seconds: dict[str, list[float]] = {name: [] for name in paths}
    requests: dict[str, int] = {}
    outputs: dict[str, Any] = {}
    names = list(paths)
    for repeat in range(repeats):  # each repeat in another order: no path always goes first
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            run = paths[name]
            http.post(f"{root}/reset_prefix_cache").raise_for_status()
            before, start = len(sent), time.perf_counter()
            outputs[name] = run(rows)
            seconds[name].append(time.perf_counter() - start)
            requests[name] = len(sent) - before
    gen = outputs["generative_scoring (one request, all rows)"]
    row_by_row = np.array(outputs["generative_scoring (one request per row)"])
    one, label = outputs["plugin max_tokens=1"], outputs["plugin generating the label"]
    default = np.array([[r.probs[n] for n in LABELS] for r in one])
    constrained = np.array([[r.constrained_probs[n] for n in LABELS] for r in one])
    generated = np.array([[r.probs[n] for n in LABELS] for r in label])
    pooled = np.array(
        [[r.probs[n] for n in LABELS] for r in outputs["plugin max_tokens=1, preset pooled"]]
    )
    y = np.array(targets)
    # The file mode: the rows' own mean as the label bias, estimated once, row by row.
    file_mode = FileCalibration.estimate(pooled)
    scores = {
        "generative_scoring (= constrained)": gen,
        "plugin default (the constrained softmax)": default,
        "plugin preset pooled (the semantic pool)": pooled,
        "generative_scoring + batch calibration over the rows": batch_calibrate(gen),
        "plugin preset pooled + the file mode (its guard)": file_mode.apply(pooled),
    }
    return {
        "rows": rows,
        "labels": LABELS,
        "label_token_ids": label_ids,
        "query_tokens": shared,
        "repeats": repeats,
        "concurrency": rows,
        "metrics": {name: classification_metrics(p, y) for name, p in scores.items()},
        "max_abs_diff": {
            "generative_scoring batch vs per row": float(np.abs(gen - row_by_row).max()),
            "generative_scoring vs the plugin's constrained_probs": float(
                np.abs(gen - constrained).max()
            ),
            "plugin max_tokens=1 vs generating the label": float(np.abs(default - generated).max()),
        },
        "throughput": {
            name: {
                "rows_per_s": rows / statistics.median(seconds[name]),
                "best_rows_per_s": rows / min(seconds[name]),
                "seconds": seconds[name],
                "http_requests": requests[name],
                "http_requests_per_row": requests[name] / rows,
            }
            for name in paths
        },
    }


def markdown(report: dict[str, Any], command: str) -> str:
    """The ``--generative`` comparison as a Markdown page."""
    paths = report["generative"]
    lines = [
        "# vLLM's own label scoring (`/generative_scoring`) against the plugin",
        "",
        f"`{command}`",
        "",
        f"{report['model']}, {report['dtype']}, {paths['rows']} SST-2 dev rows (the first ones), "
        f"labels {', '.join(paths['labels'])}; one vLLM 0.32 CPU server with the plugin, "
        f"every row sent at once, prefix cache emptied before each timed pass, "
        f"{paths['repeats']} passes per path in rotating order. Load average before / after: {report['load_before']} / "
        f"{report['load_after']} on {os.cpu_count()} cores shared with other jobs.",
        "",
        "| scores | accuracy | macro-F1 | ECE | NLL |",
        "|---|---|---|---|---|",
    ]
    for name, m in paths["metrics"].items():
        lines.append(
            f"| {name} | {m['accuracy']:.3f} | {m['macro_f1']:.3f} | {m['ece']:.3f} "
            f"| {m['nll']:.3f} |"
        )
    lines += [
        "",
        "| path | rows/s (median) | rows/s (best) | seconds per pass | HTTP requests per row "
        "| median rows/s ÷ generative_scoring's faster way |",
        "|---|---|---|---|---|---|",
    ]
    fastest = max(
        t["rows_per_s"] for name, t in paths["throughput"].items() if "generative" in name
    )
    for name, t in paths["throughput"].items():
        took = ", ".join(f"{x:.1f}" for x in t["seconds"])
        lines.append(
            f"| {name} | {t['rows_per_s']:.2f} | {t['best_rows_per_s']:.2f} | {took} "
            f"| {t['http_requests_per_row']:.3g} | {t['rows_per_s'] / fastest:.2f} |"
        )
    lines += ["", "Max abs differences between paths (same server):", ""]
    lines += [f"- {name}: {value:.2g}" for name, value in paths["max_abs_diff"].items()]
    return "\n".join(lines) + "\n"


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
    parser.add_argument(
        "--skip-offline",
        action="store_true",
        help="no offline engines: neither section 1 nor the offline check of section 2",
    )
    parser.add_argument(
        "--generative", action="store_true", help="section 3: /generative_scoring vs the plugin"
    )
    parser.add_argument(
        "--out", type=Path, help="write the figures here as JSON (and a .md beside it)"
    )
    args = parser.parse_args()

    from semsoft_plugin.engines import models
    from semsoft_plugin.engines import vllm as sv

    checkpoint = str(models.resolve(args.model))
    prompts = sst2_prompts(max(args.prompts, 1))
    report: dict[str, Any] = {"model": args.model, "dtype": args.dtype}
    report["load_before"] = [round(x, 2) for x in os.getloadavg()]
    offline = None
    if not args.skip_offline:
        plugin, reference = engines(checkpoint, args.dtype)
        report["throughput"] = throughput(plugin, reference, prompts, args.repeats)
        print(json.dumps(report["throughput"], indent=2), flush=True)
        if not args.skip_server:
            # The offline scores every HTTP response is compared with.
            offline = sv.classify_vllm(
                plugin, [prompts[i % len(prompts)] for i in range(args.requests)], LABELS
            )
        del plugin, reference
    if not args.skip_server and (offline is not None or args.generative):
        with tempfile.TemporaryDirectory() as tmp:
            process, url = start_server(checkpoint, args.dtype, Path(tmp) / "server.log")
            try:
                if offline is not None:
                    report["http"] = asyncio.run(
                        concurrent_requests(url, prompts, offline, checkpoint, args.timeout)
                    )
                    print(json.dumps(report["http"], indent=2), flush=True)
                if args.generative:
                    targets = sst2_targets(len(prompts))
                    report["generative"] = compare_paths(
                        url, checkpoint, prompts, targets, args.repeats
                    )
                    print(json.dumps(report["generative"], indent=2), flush=True)
            except Exception:
                # The log goes with the temporary folder: show why the server failed first.
                print(f"server log (last 4000 characters):\n{(Path(tmp) / 'server.log').read_text()[-4000:]}",
                      file=sys.stderr, flush=True)  # fmt: skip
                raise
            finally:
                process.terminate()
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
    report["load_after"] = [round(x, 2) for x in os.getloadavg()]
    command = "python benchmarks/perf/bench_vllm.py " + " ".join(sys.argv[1:])
    report["command"] = command
    if args.out:
        args.out.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
        if "generative" in report:
            args.out.with_suffix(".md").write_text(markdown(report, command))
    http = report.get("http")
    ok = http is None or (http["failed"] == 0 and http["answered"] == http["requests"]
                          and http["distinct_response_ids"] == http["requests"])  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
