"""Scores from the decision step's top-k log-probabilities, for any engine's output.

Engine-neutral: every reader (vLLM offline, ``classify_vllm``, the OpenAI client, a Ray
postprocess) hands the decision step's ``{token: raw log-prob}`` to :func:`read_scores`
here, the reader contract (``docs/reader-contract.md``): exact scores or a named
refusal (:class:`MissingLabelLogprobs`, :class:`EmittedLabelMismatch`, :class:`CutLabel`).
A :class:`ModelScorer` holds a model's tokenizer, its output embeddings (read once from the
checkpoint with safetensors) and its resolved label sets; the vLLM processor uses the
same object inside the engine. No vLLM import (a ``vllm.LLM`` is recognised by its
``llm_engine`` attribute), so a reader of an OpenAI-compatible server needs no vLLM.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from semsoft_plugin.core.config import SemsoftConfig
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
    padded vocabularies are handled by :func:`~semsoft_plugin.core.embeddings.from_checkpoint`)
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


_MODELS: dict[str, ModelScorer] = {}
_MODELS_LOCK = threading.Lock()


def client_model(model: Any, *, allow_download: bool = False) -> ModelScorer:
    """A cached :class:`ModelScorer` for an ``LLM``, a checkpoint path or a known model name.

    A name that is not on this machine yet (a known name not cached, a hub name not in
    the hub cache) is a ``ValueError`` unless ``allow_download``: a reader must not
    start a download as a side effect of reading scores.
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
    """The output embeddings the scores use for an ``LLM``, checkpoint or model name.

    Read once per checkpoint with safetensors and shared with every reader and
    processor in this process (the matrix the transformers adapter takes from
    ``lm_head``). A model name not on this machine is refused unless
    ``allow_download=True``.
    """
    return client_model(model, allow_download=allow_download).embeddings


def trigger_position(tokenizer: Any, generated: Sequence[int], trigger: str, start: int) -> int:
    """First ``j >= max(start, 1)`` where the generated text ``generated[:j]`` ends with
    ``trigger`` (checked on a tail window of tokens), or -1."""
    window = len(trigger) + 2
    for j in range(max(start, 1), len(generated) + 1):
        if tokenizer.decode(list(generated[max(0, j - window) : j])).endswith(trigger):
            return j
    return -1


# Probabilities closer than this are a tie at the float precision an engine and a reader
# share: a greedy constrained pick and the reader's argmax may fall either way of it.
ARGMAX_TIE = 1e-4


class ReaderError(ValueError):
    """A reader refuses to return scores it cannot stand behind (a ``ValueError``, so a
    server answers it with HTTP 400 and a batch names the item)."""


class MissingLabelLogprobs(ReaderError):
    """Answer tokens the scores need are outside what the engine returned.

    Attributes
    ----------
    labels : the labels whose answer token's log-probability is unknown
    token_ids : those answer tokens
    cause : why they are needed and what would fetch them
    """

    def __init__(self, labels: Sequence[str], token_ids: Sequence[int], cause: str) -> None:
        self.labels = tuple(labels)
        self.token_ids = tuple(int(t) for t in token_ids)
        self.cause = cause
        super().__init__(
            f"cannot give exact scores: the answer token(s) of label(s) {list(self.labels)} "
            f"are outside the returned top-k log-probabilities and {cause}"
        )


class EmittedLabelMismatch(ReaderError):
    """In constrain mode the engine emitted one label and the scores' argmax is another."""

    def __init__(self, emitted: str, argmax: str, probs: Mapping[str, float]) -> None:
        self.emitted, self.argmax, self.probs = emitted, argmax, dict(probs)
        super().__init__(
            f"the engine emitted the label {emitted!r} (p={probs[emitted]:.4f}) but the "
            f"scores' argmax is {argmax!r} (p={probs[argmax]:.4f}): the scores disagree with "
            "the greedy constrained pick, so neither is returned"
        )


class CutLabel(ReaderError):
    """The emitted text is only the start of a label: a stop string, ``stop_token_ids``
    or ``max_tokens`` cut it."""

    def __init__(self, label: str, text: str) -> None:
        self.label, self.text = label, text
        super().__init__(
            f"the text was cut: the engine emitted {text!r}, the start of the label "
            f"{label!r} (a stop string, stop_token_ids or max_tokens ended it early)"
        )


# What a reader can be told about the decision step's log-probabilities: token id ->
# raw log-prob; keys may be vLLM's ``"token_id:N"`` strings or token texts.
Logprobs = Mapping[Any, float]
Fetch = Callable[[list[int]], Mapping[int, float]]


def read_scores(
    labels: SemsoftRequest | Sequence[str],
    top_logprobs: Logprobs | Sequence[Logprobs | None],
    emitted: str | None = None,
    config: SemsoftConfig | None = None,
    *,
    model: Any,
    emitted_ids: Sequence[int] | None = None,
    known: Logprobs | None = None,
    fetch: Fetch | None = None,
    greedy: bool = True,
    constrained: bool = True,
    allow_download: bool = False,
) -> LabelResult:
    """Scores of one output from its returned log-probabilities: the reader contract.

    Every reader (vLLM offline, the OpenAI-compatible client, ``classify_vllm``, a Ray
    postprocess) ends here, so the rules hold everywhere:

    1. **Exact or nothing.** The scores are computed from the decision step's top-k raw
       log-probabilities plus every answer token's exact log-probability the settings
       read (all of them unless ``semantic_weight=1``; all of them in the 0/0 fallback).
       A needed answer token missing from ``top_logprobs`` and ``known`` is asked of
       ``fetch``; if there is no ``fetch`` (or it does not return it) the reader raises
       :class:`MissingLabelLogprobs` naming the labels. No bound stands in for a
       missing log-probability.
    2. **The emitted label agrees.** In constrain mode, when the engine applied the
       constraint (``constrained``) and picked greedily (``greedy``), the result's label
       is the emitted label and is the argmax of ``probs`` (ties within
       :data:`ARGMAX_TIE`); otherwise :class:`EmittedLabelMismatch` names both.
    3. **Cut text is said.** An emitted text that is only the start of a label raises
       :class:`CutLabel`.

    Parameters
    ----------
    labels : the label names (with ``config``), or the parsed request
    top_logprobs : the decision step's ``{token: raw log-prob}`` (its ``k`` highest are
        the top-k; any further entries, e.g. the sampled token an OpenAI server adds,
        count as known log-probs), or the per-position list of such dicts of the
        generated tokens (the decision step is found from ``emitted_ids``: 0 without a
        trigger). Keys: token ids, ``"token_id:N"`` strings, or token texts
    emitted : the generated text, when known (checked for a cut label)
    config : method settings when ``labels`` is a list
    model : a ``vllm.LLM``, a checkpoint directory or a model name (tokenizer and
        output embeddings)
    emitted_ids : the generated token ids (the decision step's one names the emitted
        label; with a trigger they locate the decision step)
    known : other exact raw log-probs of the decision step (e.g. a follow-up's)
    fetch : ``fetch(token_ids) -> {token id: raw log-prob}`` at the decision step, for
        needed answer tokens outside the top-k (e.g. :func:`semsoft_plugin.engines.openai.openai_fetch`)
    greedy : the engine picked the argmax (temperature 0); a sampled pick may be any label
    constrained : the plugin constrained the generation (False: a server without it)
    """
    client = client_model(model, allow_download=allow_download)
    if isinstance(labels, SemsoftRequest):
        request = labels
    else:
        from semsoft_plugin.core.request import build_request

        request = build_request(list(labels), config=config)
    generated = [int(t) for t in emitted_ids] if emitted_ids is not None else []
    if isinstance(top_logprobs, Mapping):
        step = 0 if request.trigger is None else decision_step(client, request, generated)
        step_logprobs: Logprobs = top_logprobs
    else:
        positions = list(top_logprobs)
        if request.trigger is None:
            step = 0
        elif not generated:
            raise ValueError(
                f"the decision step follows the trigger {request.trigger!r}: give "
                "emitted_ids (the generated token ids) to locate it"
            )
        else:
            step = decision_step(client, request, generated)
        if step >= len(positions) or positions[step] is None:
            raise ValueError(
                f"the output carries no log-probabilities at its decision step {step} "
                f"({len(positions)} position(s) returned)"
            )
        step_logprobs = positions[step]  # type: ignore[assignment]
    ids = {_token_key(client, t): float(v) for t, v in step_logprobs.items()}
    k = min(request.config.k, client.embeddings.vocab_size)
    ranked = sorted(ids, key=ids.__getitem__, reverse=True)
    top = {t: ids[t] for t in ranked[:k]}
    extra = {t: ids[t] for t in ranked[k:]}
    extra.update({_token_key(client, t): float(v) for t, v in (known or {}).items()})
    result = scores_from_top_k(client, request, top, extra, generated, step, fetch=fetch)
    return _check_emitted(
        client, request, result, emitted, generated, step, greedy=greedy, constrained=constrained
    )


def _token_key(model: ModelScorer, token: Any) -> int:
    """A token id from an int, a ``"token_id:N"`` string or a token's text."""
    if isinstance(token, int) and not isinstance(token, bool):
        return token
    if isinstance(token, str):
        if token.startswith("token_id:"):
            return int(token[len("token_id:") :])
        found = model.token_id(token)
        if found is not None:
            return found
        raise ValueError(
            f"token {token!r} maps to no unique token id: ask the server for "
            "return_tokens_as_token_ids (vLLM)"
        )
    raise ValueError(f"a log-prob key must be a token id or a token string, got {token!r}")


def _needed(request: SemsoftRequest, fallback: bool) -> bool:
    """Whether every answer token's exact log-prob is read: the pool with the
    constrained softmax (``semantic_weight < 1``) and the 0/0 fallback read them all;
    otherwise the top-k is all there is to read."""
    return request.config.semantic_weight != 1.0 or fallback


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
    """Scores from the decision step's top-k raw log-probabilities ``top`` (token ->
    log-prob) and any other known raw log-probabilities ``extra`` (the sampled token's,
    a follow-up's). Needed answer tokens missing from both are asked of ``fetch``, and
    :class:`MissingLabelLogprobs` is raised if they stay unknown (see :func:`read_scores`)."""
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
        known.update(_fetched(fetch, missing))
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
        known.update(_fetched(fetch, missing))  # the 0/0 case needs them after all
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


def _fetched(fetch: Fetch, token_ids: list[int]) -> dict[int, float]:
    found = {int(t): float(v) for t, v in fetch(list(token_ids)).items()}
    bad = [t for t, v in found.items() if math.isnan(v) or v == math.inf]
    if bad:
        raise ValueError(f"the follow-up returned NaN/+inf log-probs for token(s) {bad[:5]}")
    return found


def _check_emitted(
    model: ModelScorer,
    request: SemsoftRequest,
    result: LabelResult,
    text: str | None,
    generated: Sequence[int],
    step: int,
    *,
    greedy: bool,
    constrained: bool,
) -> LabelResult:
    """Rules 2 and 3 of :func:`read_scores`: the constrained pick is the argmax, and a
    label the text only starts is refused as cut."""
    if request.mode != "constrain" or not constrained:
        return result
    scoring = model.scoring(request)
    names = scoring.labels.names
    emitted = None
    if len(generated) > step:
        index = scoring.answer_to_label.get(int(generated[step]))
        emitted = None if index is None else names[index]
    if text is not None:
        answer = text
        if request.trigger is not None and request.trigger in answer:
            answer = answer.split(request.trigger, 1)[1]
        answer = answer.strip()
        spelled = [n for n in names if n.strip() == answer]
        started = [n for n in names if n.strip().startswith(answer)]
        if not spelled and started and (emitted is None or emitted in started):
            raise CutLabel(emitted or started[0], text)
        if emitted is None and spelled:
            emitted = spelled[0]
    if emitted is None or result.probs is None:
        return result
    if emitted != result.label:
        result = dataclasses.replace(result, label=emitted)
    probs = result.probs
    assert probs is not None  # checked above
    best = max(probs, key=probs.__getitem__)
    if greedy and probs[emitted] < probs[best] - ARGMAX_TIE:
        raise EmittedLabelMismatch(emitted, best, probs)
    return result


def decision_step(model: ModelScorer, request: SemsoftRequest, generated: Sequence[int]) -> int:
    """Index of the decision step among the generated tokens; ``ValueError`` when the
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
