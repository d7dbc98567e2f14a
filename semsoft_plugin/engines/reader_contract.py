"""The reader contract: one entry point, `read_scores`, for every engine's output.

Every reader (vLLM offline, `classify_vllm`, the OpenAI client, a Ray postprocess)
hands the decision step's `{token: raw log-prob}` to `read_scores`
(`docs/reader-contract.md`) and gets exact scores or a named refusal. What is here is
the reading: token keys to ids, the decision step among the generated tokens, and the
checks against the emitted text (`EmittedLabelMismatch`, `CutLabel`). The
scores themselves, and the refusal of missing label log-probs
(`semsoft_plugin.engines.scoring.MissingLabelLogprobs`), come from
`semsoft_plugin.engines.scoring.scores_from_top_k`, which readers that hold the
top-k already (the Ray postprocess) call directly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from semsoft_plugin.core.config import SemsoftConfig
from semsoft_plugin.core.request import SemsoftRequest, show_value
from semsoft_plugin.core.result import LabelResult
from semsoft_plugin.engines.scoring import (
    Fetch,
    ModelScorer,
    ReaderError,
    client_model,
    decision_step,
    scores_from_top_k,
)

__all__ = [
    "ARGMAX_TIE",
    "CutLabel",
    "EmittedLabelMismatch",
    "FitNotApplied",
    "Logprobs",
    "fitted_row",
    "read_scores",
]

# Probabilities closer than this are a tie at the float precision an engine and a reader
# share: a greedy constrained pick and the reader's argmax may fall either way of it.
ARGMAX_TIE = 1e-4


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
    """The emitted text is only the start of a label: a stop string, `stop_token_ids`
    or `max_tokens` cut it."""

    def __init__(self, label: str, text: str) -> None:
        self.label, self.text = label, text
        super().__init__(
            f"the text was cut: the engine emitted {text!r}, the start of the label "
            f"{label!r} (a stop string, stop_token_ids or max_tokens ended it early)"
        )


# What a reader can be told about the decision step's log-probabilities: token id ->
# raw log-prob; keys may be vLLM's ``"token_id:N"`` strings or token texts.
Logprobs = Mapping[Any, float]


class FitNotApplied(ReaderError):
    """The request named a fit (`semsoft_fit`), but its row was not scored with it; the
    message says why (a row that is not `W h + b`, an engine that serves no fits, a row
    no longer kept)."""


def fitted_row(request: SemsoftRequest, found: Mapping[str, Any] | None) -> list[float]:
    """The probabilities, in the request's label order, of the fitted row the engine
    kept for `request` (`{"probs": [...]}`), or `FitNotApplied` naming why there are
    none (`{"reason": ...}`, or no row: `found` None)."""
    if found is None:
        raise FitNotApplied(
            f"semsoft_fit={request.fit!r}: the engine kept no fitted row for this request "
            "(an engine without the worker extension semsoft_plugin.engines.vllm.fits.FittedRows, "
            "a request that never reached its decision step, or one read after many later "
            "decisions)"
        )
    if "reason" in found:
        raise FitNotApplied(str(found["reason"]))
    probs = found.get("probs")
    if not isinstance(probs, list) or len(probs) != len(request.labels):
        raise FitNotApplied(
            f"semsoft_fit={request.fit!r}: the fitted row {show_value(probs)} does not hold "
            f"one probability per label ({len(request.labels)})"
        )
    return [float(p) for p in probs]


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
    plugin: bool = True,
    allow_download: bool = False,
    fitted: Sequence[float] | None = None,
) -> LabelResult:
    """Scores of one output from its returned log-probabilities: the reader contract.

    Every reader (vLLM offline, the OpenAI-compatible client, `classify_vllm`, a Ray
    postprocess) ends here, so the rules hold everywhere:

    1. **Exact or nothing.** The scores are computed from the decision step's top-k raw
       log-probabilities plus every answer token's exact log-probability the settings
       read (all of them unless `semantic_weight=1`; all of them in the 0/0 fallback).
       A needed answer token missing from `top_logprobs` and `known` is asked of
       `fetch`; if there is no `fetch` (or it does not return it) the reader raises
       `MissingLabelLogprobs` naming the labels. No bound stands in for a
       missing log-probability.
    2. **The emitted label agrees.** In constrain mode, when the engine applied the
       constraint (`plugin`) and picked greedily (`greedy`), the result's label
       is the emitted label and is the argmax of `probs` (ties within
       `ARGMAX_TIE`); otherwise `EmittedLabelMismatch` names both.
    3. **Cut text is said.** An emitted text that is only the start of a label raises
       `CutLabel`.

    Parameters
    ----------
    labels : SemsoftRequest | Sequence[str]
        The label names (with `config`), or the parsed request
    top_logprobs : Logprobs | Sequence[Logprobs | None]
        The decision step's `{token: raw log-prob}` (its `k` highest are the top-k,
        further entries count as known log-probs), or one such dict per generated token
        (the decision step found from `emitted_ids`). Keys: token ids, `"token_id:N"`
        strings, or token texts
    emitted : str | None
        The generated text, when known (checked for a cut label)
    config : SemsoftConfig | None
        Method settings when `labels` is a list
    model : Any
        A `vllm.LLM`, a checkpoint directory or a model name (tokenizer and
        output embeddings)
    emitted_ids : Sequence[int] | None
        The generated token ids (the decision step's one names the emitted
        label; with a trigger they locate the decision step)
    known : Logprobs | None
        Other exact raw log-probs of the decision step (e.g. a follow-up's)
    fetch : Fetch | None
        `fetch(token_ids) -> {token id: raw log-prob}` at the decision step, for needed answer
        tokens outside the top-k (e.g.
        [`semsoft_plugin.engines.openai.openai_fetch`][semsoft_plugin.engines.openai.openai_fetch])
    greedy : bool
        The engine picked the argmax (temperature 0); a sampled pick may be any label
    plugin : bool
        The plugin constrained the generation (False: a server without it)
    fitted : Sequence[float] | None
        The probabilities a fit gave this row inside the engine, in the request's
        label order (`semsoft_fit`): they are the result's `probs` (and its label in
        observe mode), and rule 2 holds against them
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
    if fitted is not None:
        names = client.scoring(request).labels.names
        probs = dict(zip(names, (float(p) for p in fitted), strict=True))
        best = max(probs, key=probs.__getitem__)
        result = dataclasses.replace(result, probs=probs, label=best, fallback=False)
    return _check_emitted(
        client, request, result, emitted, generated, step, greedy=greedy, plugin=plugin
    )


def _token_key(model: ModelScorer, token: Any) -> int:
    """A token id from an int, a `"token_id:N"` string or a token's text."""
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


def _check_emitted(
    model: ModelScorer,
    request: SemsoftRequest,
    result: LabelResult,
    text: str | None,
    generated: Sequence[int],
    step: int,
    *,
    greedy: bool,
    plugin: bool,
) -> LabelResult:
    """Rules 2 and 3 of `read_scores`: the constrained pick is the argmax, and a
    label the text only starts is refused as cut."""
    if request.mode != "constrain" or not plugin:
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
