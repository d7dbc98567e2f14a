"""What reading the probe's hidden state back from the logits row costs the vLLM
classifier's forward passes (issue 41), and how close it is to the hook's.

ONE in-process vLLM engine with the plugin's processor and the worker extension
(`semsoft_plugin.engines.vllm.fits.FittedRows`) runs the passes `Classifier(backend="vllm")`
runs for a fit (`classify_vllm(..., mode="observe", max_tokens=1, keep_logprobs=50)`) on
the first N SST-2 dev prompts, interleaved, without and with `hidden=True` (the processor
reads `h = W⁺ z` from each decision-step row, keeps it in the worker's table, and the
reader takes it back through `collective_rpc`). Reported: the median seconds of each over
the repeats and their ratio (rows/s with `h` over without), the largest relative error of
the engine's `h` against the hook's on transformers (float32), the largest residual, and
the bytes `h` adds to each kept pass (`[d]` float32) against a vocabulary row's.

Usage::

    nice -n 10 python benchmarks/perf/bench_vllm_hidden.py --model smollm2-135m --prompts 128 \\
        --out benchmarks/results/vllm-hidden.json
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import numpy as np

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from semsoft_eval.benchmarking import LABELS, engine_bench_main, sst2_prompts  # noqa: E402


def hook_hidden(checkpoint: str, prompts: list[Any]) -> np.ndarray:
    """`[N, d]` the decision step's hidden state from the hook on transformers (float32)."""
    from semsoft_plugin.engines import hf, models
    from semsoft_plugin.engines.hf_hidden import HiddenAtDecision

    model, tokenizer = models.load(checkpoint, dtype="float32")
    with HiddenAtDecision(model) as hook:
        hf.classify(model, tokenizer, prompts, LABELS, batch_size=8, max_tokens=1)
    hidden: np.ndarray = hook.rows(tokenizer, prompts, 8).double().numpy()
    del model
    return hidden


def run(checkpoint: str, dtype: str, n: int, repeats: int) -> dict[str, Any]:
    """The measurement in the module docstring."""
    from vllm import LLM

    from semsoft_plugin.engines.vllm import classify_vllm
    from semsoft_plugin.engines.vllm.reader_tables import EXTENSION

    prompts = sst2_prompts(n)
    want = hook_hidden(checkpoint, prompts)
    engine = LLM(checkpoint, logits_processors=["semsoft_plugin.engines.vllm:"
                 "SemanticSoftmaxLogitsProcessor"], worker_extension_cls=EXTENSION,
                 enforce_eager=True, max_logprobs=50, max_model_len=512, dtype=dtype,
                 seed=0)  # fmt: skip

    def one(hidden: bool) -> list[Any]:
        return classify_vllm(engine, prompts, LABELS, mode="observe", max_tokens=1,
                             keep_logprobs=50, hidden=hidden)  # fmt: skip

    for hidden in (False, True):
        one(hidden)  # warm (the inverse is built on the first hidden read)
    times: dict[str, list[float]] = {"passes": [], "passes_with_h": []}
    got: list[Any] = []
    for _ in range(repeats):
        for name, hidden in (("passes", False), ("passes_with_h", True)):
            start = time.perf_counter()
            results = one(hidden)
            times[name].append(time.perf_counter() - start)
            if hidden:
                got = results
    h = np.stack([r.hidden.double().numpy() for r in got])
    relative = np.linalg.norm(h - want, axis=1) / np.linalg.norm(want, axis=1)
    median = {name: statistics.median(values) for name, values in times.items()}
    vocab = int(engine.llm_engine.model_config.get_vocab_size())
    return {
        "model_dtype": dtype,
        "rows": n,
        "repeats": repeats,
        "seconds": {name: [round(t, 3) for t in values] for name, values in times.items()},
        "median_s": median,
        "with_h_over_without_rows_per_s": median["passes"] / median["passes_with_h"],
        "max_relative_error_vs_hook": float(relative.max()),
        "bytes_h_per_kept_pass": int(h.shape[1] * 4),
        "bytes_vocab_row_not_kept": vocab * 4,
        "hidden": int(h.shape[1]),
        "vocab": vocab,
    }


def main() -> int:
    return engine_bench_main(__doc__.split("\n")[0], "perf/bench_vllm_hidden.py", run)


if __name__ == "__main__":
    raise SystemExit(main())
