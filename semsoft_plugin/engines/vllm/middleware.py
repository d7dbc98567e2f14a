"""The vLLM OpenAI server's middleware: semsoft's checks before any response starts.

`--middleware semsoft_plugin.engines.vllm.admission` (the package re-exports
[`admission`][semsoft_plugin.engines.vllm.middleware.admission]; this module is not named after it so that the attribute and the
module never shadow each other).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from vllm import SamplingParams
from vllm.exceptions import VLLMClientError

from semsoft_plugin.core.request import (
    KEY_FIT,
    SemsoftRequest,
    check_near_misses,
    mint_row_key,
    near_misses,
    parse_request,
    show_value,
)
from semsoft_plugin.engines.vllm.label_logprobs import fill_label_logprobs
from semsoft_plugin.engines.vllm.params import validate_params
from semsoft_plugin.engines.vllm.parsed import forget, keep

__all__ = ["admission"]


async def admission(request: Any, call_next: Any) -> Any:
    """vLLM OpenAI-server middleware: semsoft's checks before any response starts.

    `python -m vllm.entrypoints.openai.api_server ... --middleware
    semsoft_plugin.engines.vllm.admission`. Why a middleware: vLLM admits a request (and calls
    [`SemanticSoftmaxLogitsProcessor.validate_params`][semsoft_plugin.engines.vllm.processor.SemanticSoftmaxLogitsProcessor.validate_params]) only when the serving layer
    first reads the engine's result stream, and for `stream: true` that happens inside
    an already-sent HTTP 200, so a refusal arrives as an error event (vLLM's own checks,
    e.g. `top_logprobs` above `--max-logprobs`, behave the same). Run on the request
    body first, the same checks give streaming requests the same HTTP 400 as the
    others. The body also shows what never reaches `validate_params`: vLLM's removed
    `guided_*` fields (ignored by vLLM 0.32, so they would not constrain anything) and
    a JSON `true` given as a number (`vllm_xargs` turns it into 1). Every POST
    route is looked at: semsoft options (or near misses such as `SEMSOFT_LABELS`) on a
    route other than `SUPPORTED_ROUTES`, or outside `vllm_xargs`, are refused
    with HTTP 400 naming the key. Requests that do not opt in pass untouched.

    The `SERVER_*` limits of `semsoft_plugin.core.request` (64 labels, k <= 256,
    ...) are applied here and only here: vLLM's admission call and the engine's
    processor cannot tell an HTTP request from an in-process one, and apply the method's
    own ranges, as every in-process engine does.

    An admitted, opted-in, non-streaming chat or completions request that asked for
    its token ids (`return_token_ids`, as `openai_request` does) gets its answer
    completed: the label answer tokens' raw log-probs its decision step's top-k lacks,
    read with one internal one-token request, in each choice's
    `semsoft_label_logprobs` (`label_logprobs`), so the client's reader is
    exact without a follow-up of its own.
    """
    if request.method == "POST":
        path = request.url.path.rstrip("/")
        config = getattr(request.app.state, "vllm_config", None)
        body = await request.body()
        checked = _check_http_body(body, path, config)
        if isinstance(checked, str):
            from starlette.responses import JSONResponse

            error = {"message": checked, "type": "BadRequestError", "param": None, "code": 400}
            return JSONResponse({"error": error}, status_code=400)
        if checked is not None:
            data, semsoft = checked
            semsoft = _own_row_key(request, data, semsoft)
            response = _forget_after(await call_next(request), semsoft.row_key)
            if config is not None and not data.get("stream") and data.get("return_token_ids"):
                return await fill_label_logprobs(request, response, semsoft, config)
            return response
    return await call_next(request)


def _forget_after(response: Any, row_key: str | None) -> Any:
    """`response`, freeing the request's parse once its body is sent: a stream is
    admitted by vLLM (which looks the parse up) only while its body is read."""
    inner = response.body_iterator

    async def body() -> Any:
        try:
            async for chunk in inner:
                yield chunk
        finally:
            forget(row_key)

    response.body_iterator = body()
    return response


def _own_row_key(request: Any, data: dict[str, Any], semsoft: SemsoftRequest) -> SemsoftRequest:
    """Mint the request's own `semsoft_row_key` and put it in the body vLLM reads (a
    client cannot send one: `parse_request(server=True)` refuses it): vLLM's admission
    call in this process finds the middleware's parse by it (`engines.vllm.parsed`), and
    a fitted row in the engine is found by this request's response alone, whatever
    another client sends (the same prompt, labels in another order, `logit_bias`, a LoRA
    adapter, the same `X-Request-Id`). `data` is the body as `_check_http_body`
    parsed it."""
    key = mint_row_key()
    owned = dataclasses.replace(semsoft, row_key=key)
    # The options as the request writes them: vLLM's admission call finds this parse
    # only for the very options it holds (`parsed.parsed_request`).
    others = {k: v for k, v in data["vllm_xargs"].items() if not k.startswith("semsoft_")}
    data["vllm_xargs"] = {**others, **owned.to_extra_args()}
    rewritten = json.dumps(data).encode()
    # Starlette's BaseHTTPMiddleware hands the downstream app the body it cached.
    request._body = rewritten
    request.scope["headers"] = [
        (name, str(len(rewritten)).encode() if name.lower() == b"content-length" else value)
        for name, value in request.scope["headers"]
    ]
    keep(owned, getattr(request.app.state, "vllm_config", None))
    return owned


# The routes whose requests semsoft reads and checks; every other route that could carry
# sampling options (/invocations, /v1/chat/completions/batch, /v1/messages, /v1/responses,
# /inference/v1/generate, ...) is refused when a body holds semsoft options, instead of
# running them by other rules (k=true as k=1, guided fields ignored, a 200 then an error).
SUPPORTED_ROUTES = ("/v1/chat/completions", "/v1/completions")


def _ours(key: Any) -> bool:
    return isinstance(key, str) and (key.startswith("semsoft_") or bool(near_misses([key])))


def _option_places(data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Where a body can carry per-request options, on any vLLM route: `vllm_xargs`,
    `sampling_params` and its `extra_args`, `extra_args`, an `extra_body` sent
    as a field (and its `vllm_xargs`), and the top level."""
    places: list[tuple[str, dict[str, Any]]] = [("the request body", data)]
    for name in ("vllm_xargs", "extra_args", "sampling_params", "extra_body"):
        inner = data.get(name)
        if isinstance(inner, dict):
            places.append((name, inner))
            for sub in ("extra_args", "vllm_xargs"):
                nested = inner.get(sub)
                if isinstance(nested, dict):
                    places.append((f"{name}.{sub}", nested))
    return places


def _check_http_body(
    body: bytes, path: str, vllm_config: Any
) -> str | tuple[dict[str, Any], SemsoftRequest] | None:
    """The refusal for a body that holds semsoft options (or near misses of them); else
    the body and its options, parsed once here, for an admitted opted-in request; else
    None (also for bodies vLLM will refuse itself: malformed JSON, wrong field types)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    found = [(where, k) for where, place in _option_places(data) for k in place if _ours(k)]
    if not found:
        return None
    supported = path.endswith(SUPPORTED_ROUTES)
    try:
        for where, place in _option_places(data):
            check_near_misses(place, f" (in {where})")
        if not supported:
            where, key = found[0]
            raise ValueError(
                f"{key} (in {where}) is not supported on {path or '/'}: semsoft options are "
                f"read on {' and '.join(SUPPORTED_ROUTES)} only (this route would ignore them "
                "or apply them by other rules)"
            )
        misplaced = [(w, k) for w, k in found if w != "vllm_xargs"]
        if misplaced:
            where, key = misplaced[0]
            raise ValueError(
                f"{key} (in {where}) is not read there: send semsoft options in vllm_xargs "
                "(openai_request builds them)"
            )
        xargs = data["vllm_xargs"]
        legacy = sorted(k for k, v in data.items() if k.startswith("guided_") and v is not None)
        if legacy:
            raise ValueError(
                f"semsoft requests do their own label constraint: drop {show_value(legacy, 80)} "
                "(guided decoding erases the silent vote; vLLM no longer applies these fields)"
            )
        # The raw JSON values (a true is still a bool here), with the SERVER_* limits:
        # the engine's processor and vLLM's admission call cannot tell an HTTP request
        # from an in-process one and apply the method's ranges, so they are enforced here.
        semsoft = parse_request(xargs, server=True)
        if semsoft is not None and semsoft.fit is not None:
            _check_fit_reply(data)
        if data.get("use_beam_search"):
            raise ValueError(
                f"use_beam_search={show_value(data['use_beam_search'])}: semsoft requests "
                "cannot use beam search (vLLM's beam search runs apart from the logits "
                "processors, so the text would be no label and the scores no Semantic "
                "Softmax); drop use_beam_search"
            )
        params = _body_sampling_params(data, path)
        if params is not None and semsoft is not None:
            validate_params(params, vllm_config=vllm_config, server=True, request=semsoft)
    except (ValueError, VLLMClientError) as error:
        # VLLMValidationError (n=2 when greedy, top_p=0, max_tokens=-1, ...) is not a
        # ValueError: let through, it was "Exception in ASGI application" and a dropped
        # kept-alive connection. Its str names the field and the value.
        return str(error)
    return None if semsoft is None or not isinstance(xargs, dict) else (data, semsoft)


def _check_fit_reply(data: dict[str, Any]) -> None:
    """Refuse a request naming a fit whose response cannot carry its fitted row: the
    row is written into a whole, non-streamed response, found by the choice's token ids."""
    if data.get("stream"):
        raise ValueError(
            f"{KEY_FIT} with stream=true: the fitted row is written into the whole response "
            "(semsoft_fitted), which a stream never is; send the request without stream"
        )
    if data.get("return_token_ids") is not True:
        raise ValueError(
            f"{KEY_FIT} needs return_token_ids=true: the fitted row is found by the choice's "
            "prompt and generated token ids (openai_request sets it)"
        )


def _body_sampling_params(data: dict[str, Any], path: str) -> SamplingParams | None:
    """The `SamplingParams` vLLM's serving layer will build from `data` (None if
    vLLM's request model refuses the body's fields: it answers that itself). Values the
    fields take but `SamplingParams` refuses (`top_p=0`, `n=2` when greedy) raise
    vLLM's `VLLMValidationError`, naming the field and the value."""
    if path.endswith("/chat/completions"):
        from vllm.entrypoints.openai.chat_completion.protocol import (
            ChatCompletionRequest as Request,
        )
    else:
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest as Request
    try:
        parsed = Request.model_validate(data)
    except (ValueError, TypeError):
        return None
    limit = getattr(parsed, "max_completion_tokens", None) or parsed.max_tokens or 16
    return parsed.to_sampling_params(limit, {})
