"""Semantic Softmax through any OpenAI-compatible server: build the request, read the response.

Usable without vLLM installed (only the ``openai`` client, or any HTTP client, and the
model's checkpoint for its tokenizer and output embeddings): with the plugin on a vLLM
server the request's ``vllm_xargs`` also make the server constrain the answer to a
label; on any other server (``plugin=False``) the scores are still read from the top
log-probabilities. :func:`openai_request` returns an :class:`OpenAIRequest`, the
``create`` keywords that also know their parsed options, so the reader takes that
object and the labels are never passed twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from semsoft_plugin.config import SemsoftConfig
from semsoft_plugin.labels import label_names
from semsoft_plugin.request import (
    Mode,
    SemsoftRequest,
    build_request,
    default_max_tokens,
    parse_request,
)
from semsoft_plugin.result import LabelResult
from semsoft_plugin.scoring import _client_model, _decision_step, _Model, _score_top_k

__all__ = ["OpenAIRequest", "openai_label_probs", "openai_label_scores", "openai_request"]


class OpenAIRequest(dict[str, Any]):
    """The keyword arguments of an ``openai`` ``create`` call, plus the request they encode.

    A plain ``dict`` to the client (``create(..., **request)``); :attr:`semsoft` is the
    parsed :class:`~semsoft_plugin.request.SemsoftRequest` the reader scores with, so
    :func:`openai_label_scores` needs neither the labels nor the options again.
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
    **method: Any,
) -> OpenAIRequest:
    """Keyword arguments for the ``openai`` client's ``create`` call that opt in.

    ``client.chat.completions.create(model=..., messages=..., **openai_request(labels))``.
    With ``plugin=False`` (a server without the plugin) no ``vllm_xargs`` are sent:
    the scores are still read from the top log-probabilities, but nothing constrains
    the generated text, and ``k`` must fit the server's top-logprobs cap (OpenAI: 20).
    ``extra_body`` adds server options, e.g. ``{"continue_final_message": True,
    "add_generation_prompt": False}`` to continue a pre-filled assistant answer
    (``"Sentiment:"``) the way :func:`semsoft_plugin.hf.classify` does.
    """
    request = build_request(  # the same checks as the server's
        labels, config=config, mode=mode, trigger=trigger, leading_space=leading_space, **method
    )
    cfg = request.config
    kwargs: dict[str, Any] = {"max_tokens": default_max_tokens(request), "temperature": 0.0}
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
    if body:
        kwargs["extra_body"] = body
    return OpenAIRequest(kwargs, request)


def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def _openai_token(model: _Model, token: str) -> int:
    if token.startswith("token_id:"):
        return int(token[len("token_id:") :])
    token_id = model.token_id(token)
    if token_id is None:
        raise ValueError(
            f"token {token!r} maps to no unique token id; ask the server for "
            "return_tokens_as_token_ids (vLLM) or use the completions API"
        )
    return token_id


def _gather_chunks(chunks: Iterable[Any]) -> dict[str, Any]:
    """Streaming chunks (``stream=True``), gathered by the caller, as one response:
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
    prompt when the request echoed it (``echo: true``; the prompt's first token has no
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
    """The parsed options of what the reader was given: the :class:`OpenAIRequest`
    that built the request, its ``create`` keywords as a plain dict (read from
    ``extra_body.vllm_xargs``), a :class:`SemsoftRequest`, or the label list plus the
    options it was sent with."""
    if isinstance(request, OpenAIRequest):
        return request.semsoft
    if isinstance(request, SemsoftRequest):
        return request
    if isinstance(request, Mapping):
        xargs = (request.get("extra_body") or {}).get("vllm_xargs")
        parsed = parse_request(xargs)
        if parsed is None:
            raise ValueError(
                "these create() keywords carry no semsoft options (plugin=False drops "
                "them): pass the OpenAIRequest openai_request returned"
            )
        return parsed
    method = {k: v for k, v in options.items() if k not in ("plugin", "api", "extra_body")}
    if "method_temperature" in method:  # sampling_params' name for the method's temperature
        method["temperature"] = method.pop("method_temperature")
    return build_request(label_names(request), **method)


def openai_label_scores(
    response: Any,
    request: OpenAIRequest | SemsoftRequest | Mapping[str, Any] | Sequence[str],
    model: Any,
    *,
    choice: int = 0,
    allow_download: bool = False,
    **options: Any,
) -> LabelResult:
    """Semantic Softmax scores of an ``openai`` chat or completion response.

    Parameters
    ----------
    response : ``ChatCompletion`` / ``Completion`` (or their dict form) from a request
        built with :func:`openai_request`, or the list of chunks of a streaming one.
        Completions with ``echo: true`` are read from the generated part only.
    request : what :func:`openai_request` returned (it knows its labels and options);
        also accepted: its keywords as a plain dict, or the label list with the same
        ``**options`` the request was sent with
    model : checkpoint directory or model name of the served model (the reader needs
        its tokenizer and output embeddings); a name not on this machine yet is
        refused unless ``allow_download=True`` (reading never downloads by itself)
    choice : which choice (``n > 1`` gives ``n``; chunks are grouped by their index)

    Raises ``ValueError`` when the choice carries no decision step (no generated token
    with log-probabilities, or a trigger never written) or its decision-step
    log-probabilities are NaN/inf.
    """
    semsoft = _semsoft_of(request, options)
    client = _client_model(model, allow_download=allow_download)
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
    steps: list[tuple[int, dict[int, float], dict[int, float]]] = []
    if content is not None:  # chat
        for entry in content:
            top = {
                _openai_token(client, _get(t, "token")): float(_get(t, "logprob"))
                for t in _get(entry, "top_logprobs") or []
            }
            chosen = _openai_token(client, _get(entry, "token"))
            steps.append((chosen, top, {chosen: float(_get(entry, "logprob"))}))
    else:  # completions
        tokens = _get(logprobs, "tokens") or []
        token_logprobs = _get(logprobs, "token_logprobs") or []
        tops = _get(logprobs, "top_logprobs") or []
        start = _generated_start(picked, token_logprobs)
        for token, logprob, top in list(zip(tokens, token_logprobs, tops, strict=False))[start:]:
            chosen = _openai_token(client, token)
            parsed = {_openai_token(client, t): float(v) for t, v in (top or {}).items()}
            steps.append((chosen, parsed, {chosen: float(logprob)}))
    generated = [chosen for chosen, _, _ in steps]
    step = _decision_step(client, semsoft, generated)
    _, top, extra = steps[step]
    return _score_top_k(client, semsoft, top, extra, generated, step)


def openai_label_probs(
    response: Any,
    request: OpenAIRequest | SemsoftRequest | Mapping[str, Any] | Sequence[str],
    model: Any,
    *,
    choice: int = 0,
    **options: Any,
) -> dict[str, float]:
    """``{label: probability}`` of an ``openai`` response; see :func:`openai_label_scores`
    (a model name not on this machine needs ``allow_download=True``)."""
    scores = openai_label_scores(response, request, model, choice=choice, **options)
    if scores.probs is None:
        raise ValueError(
            "no top-k token voted for any label and the label tokens are outside the "
            "returned top-k: the constrained-softmax fallback cannot be read from this "
            "response"
        )
    return scores.probs


# ---------------------------------------------------------------------------
