"""A fitted probe inside the vLLM engine against the plugin without one (issue 41), run on
demand by ``bench_vllm.py --fit`` (or alone).

A probe is fitted on transformers (float32) on the hidden states of the first N SST-2 dev
prompts and written to a fit folder; then ONE in-process vLLM engine serving that folder
(``semsoft_plugin.engines.vllm.fits``) classifies the same N prompts, interleaved, with and
without ``semsoft_fit``, each pass ``generate`` plus reading every row's scores
(``label_scores`` given the ``LLM``: Semantic Softmax on the top-k, and for the fit its
row read from the engine's worker with ``collective_rpc``). Reported: the median
seconds of each over the repeats, their ratio (rows/s with the probe over without), the
largest difference between the engine's fitted rows and the hook probe's on
transformers, and the memory: the output layer's inverse (one per engine), each fit's
weights, and the ``[L, V]`` matrix ``B`` a folded probe would keep.

Usage::

    python benchmarks/perf/bench_vllm_fit.py --model smollm2-135m --prompts 128 \\
        --out benchmarks/results/vllm-probe.json
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from semsoft_eval.benchmarking import LABELS, engine_bench_main, sst2_prompts, sst2_targets  # noqa: E402

FIT = "sst2"


def fit_on_transformers(checkpoint: str, prompts: list[Any], folder: Path) -> Any:
    """The probe on the hook's hidden states of `prompts` (transformers, float32), saved
    in `folder` as the fit `FIT`; returns it and the hook probe's rows."""
    from semsoft_plugin.core.config import SemsoftConfig
    from semsoft_plugin.core.embeddings import from_model
    from semsoft_plugin.core.labels import LabelSet
    from semsoft_plugin.engines import hf, models
    from semsoft_plugin.engines.hf_hidden import HiddenAtDecision
    from semsoft_plugin.fit.fit_file import FitIdentity, output_layer_sha256
    from semsoft_plugin.fit.fitted import FittedCorrection, save_fitted
    from semsoft_plugin.fit.probe import fit_probe, label_logit_rows

    model, tokenizer = models.load(checkpoint, dtype="float32")
    with HiddenAtDecision(model) as hook:
        hf.classify(model, tokenizer, prompts, LABELS, batch_size=8, max_tokens=1)
    hidden = hook.rows(tokenizer, prompts, 8).double().numpy()
    rows = label_logit_rows(from_model(model), LabelSet(LABELS, tokenizer))
    probe = fit_probe(hidden, np.array(sst2_targets(len(prompts))), len(LABELS), label_rows=rows)
    correction = FittedCorrection("probe", tuple(LABELS), probe=probe)
    prompt = {"user": "Review: {text}\nIs the sentiment positive or negative?",
              "answer_prefix": "Sentiment:", "system": None}  # fmt: skip
    identity = FitIdentity(tuple(LABELS), prompt, output_layer_sha256(checkpoint))
    save_fitted(folder / f"{FIT}.json", SemsoftConfig(), correction, identity)
    del model
    return probe, probe.probs(hidden)


def run(checkpoint: str, dtype: str, n: int, repeats: int) -> dict[str, Any]:
    """The measurement in the module docstring."""
    prompts = sst2_prompts(n)
    with tempfile.TemporaryDirectory() as folder:
        probe, hook_rows = fit_on_transformers(checkpoint, prompts, Path(folder))
        os.environ["SEMSOFT_FIT_DIR"] = folder
        from vllm import LLM

        from semsoft_plugin.engines import vllm as sv
        from semsoft_plugin.engines.prompting import format_prompt
        from semsoft_plugin.engines.vllm.reader_tables import EXTENSION, FIT_PROCESSOR

        engine = LLM(checkpoint, logits_processors=[FIT_PROCESSOR], worker_extension_cls=EXTENSION,
                     enforce_eager=True, max_logprobs=50, max_model_len=512, dtype=dtype,
                     seed=0)  # fmt: skip
        tokenizer = engine.get_tokenizer()
        inputs = [
            {
                "prompt_token_ids": tokenizer.encode(
                    format_prompt(tokenizer, p)[0], add_special_tokens=False
                )
            }  # fmt: skip
            for p in prompts
        ]
        passes = {
            "plugin": sv.sampling_params(LABELS),
            "plugin_with_probe": sv.sampling_params(LABELS, fit=FIT),
        }

        def one(params: Any) -> list[Any]:
            outs = engine.generate(inputs, params, use_tqdm=False)
            return [sv.label_scores(o, params, engine) for o in outs]

        for params in passes.values():
            one(params)  # warm
        times: dict[str, list[float]] = {name: [] for name in passes}
        results: dict[str, list[Any]] = {}
        for _ in range(repeats):
            for name, params in passes.items():
                start = time.perf_counter()
                results[name] = one(params)
                times[name].append(time.perf_counter() - start)
        fitted = np.array(
            [[r.probs[label] for label in LABELS] for r in results["plugin_with_probe"]]
        )
    from semsoft_plugin.engines.scoring import client_model

    embeddings = client_model(checkpoint).embeddings  # what the engine's inverse is made of
    median = {name: statistics.median(values) for name, values in times.items()}
    vocab, dim = int(embeddings.vocab_size), int(embeddings.dim)
    return {
        "model_dtype": dtype,
        "rows": n,
        "repeats": repeats,
        "seconds": {name: [round(t, 3) for t in values] for name, values in times.items()},
        "median_s": median,
        "probe_over_plugin_rows_per_s": median["plugin"] / median["plugin_with_probe"],
        "max_abs_diff_vs_hook_probe": float(np.abs(fitted - hook_rows).max()),
        "memory_bytes": {
            "inverse_per_engine": 2 * vocab * dim * 4,
            "fit_weights_per_fit": (len(probe.seen) * dim + len(probe.seen)) * 8,
            "folded_B_per_fit_if_kept": len(LABELS) * vocab * 4,
        },
        "vocab": vocab,
        "hidden": dim,
    }


def main() -> int:
    return engine_bench_main(__doc__.split("\n")[0], "perf/bench_vllm_fit.py", run)


if __name__ == "__main__":
    raise SystemExit(main())
