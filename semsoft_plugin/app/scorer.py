"""What a [`Classifier`][semsoft_plugin.app.classifier.Classifier]'s parameters resolve to for
one label list, and the one way it scores texts: kept forward passes.

A `Scorer` is the loaded model, the label set, the prompt, the settings and the
length bound, checked. `Scorer.kept` runs the decision step of each text that
`semsoft_plugin.app.pass_cache.PASSES` does not already hold, through the adapters' batch
functions ([`semsoft_plugin.engines.hf.classify`][semsoft_plugin.engines.hf.classify] and
[`semsoft_plugin.engines.vllm.classify_vllm`][semsoft_plugin.engines.vllm.classify_vllm]);
`Scorer.results` scores the kept passes under one config
(`semsoft_plugin.core.kept_scores.kept_result`). Predictions, the fit and the content-free
bias all go through it, so a text is scored once whatever is asked of it. Every fit member
works on both engines: transformers reads the hidden state during the pass, vLLM reads it
back from the logits row (refusing a row that is not `W h + b`, by name); see
docs/few-labels.md ("What you get on each engine").
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from semsoft_plugin.app.handles import Loaded
from semsoft_plugin.app.pass_cache import PASSES, KeptPass, pass_key
from semsoft_plugin.app.texts import TextFitter
from semsoft_plugin.core.config import SemsoftConfig
from semsoft_plugin.core.kept_scores import (
    KeptScores,
    compress,
    kept_from_top_logprobs,
    kept_result,
    label_token_ids,
)
from semsoft_plugin.core.labels import LabelSet
from semsoft_plugin.core.softmax import SemanticSoftmaxResult
from semsoft_plugin.engines.prompting import PromptTemplate
from semsoft_plugin.fit.probe import probe_refused

__all__ = ["PROBE_ADVICE", "Scorer"]

PROBE_ADVICE = "leave 'probe' out of fit_family, or use backend='transformers'"


@dataclass(frozen=True)
class Scorer:
    """A classifier's parameters for one label list, checked and loaded.

    Attributes
    ----------
    loaded : Loaded
        The model, its tokenizer and its engine.
    labels : LabelSet
        The labels, in prompt order.
    prompt : PromptTemplate
        The prompt.
    config : SemsoftConfig
        The settings the parameters name (before any fit).
    fitter : TextFitter
        The prompts for texts within the length bound.
    batch_size : int
        Texts per forward pass (transformers).
    progress : bool | None
        Show the adapter's progress bar.
    exact_head : bool
        Transformers: the decision step's logits from a float32 head.
    """

    loaded: Loaded
    labels: LabelSet
    prompt: PromptTemplate
    config: SemsoftConfig
    fitter: TextFitter
    batch_size: int
    progress: bool | None
    exact_head: bool

    def engine(self) -> tuple[Hashable, ...]:
        """The engine settings a pass depends on: the engine, the weights' dtype and the
        head's (a vLLM engine is its own object, in the key by identity)."""
        if self.loaded.backend == "vllm":
            return ("vllm",)
        weights = next(iter(self.loaded.model.parameters()), None)
        dtype = str(weights.dtype) if weights is not None else "none"
        return ("transformers", dtype, bool(self.exact_head))

    def kept(
        self, inputs: list[Any], store_k: int, *, hidden: bool = False
    ) -> tuple[KeptScores, Tensor | None]:
        """The decision step's top `store_k` raw scores and every label token's for
        `inputs` (prompts from `fitter`), each distinct input run once and only if
        `semsoft_plugin.app.pass_cache.PASSES` lacks it; with `hidden` also the
        `[N, H]` hidden states there (float32; on vLLM read back from the logits row,
        refused by name with its residual where the row is not `W h + b`)."""
        token_ids = label_token_ids(self.labels)
        base = pass_key(
            self.loaded.model, self.loaded.tokenizer, self.engine(), tuple(token_ids), store_k,
            self.loaded.state(),
        )  # fmt: skip
        keys = [(*base, json.dumps(item, sort_keys=True, ensure_ascii=False)) for item in inputs]
        found: dict[Hashable, KeptPass] = {}
        todo: dict[Hashable, Any] = {}
        for key, item in zip(keys, inputs, strict=True):
            if key in found or key in todo:
                continue
            got = PASSES.get(key, hidden=hidden)
            if got is None:
                todo[key] = item
            else:
                found[key] = got
        if todo:
            # transformers: the hidden state is kept with every pass (a few KB), so a later
            # fit with the probe reads it back instead of running the text again
            keep_hidden = hidden or self.loaded.backend != "vllm"
            run = self._run(list(todo.values()), store_k, token_ids, hidden=keep_hidden)
            for todo_key, kept in zip(todo, run, strict=True):
                PASSES.put(todo_key, kept)
                found[todo_key] = kept
        rows = [found[key] for key in keys]
        width = len(token_ids)
        kept_scores = KeptScores(
            torch.stack([r.top_ids for r in rows])
            if rows
            else torch.zeros((0, store_k), dtype=torch.long),
            torch.stack([r.top_logits for r in rows]) if rows else torch.zeros((0, store_k)),
            torch.tensor(token_ids),
            torch.stack([r.label_logits for r in rows]) if rows else torch.zeros((0, width)),
        )
        states = (
            torch.stack([r.hidden for r in rows if r.hidden is not None])
            if hidden and rows
            else None
        )
        return kept_scores, states

    def results(
        self, inputs: list[Any], config: SemsoftConfig, *, hidden: bool = False
    ) -> tuple[SemanticSoftmaxResult, Tensor | None]:
        """Semantic Softmax under `config` of each input's kept pass (label columns in
        [`labels`][semsoft_plugin.core.labels] order), and with `hidden` the hidden states."""
        kept, states = self.kept(inputs, config.k, hidden=hidden)
        return kept_result(kept, self.loaded.embeddings(), self.labels, config), states

    def _run(
        self, inputs: list[Any], store_k: int, token_ids: list[int], *, hidden: bool
    ) -> list[KeptPass]:
        """One observe-mode decision step per input on this scorer's engine."""
        model, tokenizer = self.loaded.model, self.loaded.tokenizer
        if self.loaded.backend == "vllm":
            from semsoft_plugin.engines.vllm import classify_vllm
            from semsoft_plugin.engines.vllm.reader_tables import HiddenNotRead

            try:
                results = classify_vllm(
                    model, inputs, list(self.labels.names), self.config, mode="observe",
                    max_tokens=1, progress=bool(self.progress), keep_logprobs=store_k,
                    token_ids=token_ids, hidden=hidden,
                )  # fmt: skip
            except HiddenNotRead as error:
                raise probe_refused(f"{error}: {PROBE_ADVICE}") from None
            kept = kept_from_top_logprobs(results, token_ids)
            states = None
            if hidden:
                states = torch.stack([r.hidden for r in results if r.hidden is not None])
        else:
            from semsoft_plugin.engines.hf import classify
            from semsoft_plugin.engines.hf_hidden import HiddenAtDecision

            with HiddenAtDecision(model if hidden else None) as hook:
                classified = classify(
                    model, tokenizer, inputs, self.labels, config=self.config,
                    mode="observe", max_tokens=1, batch_size=self.batch_size,
                    progress=self.progress, exact_head=self.exact_head, keep_logits=True,
                )  # fmt: skip
            rows = torch.stack([c.logits for c in classified if c.logits is not None])
            top_ids, top_logits, label_logits = compress(rows, store_k, torch.tensor(token_ids))
            kept = KeptScores(top_ids, top_logits, torch.tensor(token_ids), label_logits)
            states = hook.rows(tokenizer, inputs, self.batch_size) if hidden else None
        return [
            KeptPass(
                kept.top_ids[i].clone(),
                kept.top_logits[i].clone(),
                kept.label_logits[i].clone(),
                None if states is None else states[i].clone(),
            )
            for i in range(len(inputs))
        ]
