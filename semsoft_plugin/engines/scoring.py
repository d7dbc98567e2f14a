"""Scores from the decision step's top-k log-probabilities, for any engine's output.

Engine-neutral, and shared by the readers and the vLLM processor: a `ModelScorer`
holds a model's tokenizer, its output embeddings (read once from the checkpoint with
safetensors) and its resolved label sets (`client_model` keeps one per checkpoint);
the vLLM processor uses the same object inside the engine. `scores_from_top_k`
turns the decision step's top-k raw log-probabilities into exact scores or refuses them
(`MissingLabelLogprobs`); `decision_step` finds that step among the
generated tokens. The readers' entry point, with the checks against the emitted text, is
`semsoft_plugin.engines.reader_contract.read_scores` (`docs/reader-contract.md`).
No vLLM import (a `vllm.LLM` is recognised by its `llm_engine` attribute), so a
reader of an OpenAI-compatible server needs no vLLM.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from semsoft_plugin.core.embeddings import from_checkpoint
from semsoft_plugin.core.labels import LabelSet
from semsoft_plugin.core.request import SemsoftRequest
from semsoft_plugin.core.result import LabelResult
from semsoft_plugin.core.softmax import SemanticSoftmax
from semsoft_plugin.core.tokens import OutputEmbeddings

# Distinct label sets (with their settings) kept resolved per model, and the bound of
# every other per-request cache of the plugin.
CACHE_SIZE = 128


@dataclass(frozen=True)
class LabelScorer:
    """A label set bound to one model: its tokens and its scorer."""

    labels: LabelSet
    scorer: SemanticSoftmax
    answer_ids: Tensor  # [L] on the embeddings' device
    answer_to_label: dict[int, int]


class ModelScorer:
    """Tokenizer, output embeddings and resolved label sets of one model.

    Embeddings are read once from the checkpoint (safetensors; tied embeddings and
    padded vocabularies are handled by `semsoft_plugin.core.embeddings.from_checkpoint`)
    and shared by every request and label set. Label sets are cached per distinct
    (labels, leading space, settings), least recently used first out.
    """

    def __init__(
        self,
        checkpoint: str | Path,
        tokenizer: Any,
        *,
        vocab_size: int | None = None,
        device: str | torch.device = "cpu",
    ) -> None:
        self.checkpoint = str(checkpoint)
        self.tokenizer = tokenizer
        self.embeddings: OutputEmbeddings = from_checkpoint(
            _local_checkpoint(checkpoint), vocab_size=vocab_size, device=device
        )
        self._cache: OrderedDict[tuple[Any, ...], LabelScorer] = OrderedDict()
        self._lock = threading.Lock()
        self._text_to_id: dict[str, int] | None = None

    def scoring(self, request: SemsoftRequest) -> LabelScorer:
        """The resolved label set; `ValueError` if the tokenizer cannot tell labels apart."""
        with self._lock:
            found = self._cache.get(request.key)
            if found is not None:
                self._cache.move_to_end(request.key)
                return found
        label_set = LabelSet(
            list(request.labels), self.tokenizer, leading_space=request.leading_space
        )
        scorer = SemanticSoftmax(self.embeddings, label_set, request.config)
        device = self.embeddings.weight.device
        scoring = LabelScorer(
            label_set,
            scorer,
            torch.tensor(label_set.answer_token_ids, device=device),
            {t: i for i, t in enumerate(label_set.answer_token_ids)},
        )
        with self._lock:
            self._cache[request.key] = scoring
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return scoring

    def token_id(self, text: str) -> int | None:
        """The token whose decoded text is `text` (None if none or ambiguous)."""
        if self._text_to_id is None:
            table: dict[str, int] = {}
            ambiguous: set[str] = set()
            for token_id in range(len(self.tokenizer)):
                piece = self.tokenizer.decode([token_id])
                if piece in table:
                    ambiguous.add(piece)
                table.setdefault(piece, token_id)
            self._text_to_id = {k: v for k, v in table.items() if k not in ambiguous}
        return self._text_to_id.get(text)


def _local_checkpoint(checkpoint: str | Path) -> Path:
    path = Path(checkpoint).expanduser()
    if path.is_dir():
        return path
    try:  # a hub name: vLLM has already downloaded the files
        from huggingface_hub import snapshot_download

        return Path(
            snapshot_download(
                str(checkpoint), allow_patterns=["*.json", "*.safetensors"], local_files_only=True
            )
        )
    except Exception as error:
        raise ValueError(
            f"cannot find a local safetensors checkpoint for {checkpoint!r}: {error}"
        ) from None


_MODELS: dict[str, ModelScorer] = {}
_MODELS_LOCK = threading.Lock()


def client_model(model: Any, *, allow_download: bool = False) -> ModelScorer:
    """A cached `ModelScorer` for an `LLM`, a checkpoint path or a known model name.

    A name that is not on this machine yet (a known name not cached, a hub name not in
    the hub cache) is a `ValueError` unless `allow_download`: a reader must not
    start a download as a side effect of reading scores. A known name reads
    `semsoft_plugin.engines.models.resolve_reader`'s directory: the tokenizer
    and output embeddings only, not the full checkpoint.
    """
    if isinstance(model, ModelScorer):
        return model
    tokenizer = None
    engine = getattr(model, "llm_engine", None)
    if engine is not None:  # a vllm.LLM
        checkpoint = str(engine.model_config.model)
        tokenizer = model.get_tokenizer()
    elif isinstance(model, str | Path):
        from semsoft_plugin.engines import models

        if str(model) in models.KNOWN_MODELS:  # the tokenizer and output embeddings only
            checkpoint = str(models.resolve_reader(str(model), allow_download=allow_download))
        else:
            checkpoint = str(models.resolve(str(model), allow_download=allow_download))
    else:
        raise ValueError(
            f"model must be a vllm.LLM, a checkpoint directory or a model name, got "
            f"{type(model).__name__}"
        )
    with _MODELS_LOCK:
        found = _MODELS.get(checkpoint)
        if found is None:
            if tokenizer is None:
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(checkpoint)
            found = _MODELS[checkpoint] = ModelScorer(checkpoint, tokenizer)
        return found


def output_embeddings(model: Any, *, allow_download: bool = False) -> OutputEmbeddings:
    """The output embeddings the scores use for an `LLM`, checkpoint or model name.

    Read once per checkpoint with safetensors and shared with every reader and
    processor in this process (the matrix the transformers adapter takes from
    `lm_head`). A model name not on this machine is refused unless
    `allow_download=True`.
    """
    return client_model(model, allow_download=allow_download).embeddings


def trigger_position(tokenizer: Any, generated: Sequence[int], trigger: str, start: int) -> int:
    """First `j >= max(start, 1)` where the generated text `generated[:j]` ends with
    `trigger` (checked on a tail window of tokens), or -1."""
    window = len(trigger) + 2
    for j in range(max(start, 1), len(generated) + 1):
        if tokenizer.decode(list(generated[max(0, j - window) : j])).endswith(trigger):
            return j
    return -1


class ReaderError(ValueError):
    """A reader refuses to return scores it cannot stand behind (a `ValueError`, so a
    server answers it with HTTP 400 and a batch names the item)."""


class MissingLabelLogprobs(ReaderError):
    """Answer tokens the scores need are outside what the engine returned.

    Attributes
    ----------
    labels : Sequence[str]
        The labels whose answer token's log-probability is unknown
    token_ids : Sequence[int]
        Those answer tokens
    cause : str
        Why they are needed and what would fetch them
    """

    def __init__(self, labels: Sequence[str], token_ids: Sequence[int], cause: str) -> None:
        if not labels:  # a refusal names what it concerns
            raise TypeError("MissingLabelLogprobs must name the labels it concerns")
        self.labels = tuple(labels)
        self.token_ids = tuple(int(t) for t in token_ids)
        self.cause = cause
        super().__init__(
            f"cannot give exact scores: the answer token(s) of label(s) {list(self.labels)} "
            f"are outside the returned top-k log-probabilities and {cause}"
        )


class FetchUnavailable(ReaderError):
    """A `Fetch` cannot ask for the tokens at all (the message says why, e.g. the
    response lacks its prompt ids); the reader turns it into `MissingLabelLogprobs`
    naming the labels whose answer tokens were asked for."""


# What a reader can ask for the decision step's answer tokens outside the top-k: token ids
# -> raw log-probs (e.g. a follow-up request's); may raise FetchUnavailable.
Fetch = Callable[[list[int]], Mapping[int, float]]


def _needed(request: SemsoftRequest, fallback: bool) -> bool:
    """Whether every answer token's exact log-prob is read: the pool with the
    constrained softmax (`semantic_weight < 1`, or a per-row weight: `silent_vote`)
    and the 0/0 fallback read them all; otherwise the top-k is all there is to read."""
    config = request.config
    return config.semantic_weight != 1.0 or config.silent_vote is not None or fallback


def scores_from_top_k(
    model: ModelScorer,
    request: SemsoftRequest,
    top: Mapping[int, float],
    extra: Mapping[int, float],
    emitted: Sequence[int],
    decision_step: int,
    *,
    fetch: Fetch | None = None,
) -> LabelResult:
    """Scores from the decision step's top-k raw log-probabilities `top` (token ->
    log-prob) and any other known raw log-probabilities `extra` (the sampled token's,
    a follow-up's). Needed answer tokens missing from both are asked of `fetch`, and
    `MissingLabelLogprobs` is raised if they stay unknown (see
    `semsoft_plugin.engines.reader_contract.read_scores`)."""
    scoring = model.scoring(request)
    names = scoring.labels.names
    k = request.config.k
    if any(math.isnan(v) or v == math.inf for v in (*top.values(), *extra.values())):
        raise ValueError(
            "the decision step's log-probabilities hold NaN or +inf: the model's logits "
            "for this request were not finite, so it cannot be scored (the engine left "
            "its row as it was)"
        )
    if len(top) < min(k, model.embeddings.vocab_size):
        raise ValueError(
            f"the decision step returned {len(top)} log-probabilities, fewer than k={k}: "
            f"request logprobs >= {k} (engine max_logprobs >= {k})"
        )
    known = {**extra, **top}
    answer_ids = scoring.labels.answer_token_ids
    missing = [t for t in dict.fromkeys(answer_ids) if t not in known]
    if missing and _needed(request, fallback=False) and fetch is not None:
        known.update(_fetched(fetch, missing, scoring))
        missing = [t for t in missing if t not in known]
    # Answer tokens outside the top-k whose log-probs are known go in too: they rank
    # below every kept token, so the top-k is unchanged, and the pool with the
    # constrained softmax reads them exactly.
    beyond = [t for t in dict.fromkeys(answer_ids) if t not in top and t in known]
    ids = torch.tensor([*top.keys(), *beyond], dtype=torch.long)
    values = torch.tensor([*top.values(), *(known[t] for t in beyond)], dtype=torch.float32)
    if bool((ids >= model.embeddings.vocab_size).any()):
        raise ValueError("a returned token id lies outside the model's vocabulary")
    # Ratios of top-k probabilities: exactly the full-vocabulary result (core.py).
    result = scoring.scorer.score_top_k(ids, values)
    fallback = bool(result.fallback)
    if missing and _needed(request, fallback) and fetch is not None and fallback:
        known.update(_fetched(fetch, missing, scoring))  # the 0/0 case needs them after all
        return scores_from_top_k(model, request, top, known, emitted, decision_step)
    if missing and _needed(request, fallback):
        wanted = set(missing)
        raise MissingLabelLogprobs(
            [n for n, t in zip(names, answer_ids, strict=True) if t in wanted],
            missing,
            (
                "no follow-up could fetch them (pass the engine or a client to the reader, or "
                "raise logprobs)"
                if fetch is None
                else "the follow-up request did not return them"
            )
            + (
                ": no top-k token voted for any label, so the constrained softmax is the answer"
                if fallback
                else f": the default pools with the constrained softmax (semantic_weight="
                f"{request.config.semantic_weight}), which reads every label's exact log-prob"
            ),
        )
    constrained = None
    if all(t in known for t in answer_ids):
        label_logp = torch.tensor([known[t] for t in answer_ids], dtype=torch.float32)
        constrained = torch.softmax(label_logp, dim=-1)
    semantic: Tensor | None = constrained if fallback else result.probs
    probs = None if semantic is None else dict(zip(names, semantic.tolist(), strict=True))
    label = None
    if request.mode == "constrain" and len(emitted) > decision_step:
        index = scoring.answer_to_label.get(int(emitted[decision_step]))
        label = names[index] if index is not None else None
    if label is None and semantic is not None:
        label = names[int(semantic.argmax())]
    return LabelResult(
        label=label,
        probs=probs,
        constrained_probs=(
            None if constrained is None else dict(zip(names, constrained.tolist(), strict=True))
        ),
        fallback=fallback,
        coverage=float(result.coverage),
        top_k_mass=float(values[: len(top)].exp().sum()),
        decision_step=decision_step,
    )


def _fetched(fetch: Fetch, token_ids: list[int], scoring: LabelScorer) -> dict[int, float]:
    try:
        found = {int(t): float(v) for t, v in fetch(list(token_ids)).items()}
    except FetchUnavailable as error:
        wanted = set(token_ids)
        names = [
            n
            for n, t in zip(scoring.labels.names, scoring.labels.answer_token_ids, strict=True)
            if t in wanted
        ]
        raise MissingLabelLogprobs(names, token_ids, str(error)) from None
    bad = [t for t, v in found.items() if math.isnan(v) or v == math.inf]
    if bad:
        raise ValueError(f"the follow-up returned NaN/+inf log-probs for token(s) {bad[:5]}")
    return found


def decision_step(model: ModelScorer, request: SemsoftRequest, generated: Sequence[int]) -> int:
    """Index of the decision step among the generated tokens; `ValueError` when the
    output carries none (nothing generated, or the trigger never written)."""
    if request.trigger is None:
        if not generated:
            raise ValueError(
                "the output carries no decision step: it holds no generated token with "
                "log-probabilities (max_tokens=0, or the request was cut before its first token)"
            )
        return 0
    found = trigger_position(model.tokenizer, generated, request.trigger, 1)
    if found < 0 or found >= len(generated):
        raise ValueError(
            f"the output carries no decision step: the trigger {request.trigger!r} "
            f"{'never appears in' if found < 0 else 'ends'} the {len(generated)} generated "
            "token(s) (raise max_tokens)"
        )
    return found
