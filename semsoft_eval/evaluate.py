"""`semsoft eval`: every method side by side on the same items and forward passes.

The methods are the registry in `semsoft_eval.methods` (`--methods`, comma
separated; `DEFAULT_METHODS` unless named): the constrained softmax, Semantic
Softmax with the run's config and the paper's, label-free calibrations (batch,
contextual), the cross-fitted references (temperature, prior), the whole-sequence
probability, and with `self-consistency` / `verbal` the generating baselines of
`semsoft_eval.selfconsistency`.

`semsoft_eval.preparation.prepare` loads the data and a
`semsoft_eval.backends.Backend` (`backend="transformers"` or `"vllm"`) and
runs or reads back one forward pass per item (`semsoft_eval.forward.collect`);
`evaluate` scores every method on it and builds the report
(`semsoft_eval.report`). The methods that need labels are
cross-fitted over `n_folds` folds so every item is scored out of fold.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from semsoft_eval import calibrate
from semsoft_eval.backends import Backend
from semsoft_eval.data import EvalData
from semsoft_eval.methods import (
    DEFAULT_METHODS,
    MethodInputs,
    check_methods,
    score_methods,
    semantic_probs,
)
from semsoft_eval.preparation import prepare
from semsoft_eval.report import (
    build_report,
    machine,
    plot_reliability,
)
from semsoft_plugin.core.config import SemsoftConfig
from semsoft_plugin.engines.prompting import PromptTemplate

__all__ = ["evaluate"]


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
    n_folds: int = 5,
    n_bootstrap: int = 1000,
    cache_dir: str | Path | None = None,
    backend: str = "transformers",
    engine_args: dict[str, Any] | None = None,
    progress: bool = True,
    loaded: tuple[Any, Any] | Backend | None = None,
    plot: str | Path | None = None,
    **data_options: Any,
) -> dict[str, Any]:
    """Evaluate methods side by side; returns the report (see `docs`/README for the schema).

    Parameters
    ----------
    model : str
        What `semsoft_plugin.engines.models.resolve` takes
    dataset : str | EvalData | None
        A built-in name, an `EvalData`, or with `data_file` a name for it
    methods : any of ALL_METHODS (the registry in semsoft_eval.methods)
    config : SemsoftConfig | None
        The `semantic` configuration (default `SemsoftConfig`)
    paper_k : int
        The `semantic-paper` configuration
    paper_tau : float
        The `semantic-paper` configuration
    limit : int | None
        A fixed random sample of `limit` items
    seed : int
        A fixed random sample of `limit` items
    template : PromptTemplate | None
        Prompt template (default: the task's, see `semsoft_eval.prompts`)
    n_folds : int
        Folds for the cross-fitted methods (temperature, prior)
    n_bootstrap : int
        Resamples for the 95% intervals of differences against `constrained`
    cache_dir : str | Path | None
        Where forward passes are kept (None: `<semsoft cache>/eval`); `""`
        disables the cache
    backend : str
        `"transformers"` (alias `"hf"`; through `semsoft_plugin.engines.hf.classify`)
        or `"vllm"` (through `semsoft_plugin.engines.vllm.classify_vllm`; every method, the
        self-consistency and verbal ones included, runs on the engine)
    engine_args : dict[str, Any] | None
        `vllm.LLM` arguments for `backend="vllm"` (e.g.
        `{"tensor_parallel_size": 4}`)
    loaded : tuple[Any, Any] | Backend | None
        An already loaded `(model, tokenizer)` for `model` (for vLLM:
        `(llm, llm.get_tokenizer())`), or a `semsoft_eval.backends.Backend`
    plot : str | Path | None
        Write reliability diagrams (PNG, one panel per method) to this path
    **data_options : data_file, labels_file, text_column, label_column,
        `prob_column`, `labels`, `any_gold`
        (see `semsoft_eval.preparation.resolve_data`)
    """
    methods = check_methods(methods)
    config = config or SemsoftConfig()
    paper = SemsoftConfig.preset("paper").replace(k=paper_k, tau=paper_tau)
    prepared = prepare(
        model,
        dataset,
        limit=limit,
        seed=seed,
        template=template,
        batch_size=batch_size,
        cache_dir=cache_dir,
        sequence="sequence" in methods,
        hidden="probe" in methods or "fit" in methods,
        backend=backend,
        engine_args=engine_args,
        progress=progress,
        loaded=loaded,
        min_items=2 * n_folds,
        **data_options,
    )
    data, forward, label_set = prepared.data, prepared.forward, prepared.labels
    template, model_dir, cache_file = prepared.template, prepared.model_dir, prepared.cache_file
    embeddings = prepared.embeddings
    fold_ids = calibrate.folds(len(data), n_folds, seed)
    results = score_methods(
        methods,
        MethodInputs(
            forward,
            embeddings,
            label_set,
            data.targets,
            config=config,
            paper=paper,
            fold_ids=fold_ids,
            backend=prepared.backend,
            prompts=prepared.inputs,
            seed=seed,
        ),
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
        "backend": prepared.backend.name,
        "template": template.to_dict(),
        "label_report": label_set.report(),
        "seconds_per_item": forward.seconds / forward.n,
        "sequence_seconds_per_item": forward.sequence_seconds / forward.n,
        "cache_check_max_abs_diff": float(
            np.abs(check - forward.semantic_check.double().numpy()).max()
        ),
        "cache_file": str(cache_file) if cache_file else None,
        "machine": machine(),
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
