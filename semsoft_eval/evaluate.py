"""``semsoft eval``: every method side by side on the same items and forward passes.

Methods (``--methods``, comma separated):

* ``constrained``: softmax over the label answer tokens (the baseline constrained
  decoding implies);
* ``semantic``: Semantic Softmax with the project's default :class:`SemsoftConfig`
  (or the ``--config`` file);
* ``semantic-paper``: the paper's exact formula (``SemsoftConfig.paper(k, tau)``);
* ``semantic-shared``: the previous default (``SemsoftConfig.shared_votes()``), every
  kept token's whole mass shared out among the labels;
* ``batch``: batch calibration (Zhou et al., 2024) of ``constrained``: divided by the
  mean label distribution over the items being evaluated (label-free, no extra pass);
* ``semantic-batch`` and ``semantic-contextual``: ``semantic`` followed by batch or
  contextual calibration (the content-free inputs scored by the same method): the
  silent vote and the prompt's label bias corrected together;
* ``semantic-temperature``: ``semantic`` followed by a temperature fitted on held
  folds (what ``semsoft tune`` produces; needs labels);
* ``contextual``: contextual calibration (Zhao et al., 2021) with the content-free
  inputs "N/A", "" and "[MASK]" in the same prompt;
* ``temperature``: temperature scaling of the constrained logits, fitted on held folds
  (a reference that needs labels);
* ``prior``: the label frequencies of the held folds (the floor any informative method
  must beat);
* ``sequence``: the probability of each label's whole token sequence, normalised over
  labels (one extra, batched forward per item when some label is multi-token; with
  only single-token labels it equals ``constrained`` and costs nothing);
* ``self-consistency`` and ``verbal``: from :mod:`semsoft_eval.selfconsistency`
  (sampling and a stated confidence; extra generations per item).

The forward passes go through :func:`semsoft_plugin.hf.classify` or, with
``backend="vllm"``, :func:`semsoft_plugin.vllm.classify_vllm` (see
:mod:`semsoft_eval.forward`); the methods that need labels are cross-fitted over
``n_folds`` folds so every item is scored out of fold.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from semsoft_eval import calibrate, metrics
from semsoft_eval.data import EvalData, load_builtin, sample
from semsoft_eval.forward import (
    CONTENT_FREE,
    STORE_K,
    VLLM_STORE_K,
    Forward,
    cache_path,
    collect,
    collect_vllm,
)
from semsoft_eval.prompts import TEMPLATES, PromptTemplate, build_inputs
from semsoft_plugin.calibration import batch_calibrate
from semsoft_plugin.config import SemsoftConfig
from semsoft_plugin.core import SemanticSoftmax
from semsoft_plugin.labels import LabelSet

__all__ = [
    "ALL_METHODS",
    "DEFAULT_METHODS",
    "MethodResult",
    "evaluate",
    "format_markdown",
    "plot_reliability",
    "score_methods",
    "semantic_probs",
]

DEFAULT_METHODS = (
    "constrained",
    "semantic",
    "semantic-paper",
    "semantic-shared",
    "semantic-temperature",
    "semantic-batch",
    "semantic-contextual",
    "contextual",
    "batch",
    "temperature",
    "prior",
    "sequence",
)
ALL_METHODS = (*DEFAULT_METHODS, "self-consistency", "verbal")
METRIC_COLUMNS = ("accuracy", "macro_f1", "ece", "brier", "nll", "auroc", "auroc2")
BACKENDS = ("hf", "vllm")
SOFT_COLUMNS = (
    "mae_vs_raters",
    "ece_vs_raters",
    "spearman_vs_raters",
    "share_over_0_9_on_ambiguous",
)


@dataclass
class MethodResult:
    """One method's label probabilities ``[N, L]`` and what it measured on the way."""

    probs: np.ndarray
    seconds: float
    fallback_rate: float | None = None
    coverage: float | None = None
    extra: dict[str, Any] | None = None


def semantic_probs(
    forward: Forward, embeddings: Any, labels: LabelSet, config: SemsoftConfig, *, chunk: int = 128
) -> MethodResult:
    """Semantic Softmax of the kept logits with one configuration (the core, batched)."""
    if config.k > forward.store_k:
        raise ValueError(f"k={config.k} exceeds the {forward.store_k} logits kept per item")
    start = time.perf_counter()
    scorer = SemanticSoftmax(embeddings, labels, config)
    parts = [scorer(rows) for rows in forward.chunks(chunk)]
    probs = torch.cat([p.semantic for p in parts]).double().numpy()
    fallback = torch.cat([p.fallback for p in parts]).float()
    coverage = torch.cat([p.coverage for p in parts]).float()
    return MethodResult(
        probs=probs / probs.sum(1, keepdims=True),
        seconds=time.perf_counter() - start,
        fallback_rate=float(fallback.mean()),
        coverage=float(coverage.mean()),
    )


def _constrained(forward: Forward, labels: LabelSet, *, content_free: bool = False) -> np.ndarray:
    values = forward.cf_label_logits if content_free else forward.label_logits
    answer = values[:, : len(labels)].double()  # answer token ids come first in label_ids
    return torch.softmax(answer, dim=-1).numpy()


def score_methods(
    methods: Sequence[str],
    forward: Forward,
    embeddings: Any,
    labels: LabelSet,
    targets: np.ndarray,
    *,
    config: SemsoftConfig,
    paper: SemsoftConfig,
    fold_ids: np.ndarray,
    external: dict[str, MethodResult] | None = None,
) -> dict[str, MethodResult]:
    """Label probabilities of each requested method on the same forward passes."""
    out: dict[str, MethodResult] = {}
    start = time.perf_counter()
    constrained = _constrained(forward, labels)
    constrained_seconds = time.perf_counter() - start
    semantic: MethodResult | None = None
    for name in methods:
        start = time.perf_counter()
        if name == "constrained":
            out[name] = MethodResult(constrained, constrained_seconds)
        elif name in ("semantic", "semantic-temperature"):
            if semantic is None:
                semantic = semantic_probs(forward, embeddings, labels, config)
            if name == "semantic":
                out[name] = semantic
            else:
                probs, temps = calibrate.cross_fit_temperature(semantic.probs, targets, fold_ids)
                out[name] = MethodResult(
                    probs,
                    semantic.seconds + time.perf_counter() - start,
                    semantic.fallback_rate,
                    semantic.coverage,
                    {"fold_temperatures": temps},
                )
        elif name in ("semantic-batch", "semantic-contextual"):
            if semantic is None:
                semantic = semantic_probs(forward, embeddings, labels, config)
            if name == "semantic-batch":
                probs = batch_calibrate(semantic.probs)
            else:
                cf = semantic_probs(forward.content_free(), embeddings, labels, config)
                probs = calibrate.contextual(semantic.probs, cf.probs)
            out[name] = MethodResult(
                probs,
                semantic.seconds + time.perf_counter() - start,
                semantic.fallback_rate,
                semantic.coverage,
            )
        elif name == "semantic-paper":
            out[name] = semantic_probs(forward, embeddings, labels, paper)
        elif name == "semantic-shared":
            out[name] = semantic_probs(
                forward, embeddings, labels, SemsoftConfig.shared_votes(k=config.k)
            )
        elif name == "batch":
            out[name] = MethodResult(
                batch_calibrate(constrained), constrained_seconds + time.perf_counter() - start
            )
        elif name == "contextual":
            probs = calibrate.contextual(
                constrained, _constrained(forward, labels, content_free=True)
            )
            out[name] = MethodResult(probs, constrained_seconds + time.perf_counter() - start)
        elif name == "temperature":
            probs, temps = calibrate.cross_fit_temperature(constrained, targets, fold_ids)
            out[name] = MethodResult(
                probs,
                constrained_seconds + time.perf_counter() - start,
                extra={"fold_temperatures": temps},
            )
        elif name == "prior":
            out[name] = MethodResult(calibrate.cross_fit_prior(targets, len(labels), fold_ids), 0.0)
        elif name == "sequence":
            if forward.sequence_logprob is None:
                out[name] = MethodResult(
                    constrained,
                    0.0,
                    extra={"note": "all labels are single tokens: equals constrained"},
                )
            else:
                probs = torch.softmax(forward.sequence_logprob.double(), -1).numpy()
                out[name] = MethodResult(probs, forward.sequence_seconds / forward.n)
        elif external and name in external:
            out[name] = external[name]
        else:
            raise ValueError(f"unknown method {name!r}; methods are {', '.join(ALL_METHODS)}")
    return out


def _external_methods(
    methods: Sequence[str],
    model: Any,
    tokenizer: Any,
    inputs: list[Any],
    labels: list[str],
    seed: int,
) -> dict[str, MethodResult]:
    wanted = [m for m in methods if m in ("self-consistency", "verbal")]
    if not wanted:
        return {}
    try:
        from semsoft_eval import selfconsistency
    except ImportError:
        raise ValueError(
            f"methods {wanted} need semsoft_eval.selfconsistency, which is not installed"
        ) from None
    out: dict[str, MethodResult] = {}
    if "self-consistency" in wanted:
        start = time.perf_counter()
        probs = selfconsistency.self_consistency_probs(
            model, tokenizer, inputs, labels, n=10, temperature=0.7, seed=seed
        )
        out["self-consistency"] = MethodResult(_normalised(probs), time.perf_counter() - start)
    if "verbal" in wanted:
        start = time.perf_counter()
        probs, unparsed = selfconsistency.verbal_probs(model, tokenizer, inputs, labels)
        out["verbal"] = MethodResult(
            _normalised(probs), time.perf_counter() - start, extra={"n_unparsed": int(unparsed)}
        )
    return out


def _normalised(probs: Any) -> np.ndarray:
    p = np.nan_to_num(np.asarray(probs, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0).clip(
        0, None
    )
    total = p.sum(1, keepdims=True)
    # A row with no mass (nothing parsed) says nothing: uniform, not NaN.
    return np.where(total > 0, p / np.where(total > 0, total, 1.0), 1.0 / p.shape[1])


def _machine() -> str:
    return f"{platform.machine()} {platform.processor() or platform.system()}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}"


def resolve_data(
    dataset: str | EvalData | None,
    *,
    data_file: str | None = None,
    labels_file: str | None = None,
    text_column: str = "text",
    label_column: str | None = None,
    prob_column: str | None = None,
    labels: Sequence[str] | None = None,
    any_gold: bool = False,
) -> EvalData:
    """An :class:`EvalData` from a built-in name, a GoEmotions TSV or a generic table."""
    from semsoft_eval.data import load_goemotions, load_table

    if isinstance(dataset, EvalData):
        return dataset
    if data_file is None:
        if dataset is None:
            raise ValueError("give --dataset (goemotions, ekman, davidson, sst2) or --data-file")
        return load_builtin(dataset, any_gold=any_gold)
    if dataset in ("goemotions", "ekman"):
        if labels_file is None:
            raise ValueError(f"--dataset {dataset} with --data-file needs --labels-file")
        return load_goemotions(data_file, labels_file, any_gold=any_gold, name=dataset)
    return load_table(
        data_file,
        text_column=text_column,
        label_column=label_column,
        prob_column=prob_column,
        labels=list(labels) if labels else None,
        name=dataset,
    )


@dataclass
class Prepared:
    """Items, model and their kept forward passes, ready for any method."""

    data: EvalData
    template: PromptTemplate
    model_dir: Path
    model: Any
    tokenizer: Any
    labels: LabelSet
    inputs: list[Any]
    forward: Forward
    cache_file: Path | None
    backend: str = "hf"

    @property
    def embeddings(self) -> Any:
        """The output embeddings the adapter of this backend scores with."""
        if self.backend == "vllm":
            from semsoft_plugin.vllm import output_embeddings

            return output_embeddings(self.model)
        from semsoft_plugin.embeddings import from_model

        return from_model(self.model)


def _vllm_engine(model_dir: Path, seed: int, engine_args: dict[str, Any]) -> Any:
    """A ``vllm.LLM`` with the plugin, keeping enough log-probabilities per step."""
    from vllm import LLM

    from semsoft_plugin.vllm import ENTRY_POINT

    # If the entry point is installed too, the second copy of the processor stands down.
    args = {"max_logprobs": VLLM_STORE_K, "seed": seed, **engine_args}
    return LLM(str(model_dir), logits_processors=[ENTRY_POINT], **args)


def _vllm_store_k(llm: Any) -> int:
    max_logprobs = int(llm.llm_engine.model_config.max_logprobs)
    store_k = VLLM_STORE_K if max_logprobs == -1 else min(VLLM_STORE_K, max_logprobs)
    if store_k < SemsoftConfig().k:
        raise ValueError(
            f"this engine keeps max_logprobs={max_logprobs} log-probabilities per step, "
            f"fewer than k={SemsoftConfig().k}: create it with "
            f"LLM(..., max_logprobs={VLLM_STORE_K})"
        )
    return store_k


def prepare(
    model: str,
    dataset: str | EvalData | None,
    *,
    limit: int | None = None,
    seed: int = 0,
    template: PromptTemplate | None = None,
    batch_size: int = 8,
    cache_dir: str | Path | None = None,
    sequence: bool = False,
    backend: str = "hf",
    engine_args: dict[str, Any] | None = None,
    progress: bool = True,
    loaded: tuple[Any, Any] | None = None,
    min_items: int = 2,
    **data_options: Any,
) -> Prepared:
    """Load the data and the model, and run (or read back) one forward pass per item.

    ``backend="vllm"`` builds a ``vllm.LLM`` with the plugin (``engine_args`` go to it,
    e.g. ``{"tensor_parallel_size": 4}``) unless ``loaded`` gives one as
    ``(llm, llm.get_tokenizer())``.
    """
    from semsoft_plugin import models

    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} must be one of {BACKENDS}")
    if engine_args and backend != "vllm":
        raise ValueError(f"engine_args {engine_args!r} apply only to backend='vllm'")
    data = sample(resolve_data(dataset, **data_options), limit, seed)
    if len(data) < min_items:
        raise ValueError(
            f"{len(data)} items are too few (need at least {min_items}); give more items"
        )
    template = template or TEMPLATES[data.task]
    model_dir = models.resolve(model)
    if loaded is not None:
        model_obj, tokenizer = loaded
    elif backend == "vllm":
        model_obj = _vllm_engine(model_dir, seed, dict(engine_args or {}))
        tokenizer = model_obj.get_tokenizer()
    else:
        model_obj, tokenizer = models.load(str(model_dir))
    store_k = STORE_K if backend == "hf" else _vllm_store_k(model_obj)
    label_set = LabelSet(data.labels, tokenizer)
    inputs = build_inputs(template, data.texts, data.labels, tokenizer)
    content_free = build_inputs(template, list(CONTENT_FREE), data.labels, tokenizer)
    if cache_dir is None:
        cache_dir = models.cache_dir() / "eval"
    cache_file = (
        cache_path(
            Path(cache_dir),
            model_dir,
            data.texts,
            data.labels,
            template.to_dict(),
            store_k,
            backend,
        )
        if cache_dir != ""
        else None
    )
    if backend == "vllm":
        forward = collect_vllm(
            model_obj,
            inputs,
            content_free,
            label_set,
            store_k=store_k,
            sequence=sequence,
            progress=progress,
            cache_file=cache_file,
        )
    else:
        forward = collect(
            model_obj,
            tokenizer,
            inputs,
            content_free,
            label_set,
            batch_size=batch_size,
            sequence=sequence,
            progress=progress,
            cache_file=cache_file,
        )
    return Prepared(
        data,
        template,
        model_dir,
        model_obj,
        tokenizer,
        label_set,
        inputs,
        forward,
        cache_file,
        backend,
    )


def evaluate(
    model: str = "default",
    dataset: str | EvalData | None = "goemotions",
    *,
    methods: Sequence[str] = DEFAULT_METHODS,
    config: SemsoftConfig | None = None,
    paper_k: int = 50,
    paper_tau: float = 0.0,
    limit: int | None = None,
    seed: int = 0,
    template: PromptTemplate | None = None,
    batch_size: int = 8,
    n_folds: int = 2,
    n_bootstrap: int = 1000,
    cache_dir: str | Path | None = None,
    backend: str = "hf",
    engine_args: dict[str, Any] | None = None,
    progress: bool = True,
    loaded: tuple[Any, Any] | None = None,
    plot: str | Path | None = None,
    **data_options: Any,
) -> dict[str, Any]:
    """Evaluate methods side by side; returns the report (see ``docs``/README for the schema).

    Parameters
    ----------
    model : what :func:`semsoft_plugin.models.resolve` takes
    dataset : a built-in name, an :class:`EvalData`, or with ``data_file`` a name for it
    methods : any of :data:`ALL_METHODS`
    config : the ``semantic`` configuration (default :class:`SemsoftConfig`)
    paper_k, paper_tau : the ``semantic-paper`` configuration
    limit, seed : a fixed random sample of ``limit`` items
    template : prompt template (default: the task's, see :mod:`semsoft_eval.prompts`)
    n_folds : folds for the cross-fitted methods (temperature, prior)
    n_bootstrap : resamples for the 95% intervals of differences against ``constrained``
    cache_dir : where forward passes are kept (default ``<semsoft cache>/eval``); None
        and ``cache_dir=""`` disables the cache
    backend : ``"hf"`` (transformers, through ``semsoft_plugin.hf.classify``) or
        ``"vllm"`` (through ``semsoft_plugin.vllm.classify_vllm``; every method, the
        self-consistency and verbal ones included, runs on the engine)
    engine_args : ``vllm.LLM`` arguments for ``backend="vllm"`` (e.g.
        ``{"tensor_parallel_size": 4}``)
    loaded : an already loaded ``(model, tokenizer)`` for ``model`` (for vLLM:
        ``(llm, llm.get_tokenizer())``)
    plot : write reliability diagrams (PNG, one panel per method) to this path
    **data_options : ``data_file``, ``labels_file``, ``text_column``, ``label_column``,
        ``prob_column``, ``labels``, ``any_gold`` (see :func:`resolve_data`)
    """
    methods = list(dict.fromkeys(methods))
    unknown = [m for m in methods if m not in ALL_METHODS]
    if unknown:
        raise ValueError(f"unknown method {unknown[0]!r}; methods are {', '.join(ALL_METHODS)}")
    if not methods:
        raise ValueError("no method given")
    config = config or SemsoftConfig()
    paper = SemsoftConfig.paper(k=paper_k, tau=paper_tau)
    prepared = prepare(
        model,
        dataset,
        limit=limit,
        seed=seed,
        template=template,
        batch_size=batch_size,
        cache_dir=cache_dir,
        sequence="sequence" in methods,
        backend=backend,
        engine_args=engine_args,
        progress=progress,
        loaded=loaded,
        min_items=2 * n_folds,
        **data_options,
    )
    data, forward, label_set = prepared.data, prepared.forward, prepared.labels
    model_obj, tokenizer, inputs = prepared.model, prepared.tokenizer, prepared.inputs
    template, model_dir, cache_file = prepared.template, prepared.model_dir, prepared.cache_file
    embeddings = prepared.embeddings
    fold_ids = calibrate.folds(len(data), n_folds, seed)
    external = _external_methods(methods, model_obj, tokenizer, inputs, data.labels, seed)
    results = score_methods(
        methods,
        forward,
        embeddings,
        label_set,
        data.targets,
        config=config,
        paper=paper,
        fold_ids=fold_ids,
        external=external,
    )
    check = semantic_probs(forward, embeddings, label_set, SemsoftConfig()).probs
    report = build_report(results, data, fold_ids, n_bootstrap=n_bootstrap, seed=seed)
    report["run"] = {
        "model": model,
        "model_dir": str(model_dir),
        "dataset": data.name,
        "source": data.source,
        "n": len(data),
        "limit": limit,
        "seed": seed,
        "labels": data.labels,
        "any_gold": data.gold_sets is not None,
        **config.to_dict(),
        "config": config.to_dict(),
        "paper": paper.to_dict(),
        "n_folds": n_folds,
        "n_bootstrap": n_bootstrap,
        "backend": backend,
        "template": template.to_dict(),
        "label_report": label_set.report(),
        "seconds_per_item": forward.seconds / forward.n,
        "sequence_seconds_per_item": forward.sequence_seconds / forward.n,
        "cache_check_max_abs_diff": float(
            np.abs(check - forward.semantic_check.double().numpy()).max()
        ),
        "cache_file": str(cache_file) if cache_file else None,
        "machine": _machine(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }
    if plot is not None:
        plot_reliability(
            {k: r.probs for k, r in results.items()},
            data.targets,
            plot,
            title=f"{data.name}, {model}, n={len(data)}",
        )
    report["run"].pop(
        "temperature", None
    )  # inside "config"; a bare "temperature" reads like the baseline
    return {"run": report.pop("run"), **report}


def build_report(
    results: dict[str, MethodResult],
    data: EvalData,
    fold_ids: np.ndarray,
    *,
    n_bootstrap: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """``{"methods": {name: metrics}}`` with intervals against ``constrained``."""
    out: dict[str, Any] = {}
    reference = results.get("constrained")
    for name, result in results.items():
        row: dict[str, Any] = metrics.classification_metrics(
            result.probs, data.targets, data.gold_sets
        )
        row["fallback_rate"] = result.fallback_rate
        row["coverage"] = result.coverage
        row["seconds_per_item"] = result.seconds / len(data)
        if data.soft is not None:
            row.update(metrics.soft_label_metrics(result.probs, data.soft))
        if reference is not None and name != "constrained" and n_bootstrap > 0:
            row["vs_constrained"] = metrics.bootstrap_difference(
                result.probs,
                reference.probs,
                data.targets,
                n_resamples=n_bootstrap,
                seed=seed,
                gold_sets=data.gold_sets,
            )
        if result.extra:
            row.update(result.extra)
        out[name] = row
    return {"methods": out, "folds": int(fold_ids.max()) + 1}


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3f}"


def _interval(row: dict[str, Any], metric: str) -> str:
    cmp = row.get("vs_constrained", {}).get(metric)
    if cmp is None:
        return ""
    return f"{cmp['diff']:+.3f} [{cmp['low']:+.3f}, {cmp['high']:+.3f}]"


def format_markdown(report: dict[str, Any]) -> str:
    """The results as a Markdown table (one row per method)."""
    run = report["run"]
    soft = any("mae_vs_raters" in row for row in report["methods"].values())
    header = ["method", "acc", "macro-F1", "ECE", "Brier", "NLL", "AUROC", "AUROC2"]
    keys = list(METRIC_COLUMNS)
    if soft:
        header += ["MAE raters", "ECE raters", "Spearman", ">0.9 on ambiguous"]
        keys += list(SOFT_COLUMNS)
    header += ["ΔECE vs constrained [95%]", "ΔNLL", "Δmacro-F1"]
    lines = [
        f"**{run['dataset']}**, {run['n']} items, model `{run['model']}`, "
        f"{run['seconds_per_item']:.3f} s/item forward ({run['machine']}, {run['date']})",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for name, row in report["methods"].items():
        cells = [name] + [_fmt(row.get(k)) for k in keys]
        cells += [_interval(row, "ece"), _interval(row, "nll"), _interval(row, "macro_f1")]
        lines.append("| " + " | ".join(cells) + " |")
    multi = run["label_report"]["multi_token_labels"]
    lines.append("")
    lines.append(f"multi-token labels: {', '.join(multi) if multi else 'none'}")
    return "\n".join(lines)


def plot_reliability(
    probs: dict[str, np.ndarray],
    targets: np.ndarray,
    path: str | Path,
    *,
    title: str = "",
    n_bins: int = metrics.N_BINS,
) -> None:
    """Reliability diagrams, one panel per method: accuracy against top-label confidence."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(probs)
    cols = min(4, len(names))
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.2 * rows), squeeze=False)
    edges = np.linspace(0, 1, n_bins + 1)
    for ax, name in zip(axes.ravel(), names, strict=False):
        p = probs[name]
        conf, hit = p.max(1), p.argmax(1) == targets
        bins = np.clip(np.ceil(conf * n_bins).astype(int) - 1, 0, n_bins - 1)
        count = np.bincount(bins, minlength=n_bins)
        acc = np.bincount(bins, weights=hit, minlength=n_bins) / np.maximum(count, 1)
        mean_conf = np.bincount(bins, weights=conf, minlength=n_bins) / np.maximum(count, 1)
        filled = count > 0
        ax.bar(
            edges[:-1][filled],
            acc[filled],
            width=1 / n_bins,
            align="edge",
            alpha=0.7,
            edgecolor="k",
            label="accuracy",
        )
        ax.plot(mean_conf[filled], acc[filled], "o", ms=3, color="C3", label="mean confidence")
        ax.plot([0, 1], [0, 1], "--", color="gray", lw=1)
        ax.set(
            xlim=(0, 1),
            ylim=(0, 1),
            title=f"{name} (ECE {metrics.ece_numpy(conf, hit):.3f})",
            xlabel="confidence",
        )
        ax.title.set_fontsize(9)
    for ax in axes.ravel()[len(names) :]:
        ax.axis("off")
    axes[0, 0].set_ylabel("accuracy")
    axes[0, 0].legend(fontsize=7, loc="upper left")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(report: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
