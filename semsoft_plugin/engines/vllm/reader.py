"""Reading Semantic Softmax scores from an offline vLLM `RequestOutput`.

The output carries the decision step's top-`k` raw log-probabilities (the request
asked for `logprobs=k`); [`label_scores`][semsoft_plugin.engines.vllm.reader.label_scores] hands them to the reader contract,
`semsoft_plugin.engines.reader_contract.read_scores`, the same code the OpenAI reader uses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vllm import SamplingParams

from semsoft_plugin.core.request import KEY_ROW_KEY, SemsoftRequest
from semsoft_plugin.core.result import LabelResult
from semsoft_plugin.engines.reader_contract import FitNotApplied, fitted_row, read_scores
from semsoft_plugin.engines.scoring import client_model, decision_step
from semsoft_plugin.engines.vllm.params import sampling_params
from semsoft_plugin.engines.vllm.parsed import parsed_request
from semsoft_plugin.engines.vllm.reader_tables import (
    HIDDEN,
    HiddenNotRead,
    read_hidden,
    row_table_key,
    rpc_rows,
    unscored_reason,
)

__all__ = ["label_probs", "label_scores", "output_hidden"]


def request_of(params_or_labels: Any, options: Mapping[str, Any]) -> SemsoftRequest:
    if isinstance(params_or_labels, SamplingParams):
        request = parsed_request(params_or_labels.extra_args)[0]
        if request is None:
            raise ValueError("these SamplingParams did not opt in (no semsoft_labels)")
        return request
    if isinstance(params_or_labels, SemsoftRequest):
        return params_or_labels
    if isinstance(params_or_labels, str) or not isinstance(params_or_labels, Sequence):
        raise ValueError(
            "give the request's SamplingParams or its label list, got "
            f"{type(params_or_labels).__name__}"
        )
    request = parsed_request(
        sampling_params(list(params_or_labels), **options).extra_args  # validates options
    )[0]
    assert request is not None
    return request


def label_scores(
    request_output: Any,
    params: SamplingParams | Sequence[str],
    model: Any,
    *,
    choice: int = 0,
    allow_download: bool = False,
    check_text: bool = True,
    **options: Any,
) -> LabelResult:
    """Semantic Softmax scores of an offline `RequestOutput`.

    Parameters
    ----------
    request_output : Any
        What `LLM.generate` returned for the request
    params : SamplingParams | Sequence[str]
        The request's `SamplingParams` (from
        [`sampling_params`][semsoft_plugin.engines.vllm.reader.sampling_params]), or its label list
        plus the same `options`
    model : Any
        The `vllm.LLM` (or its checkpoint directory / model name), for the tokenizer and
        output embeddings. Only the `LLM` can fetch answer tokens outside the returned
        top-k (one `max_tokens=1` request); given a path or a name, such an output raises
        `MissingLabelLogprobs`: docs/reader-contract.md
    choice : int
        Which completion (`n > 1` gives `n`), in vLLM's order
    check_text : bool
        Refuse a text that is only the start of a label (`CutLabel`); False
        where `max_tokens` was set short on purpose (only the scores are wanted)
    allow_download : bool
        A model name not on this machine yet (a known name not cached, a
        hub `owner/name` not in the hub cache) is refused unless True: reading scores
        never starts a download by itself

    Raises
    ------
    ValueError
        For this request only, when it cannot be scored: it carries no decision step,
        its decision-step log-probabilities are NaN/inf, or the engine's processor could
        not score its row and left it unconstrained (the reason is named); a request that
        names a fit (`semsoft_fit`) whose row the fit did not score raises `FitNotApplied`
        with the reason (its scores are read from the engine through `model`, which must
        be the `LLM`); and, by the
        reader contract (`semsoft_plugin.engines.reader_contract.read_scores`),
        its subclasses `MissingLabelLogprobs`, `EmittedLabelMismatch` or `CutLabel`.

    Examples
    --------
    ```python
    from vllm import LLM
    from semsoft_plugin.engines import models
    from semsoft_plugin.engines import vllm as semsoft

    llm = LLM(str(models.resolve("default")), max_logprobs=50,
              logits_processors=[semsoft.SemanticSoftmaxLogitsProcessor])
    params = semsoft.sampling_params(["positive", "negative"])
    out = llm.generate(["Review: I loved it. Sentiment:"], params)[0]
    result = semsoft.label_scores(out, params, llm)    # a LabelResult
    result.label, result.probs, result.constrained_probs
    ```
    """
    request = request_of(params, options)
    client = client_model(model, allow_download=allow_download)
    outputs = list(getattr(request_output, "outputs", None) or [])
    if not -len(outputs) <= choice < len(outputs):
        raise ValueError(f"choice={choice}: the output holds {len(outputs)} completion(s)")
    completion = outputs[choice]
    if not completion.logprobs:
        raise ValueError(
            "the output holds no log-probabilities: the request needs logprobs >= k "
            "(use semsoft_plugin.engines.vllm.sampling_params)"
        )
    generated = list(completion.token_ids)[: len(completion.logprobs)]
    step = decision_step(client, request, generated)
    reason = unscored_reason(
        client, request, getattr(request_output, "prompt_token_ids", None), generated, step
    )
    if reason is not None:
        raise ValueError(
            f"the engine could not score this request at its decision step ({reason}), so "
            "it left the request's logits as they were: the text is not a chosen label "
            "and no scores are given for it"
        )
    entries = completion.logprobs[step]
    fetch = None
    prompt_ids = getattr(request_output, "prompt_token_ids", None)
    if getattr(model, "llm_engine", None) is not None and prompt_ids is not None:
        from vllm.inputs import TokensPrompt

        follow = TokensPrompt(prompt_token_ids=list(prompt_ids) + list(generated[:step]))

        def fetch(token_ids: list[int]) -> dict[int, float]:
            return fetch_logprobs(model, [follow], token_ids)[0]

    greedy = params.temperature == 0.0 if isinstance(params, SamplingParams) else True
    fitted = None
    if request.fit is not None:
        if getattr(model, "collective_rpc", None) is None or prompt_ids is None:
            raise FitNotApplied(
                f"semsoft_fit={request.fit!r}: a fitted row is kept in the engine; read it "
                "with the vllm.LLM that ran the request (model=llm)"
            )
        key = row_table_key(request, request.fit, list(prompt_ids), generated[:step])
        if key is None:
            raise FitNotApplied(
                f"semsoft_fit={request.fit!r}: the request's row is kept under its own "
                f"{KEY_ROW_KEY}: give label_scores the request's SamplingParams (from "
                "sampling_params), not its label list"
            )
        fitted = fitted_row(request, rpc_rows(model, [key])[0])
    return read_scores(
        request,
        {int(t): float(lp.logprob) for t, lp in entries.items()},
        completion.text if check_text else None,
        model=client,
        emitted_ids=generated,
        fetch=fetch,
        greedy=greedy,
        fitted=fitted,
    )


def output_hidden(
    llm: Any,
    outputs: Sequence[Any],
    params: SamplingParams | Sequence[SamplingParams],
    steps: Sequence[int],
) -> list[Any]:
    """The `[d]` float32 decision-step hidden states of offline `RequestOutput`s whose
    requests asked for them (`sampling_params(..., hidden=True)`), taken from the
    engine's worker table (`reader_tables.read_hidden`: `HiddenNotRead` naming a row that
    is not `W h + b`, with its residual). Each row is taken once: outputs that share one
    (the same prompt under one `SamplingParams`) get the same row.

    Parameters
    ----------
    llm : Any
        The `vllm.LLM` that ran them (with the worker extension
        `semsoft_plugin.engines.vllm.fits.FittedRows`).
    outputs : Sequence[Any]
        Its outputs, first completion each.
    params : SamplingParams | Sequence[SamplingParams]
        The requests' `SamplingParams` (one for all, or one per output): each carries
        its `semsoft_row_key`, the key of its rows in the engine.
    steps : Sequence[int]
        Each output's decision step (the index of the generated token it decided).

    Returns
    -------
    list of Tensor
        One `[d]` float32 tensor per output.
    """
    each = [params] * len(outputs) if isinstance(params, SamplingParams) else list(params)
    if len(each) != len(outputs):
        raise ValueError(f"{len(each)} SamplingParams for {len(outputs)} outputs")
    keys = []
    for i, (out, one, step) in enumerate(zip(outputs, each, steps, strict=True)):
        request = request_of(one, {})
        before = list(out.outputs[0].token_ids)[:step]
        key = row_table_key(request, HIDDEN, list(out.prompt_token_ids), before)
        if key is None or not request.hidden:
            raise HiddenNotRead(
                f"prompt {i}: its request kept no hidden state (build its SamplingParams "
                "with sampling_params(..., hidden=True))"
            )
        keys.append(key)
    unique = list(dict.fromkeys(keys))
    rows = dict(zip(unique, read_hidden(llm, unique), strict=True))
    return [rows[key] for key in keys]


def _top_k_logprobs(entries: Mapping[int, Any], k: int) -> dict[int, float]:
    """token -> raw log-prob of a step's `k` most likely tokens (vLLM ranks from 1)."""
    return {
        int(t): float(lp.logprob)
        for t, lp in entries.items()
        if lp.rank is not None and lp.rank <= k
    }


def fetch_logprobs(
    llm: Any, prompts: Sequence[Any], token_ids: Sequence[int], *, progress: bool = False
) -> list[dict[int, float]]:
    """Each prompt's next-token raw log-probs of `token_ids`: one-token follow-ups
    (greedy, `max_tokens=1`, the prefix cache serves the prompt), at most vLLM's
    `MAX_LOGPROB_TOKEN_IDS` ids a request."""
    from vllm.sampling_params import MAX_LOGPROB_TOKEN_IDS

    found: list[dict[int, float]] = [{} for _ in prompts]
    for start in range(0, len(token_ids), MAX_LOGPROB_TOKEN_IDS):
        chunk = list(token_ids[start : start + MAX_LOGPROB_TOKEN_IDS])
        probe = SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=chunk)
        for row, out in zip(
            found, llm.generate(list(prompts), probe, use_tqdm=progress), strict=True
        ):
            entries = out.outputs[0].logprobs[0]
            row.update({t: float(entries[t].logprob) for t in chunk})
    return found


def label_probs(
    request_output: Any,
    params: SamplingParams | Sequence[str],
    model: Any,
    *,
    choice: int = 0,
    **options: Any,
) -> dict[str, float]:
    """`{label: probability}` (Semantic Softmax) of an offline `RequestOutput`.

    See [`label_scores`][semsoft_plugin.engines.vllm.reader.label_scores] (`allow_download` too). Raises `ValueError` in the rare 0/0 case whose
    fallback (the constrained softmax) cannot be read from the output because a label
    token is outside the returned top-k; [`classify_vllm`][semsoft_plugin.engines.vllm.classify_vllm] handles that case.
    """
    scores = label_scores(request_output, params, model, choice=choice, **options)
    if scores.probs is None:
        raise ValueError(
            "no top-k token voted for any label and the label tokens are outside the "
            "returned top-k, so the constrained-softmax fallback cannot be read from this "
            "output; use classify_vllm, or raise k"
        )
    return scores.probs
