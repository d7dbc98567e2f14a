"""What the data-set benchmarks share on the command line: the sample and the JSON out."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The pairs (model/data set:items) whose decision-step passes are kept: every kind of the
# leave-one-kind-out benchmark, SmolLM2-135M on 300 items, Qwen2.5-Coder-1.5B on 200.
KINDS = ("goemotions", "ekman", "sst2", "agnews", "trec", "convabuse", "davidson")
KEPT_PAIRS = ",".join(
    [f"smollm2-135m/{kind}:300" for kind in KINDS]
    + [f"qwen2.5-coder-1.5b/{kind}:200" for kind in KINDS]
)


def split_pair(spec: str) -> tuple[str, str, int]:
    """``"model/data set:items"`` as ``(model, data set, items)``."""
    name, limit = spec.split(":")
    model, dataset = name.split("/")
    return model, dataset, int(limit)


def sample_parser(description: str) -> argparse.ArgumentParser:
    """A parser with the sample every data-set benchmark takes and ``--out``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--dataset", default="sst2")
    parser.add_argument("--model", default="default")
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the JSON result here")
    return parser


def report(
    result: dict[str, Any], out: str | None, print_table: Callable[[dict[str, Any]], None]
) -> None:
    """Print the table and, with ``--out``, write the result (strict JSON: no NaN)."""
    print_table(result)
    if out:
        Path(out).write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")


def write_results(result: dict[str, Any], out: str | Path, text: str) -> None:
    """Write the result as strict JSON at ``out`` and its Markdown ``text`` beside it
    (same name, ``.md``), creating the folder; print the Markdown."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")
    path.with_suffix(".md").write_text(text + "\n")
    print(text)
