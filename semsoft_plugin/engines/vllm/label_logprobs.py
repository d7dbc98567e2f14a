"""The server answers what its reader needs in the same HTTP request: every label's
answer-token log-prob at the decision step.

vLLM 0.32 cannot return the top-`k` and chosen tokens' log-probs in one engine request, so
after an opted-in, non-streaming request is answered the admission middleware
([`admission`][semsoft_plugin.engines.vllm.admission]) asks the engine, in one internal
`max_tokens=1` `logprob_token_ids` call, for the label answer tokens the decision step did
not return, and writes them into the choice as `semsoft_label_logprobs`, which
[`openai_label_scores`][semsoft_plugin.engines.openai.openai_label_scores] reads. Nothing is
filled for a stream or a response without token ids (the reader then refuses); a request
naming a fit also gets `semsoft_fitted`
([reader_tables][semsoft_plugin.engines.vllm.reader_tables]). Why a second request:
docs/reader-contract.md ("Fetching a missing log-prob").
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from semsoft_plugin.core.request import RESPONSE_FITTED, RESPONSE_LABEL_LOGPROBS, SemsoftRequest
from semsoft_plugin.engines.scoring import trigger_position
from semsoft_plugin.engines.vllm.params import check_label_set, load_tokenizer
from semsoft_plugin.engines.vllm.reader_tables import RPC_METHOD, fitted_key

__all__ = ["fill_label_logprobs"]

_TOKEN_ID = "token_id:"


def _token(text: Any) -> int | None:
    if isinstance(text, str) and text.startswith(_TOKEN_ID):
        try:
            return int(text[len(_TOKEN_ID) :])
        except ValueError:
            return None
    return None


def _chat_top_k_cut(choice: Mapping[str, Any], step: int, k: int) -> bool:
    """Whether a chat choice's decision step may lack its `k`-th token: vLLM's chat
    `top_logprobs` are the first `k` entries of a dict that starts with the
    sampled token, so a sampled token outside the top-`k` (the constrained label,
    often) pushes the `k`-th out. Seen as the sampled token listed first and lowest."""
    content = (choice.get("logprobs") or {}).get("content")
    if not isinstance(content, list) or step >= len(content):
        return False
    tops = (content[step] or {}).get("top_logprobs") or []
    if len(tops) < k or tops[0].get("token") != content[step].get("token"):
        return False
    return all(float(tops[0]["logprob"]) <= float(t["logprob"]) for t in tops[1:])


def _returned(choice: Mapping[str, Any], step: int, prompt_length: int) -> set[int]:
    """The token ids whose log-probs the choice already carries at the decision step
    (only `"token_id:N"` keys are recognised; others count as not returned, and are
    then fetched again, which costs nothing in exactness)."""
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, Mapping):
        return set()
    found: list[int | None] = []
    content = logprobs.get("content")
    if isinstance(content, list):  # chat
        if step < len(content) and isinstance(content[step], Mapping):
            entry = content[step]
            found.append(_token(entry.get("token")))
            found.extend(_token(t.get("token")) for t in entry.get("top_logprobs") or [])
    else:  # completions; with echo the prompt's tokens come first
        tokens = logprobs.get("tokens") or []
        values = logprobs.get("token_logprobs") or []
        start = prompt_length if values and values[0] is None else 0
        tops = logprobs.get("top_logprobs") or []
        if start + step < min(len(tokens), len(tops)):
            found.append(_token(tokens[start + step]))
            found.extend(_token(t) for t in tops[start + step] or {})
    return {t for t in found if t is not None}


def _decisions(
    reply: Mapping[str, Any], request: SemsoftRequest, tokenizer: Any
) -> list[tuple[dict[str, Any], list[int], list[int], int]]:
    """Each choice that reached its decision step: the choice, its prompt's token ids,
    its generated token ids and the decision step's index (a choice without them is
    left out: the reader says why)."""
    found = []
    for choice in reply.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        prompt = choice.get("prompt_token_ids") or reply.get("prompt_token_ids")
        generated = choice.get("token_ids")
        if not isinstance(prompt, list) or not prompt or not isinstance(generated, list):
            continue
        step = 0
        if request.trigger is not None:
            step = trigger_position(tokenizer, generated, request.trigger, 1)
        if 0 <= step < len(generated):
            found.append((choice, prompt, generated, step))
    return found


async def _fill_fitted(
    http_request: Any, reply: Mapping[str, Any], request: SemsoftRequest, tokenizer: Any
) -> bool:
    """Write each choice's fitted row (or why there is none) as `semsoft_fitted`, read
    from the engine's workers with one `collective_rpc` (`reader_tables`); True when some
    choice got one."""
    decisions = _decisions(reply, request, tokenizer)
    if request.fit is None or request.row_key is None or not decisions:
        return False
    keys = [
        fitted_key(request.row_key, request.fit, prompt, generated[:step])
        for _, prompt, generated, step in decisions
    ]
    engine: Any = getattr(http_request.app.state, "engine_client", None)
    try:
        rows = list((await engine.collective_rpc(RPC_METHOD, args=(keys,)))[0])
    except Exception as error:  # an engine without the worker extension, a dead engine
        reason = f"fit {request.fit!r}: the engine's fitted rows could not be read ({error})"
        rows = [{"reason": reason}] * len(keys)
    for (choice, *_), row in zip(decisions, rows, strict=True):
        choice[RESPONSE_FITTED] = row
    return True


def _plan(
    reply: Mapping[str, Any], request: SemsoftRequest, tokenizer: Any, answers: Sequence[int]
) -> list[tuple[dict[str, Any], tuple[int, ...], set[int], bool]]:
    """Per choice that needs it: the choice, its decision step's prefix (prompt ids
    plus the tokens generated before it), the token ids it returned there, and whether
    its top-k may lack the k-th token (`_chat_top_k_cut`). `answers`: the label
    answer token ids."""
    plan = []
    for choice, prompt, generated, step in _decisions(reply, request, tokenizer):
        returned = _returned(choice, step, len(prompt))
        cut = _chat_top_k_cut(choice, step, request.config.k)
        if cut or any(t not in returned for t in answers):
            prefix = tuple(int(t) for t in (*prompt, *generated[:step]))
            plan.append((choice, prefix, returned, cut))
    return plan


async def _read_engine(
    http_request: Any,
    model: Any,
    prefixes: Sequence[tuple[int, ...]],
    token_ids: list[int] | None,
    k: int = 1,
) -> list[dict[int, float]]:
    """One internal `/v1/completions` call on the same app: each prefix's next-token
    raw log-probs of `token_ids`, or with `token_ids=None` its top-`k` (vLLM serves
    it like any client's request, with the same model name, LoRA and credentials; it
    does not opt in, so the plugin leaves it alone). Two calls, never one: vLLM's
    `logprob_token_ids` replaces the top-k."""
    import httpx

    headers = {
        k: v for k, v in http_request.headers.items() if k.lower() in ("authorization", "x-api-key")
    }
    body: dict[str, Any] = {
        "model": model,
        "prompt": [list(p) for p in prefixes],
        "max_tokens": 1,
        "temperature": 0.0,
        "logprobs": k,
        "return_tokens_as_token_ids": True,
    }
    if token_ids is not None:
        body["logprob_token_ids"] = token_ids
    transport = httpx.ASGITransport(app=http_request.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://semsoft.internal") as http:
        answer = await http.post("/v1/completions", json=body, headers=headers, timeout=None)
    if answer.status_code != 200:
        return [{} for _ in prefixes]
    found: list[dict[int, float]] = [{} for _ in prefixes]
    for choice in answer.json().get("choices") or []:
        index = int(choice.get("index") or 0)
        tops = ((choice.get("logprobs") or {}).get("top_logprobs") or [None])[0] or {}
        if 0 <= index < len(found):
            found[index] = {
                t: float(v)
                for key, v in tops.items()
                if (t := _token(key)) is not None and (token_ids is None or t in token_ids)
            }
    return found


async def fill_label_logprobs(
    http_request: Any, response: Any, request: SemsoftRequest, vllm_config: Any
) -> Any:
    """The server's `response` to an opted-in, non-streaming request, with every
    choice's missing label answer-token log-probs added as `semsoft_label_logprobs`
    (module docstring). Any other response is returned with its body unchanged."""
    from starlette.responses import Response

    chunks = [chunk async for chunk in response.body_iterator]
    body = b"".join(c if isinstance(c, bytes) else c.encode() for c in chunks)
    headers = {k: v for k, v in response.headers.items() if k.lower() != "content-length"}

    def answer(content: bytes) -> Any:
        return Response(content=content, status_code=response.status_code, headers=headers)

    if response.status_code != 200 or vllm_config is None:
        return answer(body)
    try:
        reply = json.loads(body)
    except ValueError:
        return answer(body)
    if not isinstance(reply, dict):
        return answer(body)
    # The label set was tokenised when the request was admitted: read from that cache.
    answers = check_label_set(request, vllm_config.model_config).answer_ids
    tokenizer = load_tokenizer(vllm_config.model_config)
    fitted = await _fill_fitted(http_request, reply, request, tokenizer)
    plan = _plan(reply, request, tokenizer, answers)
    if not plan:
        return answer(json.dumps(reply).encode() if fitted else body)
    model = reply.get("model")
    added: dict[int, dict[int, float]] = {id(choice): {} for choice, *_ in plan}
    cut = list(dict.fromkeys(prefix for _, prefix, _, is_cut in plan if is_cut))
    if cut:  # the true top-k of each step whose k-th token the chat list pushed out
        tops = await _read_engine(http_request, model, cut, None, request.config.k)
        for choice, prefix, returned, is_cut in plan:
            if is_cut:
                values = tops[cut.index(prefix)]
                added[id(choice)].update((t, v) for t, v in values.items() if t not in returned)
    needs = [
        (choice, prefix, [t for t in answers if t not in returned and t not in added[id(choice)]])
        for choice, prefix, returned, _ in plan
    ]
    prefixes = list(dict.fromkeys(prefix for _, prefix, missing in needs if missing))
    if prefixes:
        # At most SERVER_MAX_LABELS (64) answer tokens: within vLLM's 128 logprob_token_ids.
        wanted = sorted({t for _, _, missing in needs for t in missing})
        read = await _read_engine(http_request, model, prefixes, wanted)
        for choice, prefix, missing in needs:
            if missing:
                values = read[prefixes.index(prefix)]
                added[id(choice)].update((t, values[t]) for t in missing if t in values)
    for choice, *_ in plan:
        choice[RESPONSE_LABEL_LOGPROBS] = {
            f"{_TOKEN_ID}{t}": v for t, v in sorted(added[id(choice)].items())
        }
    return answer(json.dumps(reply).encode())
