"""What the benchmark scripts (`benchmarks/perf/`, `benchmarks/research/`) share.

Their command line (the sample, `--out`, the merge of parts run side by side), the result
files (strict JSON and its Markdown beside it), the SST-2 chat prompts of the vLLM benches,
and the kept forward passes of a pair (model, data set) the data-set benchmarks read.
Imported by the scripts as a module of the installed package; importing it loads no model
and no engine (each helper imports what it needs when called).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from semsoft_eval.data import data_dir

if TYPE_CHECKING:
    import numpy as np
    import torch

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
    merged["command"] = (
        "; ".join(part["command"] for part in parts)
        + "; then "
        + " ".join(["python", script, *sys.argv[1:]])
    )
    return merged


def engine_bench_main(
    description: str, script: str, run: Callable[[str, str, int, int], dict[str, Any]]
) -> int:
    """The command line of a one-engine benchmark (`--model`, `--prompts`, `--repeats`,
    `--dtype`, `--out`): `run(checkpoint, dtype, prompts, repeats)`'s report, with the
    model, the load average and the command, printed and written as JSON. `script` is
    the path under `benchmarks/` (``"perf/bench_vllm_fit.py"``)."""
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


# The vLLM benches' prompts: the first SST-2 dev sentences, labels in this order.
LABELS = ["positive", "negative"]


def sst2_dev() -> Path:
    """The SST-2 dev file the built-in data set reads (`semsoft_eval.data.data_dir`)."""
    return data_dir() / "sst2" / "dev.txt"


def sst2_targets(n: int) -> list[int]:
    """The gold index into :data:`LABELS` of the first ``n`` SST-2 dev sentences
    (the file's 1 is positive, 0 negative)."""
    lines = sst2_dev().read_text().splitlines()[:n]
    return [0 if line.split(" ", 1)[0] == "1" else 1 for line in lines]


def sst2_prompts(n: int) -> list[list[dict[str, str]]]:
    """The first ``n`` SST-2 dev sentences as chat prompts with a pre-filled answer."""
    path = sst2_dev()
    if not path.is_file():
        raise SystemExit(f"data file not found: {path}")
    lines = path.read_text().splitlines()
    if n > len(lines):
        raise SystemExit(f"--prompts {n} exceeds the {len(lines)} sentences in {path}")
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


def load_pair(model: str, dataset: str, limit: int, seed: int, collect: bool) -> dict[str, Any]:
    """The kept forward passes of ``model`` on a seeded sample of ``limit`` items of
    ``dataset`` (what ``semsoft eval`` keeps), with the embeddings, label set, tokenizer
    and data. A missing cache is computed with ``collect``, else refused naming it."""
    from transformers import AutoTokenizer

    from semsoft_eval.backend_transformers import STORE_K
    from semsoft_eval.data import load_builtin, sample
    from semsoft_eval.forward import Forward, cache_path
    from semsoft_eval.prompts import TEMPLATES
    from semsoft_plugin.core.embeddings import from_checkpoint
    from semsoft_plugin.core.labels import LabelSet
    from semsoft_plugin.engines import models

    model_dir = models.resolve(model)
    data = sample(load_builtin(dataset), limit, seed)
    template = TEMPLATES[data.task]
    path = cache_path(
        models.cache_dir() / "eval", model_dir, data.texts, data.labels, template.to_dict(), STORE_K
    )
    if not path.is_file():
        if not collect:
            raise SystemExit(f"no kept forward passes for {model} {dataset} {limit} ({path})")
        from semsoft_eval.preparation import prepare

        prepare(model, dataset, limit=limit, seed=seed, sequence=False)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return {
        "forward": Forward.load(path),
        "embeddings": from_checkpoint(model_dir),
        "labels": LabelSet(data.labels, tokenizer),
        "tokenizer": tokenizer,
        "data": data,
    }


_BACKENDS: dict[str, Any] = {}  # one loaded model per name, reused across its kinds


def load_pair_with_hidden(
    model: str, dataset: str, limit: int, seed: int, collect: bool, probe: bool
) -> Any:
    """The pair's kept passes (:func:`load_pair`); with ``probe`` and ``collect``, a
    missing cache is computed with the hidden states in one decision-step pass, and a
    cache without them gains them (the model is loaded once per name)."""
    try:
        pair = load_pair(model, dataset, limit, seed, collect=not probe and collect)
    except SystemExit:
        if not (probe and collect):
            raise
        pair = None
    if probe and collect and (pair is None or pair["forward"].hidden is None):
        from semsoft_eval.backend_factory import load_backend
        from semsoft_eval.preparation import prepare

        if model not in _BACKENDS:
            _BACKENDS[model] = load_backend(model, seed=seed)
        prepare(model, dataset, limit=limit, seed=seed, hidden=True, loaded=_BACKENDS[model])
        pair = load_pair(model, dataset, limit, seed, collect=False)
    return pair


def forget_model(model: str) -> None:
    """Free the model :func:`load_pair_with_hidden` loaded for ``model``, if any."""
    _BACKENDS.pop(model, None)


def collected_dtype_note() -> str:
    """The dtype note of a result whose missing passes ``--collect`` computed here."""
    from semsoft_plugin.engines.models import default_dtype

    return (
        f"passes collected by --collect: {default_dtype()} weights (models.load's 'auto' on this "
        "machine), float32 output head; passes read from the cache keep the dtype they were "
        "written with"
    )


def constrained_probs(values: torch.Tensor, n_labels: int) -> np.ndarray:
    """The softmax over the first ``n_labels`` columns of kept label values (float64)."""
    import torch

    return torch.softmax(values[:, :n_labels].double(), -1).numpy()
