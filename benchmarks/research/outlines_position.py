"""Outlines' decision position against the eval prompt's: where does the silent vote help?

An Outlines choice generator formats a string prompt as a user turn and opens a new
assistant turn (``add_generation_prompt=True``), so the label is the *first* token of
the answer and is written without a leading space. An answer prefix cannot be
pre-filled there. ``semsoft eval`` instead continues an assistant message that holds
an answer prefix (``"Sentiment:"``), so the next token is the answer word.

This runs both on the same items and the same user text and prints, for each, the
constrained softmax (the baseline) and Semantic Softmax with the default settings:

* ``outlines``: :class:`semsoft_plugin.engines.outlines.Generator` on a real Outlines model,
  prompt = the template's user message;
* ``answer-prefix``: :func:`semsoft_plugin.engines.hf.classify` on the template's chat
  messages, ending with the answer prefix (labels as leading-space words).

It also prints the median ``coverage`` (share of the top-K mass that voted for some
label) and how each label is tokenised at the Outlines position, since fragments
(``"s" "ad" "ness"``) are one of the two reasons scores differ there; the other is
that a small model starts its answer with filler ("The", "This") that holds most of
the top-K mass.

Usage::

    OMP_NUM_THREADS=2 python benchmarks/research/outlines_position.py --dataset sst2 --limit 200
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import numpy as np
import outlines
from outlines.types import Choice
from tqdm.auto import tqdm

from semsoft_eval.benchmarking import report, sample_parser
from semsoft_eval.data import load_builtin, sample
from semsoft_eval.metrics import classification_metrics
from semsoft_eval.prompts import TEMPLATES
from semsoft_plugin.engines import models
from semsoft_plugin.engines.hf import classify
from semsoft_plugin.engines.outlines import Generator

REPORTED = ("accuracy", "ece", "brier", "nll")


def _as_matrix(rows: list[dict[str, float]], labels: list[str]) -> np.ndarray:
    return np.array([[row[name] for name in labels] for row in rows], dtype=np.float64)


def _scores(results: list[Any], labels: list[str], targets: np.ndarray) -> dict[str, Any]:
    """Metrics of the baseline and of the calibrated scores; ``results`` are ScoredLabel
    (Outlines) or Classification (hf) objects, which both carry these three fields."""
    return {
        "constrained": classification_metrics(
            _as_matrix([r.constrained_probs for r in results], labels), targets
        ),
        "semantic": classification_metrics(_as_matrix([r.probs for r in results], labels), targets),
        "median_coverage": statistics.median(r.coverage for r in results),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    data = sample(load_builtin(args.dataset), args.limit, seed=args.seed)
    template = TEMPLATES[data.task]
    model, tokenizer = models.load(args.model)

    generator = Generator(outlines.from_transformers(model, tokenizer), Choice(data.labels))
    outlines_out = []
    for start in tqdm(range(0, len(data), args.batch_size), desc="outlines", unit="batch"):
        texts = data.texts[start : start + args.batch_size]
        outlines_out += generator.batch(
            [template.user.format(text=t, labels=", ".join(data.labels)) for t in texts]
        )

    messages = [template.messages(t, data.labels) for t in data.texts]
    prefixed = classify(model, tokenizer, messages, data.labels, batch_size=args.batch_size)

    return {
        "dataset": data.name,
        "model": args.model,
        "n": len(data),
        "outlines_tokens": {
            label.name: [tokenizer.decode([t]) for t in label.token_ids]
            for label in generator.labels.labels
        },
        "outlines": _scores(outlines_out, data.labels, data.targets),
        "answer-prefix": _scores(prefixed, data.labels, data.targets),
    }


def print_table(result: dict[str, Any]) -> None:
    print(f"{result['dataset']}, n={result['n']}, {result['model']}")
    print(f"labels at the Outlines position: {result['outlines_tokens']}")
    print("| position | method | " + " | ".join(REPORTED) + " | median coverage |")
    print("|---|---|" + "---|" * (len(REPORTED) + 1))
    for position in ("outlines", "answer-prefix"):
        block = result[position]
        for method in ("constrained", "semantic"):
            values = " | ".join(f"{block[method][m]:.3f}" for m in REPORTED)
            coverage = f"{block['median_coverage']:.2f}" if method == "semantic" else ""
            print(f"| {position} | {method} | {values} | {coverage} |")


def main() -> None:
    parser = sample_parser(__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    report(run(args), args.out, print_table)


if __name__ == "__main__":
    main()
