"""Scores from the decision step's top-k log-probabilities, for any engine's output.

Engine-neutral: the vLLM reader and the OpenAI reader both turn what they read into
``{token id: raw log-prob}`` of the decision step and call :func:`_score_top_k` here.
A :class:`_Model` holds a model's tokenizer, its output embeddings (read once from the
checkpoint with safetensors) and its resolved label sets; the vLLM processor uses the
same object inside the engine. No vLLM import (a ``vllm.LLM`` is recognised by its
``llm_engine`` attribute), so a reader of an OpenAI-compatible server needs no vLLM.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from semsoft_plugin.core import OutputEmbeddings, SemanticSoftmax
from semsoft_plugin.embeddings import from_checkpoint
from semsoft_plugin.labels import LabelSet
from semsoft_plugin.request import SemsoftRequest
from semsoft_plugin.result import LabelResult

# Distinct label sets (with their settings) kept resolved per model, and the bound of
# every other per-request cache of the plugin.
_CACHE_SIZE = 128


@dataclass(frozen=True)
class _Scoring:
    """A label set bound to one model: its tokens and its scorer."""

    labels: LabelSet
    scorer: SemanticSoftmax
    answer_ids: Tensor  # [L] on the embeddings' device
    answer_to_label: dict[int, int]


class _Model:
    """Tokenizer, output embeddings and resolved label sets of one model.

    Embeddings are read once from the checkpoint (safetensors; tied embeddings and
    padded vocabularies are handled by :func:`~semsoft_plugin.embeddings.from_checkpoint`)
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
        self._cache: OrderedDict[tuple[Any, ...], _Scoring] = OrderedDict()
        self._lock = threading.Lock()
        self._text_to_id: dict[str, int] | None = None

    def scoring(self, request: SemsoftRequest) -> _Scoring:
        """The resolved label set; ``ValueError`` if the tokenizer cannot tell labels apart."""
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
        scoring = _Scoring(
            label_set,
            scorer,
            torch.tensor(label_set.answer_token_ids, device=device),
            {t: i for i, t in enumerate(label_set.answer_token_ids)},
        )
        with self._lock:
            self._cache[request.key] = scoring
            while len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        return scoring

    def token_id(self, text: str) -> int | None:
        """The token whose decoded text is ``text`` (None if none or ambiguous)."""
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


_MODELS: dict[str, _Model] = {}
_MODELS_LOCK = threading.Lock()


def _client_model(model: Any, *, allow_download: bool = False) -> _Model:
    """A cached :class:`_Model` for an ``LLM``, a checkpoint path or a known model name.

    A name that is not on this machine yet (a known name not cached, a hub name not in
    the hub cache) is a ``ValueError`` unless ``allow_download``: a reader must not
    start a download as a side effect of reading scores.
    """
    if isinstance(model, _Model):
        return model
    tokenizer = None
    engine = getattr(model, "llm_engine", None)
    if engine is not None:  # a vllm.LLM
        checkpoint = str(engine.model_config.model)
        tokenizer = model.get_tokenizer()
    elif isinstance(model, str | Path):
        from semsoft_plugin import models

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
            found = _MODELS[checkpoint] = _Model(checkpoint, tokenizer)
        return found


def output_embeddings(model: Any, *, allow_download: bool = False) -> OutputEmbeddings:
    """The output embeddings the scores use for an ``LLM``, checkpoint or model name.

    Read once per checkpoint with safetensors and shared with every reader and
    processor in this process (the matrix the transformers adapter takes from
    ``lm_head``). A model name not on this machine is refused unless
    ``allow_download=True``.
    """
    return _client_model(model, allow_download=allow_download).embeddings


def _trigger_position(tokenizer: Any, generated: Sequence[int], trigger: str, start: int) -> int:
    """First ``j >= max(start, 1)`` where the generated text ``generated[:j]`` ends with
    ``trigger`` (checked on a tail window of tokens), or -1."""
    window = len(trigger) + 2
    for j in range(max(start, 1), len(generated) + 1):
        if tokenizer.decode(list(generated[max(0, j - window) : j])).endswith(trigger):
            return j
    return -1


# The readers' result (an alias of the one result type, kept for one release).
LabelScores = LabelResult


def _score_top_k(
    model: _Model,
    request: SemsoftRequest,
    top: Mapping[int, float],
    extra: Mapping[int, float],
    emitted: Sequence[int],
    decision_step: int,
) -> LabelResult:
    """Scores from the decision step's top-k raw log-probabilities ``top`` (token ->
    log-prob) and any other known raw log-probabilities ``extra`` (e.g. the sampled
    token's)."""
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
    # Answer tokens outside the top-k whose log-probs are known (the sampled token, a
    # follow-up) go in too: they rank below every kept token, so the top-k is unchanged,
    # and the default's pool with the constrained softmax reads them exactly.
    beyond = [t for t in dict.fromkeys(answer_ids) if t not in top and t in known]
    ids = torch.tensor([*top.keys(), *beyond], dtype=torch.long)
    values = torch.tensor([*top.values(), *(known[t] for t in beyond)], dtype=torch.float32)
    if bool((ids >= model.embeddings.vocab_size).any()):
        raise ValueError("a returned token id lies outside the model's vocabulary")
    # Ratios of top-k probabilities: exactly the full-vocabulary result (core.py).
    result = scoring.scorer.score_top_k(ids, values)
    constrained = None
    if all(t in known for t in answer_ids):
        label_logp = torch.tensor([known[t] for t in answer_ids], dtype=torch.float32)
        constrained = torch.softmax(label_logp, dim=-1)
    fallback = bool(result.fallback)
    semantic: Tensor | None = constrained if fallback else result.semantic
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


def _decision_step(model: _Model, request: SemsoftRequest, generated: Sequence[int]) -> int:
    """Index of the decision step among the generated tokens; ``ValueError`` when the
    output carries none (nothing generated, or the trigger never written)."""
    if request.trigger is None:
        if not generated:
            raise ValueError(
                "the output carries no decision step: it holds no generated token with "
                "log-probabilities (max_tokens=0, or the request was cut before its first token)"
            )
        return 0
    found = _trigger_position(model.tokenizer, generated, request.trigger, 1)
    if found < 0 or found >= len(generated):
        raise ValueError(
            f"the output carries no decision step: the trigger {request.trigger!r} "
            f"{'never appears in' if found < 0 else 'ends'} the {len(generated)} generated "
            "token(s) (raise max_tokens)"
        )
    return found
