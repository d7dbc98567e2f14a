"""Opted-in `SamplingParams`: built ([`sampling_params`][semsoft_plugin.engines.vllm.params.sampling_params]) and checked at admission.

[`validate_params`][semsoft_plugin.engines.vllm.params.validate_params] is what the processor's `validate_params` hook runs in the
frontend process, for every request, before the engine sees it. The checks that need
the engine's config ([`check_on_engine`][semsoft_plugin.engines.vllm.params.check_on_engine]: labels resolved with the engine's
tokenizer, its limits, its fits) run where that config is handed over: in the server's
admission middleware (HTTP 400 before the engine sees the request) and in the
processor when an offline request joins the engine.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from vllm import SamplingParams
from vllm.sampling_params import SamplingType

from semsoft_plugin.core.config import SemsoftConfig, renamed_message
from semsoft_plugin.core.labels import LabelSet
from semsoft_plugin.core.request import (
    KEY_FIT,
    KEY_HIDDEN,
    KEY_LABELS,
    KEY_MODE,
    KEY_ROW_KEY,
    KEY_TRIGGER,
    Mode,
    SemsoftRequest,
    build_request,
    default_max_tokens,
    mint_row_key,
    parse_request,
)
from semsoft_plugin.engines.scoring import CACHE_SIZE
from semsoft_plugin.engines.vllm.parsed import keep, parsed_request
from semsoft_plugin.engines.vllm.reader_tables import fit_refusal

if TYPE_CHECKING:
    from vllm.config import VllmConfig

# The processor's import path: what `LLM(logits_processors=[...])` and the server's
# `--logits-processors` take (the package also registers it as an entry point).
ENTRY_POINT = "semsoft_plugin.engines.vllm:SemanticSoftmaxLogitsProcessor"
# sampling_params' keywords that set a method option rather than a sampling one: every
# SemsoftConfig field (``temperature`` stays the engine's sampling temperature).
_METHOD_KWARGS = tuple(f.name for f in dataclasses.fields(SemsoftConfig))


def validate_params(
    params: SamplingParams,
    *,
    vllm_config: VllmConfig | None = None,
    server: bool = False,
    request: SemsoftRequest | None = None,
) -> SemsoftRequest | None:
    """Check an opted-in request's options and its compatibility with the method.

    `server=True` for a request that arrived over HTTP: the `SERVER_*` limits of
    `semsoft_plugin.core.request` apply (the server's admission middleware passes
    it, with the `request` it parsed, before the engine sees the request). vLLM's own
    admission call cannot tell an HTTP request from an in-process one, so there the
    method's own ranges apply, as on every in-process engine; the request is parsed
    once per process and found again by its row key (`engines.vllm.parsed`).

    Returns the parsed options (None when the request did not opt in). Raises
    `ValueError` with the reason; the server turns it into HTTP 400 and the other
    requests are not affected.

    With the engine's `vllm_config` (the middleware has it; vLLM's admission call hands
    over the `SamplingParams` only) it also runs
    [`check_on_engine`][semsoft_plugin.engines.vllm.params.check_on_engine]: the labels
    resolved with the engine's tokenizer, the engine's limits and its fits. Offline the
    processor runs those checks when the request joins the engine.

    Besides the options themselves it refuses, for opted-in requests, what would make
    the emitted label or the returned scores disagree with Semantic Softmax on the
    model's logits: fewer than `k` log-probabilities (the scores are read from
    them), structured outputs / guided choice (they mask the logits before any
    processor and before the raw log-probabilities), and, in constrain mode, token
    edits that act before or after the processor at the decision step (logit bias,
    allowed tokens, bad words, min_tokens, repetition/presence/frequency penalties).
    """
    if request is None:
        if server:
            request = parse_request(params.extra_args, server=True)
        else:
            request = parsed_request(params.extra_args)[0]
    if request is None:
        return None
    k = request.config.k
    if params.logprobs is None or (params.logprobs != -1 and params.logprobs < k):
        raise ValueError(
            f"semsoft reads its scores from the top-k raw log-probabilities: set "
            f"logprobs (top_logprobs over HTTP) to at least k={k} (got {params.logprobs}); "
            f"the engine needs max_logprobs >= {k} (LLM(..., max_logprobs={k}) or "
            f"--max-logprobs {k})"
        )
    if params.logprob_token_ids:
        raise ValueError("semsoft requests cannot use logprob_token_ids (it replaces the top-k)")
    if params.structured_outputs is not None:
        raise ValueError(
            "semsoft requests do their own label constraint: drop structured outputs / "
            "guided choice (they erase the silent vote before any processor sees it)"
        )
    if request.mode == "constrain":
        edits = {
            "logit_bias": bool(params.logit_bias),
            "allowed_token_ids": bool(params.allowed_token_ids),
            "bad_words": bool(params.bad_words),
            "min_tokens": bool(params.min_tokens),
            "repetition_penalty": params.repetition_penalty != 1.0,
            "presence_penalty": params.presence_penalty != 0.0,
            "frequency_penalty": params.frequency_penalty != 0.0,
        }
        used = [name for name, on in edits.items() if on]
        if used:
            raise ValueError(
                f"semsoft constrain mode cannot be combined with {', '.join(used)}: they "
                "change the decision-step logits, so the label would not follow P_sem "
                f"(use {KEY_MODE}='observe' to keep them)"
            )
    _check_stops(request, params)
    if vllm_config is not None:
        check_on_engine(request, params, vllm_config)
    if request.keeps_rows and request.row_key is None and not server:
        raise ValueError(
            f"a request that names a fit ({KEY_FIT}) or keeps a hidden state ({KEY_HIDDEN}) "
            f"needs its own {KEY_ROW_KEY}, the key of its row in the engine: build its "
            "SamplingParams with semsoft_plugin.engines.vllm.sampling_params (one per "
            "request), or on a server start it with --middleware "
            "semsoft_plugin.engines.vllm.admission, which mints it"
        )
    return request


def check_on_engine(
    request: SemsoftRequest, params: SamplingParams, vllm_config: Any, *, fits: bool = True
) -> None:
    """The checks that need the engine's config (`ValueError` naming the reason): `k`
    within its `max_logprobs`, a fit it can serve, labels its tokenizer tells apart
    and can emit, what its scheduling lets the processor follow, no stop token inside a
    label. Run by the server's middleware before the engine sees a request, and by the
    processor when an offline request joins the engine (`fits=False`: there a fit the
    engine cannot serve is named by the reader, `FitNotApplied`)."""
    check_engine_logprobs(vllm_config.model_config, request.config.k)
    if fits and request.fit is not None:
        refusal = fit_refusal(vllm_config.model_config, vllm_config.parallel_config)
        if refusal is not None:
            raise ValueError(refusal)
    admitted = check_label_set(request, vllm_config.model_config)
    _check_servable(request, params, vllm_config, admitted.multi_token)
    cut = sorted(set(params.stop_token_ids or ()) & admitted.label_ids)
    if cut and request.mode == "constrain":
        raise ValueError(
            f"stop_token_ids {cut[:5]} are tokens of the labels: the engine would stop "
            "inside a label and the text would be cut; drop them"
        )


def check_engine_logprobs(model_config: Any, wanted: int, name: str = "semsoft_k") -> None:
    """Refuse a top-`wanted` the engine cannot return, naming the engine setting: its
    `max_logprobs` (vLLM would refuse `logprobs` above it with its own message,
    which does not say what to change) or its vocabulary. `name` is what the caller
    calls the number (`semsoft_k`, `k`, `keep_logprobs`)."""
    vocab = model_config.get_vocab_size()
    if wanted > vocab:
        raise ValueError(f"{name}={wanted} exceeds this model's vocabulary size ({vocab})")
    limit = model_config.max_logprobs
    if limit != -1 and limit < wanted:
        raise ValueError(
            f"{name}={wanted} exceeds this engine's max_logprobs={limit} (the scores are "
            f"read from the top-k raw log-probabilities): create the engine with "
            f"LLM(..., max_logprobs={wanted}) (server: --max-logprobs {wanted})"
        )


def _check_stops(request: SemsoftRequest, params: SamplingParams) -> None:
    """Refuse stop strings that would cut an emitted label (a stop inside
    `" positive"` ends the text at `" pos"` while the scores name the whole label)."""
    if request.mode != "constrain" or not params.stop:
        return
    stops = [params.stop] if isinstance(params.stop, str) else list(params.stop)
    prefix = " " if request.leading_space else ""
    for label in request.labels:
        text = prefix + label.strip()
        for stop in stops:
            if stop and stop in text:
                raise ValueError(
                    f"stop={stop!r} would cut the label {label!r} (its text {text!r} holds "
                    "it): the engine would end the text inside the label; drop that stop"
                )


def _check_servable(
    request: SemsoftRequest, params: SamplingParams, vllm_config: Any, multi_token: bool
) -> None:
    """Refuse what the engine's processor could not follow: on a V1 engine that leaves
    async-scheduling placeholders in the output tokens (package docstring), a trigger
    and a sampled multi-token label would otherwise run partly unconstrained."""
    if request.mode != "constrain":
        return
    if not getattr(vllm_config.scheduler_config, "async_scheduling", False):
        return
    runner = "v2" if vllm_config.use_v2_model_runner else "v1"
    if not unrepaired_output_tokens(vllm_config, runner):
        return
    greedy = params.sampling_type == SamplingType.GREEDY
    if request.trigger is not None or (multi_token and not greedy):
        what = KEY_TRIGGER if request.trigger is not None else "sampled multi-token labels"
        raise ValueError(
            f"semsoft cannot follow {what} on this engine: it schedules asynchronously and "
            "the processor was loaded only through the entry point, so vLLM does not repair "
            f"the output tokens it reads; start it with --logits-processors {ENTRY_POINT} "
            "or --no-async-scheduling"
        )


_TOKENIZERS: dict[tuple[Any, ...], Any] = {}
_TOKENIZERS_LOCK = threading.Lock()


class AdmittedLabels(NamedTuple):
    """What the engine's tokenizer makes of an admitted label set."""

    multi_token: bool  # some label takes several tokens
    label_ids: frozenset[int]  # every token of every label
    answer_ids: tuple[int, ...]  # each label's answer token, in label order


# (tokenizer, labels, leading space) -> (refusal or None, the labels); LRU-bounded.
_ADMITTED: OrderedDict[tuple[Any, ...], tuple[str | None, AdmittedLabels]] = OrderedDict()
_REFUSED = AdmittedLabels(False, frozenset(), ())


def _tokenizer_key(model_config: Any) -> tuple[Any, ...]:
    return (
        str(model_config.tokenizer),
        getattr(model_config, "tokenizer_revision", None),
        bool(getattr(model_config, "trust_remote_code", False)),
    )


def load_tokenizer(model_config: Any) -> Any:
    """The engine's tokenizer, loaded once per process (the processor, the admission
    check and the server middleware share it)."""
    key = _tokenizer_key(model_config)
    with _TOKENIZERS_LOCK:
        found = _TOKENIZERS.get(key)
    if found is None:
        from transformers import AutoTokenizer

        loaded = AutoTokenizer.from_pretrained(key[0], revision=key[1], trust_remote_code=key[2])
        with _TOKENIZERS_LOCK:
            found = _TOKENIZERS.setdefault(key, loaded)
    return found


def check_label_set(request: SemsoftRequest, model_config: Any) -> AdmittedLabels:
    """Refuse labels the engine's tokenizer cannot tell apart or cannot emit as text
    (`ValueError` naming them); else what the tokenizer makes of them. Outcomes are
    cached per distinct label set, at most `CACHE_SIZE`: the admission check, and the
    server middleware after it, tokenise a label set once."""
    key = (_tokenizer_key(model_config), request.labels, request.leading_space)
    with _TOKENIZERS_LOCK:
        outcome = _ADMITTED.get(key)
        if outcome is not None:
            _ADMITTED.move_to_end(key)
    if outcome is None:
        try:
            labels = LabelSet(
                list(request.labels),
                load_tokenizer(model_config),
                leading_space=request.leading_space,
            )
            ids = frozenset(t for seq in labels.token_sequences for t in seq)
            answers = tuple(int(t) for t in labels.answer_token_ids)
            outcome = (None, AdmittedLabels(bool(labels.multi_token_labels), ids, answers))
        except ValueError as error:
            outcome = (str(error), _REFUSED)
        with _TOKENIZERS_LOCK:
            _ADMITTED[key] = outcome
            while len(_ADMITTED) > CACHE_SIZE:
                _ADMITTED.popitem(last=False)
    refusal, admitted = outcome
    if refusal is not None:
        raise ValueError(f"{KEY_LABELS}: {refusal}")
    return admitted


def sampling_params(
    labels: Sequence[str],
    *,
    config: SemsoftConfig | None = None,
    mode: Mode = "constrain",
    trigger: str | None = None,
    leading_space: bool = True,
    fit: str | None = None,
    hidden: bool = False,
    **kwargs: Any,
) -> SamplingParams:
    """Ordinary `SamplingParams` for a request that opts in to Semantic Softmax.

    Parameters
    ----------
    labels : Sequence[str]
        Label names (whole words after a space unless `leading_space=False`): a
        list of at least two distinct strings (a `str` is refused, not split; a
        LabelSet gives its names, which the engine binds to its own tokenizer)
    config : SemsoftConfig | None
        Semantic Softmax settings; any of its fields given as a keyword (`k`,
        `vote`, `score_temperature`, ...) overrides it (`temperature` is the
        ordinary sampling temperature)
    mode : Mode
        `"constrain"` (default) or `"observe"`
    trigger : str | None
        Decide after this generated text (e.g. `"</think>"`)
    leading_space : bool
        Score labels as whole words after a space
    fit : str | None
        The name of a fit the engine serves (`semsoft_plugin.engines.vllm.fits`): its
        probabilities replace the scores and, in constrain mode, choose the label
    hidden : bool
        Keep the decision step's hidden state, read back from its logits row, in the
        engine's worker for the offline reader (`classify_vllm(hidden=True)`; the engine
        needs the worker extension `semsoft_plugin.engines.vllm.fits.FittedRows`)
    **kwargs : Any
        Any other `SamplingParams` argument. Defaults: greedy
        (`temperature=0`), `logprobs=k`, `max_tokens` = the longest label's
        UTF-8 bytes + 2 without a trigger (EOS ends it earlier), 256 with one, as on
        every engine (`semsoft_plugin.core.request.default_max_tokens`).
    """
    for name in kwargs:
        renamed = renamed_message(name) if name != "temperature" else None
        if renamed:
            raise ValueError(renamed)
    method = {name: kwargs.pop(name) for name in _METHOD_KWARGS if name in kwargs}
    request = build_request(
        labels, config=config, mode=mode, trigger=trigger, leading_space=leading_space, fit=fit,
        hidden=hidden, **method,
    )  # fmt: skip
    # Every request gets its own row key: its one parse is found again by it
    # (`engines.vllm.parsed`), and a fit's or a hidden state's row is kept under it.
    request = dataclasses.replace(request, row_key=mint_row_key())
    extra = dict(kwargs.pop("extra_args", None) or {})
    extra.update(request.to_extra_args())
    kwargs.setdefault("temperature", 0.0)
    kwargs.setdefault("logprobs", request.config.k)
    kwargs.setdefault("max_tokens", default_max_tokens(request.labels, request.trigger))
    params = SamplingParams(extra_args=extra, **kwargs)
    keep(request)
    validate_params(params, request=request)
    return params


def own_row_key(params: SamplingParams) -> SamplingParams:
    """A copy of `params` with a fresh `semsoft_row_key`: one request's own rows in the
    engine, for a prompt list that would otherwise share one `SamplingParams`."""
    fresh = params.clone()
    key = mint_row_key()
    fresh.extra_args = {**(params.extra_args or {}), KEY_ROW_KEY: key}
    request = parsed_request(params.extra_args)[0]
    if request is not None:
        keep(dataclasses.replace(request, row_key=key))
    return fresh


def unrepaired_output_tokens(vllm_config: Any, runner: str) -> bool:
    """True when the V1 runner leaves `-1` placeholders in the output tokens this
    processor reads: async scheduling on and no processor in
    `model_config.logits_processors` (vLLM sets `logitsprocs_need_output_token_ids`
    from that list alone, not from entry-point plugins)."""
    if runner != "v1":
        return False  # Model Runner V2 writes sampled tokens on the device first
    scheduler = getattr(vllm_config, "scheduler_config", None)
    if not getattr(scheduler, "async_scheduling", False):
        return False
    return not getattr(vllm_config.model_config, "logits_processors", None)
