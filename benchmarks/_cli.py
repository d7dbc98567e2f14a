"""What the data-set benchmarks share on the command line: the sample and the JSON out."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
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


def merge_parts(files: Sequence[str], settings: Mapping[str, Any], script: str) -> dict[str, Any]:
    """Results of runs over parts of a benchmark's pairs (run side by side) as one: `pairs`
    joined, `command` each part's command then this one's (`script`), and each setting
    of `settings` (key -> its value in a result written before the key was recorded)
    one for all, the parts' own; parts that ran with different settings are refused."""
    parts = [json.loads(Path(f).read_text()) for f in files]
    merged: dict[str, Any] = {}
    for key, before in settings.items():
        values = {json.dumps(part.get(key, before)) for part in parts}
        if len(values) > 1:
            raise SystemExit(f"--merge: the parts ran with different {key}: {sorted(values)}")
        merged[key] = json.loads(values.pop())
    merged["pairs"] = {k: v for part in parts for k, v in part["pairs"].items()}
    merged["command"] = "; ".join(part["command"] for part in parts) + "; then " + " ".join(
        ["python", script, *sys.argv[1:]]
    )
    return merged


def engine_bench_main(
    description: str, script: str, run: Callable[[str, str, int, int], dict[str, Any]]
) -> int:
    """The command line of a one-engine benchmark (`--model`, `--prompts`, `--repeats`,
    `--dtype`, `--out`): `run(checkpoint, dtype, prompts, repeats)`'s report, with the
    model, the load average and the command, printed and written as JSON."""
    import os
    import sys

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    from semsoft_plugin.engines import models

    report = run(str(models.resolve(args.model)), args.dtype, args.prompts, args.repeats)
    report["model"] = args.model
    report["load"] = [round(x, 2) for x in os.getloadavg()]
    report["command"] = f"python benchmarks/{script} " + " ".join(sys.argv[1:])
    print(json.dumps(report, indent=2), flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
    return 0
