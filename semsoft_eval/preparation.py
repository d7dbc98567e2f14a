"""What every run over a dataset starts from: the items, a backend and their forward passes.

`prepare` loads the data (`resolve_data`) and a
`semsoft_eval.backends.Backend` (`backend="transformers"` or `"vllm"`) and runs
or reads back one forward pass per item (`semsoft_eval.forward.collect`).
`semsoft eval` (`semsoft_eval.evaluate.evaluate`) and `semsoft tune`
(`semsoft_eval.tune.tune_dataset`) both start from its `Prepared`; kept apart
from them so that neither imports the other (the methods registry uses the tune grid).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from semsoft_eval.backend_factory import as_backend, load_backend
from semsoft_eval.backends import Backend, check_engine_args
from semsoft_eval.data import BUILTIN, EvalData, load_builtin, sample
from semsoft_eval.forward import Forward, cache_path, collect
from semsoft_eval.prompts import TEMPLATES
from semsoft_plugin.core.calibration import CONTENT_FREE
from semsoft_plugin.core.labels import LabelSet
from semsoft_plugin.engines.prompting import PromptTemplate, build_inputs

__all__ = ["Prepared", "prepare", "resolve_data"]


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
    """An `EvalData` from a built-in name, a GoEmotions TSV or a generic table."""
    from semsoft_eval.data import load_goemotions, load_table

    if isinstance(dataset, EvalData):
        return dataset
    if data_file is None:
        if dataset is None:
            raise ValueError(f"give --dataset ({', '.join(BUILTIN)}) or --input")
        return load_builtin(dataset, any_gold=any_gold)
    if dataset in ("goemotions", "ekman"):
        if labels_file is None:
            raise ValueError(f"--dataset {dataset} with --input needs --labels-file")
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
    hidden: bool = False,
    backend: str = "transformers",
    engine_args: dict[str, Any] | None = None,
    progress: bool = True,
    loaded: tuple[Any, Any] | Backend | None = None,
    min_items: int = 2,
    **data_options: Any,
) -> Prepared:
    """Load the data and the model, and run (or read back) one forward pass per item.

    `backend="vllm"` builds a `vllm.LLM` with the plugin (`engine_args` go to it,
    e.g. `{"tensor_parallel_size": 4}`) unless `loaded` gives one, as
    `(llm, llm.get_tokenizer())` or as a `semsoft_eval.backends.Backend`.
    `sequence` / `hidden`: extend a cache that lacks the label sequences' log-probabilities
    / the decision step's hidden states (`semsoft_eval.forward.collect`).
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
        hidden=hidden,
    )
    return Prepared(data, template, model_dir, engine, label_set, inputs, forward, cache_file)
