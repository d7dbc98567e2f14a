"""Semantic Softmax through any OpenAI-compatible server: build the request, read the response.

Usable without vLLM installed (only the `openai` client, or any HTTP client, and the
model's checkpoint for its tokenizer and output embeddings): with the plugin on a vLLM
server the request's `vllm_xargs` also make the server constrain the answer to a
label; on any other server (`plugin=False`) the scores are still read from the top
log-probabilities. [`openai_request`][semsoft_plugin.engines.openai.openai_request] returns an [`OpenAIRequest`][semsoft_plugin.engines.openai.OpenAIRequest], the
`create` keywords that also know their parsed options, so the reader takes that
object and the labels are never passed twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

from semsoft_plugin.core.config import SemsoftConfig
from semsoft_plugin.core.labels import label_names
from semsoft_plugin.core.request import (
    RESPONSE_FITTED,
    RESPONSE_LABEL_LOGPROBS,
    Mode,
    SemsoftRequest,
    build_request,
    default_max_tokens,
    parse_request,
)
from semsoft_plugin.core.result import LabelResult
from semsoft_plugin.engines.reader_contract import fitted_row, read_scores
from semsoft_plugin.engines.scoring import ModelScorer, ReaderError, client_model, decision_step

# vLLM's cap on logprob_token_ids per request (vllm.sampling_params.MAX_LOGPROB_TOKEN_IDS;
# not imported: this module works without vLLM).
_MAX_LOGPROB_TOKEN_IDS = 128

__all__ = [
    "OpenAIRequest",
    "openai_fetch",
    "openai_label_probs",
    "openai_label_scores",
    "openai_request",
]


class OpenAIRequest(dict[str, Any]):
    """The keyword arguments of an `openai` `create` call, plus the request they encode.

    A plain `dict` to the client (`create(..., **request)`); `semsoft` is the
    parsed `semsoft_plugin.core.request.SemsoftRequest` the reader scores with, so
    [`openai_label_scores`][semsoft_plugin.engines.openai.openai_label_scores] needs neither the labels nor the options again.
    """

    semsoft: SemsoftRequest

    def __init__(self, kwargs: Mapping[str, Any], semsoft: SemsoftRequest) -> None:
        super().__init__(kwargs)
        self.semsoft = semsoft


def openai_request(
    labels: Sequence[str],
    *,
    api: Literal["chat", "completions"] = "chat",
    config: SemsoftConfig | None = None,
    mode: Mode = "constrain",
    trigger: str | None = None,
    leading_space: bool = True,
    plugin: bool = True,
    extra_body: Mapping[str, Any] | None = None,
    fit: str | None = None,
    **method: Any,
) -> OpenAIRequest:
    """Keyword arguments for the `openai` client's `create` call that opt in.

    `client.chat.completions.create(model=..., messages=..., **openai_request(labels))`.
    With `plugin=False` (a server without the plugin) no `vllm_xargs` are sent:
    the scores are still read from the top log-probabilities, but nothing constrains
    the generated text, and `k` must fit the server's top-logprobs cap (OpenAI: 20).
    `extra_body` adds server options, e.g. `{"continue_final_message": True,
    "add_generation_prompt": False}` to continue a pre-filled assistant answer
    (`"Sentiment:"`) the way [`semsoft_plugin.engines.hf.classify`][semsoft_plugin.engines.hf.classify] does.
    `fit` names a fit the server serves (`semsoft_fit`): the choice's scores are then
    the fit's, which the server returns in `semsoft_fitted`.
    """
    request = build_request(  # the same checks as the server's
        labels,
        config=config,
        mode=mode,
        trigger=trigger,
        leading_space=leading_space,
        server=True,
        fit=fit,
        **method,
    )
    cfg = request.config
    kwargs: dict[str, Any] = {
        "max_tokens": default_max_tokens(request.labels, request.trigger),
        "temperature": 0.0,
    }
    if api == "chat":
        kwargs.update(logprobs=True, top_logprobs=cfg.k)
    elif api == "completions":
        kwargs["logprobs"] = cfg.k
    else:
        raise ValueError(f"api={api!r} must be 'chat' or 'completions'")
    body = dict(extra_body or {})
    if plugin:
        body["vllm_xargs"] = request.to_extra_args()
        body["return_tokens_as_token_ids"] = True
        body["return_token_ids"] = True  # the prompt's ids, for an exact follow-up
    if body:
        kwargs["extra_body"] = body
    return OpenAIRequest(kwargs, request)


def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def _openai_token(model: ModelScorer, token: str, api: str = "chat") -> int:
    if token.startswith("token_id:"):
        return int(token[len("token_id:") :])
    token_id = model.token_id(token)
    if token_id is None:
        # The completions advice only helps a chat response (and must not be given to one
        # that already is a completions response).
        also = " or use the completions API" if api == "chat" else ""
        raise ValueError(
            f"token {token!r} maps to no unique token id; ask the server for "
            f"return_tokens_as_token_ids (vLLM){also}"
        )
    return token_id


def _gather_chunks(chunks: Iterable[Any]) -> dict[str, Any]:
    """Streaming chunks (`stream=True`), gathered by the caller, as one response:
    per choice index, the log-probability entries of every chunk in order."""
    choices: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for part in _get(chunk, "choices") or []:
            index = int(_get(part, "index") or 0)
            merged = choices.setdefault(index, {"index": index, "logprobs": None})
            logprobs = _get(part, "logprobs")
            if logprobs is None:
                continue
            content = _get(logprobs, "content")
            if content is not None:  # chat
                merged["logprobs"] = merged["logprobs"] or {"content": []}
                merged["logprobs"]["content"].extend(content)
                continue
            target = merged["logprobs"] = merged["logprobs"] or {
                "tokens": [],
                "token_logprobs": [],
                "top_logprobs": [],
            }
            for name in ("tokens", "token_logprobs", "top_logprobs"):
                target[name].extend(_get(logprobs, name) or [])
    return {"choices": [choices[i] for i in sorted(choices)]}


def _generated_start(picked: Any, token_logprobs: Sequence[Any]) -> int:
    """Where the generated tokens start in a completions choice: 0, or after the
    prompt when the request echoed it (`echo: true`; the prompt's first token has no
    log-probability, which is how an echo is recognised)."""
    if not token_logprobs or token_logprobs[0] is not None:
        return 0
    for name in ("prompt_token_ids", "prompt_logprobs"):  # vLLM sends prompt_logprobs
        prompt = _get(picked, name)
        if prompt:
            return len(prompt)
    raise ValueError(
        "the response echoes the prompt (echo: true) but does not say how long it is: "
        "ask with return_token_ids (vLLM) or without echo"
    )


def _semsoft_of(request: Any, options: Mapping[str, Any]) -> SemsoftRequest:
    """The parsed options of what the reader was given: the [`OpenAIRequest`][semsoft_plugin.engines.openai.OpenAIRequest]
    that built the request, its `create` keywords as a plain dict (read from
    `extra_body.vllm_xargs`), a `SemsoftRequest`, or the label list plus the
    options it was sent with."""
    if isinstance(request, OpenAIRequest):
        return request.semsoft
    if isinstance(request, SemsoftRequest):
        return request
    if isinstance(request, Mapping):
        xargs = (request.get("extra_body") or {}).get("vllm_xargs")
        parsed = parse_request(xargs, server=True)
        if parsed is None:
            raise ValueError(
                "these create() keywords carry no semsoft options (plugin=False drops "
                "them): pass the OpenAIRequest openai_request returned"
            )
        return parsed
    method = {k: v for k, v in options.items() if k not in ("plugin", "api", "extra_body")}
    return build_request(label_names(request), server=True, **method)


def openai_label_scores(
    response: Any,
    request: OpenAIRequest | SemsoftRequest | Mapping[str, Any] | Sequence[str],
    model: Any,
    *,
    choice: int = 0,
    allow_download: bool = False,
    client: Any = None,
    greedy: bool | None = None,
    **options: Any,
) -> LabelResult:
    """Semantic Softmax scores of an `openai` chat or completion response.

    Parameters
    ----------
    response : Any
        `ChatCompletion` / `Completion` (or their dict form) from a request built with
        [`openai_request`][semsoft_plugin.engines.openai.openai_request], or the list of chunks of a
        streaming one. Completions with `echo: true` are read from the generated part only.
    request : OpenAIRequest | SemsoftRequest | Mapping[str, Any] | Sequence[str]
        What [`openai_request`][semsoft_plugin.engines.openai.openai_request] returned (it knows its
        labels and options); also accepted: its keywords as a plain dict, or the label list with the
        same `**options` the request was sent with
    model : Any
        Checkpoint directory or model name of the served model (the reader needs
        its tokenizer and output embeddings); a name not on this machine yet is
        refused unless `allow_download=True` (reading never downloads by itself)
    choice : int
        Which choice (`n > 1` gives `n`; chunks are grouped by their index)
    client : Any
        The `openai.OpenAI` client the request went through: given, a label log-prob the
        response lacks (streaming, no semsoft middleware) is fetched exactly with
        [`openai_fetch`][semsoft_plugin.engines.openai.openai_fetch]; without it that response
        is refused with `MissingLabelLogprobs` (docs/reader-contract.md)
    greedy : bool | None
        Whether the server picked greedily (default: from the `create`
        keywords' `temperature` when given them, else greedy); only a greedy pick
        must be the argmax of the scores

    Raises
    ------
    ValueError
        The reader contract (`semsoft_plugin.engines.reader_contract.read_scores`):
        exact scores or a named refusal. The choice carries no decision step (no
        generated token with log-probabilities, or a trigger never written) or its
        decision-step log-probabilities are NaN/inf; or one of its named subclasses:
        `MissingLabelLogprobs` (needed label log-probs not returned, no `client`),
        `EmittedLabelMismatch` (the greedy constrained pick is not the argmax),
        `CutLabel` (the text is only the start of a label); `FitNotApplied` (the request
        named a fit, `semsoft_fit`, and the server's `semsoft_fitted` says why the fit did
        not score this choice, or is missing).

    Examples
    --------
    Against a vLLM server started with the plugin (the guide "Behind the server"):

    ```python
    import openai
    from semsoft_plugin.engines.openai import openai_label_scores, openai_request

    client = openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none")
    request = openai_request(["positive", "negative"])
    response = client.completions.create(model="semsoft", prompt="Review: I loved it. Sentiment:",
                                         **request)
    result = openai_label_scores(response, request, "default", client=client)   # a LabelResult
    result.label, result.probs
    ```
    """
    semsoft = _semsoft_of(request, options)
    plugin, sent_greedy = _sent_with(request, options)
    fetch_client = client
    if greedy is None:
        greedy = sent_greedy
    reader = client_model(model, allow_download=allow_download)
    if _get(response, "choices") is None and isinstance(response, Iterable):
        response = _gather_chunks(response)
    choices = list(_get(response, "choices") or [])
    if not -len(choices) <= choice < len(choices):
        raise ValueError(f"choice={choice}: the response holds {len(choices)} choice(s)")
    picked = choices[choice]
    logprobs = _get(picked, "logprobs")
    if logprobs is None:
        raise ValueError("the response holds no log-probabilities (see openai_request)")
    content = _get(logprobs, "content")
    tops: list[dict[int, float]] = []
    generated: list[int] = []
    cut: list[bool] = []  # chat: the step's k-th top log-prob may have been pushed out
    if content is not None:  # chat
        api = "chat"
        text = _get(_get(picked, "message") or _get(picked, "delta") or {}, "content")
        for entry in content:
            top = {
                _openai_token(reader, _get(t, "token")): float(_get(t, "logprob"))
                for t in _get(entry, "top_logprobs") or []
            }
            chosen = _openai_token(reader, _get(entry, "token"))
            top.setdefault(chosen, float(_get(entry, "logprob")))  # beyond the top-k
            generated.append(chosen)
            tops.append(top)
            cut.append(_chat_top_k_cut(top, chosen, semsoft.config.k))
    else:  # completions
        api = "completions"
        text = _get(picked, "text")
        tokens = _get(logprobs, "tokens") or []
        token_logprobs = _get(logprobs, "token_logprobs") or []
        top_lists = _get(logprobs, "top_logprobs") or []
        start = _generated_start(picked, token_logprobs)
        if start and isinstance(text, str):  # an echo: the text holds the prompt too
            text = None
        for token, logprob, top in list(zip(tokens, token_logprobs, top_lists, strict=False))[
            start:
        ]:
            chosen = _openai_token(reader, token, api)
            parsed = {_openai_token(reader, t, api): float(v) for t, v in (top or {}).items()}
            parsed.setdefault(chosen, float(logprob))
            generated.append(chosen)
            tops.append(parsed)
    step = decision_step(reader, semsoft, generated)
    # What the server's admission middleware added: the label answer tokens' raw
    # log-probs the decision step's top-k lacks (semsoft_plugin.engines.vllm.label_logprobs).
    filled = _get(picked, RESPONSE_LABEL_LOGPROBS)
    if isinstance(filled, Mapping):  # more exact raw log-probs of the same step
        for token, value in filled.items():
            tops[step].setdefault(_openai_token(reader, token, api), float(value))
    elif step < len(cut) and cut[step]:
        raise ReaderError(
            "the chat response's decision step may lack its k-th top log-prob: vLLM lists "
            "the sampled token (here the constrained label, outside the top-k) first and "
            "cuts the list at top_logprobs=k; serve with semsoft's middleware (it adds what "
            "is missing) or use the completions API"
        )
    fetch = None
    if fetch_client is not None:
        prompt = _get(picked, "prompt_token_ids") or _get(response, "prompt_token_ids")
        fetch = openai_fetch(
            fetch_client, _get(response, "model"), prompt, generated[:step], model=reader
        )
    fitted = None if semsoft.fit is None else fitted_row(semsoft, _get(picked, RESPONSE_FITTED))
    return read_scores(
        semsoft,
        tops[step],
        text if isinstance(text, str) else None,
        model=reader,
        emitted_ids=generated,
        fetch=fetch,
        greedy=greedy,
        plugin=plugin,
        fitted=fitted,
    )


def _chat_top_k_cut(top: Mapping[int, float], chosen: int, k: int) -> bool:
    """Whether a chat step's `top_logprobs` may lack the `k`-th token: vLLM lists
    the first `k` entries of a dict that starts with the sampled token, so a sampled
    token outside the top-`k` pushes the `k`-th out. Seen as the sampled token
    listed first and lowest in a list of `k`."""
    if len(top) < k or next(iter(top)) != chosen:
        return False
    return all(top[chosen] <= v for v in top.values())


def _sent_with(request: Any, options: Mapping[str, Any]) -> tuple[bool, bool]:
    """Whether the request ran with the plugin and greedily, as far as the reader can
    tell: from the `create` keywords when given them; for a bare label list, the
    plugin (unless `plugin=False`) and a greedy pick (`greedy=` says otherwise;
    the method's temperature is `score_temperature`, never `temperature`)."""
    if isinstance(request, Mapping):
        plugin = "vllm_xargs" in (request.get("extra_body") or {})
        temperature = request.get("temperature", 1.0)  # the API's default
        return plugin, temperature is not None and float(temperature) == 0.0
    return bool(options.get("plugin", True)), True


def openai_fetch(
    client: Any,
    served_model: str | None,
    prompt_token_ids: Sequence[int] | None,
    generated: Sequence[int] = (),
    *,
    model: Any = None,
) -> Callable[[list[int]], dict[int, float]]:
    """A follow-up that asks a vLLM server for exact decision-step log-probs of tokens.

    One completions request on the prompt's token ids plus the tokens generated before
    the decision step, `max_tokens=1` and `logprob_token_ids` (vLLM 0.32: exactly
    those tokens' raw log-probs, at most 128 a request); it does not opt in, so the
    plugin leaves it untouched and the prefix cache serves the prompt. Used by
    [`openai_label_scores`][semsoft_plugin.engines.openai.openai_label_scores] (`client=`) for answer tokens outside the returned
    top-k. `prompt_token_ids` come back when the request asked for
    `return_token_ids` ([`openai_request`][semsoft_plugin.engines.openai.openai_request] does).
    """
    from semsoft_plugin.engines.scoring import FetchUnavailable

    def fetch(token_ids: list[int]) -> dict[int, float]:
        if not prompt_token_ids:
            raise FetchUnavailable(
                "the response does not carry its prompt token ids to ask for them (send "
                "return_token_ids: true, as openai_request does)"
            )
        found: dict[int, float] = {}
        for begin in range(0, len(token_ids), _MAX_LOGPROB_TOKEN_IDS):
            chunk = [int(t) for t in token_ids[begin : begin + _MAX_LOGPROB_TOKEN_IDS]]
            reply = client.completions.create(
                model=served_model,
                prompt=[int(t) for t in (*prompt_token_ids, *generated)],
                max_tokens=1,
                temperature=0.0,
                logprobs=1,
                extra_body={"logprob_token_ids": chunk, "return_tokens_as_token_ids": True},
            )
            tops = _get(_get(_get(reply, "choices")[0], "logprobs"), "top_logprobs")[0]
            for token, value in (tops or {}).items():
                key = (
                    int(token[len("token_id:") :])
                    if str(token).startswith("token_id:")
                    else (_openai_token(model, token, "completions") if model is not None else None)
                )
                if key is not None and key in chunk:
                    found[key] = float(value)
        return found

    return fetch


def openai_label_probs(
    response: Any,
    request: OpenAIRequest | SemsoftRequest | Mapping[str, Any] | Sequence[str],
    model: Any,
    *,
    choice: int = 0,
    **options: Any,
) -> dict[str, float]:
    """`{label: probability}` of an `openai` response; see [`openai_label_scores`][semsoft_plugin.engines.openai.openai_label_scores]
    (a model name not on this machine needs `allow_download=True`)."""
    scores = openai_label_scores(response, request, model, choice=choice, **options)
    if scores.probs is None:
        raise ValueError(
            "no top-k token voted for any label and the label tokens are outside the "
            "returned top-k: the constrained-softmax fallback cannot be read from this "
            "response"
        )
    return scores.probs


# ---------------------------------------------------------------------------
