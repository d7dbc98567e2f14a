"""``semsoft eval``: every method side by side on the same items and forward passes.

The methods are the registry in :mod:`semsoft_eval.methods` (``--methods``, comma
separated; :data:`DEFAULT_METHODS` unless named): the constrained softmax, Semantic
Softmax with the run's config and the paper's, label-free calibrations (batch,
contextual), the cross-fitted references (temperature, prior), the whole-sequence
probability, and with ``self-consistency`` / ``verbal`` the generating baselines of
:mod:`semsoft_eval.selfconsistency`.

:func:`prepare` loads the data and a :class:`~semsoft_eval.backends.Backend`
(``backend="transformers"`` or ``"vllm"``) and runs or reads back one forward pass per
item (:func:`semsoft_eval.forward.collect`); :func:`evaluate` scores every method on it
and builds the report (:mod:`semsoft_eval.report`). The methods that need labels are
cross-fitted over ``n_folds`` folds so every item is scored out of fold.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from semsoft_eval import calibrate
from semsoft_eval.backends import ENGINES, Backend, as_backend, check_engine_args, load_backend
from semsoft_eval.data import EvalData, load_builtin, sample
from semsoft_eval.forward import CONTENT_FREE, Forward, cache_path, collect
from semsoft_eval.methods import (
    ALL_METHODS,
    DEFAULT_METHODS,
    MethodInputs,
    MethodResult,
    check_methods,
    constrained_probs,
    score_methods,
    semantic_probs,
)
from semsoft_eval.prompts import TEMPLATES, PromptTemplate, build_inputs
from semsoft_eval.report import (
    METRIC_COLUMNS,
    build_report,
    format_markdown,
    machine,
    plot_reliability,
    write_report,
)
from semsoft_plugin.core.config import SemsoftConfig
from semsoft_plugin.core.labels import LabelSet

__all__ = [
    "ALL_METHODS",
    "BACKENDS",
    "DEFAULT_METHODS",
    "METRIC_COLUMNS",
    "MethodResult",
    "Prepared",
    "constrained_probs",
    "evaluate",
    "format_markdown",
    "plot_reliability",
    "prepare",
    "resolve_data",
    "score_methods",
    "semantic_probs",
    "write_report",
]

BACKENDS = ENGINES
_constrained = constrained_probs  # the name the vLLM tests compare both engines through


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
    """Items, backend and their kept forward passes, ready for any method."""

    data: EvalData
    template: PromptTemplate
    model_dir: Path
    backend: Backend
    labels: LabelSet
    inputs: list[Any]
    forward: Forward
    cache_file: Path | None

    @property
    def model(self) -> Any:
        return self.backend.model

    @property
    def tokenizer(self) -> Any:
        return self.backend.tokenizer

    @property
    def embeddings(self) -> Any:
        """The output embeddings the adapter of this backend scores with."""
        return self.backend.embeddings()


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
    backend: str = "transformers",
    engine_args: dict[str, Any] | None = None,
    progress: bool = True,
    loaded: tuple[Any, Any] | Backend | None = None,
    min_items: int = 2,
    **data_options: Any,
) -> Prepared:
    """Load the data and the model, and run (or read back) one forward pass per item.

    ``backend="vllm"`` builds a ``vllm.LLM`` with the plugin (``engine_args`` go to it,
    e.g. ``{"tensor_parallel_size": 4}``) unless ``loaded`` gives one, as
    ``(llm, llm.get_tokenizer())`` or as a :class:`~semsoft_eval.backends.Backend`.
    """
    from semsoft_plugin.engines import models

    backend = check_engine_args(backend, engine_args)
    data = sample(resolve_data(dataset, **data_options), limit, seed)
    if len(data) < min_items:
        raise ValueError(
            f"{len(data)} items are too few (need at least {min_items}); give more items"
        )
    template = template or TEMPLATES[data.task]
    model_dir = models.resolve(model)
    if loaded is not None:
        engine = as_backend(*loaded) if isinstance(loaded, tuple) else as_backend(loaded)
    else:
        engine = load_backend(str(model_dir), backend, seed=seed, engine_args=engine_args)
    store_k = engine.max_store_k()
    label_set = LabelSet(data.labels, engine.tokenizer)
    inputs = build_inputs(template, data.texts, data.labels, engine.tokenizer)
    content_free = build_inputs(template, list(CONTENT_FREE), data.labels, engine.tokenizer)
    if cache_dir is None:
        cache_dir = models.cache_dir() / "eval"
    cache_file = None
    if cache_dir != "":
        cache_file = cache_path(
            Path(cache_dir),
            model_dir,
            data.texts,
            data.labels,
            template.to_dict(),
            store_k,
            engine.name,
        )
    forward = collect(
        engine,
        inputs,
        content_free,
        label_set,
        store_k=store_k,
        batch_size=batch_size,
        sequence=sequence,
        progress=progress,
        cache_file=cache_file,
    )
    return Prepared(data, template, model_dir, engine, label_set, inputs, forward, cache_file)


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
    backend: str = "transformers",
    engine_args: dict[str, Any] | None = None,
    progress: bool = True,
    loaded: tuple[Any, Any] | Backend | None = None,
    plot: str | Path | None = None,
    **data_options: Any,
) -> dict[str, Any]:
    """Evaluate methods side by side; returns the report (see ``docs``/README for the schema).

    Parameters
    ----------
    model : what :func:`semsoft_plugin.engines.models.resolve` takes
    dataset : a built-in name, an :class:`EvalData`, or with ``data_file`` a name for it
    methods : any of :data:`ALL_METHODS` (the registry in :mod:`semsoft_eval.methods`)
    config : the ``semantic`` configuration (default :class:`SemsoftConfig`)
    paper_k, paper_tau : the ``semantic-paper`` configuration
    limit, seed : a fixed random sample of ``limit`` items
    template : prompt template (default: the task's, see :mod:`semsoft_eval.prompts`)
    n_folds : folds for the cross-fitted methods (temperature, prior)
    n_bootstrap : resamples for the 95% intervals of differences against ``constrained``
    cache_dir : where forward passes are kept (default ``<semsoft cache>/eval``); None
        and ``cache_dir=""`` disables the cache
    backend : ``"transformers"`` (alias ``"hf"``; through ``semsoft_plugin.engines.hf.classify``)
        or ``"vllm"`` (through ``semsoft_plugin.engines.vllm.classify_vllm``; every method, the
        self-consistency and verbal ones included, runs on the engine)
    engine_args : ``vllm.LLM`` arguments for ``backend="vllm"`` (e.g.
        ``{"tensor_parallel_size": 4}``)
    loaded : an already loaded ``(model, tokenizer)`` for ``model`` (for vLLM:
        ``(llm, llm.get_tokenizer())``), or a :class:`~semsoft_eval.backends.Backend`
    plot : write reliability diagrams (PNG, one panel per method) to this path
    **data_options : ``data_file``, ``labels_file``, ``text_column``, ``label_column``,
        ``prob_column``, ``labels``, ``any_gold`` (see :func:`resolve_data`)
    """
    methods = check_methods(methods)
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
