"""One long text in a batch of short ones: the length bound and length-grouped batches.

A batch of ``--batch`` texts for :class:`semsoft_plugin.Classifier` (transformers): the
short reviews of ``examples/reviews.csv`` and one long text (``--long-chars`` characters
of a review repeated). Measured, each the median of ``--repeats`` timed calls:

* ``grouped``: the library as it is: the long text is cut to ``--max-text-tokens`` (or
  the model's context) and :func:`semsoft_plugin.engines.prompting.padding_batches` runs it apart from
  the short texts;
* ``one padded batch``: the same cut texts in one left-padded batch, every short row
  padded to the long one (how batches were formed before);
* ``short only``: the short texts alone, the floor.

Also recorded: the tokens cut from the long text and the largest difference of the short
rows' probabilities between the two groupings. Run::

    python benchmarks/perf/bench_long_text.py --long-chars 20000 --max-text-tokens 2048 \\
        --out benchmarks/results/long-text.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import semsoft_plugin.engines.hf as hf
from semsoft_plugin import Classifier
from semsoft_plugin.app.engine_settings import EngineSettings
from semsoft_plugin.app.tables import read_records
from semsoft_plugin.engines import models

ROOT = Path(__file__).resolve().parents[2]


def _timed(clf: Classifier, texts: list[str], repeats: int) -> tuple[float, Any]:
    seconds, details = [], None
    for _ in range(repeats):
        began = time.perf_counter()
        details = clf.predict_details(texts)
        seconds.append(time.perf_counter() - began)
    return statistics.median(seconds), details


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--long-chars", type=int, default=20_000)
    parser.add_argument("--max-text-tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    rows = read_records(ROOT / "examples/reviews.csv")
    short = [str(r["text"]) for r in rows][: args.batch - 1]
    long = (short[0] + " ") * (args.long_chars // (len(short[0]) + 1) + 1)
    texts = [*short, long[: args.long_chars]]
    model, tokenizer = models.load(args.model)
    clf = Classifier(
        model,
        tokenizer,
        ["positive", "negative"],
        engine=EngineSettings(batch_size=args.batch),
        max_text_tokens=args.max_text_tokens,
    )
    grouped_s, grouped = _timed(clf, texts, args.repeats)
    plain = hf.padding_batches
    hf.padding_batches = lambda lengths, size: [list(range(len(lengths)))]  # type: ignore[assignment]
    try:
        padded_s, padded = _timed(clf, texts, args.repeats)
    finally:
        hf.padding_batches = plain
    short_s, _ = _timed(clf, short, args.repeats)
    result = {
        "model": args.model,
        "dtype": str(model.dtype),
        "batch": args.batch,
        "long_chars": args.long_chars,
        "max_text_tokens": args.max_text_tokens,
        "long_tokens_cut": int(grouped.truncated[-1]),
        "seconds": {
            "grouped": round(grouped_s, 3),
            "one padded batch": round(padded_s, 3),
            "short only": round(short_s, 3),
        },
        "short_rows_max_abs_diff": float(np.abs(grouped.probs[:-1] - padded.probs[:-1]).max()),
        "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
        "load_1min": os.getloadavg()[0],
    }
    table = [
        "| batching | seconds per call |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in result["seconds"].items()),
    ]
    print(json.dumps(result, indent=2))
    print("\n".join(table))
    if args.out:
        out = Path(args.out)
        out.write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")
        command = (
            f"python benchmarks/perf/bench_long_text.py --long-chars {args.long_chars} "
            f"--max-text-tokens {args.max_text_tokens} --out {args.out}"
        )
        body = [
            f"# One long text in a batch of {args.batch}\n",
            f"`{command}` ({result['model']}, {result['dtype']}, {result['threads']} thread(s), "
            f"load {result['load_1min']:.1f}). The long text ({args.long_chars} characters) "
            f"had {result['long_tokens_cut']} tokens cut by `max_text_tokens`. Short rows' "
            f"largest probability difference between the groupings: "
            f"{result['short_rows_max_abs_diff']:.2e}.\n",
            *table,
        ]
        out.with_suffix(".md").write_text("\n".join(body) + "\n")


if __name__ == "__main__":
    main()
