"""Benchmarks for semsoft eval and the transformers processor (run on demand, not a test).

1. Seconds per item per method (``semsoft eval`` on a fixed sample, no cache): the
   forward pass is shared; each method's own cost is the time it adds.
2. The processor's overhead inside ``model.generate``: the same batch generated with
   and without :class:`SemanticSoftmaxLogitsProcessor` (observe mode), interleaved
   repetitions in one run, median ratio minus one (target: at most 5%).
3. Time per item as the label count grows from 2 to 100 (target: flat): a fixed prompt
   that does not list the labels, so the forward pass is the same for every count and
   any growth is the processor's; plus the core alone on fixed logits.

Usage::

    OMP_NUM_THREADS=2 python benchmarks/perf/bench_eval.py --model default --out bench.json
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from transformers import LogitsProcessorList

from semsoft_eval.evaluate import evaluate
from semsoft_plugin.core.embeddings import from_model
from semsoft_plugin.core.labels import LabelSet
from semsoft_plugin.core.softmax import SemanticSoftmax
from semsoft_plugin.engines import models
from semsoft_plugin.engines.hf import SemanticSoftmaxLogitsProcessor, classify

TEXTS = [
    "I can't believe they cancelled the show, I'm furious.",
    "What a lovely surprise, thank you all so much!",
    "Not sure what to think about the new policy.",
    "My cat knocked the glass off the table again.",
    "The results came back and everything is fine.",
    "Why would anyone do that? It makes no sense.",
    "I miss my grandmother every single day.",
    "Finally finished the marathon, legs are jelly.",
]


def label_words(tokenizer: Any, count: int) -> list[str]:
    """``count`` alphabetic words that are one leading-space token each, from the vocabulary."""
    words: list[str] = []
    for token_id in range(tokenizer.vocab_size):
        text = tokenizer.decode([token_id])
        if text.startswith(" ") and text[1:].isalpha() and text[1:].islower() and len(text) > 4:
            word = text[1:]
            try:  # a set of one label is refused: the first word is checked with the second
                if words:
                    LabelSet([*words, word], tokenizer)
            except ValueError:
                continue
            words.append(word)
            if len(words) == count:
                return words
    raise ValueError(f"found only {len(words)} single-token words")


def per_method(model_name: str, loaded: Any, limit: int) -> dict[str, Any]:
    report = evaluate(
        model_name, "ekman", limit=limit, cache_dir="", n_bootstrap=0, progress=False, loaded=loaded
    )
    forward = report["run"]["seconds_per_item"]
    return {
        "dataset": "ekman",
        "n": report["run"]["n"],
        "forward_seconds_per_item": forward,
        "sequence_seconds_per_item": report["run"]["sequence_seconds_per_item"],
        "method_seconds_per_item": {
            m: row["seconds_per_item"] for m, row in report["methods"].items()
        },
    }


def generate_overhead(model: Any, tokenizer: Any, reps: int) -> dict[str, Any]:
    labels = LabelSet(
        ["anger", "disgust", "fear", "joy", "neutral", "sadness", "surprise"], tokenizer
    )
    prompts = [
        tokenizer.apply_chat_template(
            [
                {"role": "user", "content": f"Emotion of: {t}"},
                {"role": "assistant", "content": "Emotion:"},
            ],
            tokenize=False,
            continue_final_message=True,
        )
        for t in TEXTS
    ]
    tokenizer.padding_side = "left"
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    processor = SemanticSoftmaxLogitsProcessor(model, labels, mode="observe")
    kwargs = {
        "max_new_tokens": 8,
        "do_sample": False,
        "pad_token_id": tokenizer.pad_token_id or tokenizer.eos_token_id,
    }
    with torch.inference_mode():
        model.generate(**batch, **kwargs)  # warm-up
        model.generate(**batch, logits_processor=LogitsProcessorList([processor]), **kwargs)
        plain, with_proc = [], []
        for _ in range(reps):
            start = time.perf_counter()
            model.generate(**batch, **kwargs)
            plain.append(time.perf_counter() - start)
            start = time.perf_counter()
            model.generate(**batch, logits_processor=LogitsProcessorList([processor]), **kwargs)
            with_proc.append(time.perf_counter() - start)
    ratio = statistics.median(w / p for w, p in zip(with_proc, plain, strict=True)) - 1.0
    return {
        "batch": len(TEXTS),
        "max_new_tokens": 8,
        "reps": reps,
        "median_seconds_plain": statistics.median(plain),
        "median_seconds_with_processor": statistics.median(with_proc),
        "overhead_ratio": ratio,
        "target": 0.05,
        "met": ratio <= 0.05,
    }


def label_scaling(model: Any, tokenizer: Any, counts: list[int], reps: int) -> dict[str, Any]:
    words = label_words(tokenizer, max(counts))
    inputs = [
        [
            {"role": "user", "content": f"One word for: {t}"},
            {"role": "assistant", "content": "Word:"},
        ]
        for t in TEXTS
    ]
    embeddings = from_model(model)
    logits = torch.randn(len(TEXTS), model.config.vocab_size)
    rows = []
    for count in counts:
        labels = LabelSet(words[:count], tokenizer)
        one_pass = functools.partial(
            classify,
            model,
            tokenizer,
            inputs,
            labels,
            mode="observe",
            max_tokens=1,
            batch_size=len(TEXTS),
            progress=False,
        )
        one_pass()  # warm-up
        start = time.perf_counter()
        for _ in range(reps):
            one_pass()
        per_item = (time.perf_counter() - start) / (reps * len(TEXTS))
        scorer = SemanticSoftmax(embeddings, labels)
        scorer(logits)
        start = time.perf_counter()
        for _ in range(reps * 5):
            scorer(logits)
        core = (time.perf_counter() - start) / (reps * 5 * len(TEXTS))
        rows.append(
            {"labels": count, "classify_seconds_per_item": per_item, "core_seconds_per_item": core}
        )
    return {
        "rows": rows,
        "growth_2_to_max": rows[-1]["classify_seconds_per_item"]
        / rows[0]["classify_seconds_per_item"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--limit", type=int, default=64, help="items for the per-method timing")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--counts", default="2,5,10,28,50,100")
    parser.add_argument("--out", default="bench.json")
    args = parser.parse_args()
    model, tokenizer = models.load(args.model)
    result = {
        "model": args.model,
        "machine": f"{platform.machine()}, torch threads {torch.get_num_threads()}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "per_method": per_method(args.model, (model, tokenizer), args.limit),
        "generate_overhead": generate_overhead(model, tokenizer, args.reps),
        "label_scaling": label_scaling(
            model, tokenizer, [int(c) for c in args.counts.split(",")], args.reps
        ),
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
