"""Batch classification on a `vllm.LLM` (what `Classifier(backend="vllm")` and the
evaluation run): one `generate` call, the scores read back, and one-token follow-up
requests for what the top-`k` did not hold (the exact constrained softmax, and the
evaluation's extra `token_ids`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from semsoft_plugin.core.config import SemsoftConfig
from semsoft_plugin.core.labels import LabelSet, label_names
from semsoft_plugin.core.request import Mode
from semsoft_plugin.core.result import LabelResult
from semsoft_plugin.engines.reader_contract import read_scores
from semsoft_plugin.engines.scoring import MissingLabelLogprobs, client_model, decision_step
from semsoft_plugin.engines.vllm.params import (
    check_engine_logprobs,
    own_row_key,
    sampling_params,
)
from semsoft_plugin.engines.vllm.reader import (
    fetch_logprobs,
    label_scores,
    output_hidden,
    request_of,
)
from semsoft_plugin.engines.vllm.reader_tables import HiddenNotRead

__all__ = ["HIDDEN_CHUNK", "classify_vllm"]

# Prompts per engine call when hidden states are kept: each call's rows are read (and
# taken) from the worker's table before the next, so the table (reader_tables.TABLE_SIZE
# rows) never drops one, and holds at most this many hidden states at a time.
HIDDEN_CHUNK = 4096


def classify_vllm(
    llm: Any,
    prompts: Sequence[str | Sequence[Mapping[str, str]]],
    labels: Sequence[str],
    config: SemsoftConfig | None = None,
    *,
    mode: Mode = "constrain",
    trigger: str | None = None,
    constrained: bool = True,
    keep_logprobs: int = 0,
    token_ids: Sequence[int] = (),
    max_tokens: int | None = None,
    progress: bool = False,
    hidden: bool = False,
    **overrides: Any,
) -> list[LabelResult]:
    """Classify prompts on a vLLM engine; one `LabelResult` per prompt, in order.

    The engine must have the processor loaded (`logits_processors=[...]` or the
    installed entry point) for `mode="constrain"`, and `max_logprobs >= k`.

    Parameters
    ----------
    llm : vllm.LLM
    prompts : Sequence[str | Sequence[Mapping[str, str]]]
        Strings (used as is) or chat message lists (chat template applied,
        continuing a final assistant message), tokenised exactly as
        [`semsoft_plugin.engines.hf.classify`][semsoft_plugin.engines.hf.classify] does
    labels : Sequence[str]
        Label names (at least two; a `str` is refused), or a LabelSet built with
        the engine's tokenizer (another tokenizer's is refused by name; its
        `leading_space` is used; verbalizers and variants do not travel to the engine
        and a set that has them is refused)
    config : SemsoftConfig | None
        Semantic Softmax settings
    **overrides : Any
        Semantic Softmax settings
    mode : Mode
        See [`sampling_params`][semsoft_plugin.engines.vllm.sampling_params]
    trigger : str | None
        See [`sampling_params`][semsoft_plugin.engines.vllm.sampling_params]
    constrained : bool
        Also return the exact constrained softmax; prompts whose label
        tokens were not all in the top-k get one extra one-token request
        (`logprob_token_ids`), run after the main batch
    keep_logprobs : int
        Also return the decision step's `keep_logprobs` highest raw
        log-probabilities (`top_logprobs`: token id -> log-prob); the engine needs
        `max_logprobs >= max(k, keep_logprobs)`. `semsoft eval --backend vllm`
        keeps them to score every method from one pass.
    token_ids : Sequence[int]
        Also return these tokens' raw decision-step log-probabilities
        (`token_logprobs`), read from the top-k where they are in it and otherwise
        from the same one-token follow-up request
    max_tokens : int | None
        Generation length in tokens (default: the longest label's UTF-8 bytes
        + 2, 256 with a trigger, as on every engine:
        `semsoft_plugin.core.request.default_max_tokens`); 1 is enough when only
        the scores are wanted
    progress : bool
        Show vLLM's progress bar over the batch
    hidden : bool
        Also return the decision step's hidden state (`hidden`, `[d]` float32), read back
        from its logits row in the engine (which needs the worker extension
        `semsoft_plugin.engines.vllm.fits.FittedRows`); a row that is not `W h + b` raises
        `HiddenNotRead` naming its residual. Sent `HIDDEN_CHUNK` prompts at a time

    Returns
    -------
    list[LabelResult]
        List of [`LabelResult`][semsoft_plugin.core.result.LabelResult] with `label`, `probs`
        and `constrained_probs` (label -> p), `fallback`, `coverage`, `top_k_mass`,
        `decision_step` and `text`; `top_logprobs` and `token_logprobs` when asked
        for (None otherwise).
    """
    from vllm.inputs import TokensPrompt

    from semsoft_plugin.engines.prompting import encode_prompts, format_prompt

    cfg = (config or SemsoftConfig()).replace(**overrides)
    if hidden and isinstance(prompts, Sequence) and len(prompts) > HIDDEN_CHUNK:
        results: list[LabelResult] = []
        for start in range(0, len(prompts), HIDDEN_CHUNK):
            try:
                results += classify_vllm(
                    llm, prompts[start : start + HIDDEN_CHUNK], labels, cfg, mode=mode,
                    trigger=trigger, constrained=constrained, keep_logprobs=keep_logprobs,
                    token_ids=token_ids, max_tokens=max_tokens, progress=progress, hidden=True,
                )  # fmt: skip
            except HiddenNotRead as error:  # its prompt index counts from the chunk's start
                raise HiddenNotRead(f"in the prompts from {start} on: {error}") from None
        return results
    wanted = max(cfg.k, keep_logprobs)
    name = "k" if wanted == cfg.k else "keep_logprobs"
    check_engine_logprobs(llm.llm_engine.model_config, wanted, name)
    if keep_logprobs < 0:
        raise ValueError(f"keep_logprobs={keep_logprobs} must be >= 0")
    if isinstance(prompts, str) or not isinstance(prompts, Sequence):
        raise ValueError("prompts must be a list of strings or of chat message lists")
    client = client_model(llm)
    vocab = client.embeddings.vocab_size
    extra_ids = [int(t) for t in dict.fromkeys(token_ids)]
    bad = [t for t in extra_ids if not 0 <= t < vocab]
    if bad:
        raise ValueError(f"token_ids {bad[:5]} lie outside the vocabulary (size {vocab})")
    encoded = encode_prompts(
        client.tokenizer, [format_prompt(client.tokenizer, p) for p in prompts]
    )
    token_prompts = [TokensPrompt(prompt_token_ids=ids) for ids in encoded]
    length: dict[str, Any] = {} if max_tokens is None else {"max_tokens": max_tokens}
    leading_space = True
    if isinstance(labels, LabelSet):
        labels.check_tokenizer(client.tokenizer, where="classify_vllm")
        leading_space = labels.leading_space
    params = sampling_params(
        label_names(labels),
        config=cfg,
        mode=mode,
        trigger=trigger,
        leading_space=leading_space,
        logprobs=wanted,
        hidden=hidden,
        **length,
    )
    request = request_of(params, {})
    scoring = client.scoring(request)  # label-set errors surface here, before any work
    if isinstance(labels, LabelSet) and labels.label_tokens != scoring.labels.label_tokens:
        raise ValueError(
            f"LabelSet {list(labels.names)!r} has verbalizers or variants the engine does "
            "not know (it binds label names itself): pass the label names"
        )
    # A kept hidden state is one request's row: each prompt gets its own row key, so a
    # duplicate prompt reads its own row, never another's.
    each = [own_row_key(params) for _ in token_prompts] if hidden else params
    outputs = llm.generate(token_prompts, each, use_tqdm=progress)
    answer_ids = list(scoring.labels.answer_token_ids)
    greedy = params.temperature == 0.0
    # A max_tokens the caller set may cut the text on purpose (1: scores only); the
    # default length holds every label, so a cut text there is refused.
    check_text = max_tokens is None

    def reread(i: int, known: Mapping[int, float]) -> LabelResult:
        completion = outputs[i].outputs[0]
        positions = [
            {int(t): float(lp.logprob) for t, lp in p.items()} for p in completion.logprobs
        ]
        try:
            return read_scores(
                request,
                positions,
                completion.text if check_text else None,
                model=client,
                emitted_ids=list(completion.token_ids)[: len(positions)],
                known=known,
                greedy=greedy,
            )
        except ValueError as error:
            raise ValueError(f"prompt {i}: {error}") from None

    # First pass without follow-ups: the outputs whose needed answer tokens (or asked
    # token_ids) are outside the top-k get one batched one-token follow-up each.
    first: list[LabelResult | None] = []
    for i, out in enumerate(outputs):
        try:
            first.append(label_scores(out, params, client, check_text=check_text))
        except MissingLabelLogprobs:
            first.append(None)
        except ValueError as error:
            raise ValueError(f"prompt {i}: {error}") from None
    steps = [
        {
            int(t): float(lp.logprob)
            for t, lp in out.outputs[0]
            .logprobs[s.decision_step if s is not None else _step(client, request, out)]
            .items()
        }
        for s, out in zip(first, outputs, strict=True)
    ]
    probe_ids = list(dict.fromkeys(answer_ids + extra_ids))
    missing = [
        i
        for i, s in enumerate(first)
        if s is None
        or (s.constrained_probs is None and constrained)
        or any(t not in steps[i] for t in extra_ids)
    ]
    if missing:
        follow = [
            TokensPrompt(
                prompt_token_ids=encoded[i]
                + list(outputs[i].outputs[0].token_ids[: _step(client, request, outputs[i])])
            )
            for i in missing
        ]
        fetched = fetch_logprobs(llm, follow, probe_ids, progress=progress)
        for i, found in zip(missing, fetched, strict=True):
            steps[i].update(found)
            # Scored again with every answer token's log-prob known: exact, as
            # transformers has it.
            first[i] = reread(i, steps[i])
    scores = [s for s in first if s is not None]
    states: list[Any] = [None] * len(scores)
    if hidden:
        states = list(output_hidden(llm, outputs, each, [s.decision_step or 0 for s in scores]))
    results = []
    for s, out, step, state in zip(scores, outputs, steps, states, strict=True):
        top = None
        if keep_logprobs:
            ranked = out.outputs[0].logprobs[s.decision_step].items()
            top = {
                int(t): float(lp.logprob)
                for t, lp in ranked
                if lp.rank is not None and lp.rank <= keep_logprobs
            }
        results.append(
            replace(
                s,
                text=out.outputs[0].text,
                top_logprobs=top,
                token_logprobs={t: step[t] for t in extra_ids} if extra_ids else None,
                hidden=state,
            )
        )
    return results


def _step(client: Any, request: Any, out: Any) -> int:
    """The decision step of an offline output (its generated tokens with log-probs)."""
    completion = out.outputs[0]
    return decision_step(client, request, list(completion.token_ids)[: len(completion.logprobs)])
