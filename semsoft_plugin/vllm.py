"""vLLM adapter: Semantic Softmax inside the engine, offline and behind the OpenAI server.

One class, :class:`SemanticSoftmaxLogitsProcessor`, satisfies both of vLLM 0.32's
logits-processor interfaces (the V1 model runner's, used on CPU, and Model Runner
V2's, picked on most GPUs) and is loaded by class, by the string
``"semsoft_plugin.vllm:SemanticSoftmaxLogitsProcessor"``, by the server's
``--logits-processors`` flag or through the ``vllm.logits_processors`` entry point.
Requests opt in through ``SamplingParams.extra_args`` (``vllm_xargs`` over HTTP);
every other request is left untouched, bit for bit.

How the scores come back (the mechanism, and why)
-------------------------------------------------
No vLLM API returns side data from a logits processor. This adapter returns the
scores through the ordinary output: an opted-in request asks for the top-``k``
*raw* log-probabilities (``logprobs=k``; ``top_logprobs=k`` over HTTP), which vLLM
takes before any processor, penalty or temperature, and
:func:`label_scores` / :func:`openai_label_scores` compute Semantic Softmax from them
with the same core code and the model's output embeddings. Semantic Softmax only
ever reads the top-``k`` probabilities and the embeddings, and it is a ratio, so the
top-``k`` raw log-probabilities determine it exactly. Chosen over the alternatives
because

* it needs no engine-wide setting: ``logprobs_mode="processed_logprobs"`` (the
  other working route) would change the log-probabilities of *every* request on the
  engine, including those that never opted in, and would return values already
  bent by temperature, top-p/top-k and min-p;
* raw log-probabilities do not depend on the request's sampling settings, so the
  scores are the model's, whatever the temperature;
* it also yields the coverage and the top-``k`` mass, which a value written into
  the label logits cannot carry;
* the very same reader works against any OpenAI-compatible server that returns top
  log-probabilities for an open-weights model, with no plugin on it (then without
  the label constraint, and with ``k`` capped by the server's top-logprobs limit).

Its price: the engine needs ``max_logprobs >= k`` (vLLM's default is 20, the
method's ``k`` is 50: ``LLM(..., max_logprobs=50)`` / ``--max-logprobs 50``), and
the reader needs the output embeddings (read once per model from the checkpoint).
The constrained softmax (the baseline) needs every label's log-probability; when a
label's answer token is outside the returned top-``k`` it is ``None`` (and so are
the scores in the rare 0/0 case, whose defined result *is* the constrained
softmax); :func:`classify_vllm` fetches those with one extra one-token request per
affected prompt (``logprob_token_ids``), so it is always complete.

The processor's own job is the label constraint (vLLM's guided choice masks the
logits before any processor and before the raw log-probabilities, erasing the silent
vote, so it is refused for opted-in requests). At the decision step it computes
Semantic Softmax from the same logits and leaves only the label answer tokens, at
``log P_sem``: greedy decoding emits the calibrated argmax, sampling draws from
``P_sem`` (then shaped by temperature/top-p as usual). The rest of a multi-token
label is forced, then EOS.

The decision step
-----------------
The first generated token, or with ``trigger`` the step right after the generated
text ends with the trigger (matched within generated text only). The V1 runner
also shows the processor the rows of partial prefills under chunked prefill, whose
samples are discarded; the processor keeps no record from those rows and derives
everything from the request's output tokens on each step, so the last write at the
decision step (the real one) is the one sampled. Model Runner V2 reports each row's
position, and rows before the end of the prompt are skipped outright.

Async scheduling (placeholder output tokens)
--------------------------------------------
With async scheduling (vLLM's default on GPUs) the V1 runner schedules step ``n + 1``
before step ``n``'s sampled token has reached the host: its bookkeeping appends a
``-1`` placeholder to the request's output-token list (the very list a processor was
handed in ``BatchUpdate.added``) and repairs it in place, right before the sampler,
only when ``InputBatch.logitsprocs_need_output_token_ids`` is set, i.e. when
``model_config.logits_processors`` is non-empty (``LLM(logits_processors=[...])``,
``--logits-processors``), or when some request in the batch uses penalties or bad
words. A processor loaded *only* through the entry point sees ``-1`` for every
generated token (vLLM issue 52461). Model Runner V2 has no placeholders: its
``post_update`` writes each sampled token into ``req_states.all_token_ids`` on the
device before the next step. The CPU platform turns async scheduling off
(``CpuPlatform.check_and_update_config``), whatever the engine argument says.

So the processor never acts on a placeholder: the trigger search stops at the first
``-1`` (and resumes there once the token is known), and a row whose decision-step
token is still ``-1`` is not forced. For greedy requests (the default) it does not
need the list: greedy decoding takes the argmax of the logits this processor wrote,
so the processor records that pick itself at the decision step and forces the rest
of that label and EOS from it. A sampled (temperature > 0) multi-token label or a
trigger on an engine whose output tokens are never repaired cannot be followed;
the processor warns once, naming the fix (``--logits-processors ...`` or
``--no-async-scheduling``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import sys
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor
from vllm import SamplingParams
from vllm.sampling_params import SamplingType
from vllm.v1.sample.logits_processor import BatchUpdate, process_dict_updates
from vllm.v1.sample.logits_processor import LogitsProcessor as V1LogitsProcessor
from vllm.v1.worker.gpu.sample.logits_processor.interface import (
    LogitsContext,
    LogitsProcRequestState,
)
from vllm.v1.worker.gpu.sample.logits_processor.interface import (
    LogitsProcessor as V2LogitsProcessor,
)

from semsoft_plugin.config import SemsoftConfig
from semsoft_plugin.core import OutputEmbeddings, SemanticSoftmax
from semsoft_plugin.embeddings import from_checkpoint
from semsoft_plugin.labels import LabelSet, label_names

if TYPE_CHECKING:
    from vllm.config import VllmConfig

__all__ = [
    "ENTRY_POINT",
    "LabelScores",
    "MAX_K",
    "MAX_LABELS",
    "MAX_LABEL_BYTES",
    "SemanticSoftmaxLogitsProcessor",
    "SemsoftRequest",
    "admission",
    "classify_vllm",
    "label_probs",
    "label_scores",
    "openai_label_probs",
    "openai_label_scores",
    "openai_request",
    "output_embeddings",
    "parse_request",
    "sampling_params",
    "validate_params",
]

logger = logging.getLogger(__name__)

ENTRY_POINT = "semsoft_plugin.vllm:SemanticSoftmaxLogitsProcessor"
Mode = Literal["constrain", "observe"]
_MODES = ("constrain", "observe")

# extra_args keys; flat values only so the same keys work in ``vllm_xargs``.
KEY_LABELS = "semsoft_labels"
KEY_MODE = "semsoft_mode"
KEY_TRIGGER = "semsoft_trigger"
KEY_LEADING_SPACE = "semsoft_leading_space"
_CONFIG_KEYS = {f"semsoft_{f.name}": f.name for f in dataclasses.fields(SemsoftConfig)}
_METHOD_KWARGS = (
    "k",
    "tau",
    "center",
    "own_vote",
    "normalize_votes",
    "residual",
    "tau_quantile",
    "semantic_weight",
)
_KEYS = {KEY_LABELS, KEY_MODE, KEY_TRIGGER, KEY_LEADING_SPACE, *_CONFIG_KEYS}

# Server clients are untrusted: these bound the work and memory one request can ask
# for. A label of at most MAX_LABEL_BYTES UTF-8 bytes is at most that many tokens (+1
# for the leading space) on byte-level tokenizers.
MAX_LABELS = 64
MAX_LABEL_BYTES = 64
MAX_TRIGGER_BYTES = 64
MAX_K = 256
# Distinct label sets (with their settings) kept resolved per engine.
_CACHE_SIZE = 128


# ---------------------------------------------------------------------------
# Per-request options
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SemsoftRequest:
    """The options of one opted-in request, parsed and checked.

    Attributes
    ----------
    labels : label names, in the order results are reported
    config : Semantic Softmax settings
    mode : ``"constrain"`` (the emitted text is a label chosen from ``P_sem``) or
        ``"observe"`` (generation untouched; scores only)
    trigger : decide after this generated text instead of at the first token
    leading_space : labels are scored as whole words after a space
    """

    labels: tuple[str, ...]
    config: SemsoftConfig
    mode: Mode = "constrain"
    trigger: str | None = None
    leading_space: bool = True

    def to_extra_args(self) -> dict[str, Any]:
        """Flat ``extra_args`` / ``vllm_xargs`` (str, int, float or lists of str)."""
        args: dict[str, Any] = {KEY_LABELS: list(self.labels), KEY_MODE: self.mode}
        for key, name in _CONFIG_KEYS.items():
            value = getattr(self.config, name)
            if value is None:  # an unset option (tau_quantile): the default applies
                continue
            args[key] = int(value) if isinstance(value, bool) else value
        args[KEY_LEADING_SPACE] = int(self.leading_space)
        if self.trigger is not None:
            args[KEY_TRIGGER] = self.trigger
        return args

    @property
    def key(self) -> tuple[Any, ...]:
        """What a resolved label set depends on (the trigger and mode do not)."""
        return (self.labels, self.leading_space, self.config)


_FLAG_RULE = "a boolean (true/false or 0/1)"
_RULES = {
    "k": f"an integer in [1, MAX_K={MAX_K}]",
    "tau": "a finite number in [-1, 1)",
    "temperature": "a finite number > 0",
    "center": _FLAG_RULE,
    "own_vote": _FLAG_RULE,
    "normalize_votes": _FLAG_RULE,
    "residual": _FLAG_RULE,
    "tau_quantile": "a finite number in (0, 1)",
    "semantic_weight": "a finite number in [0, 1]",
}


def _show(value: Any, limit: int = 40) -> str:
    """``repr(value)`` cut to ``limit`` characters, for error messages about client
    values of any size."""
    try:
        text = repr(value)
    except ValueError:  # an int too long for str()
        return "<an integer too long to print>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _refuse(key: str, value: Any, rule: str) -> ValueError:
    return ValueError(f"{key}={_show(value)} must be {rule}")


def _flag(key: str, value: Any) -> bool:
    # vllm_xargs values are str|int|float (JSON booleans arrive as 0/1): accept 0/1 too.
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in ("true", "false", "0", "1"):
        return value.lower() in ("true", "1")
    raise _refuse(key, value, _FLAG_RULE)


def _utf8_bytes(text: str) -> int | None:
    """UTF-8 length of ``text``; None for a lone surrogate (JSON allows ``"\\ud800"``,
    no tokenizer does)."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return None


def _option(key: str, name: str, value: Any) -> Any:
    """One method option, type-checked (a bool is not a number, NaN and inf are not
    finite, a fraction is not an integer); ranges are left to :class:`SemsoftConfig`,
    except the server's ``MAX_K``."""
    rule = _RULES[name]
    if rule == _FLAG_RULE:
        return _flag(key, value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _refuse(key, value, rule)
    if isinstance(value, float) and not math.isfinite(value):
        raise _refuse(key, value, rule)
    if name != "k":
        try:
            return float(value)
        except OverflowError:  # an int beyond the float range (JSON allows any size)
            raise _refuse(key, value, rule) from None
    if isinstance(value, float) and not value.is_integer():
        raise _refuse(key, value, rule)
    if not 1 <= value <= MAX_K:
        raise _refuse(key, value, rule)
    return int(value)


def parse_request(extra_args: Mapping[str, Any] | None) -> SemsoftRequest | None:
    """The semsoft options in ``extra_args``, or None when the request did not opt in.

    A request opts in by carrying ``semsoft_labels``. Every option is checked here, once,
    with the same rules as :class:`~semsoft_plugin.config.SemsoftConfig` (plus the
    server's size limits). Raises ``ValueError`` naming the option, its value (cut to
    a few characters) and what is allowed; the server answers it with HTTP 400.
    """
    if not extra_args:
        return None
    present = {k for k in extra_args if isinstance(k, str) and k.startswith("semsoft_")}
    if not present:
        return None
    if KEY_LABELS not in extra_args:
        raise ValueError(
            f"semsoft options {_show(sorted(present))} given without {KEY_LABELS!r} "
            "(the label list)"
        )
    unknown = present - _KEYS
    if unknown:
        raise ValueError(
            f"unknown semsoft option(s) {_show(sorted(unknown), 80)}; known: {sorted(_KEYS)}"
        )
    labels = extra_args[KEY_LABELS]
    if isinstance(labels, str) or not isinstance(labels, Sequence):
        raise ValueError(f"{KEY_LABELS} must be a list of strings, got {_show(labels)}")
    if not 2 <= len(labels) <= MAX_LABELS:
        raise ValueError(
            f"{KEY_LABELS} has {len(labels)} labels; allowed: 2 to MAX_LABELS={MAX_LABELS}"
        )
    for label in labels:
        if not isinstance(label, str) or not label.strip():
            raise ValueError(f"{KEY_LABELS}: label {_show(label)} is not a non-empty string")
        if _utf8_bytes(label) is None:
            raise ValueError(f"{KEY_LABELS}: label {_show(label)} is not valid Unicode")
        if _utf8_bytes(label) > MAX_LABEL_BYTES:
            raise ValueError(
                f"{KEY_LABELS}: label {_show(label, 24)} is longer than "
                f"MAX_LABEL_BYTES={MAX_LABEL_BYTES} UTF-8 bytes"
            )
    if len(set(labels)) != len(labels):
        twice = next(label for i, label in enumerate(labels) if label in labels[:i])
        raise ValueError(f"{KEY_LABELS} holds the label {_show(twice)} twice")

    overrides: dict[str, Any] = {}
    for key, name in _CONFIG_KEYS.items():
        if key in extra_args:
            overrides[name] = _option(key, name, extra_args[key])
    try:
        config = SemsoftConfig().replace(**overrides)
    except ValueError as error:  # SemsoftConfig names the field: "tau=1.5 must be ..."
        raise ValueError(f"semsoft_{error}") from None

    mode = extra_args.get(KEY_MODE, "constrain")
    if not isinstance(mode, str) or mode not in _MODES:
        raise _refuse(KEY_MODE, mode, f"one of {_MODES}")
    trigger = extra_args.get(KEY_TRIGGER)
    if trigger is not None:
        rule = f"a non-empty string of at most MAX_TRIGGER_BYTES={MAX_TRIGGER_BYTES} UTF-8 bytes"
        if not isinstance(trigger, str) or not trigger:
            raise _refuse(KEY_TRIGGER, trigger, rule)
        size = _utf8_bytes(trigger)
        if size is None or size > MAX_TRIGGER_BYTES:
            raise _refuse(KEY_TRIGGER, trigger, rule)
    leading_space = _flag(KEY_LEADING_SPACE, extra_args.get(KEY_LEADING_SPACE, True))
    return SemsoftRequest(tuple(labels), config, mode, trigger, leading_space)


def validate_params(
    params: SamplingParams, *, vllm_config: VllmConfig | None = None
) -> SemsoftRequest | None:
    """Check an opted-in request's options and its compatibility with the method.

    Returns the parsed options (None when the request did not opt in). Raises
    ``ValueError`` with the reason; the server turns it into HTTP 400 and the other
    requests are not affected.

    With the engine's ``vllm_config`` (given, or found from vLLM's admission call, see
    :func:`_admission_config`) it also resolves the labels with the engine's tokenizer
    and refuses a label set the decision step cannot tell apart (two labels sharing a
    first token), naming both labels, instead of letting it reach the engine.

    Besides the options themselves it refuses, for opted-in requests, what would make
    the emitted label or the returned scores disagree with Semantic Softmax on the
    model's logits: fewer than ``k`` log-probabilities (the scores are read from
    them), structured outputs / guided choice (they mask the logits before any
    processor and before the raw log-probabilities), and, in constrain mode, token
    edits that act before or after the processor at the decision step (logit bias,
    allowed tokens, bad words, min_tokens, repetition/presence/frequency penalties).
    """
    request = parse_request(params.extra_args)
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
    config = vllm_config if vllm_config is not None else _admission_config()
    if config is not None:
        multi_token = _check_label_set(request, config.model_config)
        _check_servable(request, params, config, multi_token)
    return request


def _check_servable(
    request: SemsoftRequest, params: SamplingParams, vllm_config: Any, multi_token: bool
) -> None:
    """Refuse what the engine's processor could not follow: on a V1 engine that leaves
    async-scheduling placeholders in the output tokens (module docstring), a trigger
    and a sampled multi-token label would otherwise run partly unconstrained."""
    if request.mode != "constrain":
        return
    if not getattr(vllm_config.scheduler_config, "async_scheduling", False):
        return
    runner = "v2" if vllm_config.use_v2_model_runner else "v1"
    if not _unrepaired_output_tokens(vllm_config, runner):
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


def _admission_config() -> Any | None:
    """The engine's ``VllmConfig`` when called from vLLM's request admission, else None.

    vLLM hands ``validate_params`` the ``SamplingParams`` only, but it calls it from
    ``InputProcessor._validate_params`` (every request: ``LLM.generate``, the OpenAI
    server, V1 and Model Runner V2 validators alike), in the frontend process, which
    holds the engine's config. That caller is found a few frames up. The processor
    itself cannot supply the tokenizer there: it is built in the engine-core process,
    not in the server's frontend.
    """
    module = sys.modules.get("vllm.v1.engine.input_processor")
    if module is None:
        return None
    frame = sys._getframe(1)
    for _ in range(_ADMISSION_FRAMES):
        frame = frame.f_back
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if isinstance(owner, module.InputProcessor):
            return owner.vllm_config
    return None


# How far up validate_params' callers the admission frame may be (vLLM 0.32: 3-4).
_ADMISSION_FRAMES = 8
_TOKENIZERS: dict[tuple[Any, ...], Any] = {}
_TOKENIZERS_LOCK = threading.Lock()
# (tokenizer, labels, leading space) -> (refusal or None, any multi-token label); LRU-bounded.
_ADMITTED: OrderedDict[tuple[Any, ...], tuple[str | None, bool]] = OrderedDict()


def _tokenizer_key(model_config: Any) -> tuple[Any, ...]:
    return (
        str(model_config.tokenizer),
        getattr(model_config, "tokenizer_revision", None),
        bool(getattr(model_config, "trust_remote_code", False)),
    )


def _load_tokenizer(model_config: Any) -> Any:
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


def _check_label_set(request: SemsoftRequest, model_config: Any) -> bool:
    """Refuse labels the engine's tokenizer cannot tell apart (``ValueError`` naming
    them); else whether some label takes several tokens. Outcomes are cached per
    distinct label set, at most ``_CACHE_SIZE``."""
    key = (_tokenizer_key(model_config), request.labels, request.leading_space)
    with _TOKENIZERS_LOCK:
        outcome = _ADMITTED.get(key)
        if outcome is not None:
            _ADMITTED.move_to_end(key)
    if outcome is None:
        try:
            labels = LabelSet(
                list(request.labels),
                _load_tokenizer(model_config),
                leading_space=request.leading_space,
            )
            outcome = (None, bool(labels.multi_token_labels))
        except ValueError as error:
            outcome = (str(error), False)
        with _TOKENIZERS_LOCK:
            _ADMITTED[key] = outcome
            while len(_ADMITTED) > _CACHE_SIZE:
                _ADMITTED.popitem(last=False)
    refusal, multi_token = outcome
    if refusal is not None:
        raise ValueError(f"{KEY_LABELS}: {refusal}")
    return multi_token


def sampling_params(
    labels: Sequence[str],
    *,
    config: SemsoftConfig | None = None,
    mode: Mode = "constrain",
    trigger: str | None = None,
    leading_space: bool = True,
    **kwargs: Any,
) -> SamplingParams:
    """Ordinary ``SamplingParams`` for a request that opts in to Semantic Softmax.

    Parameters
    ----------
    labels : label names (whole words after a space unless ``leading_space=False``): a
        list of at least two distinct strings (a ``str`` is refused, not split; a
        LabelSet gives its names, which the engine binds to its own tokenizer)
    config : Semantic Softmax settings; ``k``, ``tau``, ``center``, ``own_vote``,
        ``normalize_votes``, ``residual`` and ``tau_quantile`` given as keywords
        override it, and so does
        ``method_temperature`` (the method's final temperature: ``temperature`` is
        the ordinary sampling temperature)
    mode : ``"constrain"`` (default) or ``"observe"``
    trigger : decide after this generated text (e.g. ``"</think>"``)
    leading_space : score labels as whole words after a space
    **kwargs : any other ``SamplingParams`` argument. Defaults: greedy
        (``temperature=0``), ``logprobs=k``, ``max_tokens`` = longest label in
        characters + 2 without a trigger (EOS ends it earlier), 256 with one.
    """
    method = {name: kwargs.pop(name) for name in _METHOD_KWARGS if name in kwargs}
    if "method_temperature" in kwargs:
        method["temperature"] = kwargs.pop("method_temperature")
    cfg = (config or SemsoftConfig()).replace(**method)
    labels = label_names(labels)
    request = SemsoftRequest(tuple(labels), cfg, mode, trigger, leading_space)
    extra = dict(kwargs.pop("extra_args", None) or {})
    extra.update(request.to_extra_args())
    kwargs.setdefault("temperature", 0.0)
    kwargs.setdefault("logprobs", cfg.k)
    if "max_tokens" not in kwargs:
        kwargs["max_tokens"] = 256 if trigger else max(len(s) for s in labels) + 2
    params = SamplingParams(extra_args=extra, **kwargs)
    validate_params(params)
    return params


# ---------------------------------------------------------------------------
# Resolved label sets: tokenizer, embeddings and scorers, shared per model
# ---------------------------------------------------------------------------


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


def _known_length(tokens: Sequence[int], start: int) -> int:
    """Length of the prefix of ``tokens`` free of async-scheduling placeholders
    (``-1``), scanning from a little before ``start`` (earlier tokens were known)."""
    for i in range(max(0, start - 1), len(tokens)):
        if tokens[i] < 0:
            return i
    return len(tokens)


def _unrepaired_output_tokens(vllm_config: Any, runner: str) -> bool:
    """True when the V1 runner leaves ``-1`` placeholders in the output tokens this
    processor reads: async scheduling on and no processor in
    ``model_config.logits_processors`` (vLLM sets ``logitsprocs_need_output_token_ids``
    from that list alone, not from entry-point plugins)."""
    if runner != "v1":
        return False  # Model Runner V2 writes sampled tokens on the device first
    scheduler = getattr(vllm_config, "scheduler_config", None)
    if not getattr(scheduler, "async_scheduling", False):
        return False
    return not getattr(vllm_config.model_config, "logits_processors", None)


def _record_greedy_picks(logits: Tensor, rows: Tensor, group: list[tuple[int, Any]]) -> None:
    """Remember, for greedy rows, the label the engine will sample from ``logits``.

    vLLM's greedy sampler takes ``argmax`` of the processed logits, and only this
    processor's label scores are finite in these rows, so the same ``argmax`` here is
    the engine's pick (ties included). Used when async scheduling has not yet written
    the sampled token back (module docstring). Overwritten on every decision, so a
    discarded partial-prefill row never leaves a stale pick."""
    greedy = [i for i, (_, state) in enumerate(group) if state.greedy]
    for _, state in group:
        state.predicted = None
    if not greedy:
        return
    index = torch.tensor(greedy, device=logits.device)
    picks = logits.index_select(0, rows.index_select(0, index)).argmax(-1).tolist()
    for i, token in zip(greedy, picks, strict=True):
        state = group[i][1]
        state.predicted = state.scoring.answer_to_label.get(int(token))


# ---------------------------------------------------------------------------
# The processor
# ---------------------------------------------------------------------------


# id(vllm_config), runner -> (the config, the processor that serves it), both weak.
_ENGINES: dict[tuple[int, str], tuple[weakref.ref[Any], weakref.ref[Any]]] = {}
_ENGINES_LOCK = threading.Lock()


def _claim_engine(vllm_config: Any, runner: str, processor: Any) -> bool:
    """Register ``processor`` as the one serving this engine; True if another already is."""
    key = (id(vllm_config), runner)
    with _ENGINES_LOCK:
        held = _ENGINES.get(key)
        if held is not None and held[0]() is vllm_config and held[1]() is not None:
            return True
        _ENGINES[key] = (weakref.ref(vllm_config), weakref.ref(processor))
        return False


# Requests the processor could not score, for the readers in this process: (prompt
# token ids, output tokens before the decision step) -> the reason. Bounded like the
# label-set cache. Only in-process readers see it (the engine process of a server
# is another one); there a model-made NaN still shows in the raw log-probabilities.
_UNSCORED: OrderedDict[tuple[tuple[int, ...], tuple[int, ...]], str] = OrderedDict()
_UNSCORED_LOCK = threading.Lock()


def _record_unscored(prompt: Sequence[int], before: Sequence[int], reason: str) -> None:
    key = (tuple(int(t) for t in prompt), tuple(int(t) for t in before))
    with _UNSCORED_LOCK:
        _UNSCORED[key] = reason
        _UNSCORED.move_to_end(key)
        while len(_UNSCORED) > _CACHE_SIZE:
            _UNSCORED.popitem(last=False)


def _unscored_reason(
    model: _Model,
    request: SemsoftRequest,
    prompt: Sequence[int] | None,
    generated: Sequence[int],
    step: int,
) -> str | None:
    """Why the engine left this output unconstrained, if it recorded one: only when
    the decision-step token is not a label (a constrained row always emits one)."""
    if not _UNSCORED or request.mode != "constrain" or prompt is None:
        return None
    if len(generated) > step and int(generated[step]) in model.scoring(request).answer_to_label:
        return None
    key = (tuple(int(t) for t in prompt), tuple(int(t) for t in generated[:step]))
    with _UNSCORED_LOCK:
        return _UNSCORED.get(key)


@dataclass
class _Active:
    """Engine-side state of one opted-in request (constrain mode)."""

    request: SemsoftRequest
    scoring: _Scoring | None  # None: the label set was refused; the request is ended
    eos_token_id: int | None
    output_ids: list[int] | None = None  # V1: the runner's live list
    decided_at: int | None = None  # output index of the decision step
    checked_upto: int = 0  # trigger search resumes here
    label: int | None = None  # chosen label, once sampled
    greedy: bool = True  # the engine samples the argmax of the written logits
    predicted: int | None = None  # greedy: the label this processor's logits make it pick
    prompt_ids: Sequence[int] | None = None  # V1: the runner's prompt list (for _UNSCORED)


class SemanticSoftmaxLogitsProcessor(V1LogitsProcessor, V2LogitsProcessor):
    """Semantic Softmax label constraint for opted-in requests, for both vLLM runners.

    Constructed by vLLM, never by hand: ``(vllm_config, device, is_pin_memory)`` by the
    V1 model runner, ``(vllm_config, req_states)`` by Model Runner V2; the branch is
    taken on those arguments. Requests without ``semsoft_labels`` in their
    ``extra_args`` are never touched (their logits rows are not written).

    What it does for an opted-in request in constrain mode: at the decision step,
    only the labels' answer tokens keep a finite logit, set to ``log P_sem``; the
    remaining tokens of the sampled label are then forced, then EOS. In observe mode
    it does nothing in the engine (the scores are read from the output).

    The embeddings and the tokenizer are loaded on the first opted-in request, so an
    engine that merely has the plugin installed (entry point) pays nothing.
    """

    def __init__(self, vllm_config: VllmConfig, *args: Any) -> None:
        if len(args) == 2:  # V1: (device, is_pin_memory)
            self._runner = "v1"
            self._device = torch.device(args[0])
            self._req_states: LogitsProcRequestState | None = None
        elif len(args) == 1:  # Model Runner V2: (req_states)
            self._runner = "v2"
            self._req_states = args[0]
            self._device = torch.device(self._req_states.device)
        else:
            raise TypeError(
                "SemanticSoftmaxLogitsProcessor(vllm_config, device, is_pin_memory) or "
                "(vllm_config, req_states)"
            )
        self._config = vllm_config
        # vLLM does not deduplicate: a class both installed (entry point) and passed
        # explicitly is built twice for one engine. The second copy stands down so the
        # constraint is applied once.
        self.inert = _claim_engine(vllm_config, self._runner, self)
        self._model: _Model | None = None
        self._model_lock = threading.Lock()
        self._active: dict[int, _Active] = {}  # V1: batch index; V2: request slot
        # Bounded like the label-set cache: one entry per distinct refusal, so a stream
        # of distinct refused label sets cannot grow it without end.
        self._warned: OrderedDict[str, None] = OrderedDict()
        max_logprobs = getattr(vllm_config.model_config, "max_logprobs", None)
        default_k = SemsoftConfig().k
        if max_logprobs is not None and max_logprobs != -1 and max_logprobs < default_k:
            logger.info(
                "semsoft: this engine has max_logprobs=%s < k=%s; opted-in requests with the "
                "default k will be refused: set max_logprobs=%s (--max-logprobs %s)",
                max_logprobs,
                default_k,
                default_k,
                default_k,
            )
        self.placeholders = not self.inert and _unrepaired_output_tokens(vllm_config, self._runner)
        if self.placeholders:
            logger.warning(
                "semsoft: this engine schedules asynchronously and no logits processor was "
                "passed explicitly, so vLLM does not repair the placeholder (-1) output "
                "tokens processors see; greedy label requests are still completed, sampled "
                "multi-token labels and triggers are not: start it with --logits-processors "
                "%s (LLM(logits_processors=[...])) or --no-async-scheduling",
                ENTRY_POINT,
            )

    # -- both interfaces -----------------------------------------------------
    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """Refuse malformed or oversized semsoft options (HTTP 400 on the server)."""
        validate_params(sampling_params)

    def is_argmax_invariant(self) -> bool:
        """The label constraint changes greedy picks."""
        return False

    def _engine_model(self) -> _Model:
        with self._model_lock:
            if self._model is None:
                model_config = self._config.model_config
                self._model = _Model(
                    model_config.model,
                    _load_tokenizer(model_config),
                    vocab_size=model_config.get_vocab_size(),
                    device=self._device,
                )
            return self._model

    def _activate(self, params: SamplingParams) -> _Active | None:
        if self.inert:
            return None
        try:
            request = parse_request(params.extra_args)
        except ValueError:
            return None  # refused at admission by validate_params; never reaches here
        if request is None or request.mode != "constrain":
            return None
        model = self._engine_model()
        eos = params.eos_token_id
        if eos is None:
            eos = getattr(model.tokenizer, "eos_token_id", None)
        greedy = params.sampling_type == SamplingType.GREEDY
        try:
            scoring = model.scoring(request)
        except ValueError as error:
            # Normally refused at admission (validate_params resolves the labels with
            # the engine's tokenizer). Should a request get here without that check, it
            # is ended at its first step (EOS), never run unconstrained; the reader
            # raises the same error on its output.
            self._warn(str(error), f"semsoft: label set refused, request ended: {error}")
            return _Active(request, None, eos, greedy=greedy)
        return _Active(request, scoring, eos, greedy=greedy)

    def _warn(self, key: str, message: str) -> None:
        """Log ``message`` once per ``key`` among the last ``_CACHE_SIZE`` distinct keys."""
        if key in self._warned:
            self._warned.move_to_end(key)
            return
        self._warned[key] = None
        while len(self._warned) > _CACHE_SIZE:
            self._warned.popitem(last=False)
        logger.warning(message)

    # -- V1 --------------------------------------------------------------------
    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """V1: follow requests through adds, removals and moves of the batch."""

        def new_state(
            params: SamplingParams, _prompt: list[int] | None, output_ids: list[int]
        ) -> _Active | None:
            state = self._activate(params)
            if state is not None:
                state.output_ids = output_ids  # live reference, grows each step
                state.prompt_ids = _prompt
            return state

        process_dict_updates(self._active, batch_update, new_state)

    # -- V2 --------------------------------------------------------------------
    def add_request(self, req_idx: int, sampling_params: SamplingParams) -> bool:
        """V2: (re)initialise a slot; True when this request is constrained."""
        state = self._activate(sampling_params)
        if state is None:
            self._active.pop(req_idx, None)
            return False
        self._active[req_idx] = state
        return True

    def apply_staged_writes(self) -> None:
        """V2: nothing is staged (state is host-side)."""

    # -- the step ----------------------------------------------------------------
    def apply(self, logits: Tensor, ctx: LogitsContext | None = None) -> Tensor:
        """Constrain the opted-in rows; every other row is left as it is."""
        if not self._active:
            return logits
        if self._runner == "v1":
            rows = [
                (index, state, state.output_ids or [], len(state.output_ids or []))
                for index, state in self._active.items()
                if index < logits.shape[0]
            ]
        else:
            if ctx is None:
                raise ValueError("Model Runner V2 passes a LogitsContext to apply()")
            rows = self._v2_rows(logits, ctx)
        decide: dict[int, list[tuple[int, _Active]]] = {}
        force_rows: list[int] = []
        force_tokens: list[int] = []
        for row, state, generated, j in rows:
            action = self._plan(state, generated, j)
            if action == "decide":
                decide.setdefault(id(state.scoring), []).append((row, state))
            elif isinstance(action, int):
                force_rows.append(row)
                force_tokens.append(action)
        for group in decide.values():
            self._decide(logits, group)
        if force_rows:
            index = torch.tensor(force_rows, device=logits.device)
            logits[index] = float("-inf")
            logits[index, torch.tensor(force_tokens, device=logits.device)] = 0.0
        return logits

    def _plan(self, state: _Active, generated: Any, j: int) -> str | int | None:
        """What to do to the row that samples output token ``j``: decide, force a
        token (int) or nothing. Derived from the output tokens only, so rows whose
        sample is discarded (partial prefills) leave no trace.

        A ``-1`` in the output tokens is an async-scheduling placeholder for a token
        sampled but not yet copied to the host (module docstring): it is never read
        as a token. The trigger search stops before it and resumes there on a later
        step; a decision-step token that is still a placeholder is taken from the
        processor's own greedy pick, and otherwise the row waits (nothing is forced
        from a guess, and no label is cached from it)."""
        if state.scoring is None:  # refused label set: end the request now
            return None if state.eos_token_id is None else int(state.eos_token_id)
        if state.decided_at is None:
            trigger = state.request.trigger
            if trigger is None:
                state.decided_at = 0
            else:
                if j < 1:
                    return None
                tokens = list(generated(j) if callable(generated) else generated[:j])
                known = _known_length(tokens, state.checked_upto)
                if known < j:
                    self._warn_placeholder()
                tokenizer = self._engine_model().tokenizer
                found = _trigger_position(tokenizer, tokens[:known], trigger, state.checked_upto)
                state.checked_upto = known + 1
                if found < 0:
                    return None
                state.decided_at = found
        m = j - state.decided_at
        if m == 0:
            state.label = None
            return "decide"
        if m < 0:
            return None
        if state.label is None:
            tokens = generated(state.decided_at + 1) if callable(generated) else generated
            answer = int(tokens[state.decided_at])
            if answer >= 0:
                state.label = state.scoring.answer_to_label.get(answer, -1)
            elif state.predicted is not None:
                state.label = state.predicted
            else:
                self._warn_placeholder()
                sequences = state.scoring.labels.token_sequences
                if (
                    m == 1
                    and state.eos_token_id is not None
                    and all(len(q) == 1 for q in sequences)
                ):
                    return int(state.eos_token_id)  # one-token labels all end here
                return None
        if state.label < 0:
            return None
        sequence = state.scoring.labels.token_sequences[state.label]
        if m < len(sequence):
            return int(sequence[m])
        if m == len(sequence) and state.eos_token_id is not None:
            return int(state.eos_token_id)
        return None

    def _decide(self, logits: Tensor, group: list[tuple[int, _Active]]) -> None:
        """Write ``log P_sem`` into the label tokens of rows at their decision step.

        A row it cannot score (NaN or +inf logits, every token masked), or every row of
        a label set whose scoring fails, is left exactly as the engine had it, and so is
        the rest of that request (no label is forced): one bad row must never fail the
        batch, its neighbours go on. The request is recorded in ``_UNSCORED`` so that
        the reader reports why instead of returning scores for text it did not choose.
        """
        scoring = group[0][1].scoring
        rows = torch.tensor([row for row, _ in group], device=logits.device)
        picked = logits.index_select(0, rows)
        nan = torch.isnan(picked).any(-1)
        pos_inf = (picked == float("inf")).any(-1)
        masked = (picked == float("-inf")).all(-1)
        bad = nan | pos_inf | masked
        if bool(bad.any()):
            for (_, state), is_nan, is_inf, is_bad in zip(
                group, nan.tolist(), pos_inf.tolist(), bad.tolist(), strict=True
            ):
                if is_bad:
                    what = (
                        "NaN" if is_nan else "+inf" if is_inf else "only -inf (every token masked)"
                    )
                    self._leave_unscored(state, f"its decision-step logits hold {what}")
            keep = [i for i, is_bad in enumerate(bad.tolist()) if not is_bad]
            if not keep:
                return
            group = [group[i] for i in keep]
            rows = rows[keep]
            picked = picked[keep]
        try:
            result = scoring.scorer(picked)
        except Exception as error:  # never let one label set fail the engine's batch
            logger.exception("semsoft: scoring failed; the rows are left as they are")
            for _, state in group:
                self._leave_unscored(state, f"scoring failed: {error}")
            return
        log_p = result.semantic.clamp_min(1e-30).log().to(logits.device, logits.dtype)
        answer = scoring.answer_ids.to(logits.device)
        logits[rows] = float("-inf")
        logits[rows.unsqueeze(1), answer.unsqueeze(0)] = log_p
        _record_greedy_picks(logits, rows, group)

    def _warn_placeholder(self) -> None:
        self._warn(
            "placeholder",
            "semsoft: output tokens are still async-scheduling placeholders (-1) when the "
            "processor runs, so a sampled label or a trigger cannot be followed; start the "
            f"engine with --logits-processors {ENTRY_POINT} (LLM(logits_processors=[...])) "
            "or --no-async-scheduling",
        )

    def _leave_unscored(self, state: _Active, reason: str) -> None:
        state.label = -1  # nothing forced later: the request runs as the engine has it
        self._warn(
            f"unscored: {reason[:80]}",
            f"semsoft: a request's row is left as the engine had it, {reason}; its reader "
            "raises with this reason",
        )
        if state.prompt_ids is not None and state.output_ids is not None:
            _record_unscored(state.prompt_ids, state.output_ids[: state.decided_at or 0], reason)

    def _v2_rows(self, logits: Tensor, ctx: LogitsContext) -> list[tuple[int, _Active, Any, int]]:
        slots = ctx.idx_mapping_np
        if logits.shape[0] != len(slots):
            # One row per draft token (speculative decoding): the decision step is not
            # one row. Leave the rows alone rather than constrain the wrong one.
            self._warn("spec", "semsoft: speculative decoding rows are not constrained")
            return []
        assert self._req_states is not None
        prompt_len = self._req_states.prompt_len.np
        all_tokens = self._req_states.all_token_ids.gpu
        rows = []
        for row, slot in enumerate(slots.tolist()):
            state = self._active.get(slot)
            if state is None:
                continue
            start = int(prompt_len[slot])
            # Tokens visible to the token sampled now (exact without spec decoding);
            # below the prompt length the row is a partial prefill, its sample discarded.
            j = int(ctx.seq_lens_upper_bound_np[row]) - start
            if j < 0:
                continue

            def generated(n: int, slot: int = slot, start: int = start) -> list[int]:
                return all_tokens[slot, start : start + n].tolist()

            rows.append((row, state, generated, j))
        return rows


# ---------------------------------------------------------------------------
# Reading the scores from the output
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LabelScores:
    """Semantic Softmax scores read from one generated output.

    Attributes
    ----------
    label : the label the text spells (constrain mode) or the calibrated argmax;
        None if neither is known
    probs : label -> calibrated probability; None only in the 0/0 case when the
        constrained softmax it falls back to cannot be read (label tokens outside
        the returned top-k)
    constrained_probs : label -> softmax over the label tokens only; None when some
        label's answer token is outside the returned top-k
    fallback : no kept token voted for any label (``probs`` is the constrained softmax)
    coverage : share of the top-k mass that voted for some label
    top_k_mass : total probability of the k kept tokens
    decision_step : index of the generated token that was the decision step
    """

    label: str | None
    probs: dict[str, float] | None
    constrained_probs: dict[str, float] | None
    fallback: bool
    coverage: float
    top_k_mass: float
    decision_step: int


def _score_top_k(
    model: _Model,
    request: SemsoftRequest,
    top: Mapping[int, float],
    extra: Mapping[int, float],
    emitted: Sequence[int],
    decision_step: int,
) -> LabelScores:
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
    vocab = model.embeddings.vocab_size
    sparse = torch.full((vocab,), float("-inf"))
    ids = torch.tensor(list(top.keys()), dtype=torch.long)
    values = torch.tensor(list(top.values()), dtype=torch.float32)
    if bool((ids >= vocab).any()):
        raise ValueError("a returned token id lies outside the model's vocabulary")
    sparse[ids] = values
    known = {**extra, **top}
    answer_ids = scoring.labels.answer_token_ids
    # Answer tokens outside the top-k whose log-probs are known (the sampled token, a
    # follow-up) enter the row too: they rank below every kept token, so the top-k is
    # unchanged, and the pool with the constrained softmax reads them exactly.
    for t in answer_ids:
        if t not in top and t in known and 0 <= t < vocab:
            sparse[t] = known[t]
    # Semantic Softmax and coverage are ratios of top-k probabilities: the missing
    # normaliser cancels, so the sparse vector gives exactly the full-vocabulary result.
    result = scoring.scorer(sparse)
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
    return LabelScores(
        label=label,
        probs=probs,
        constrained_probs=(
            None if constrained is None else dict(zip(names, constrained.tolist(), strict=True))
        ),
        fallback=fallback,
        coverage=float(result.coverage),
        top_k_mass=float(values.exp().sum()),
        decision_step=decision_step,
    )


def _request_of(params_or_labels: Any, options: Mapping[str, Any]) -> SemsoftRequest:
    if isinstance(params_or_labels, SamplingParams):
        request = parse_request(params_or_labels.extra_args)
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
    request = parse_request(
        sampling_params(list(params_or_labels), **options).extra_args  # validates options
    )
    assert request is not None
    return request


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


def label_scores(
    request_output: Any,
    params: SamplingParams | Sequence[str],
    model: Any,
    *,
    choice: int = 0,
    allow_download: bool = False,
    **options: Any,
) -> LabelScores:
    """Semantic Softmax scores of an offline ``RequestOutput``.

    Parameters
    ----------
    request_output : what ``LLM.generate`` returned for the request
    params : the request's ``SamplingParams`` (from :func:`sampling_params`), or its
        label list plus the same ``options``
    model : the ``vllm.LLM`` (or its checkpoint directory / model name): the reader
        needs the tokenizer and the output embeddings, loaded once per model. Given the
        ``LLM``, answer tokens outside the returned top-k are fetched with one
        ``max_tokens=1`` request, so the scores equal transformers'; given a path or a
        name, such a token counts with the smallest kept probability (an upper bound)
    choice : which completion (``n > 1`` gives ``n``), in vLLM's order
    allow_download : a model name not on this machine yet (a known name not cached, a
        hub ``owner/name`` not in the hub cache) is refused unless True: reading scores
        never starts a download by itself

    Raises ``ValueError`` for this request only when it cannot be scored: it carries
    no decision step, its decision-step log-probabilities are NaN/inf, or the engine's
    processor could not score its row and left it unconstrained (the reason is named).
    """
    request = _request_of(params, options)
    client = _client_model(model, allow_download=allow_download)
    outputs = list(getattr(request_output, "outputs", None) or [])
    if not -len(outputs) <= choice < len(outputs):
        raise ValueError(f"choice={choice}: the output holds {len(outputs)} completion(s)")
    completion = outputs[choice]
    if not completion.logprobs:
        raise ValueError(
            "the output holds no log-probabilities: the request needs logprobs >= k "
            "(use semsoft_plugin.vllm.sampling_params)"
        )
    generated = list(completion.token_ids)[: len(completion.logprobs)]
    step = _decision_step(client, request, generated)
    reason = _unscored_reason(
        client, request, getattr(request_output, "prompt_token_ids", None), generated, step
    )
    if reason is not None:
        raise ValueError(
            f"the engine could not score this request at its decision step ({reason}), so "
            "it left the request's logits as they were: the text is not a chosen label "
            "and no scores are given for it"
        )
    entries = completion.logprobs[step]
    k = request.config.k
    top = {
        int(t): float(lp.logprob)
        for t, lp in entries.items()
        if lp.rank is not None and lp.rank <= k
    }
    extra = {int(t): float(lp.logprob) for t, lp in entries.items()}
    prompt_ids = getattr(request_output, "prompt_token_ids", None)
    if getattr(model, "llm_engine", None) is not None and prompt_ids is not None:
        extra.update(
            _missing_answer_logprobs(model, client, request, prompt_ids, generated, step, extra)
        )
    return _score_top_k(client, request, top, extra, generated, step)


def _missing_answer_logprobs(
    llm: Any,
    client: _Model,
    request: SemsoftRequest,
    prompt_ids: Sequence[int],
    generated: Sequence[int],
    step: int,
    known: Mapping[int, float],
) -> dict[int, float]:
    """The decision step's raw log-probs of answer tokens the output does not hold.

    The default pools the semantic distribution with the constrained softmax, which
    needs every answer token's log-prob; the output has only the top-k. One
    ``max_tokens=1`` request on ``prompt + generated[:step]`` (the prefix cache serves
    the prompt) fetches them, so the offline reader equals transformers. Not needed
    (and not sent) with ``semantic_weight=1``, where the top-k is all there is to read.
    """
    answer_ids = client.scoring(request).labels.answer_token_ids
    missing = [t for t in dict.fromkeys(answer_ids) if t not in known]
    if not missing or request.config.semantic_weight == 1.0:
        return {}
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import MAX_LOGPROB_TOKEN_IDS

    prompt = TokensPrompt(prompt_token_ids=list(prompt_ids) + list(generated[:step]))
    found: dict[int, float] = {}
    for start in range(0, len(missing), MAX_LOGPROB_TOKEN_IDS):
        chunk = missing[start : start + MAX_LOGPROB_TOKEN_IDS]
        probe = SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=chunk)
        out = llm.generate([prompt], probe, use_tqdm=False)[0]
        entries = out.outputs[0].logprobs[0]
        found.update({t: float(entries[t].logprob) for t in chunk})
    return found


def label_probs(
    request_output: Any,
    params: SamplingParams | Sequence[str],
    model: Any,
    *,
    choice: int = 0,
    **options: Any,
) -> dict[str, float]:
    """``{label: probability}`` (Semantic Softmax) of an offline ``RequestOutput``.

    See :func:`label_scores` (``allow_download`` too). Raises ``ValueError`` in the rare 0/0 case whose
    fallback (the constrained softmax) cannot be read from the output because a label
    token is outside the returned top-k; :func:`classify_vllm` handles that case.
    """
    scores = label_scores(request_output, params, model, choice=choice, **options)
    if scores.probs is None:
        raise ValueError(
            "no top-k token voted for any label and the label tokens are outside the "
            "returned top-k, so the constrained-softmax fallback cannot be read from this "
            "output; use classify_vllm, or raise k"
        )
    return scores.probs


# ---------------------------------------------------------------------------
# OpenAI-compatible servers
# ---------------------------------------------------------------------------


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
) -> dict[str, Any]:
    """Keyword arguments for the ``openai`` client's ``create`` call that opt in.

    ``client.chat.completions.create(model=..., messages=..., **openai_request(labels))``.
    With ``plugin=False`` (a server without the plugin) no ``vllm_xargs`` are sent:
    the scores are still read from the top log-probabilities, but nothing constrains
    the generated text, and ``k`` must fit the server's top-logprobs cap (OpenAI: 20).
    ``extra_body`` adds server options, e.g. ``{"continue_final_message": True,
    "add_generation_prompt": False}`` to continue a pre-filled assistant answer
    (``"Sentiment:"``) the way :func:`semsoft_plugin.hf.classify` does.
    """
    cfg = (config or SemsoftConfig()).replace(**method)
    labels = label_names(labels)
    request = SemsoftRequest(tuple(labels), cfg, mode, trigger, leading_space)
    parse_request(request.to_extra_args())  # same checks as the server
    max_tokens = 256 if trigger else max(len(s) for s in labels) + 2
    kwargs: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0.0}
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
    return kwargs


async def admission(request: Any, call_next: Any) -> Any:
    """vLLM OpenAI-server middleware: semsoft's checks before any response starts.

    ``python -m vllm.entrypoints.openai.api_server ... --middleware
    semsoft_plugin.vllm.admission``. Why a middleware: vLLM admits a request (and calls
    :meth:`SemanticSoftmaxLogitsProcessor.validate_params`) only when the serving layer
    first reads the engine's result stream, and for ``stream: true`` that happens inside
    an already-sent HTTP 200, so a refusal arrives as an error event (vLLM's own checks,
    e.g. ``top_logprobs`` above ``--max-logprobs``, behave the same). Run on the request
    body first, the same checks give streaming requests the same HTTP 400 as the
    others. The body also shows what never reaches ``validate_params``: vLLM's removed
    ``guided_*`` fields (ignored by vLLM 0.32, so they would not constrain anything) and
    a JSON ``true`` given as a number (``vllm_xargs`` turns it into 1). Requests that
    do not opt in pass untouched.
    """
    path = request.url.path.rstrip("/")
    if request.method == "POST" and path.endswith("/completions"):
        config = getattr(request.app.state, "vllm_config", None)
        message = _check_http_body(await request.body(), path, config)
        if message is not None:
            from starlette.responses import JSONResponse

            error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
            return JSONResponse({"error": error}, status_code=400)
    return await call_next(request)


def _check_http_body(body: bytes, path: str, vllm_config: Any) -> str | None:
    """The refusal for an opted-in chat/completions body, or None (also for bodies
    vLLM will refuse itself: malformed JSON, wrong field types)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    xargs = data.get("vllm_xargs")
    if not isinstance(xargs, dict) or not any(
        isinstance(k, str) and k.startswith("semsoft_") for k in xargs
    ):
        return None
    try:
        legacy = sorted(k for k, v in data.items() if k.startswith("guided_") and v is not None)
        if legacy:
            raise ValueError(
                f"semsoft requests do their own label constraint: drop {_show(legacy, 80)} "
                "(guided decoding erases the silent vote; vLLM no longer applies these fields)"
            )
        parse_request(xargs)  # the raw JSON values: a true is still a bool here
        params = _body_sampling_params(data, path)
        if params is not None:
            validate_params(params, vllm_config=vllm_config)
    except ValueError as error:
        return str(error)
    return None


def _body_sampling_params(data: dict[str, Any], path: str) -> SamplingParams | None:
    """The ``SamplingParams`` vLLM's serving layer will build from ``data`` (None if
    vLLM's own request validation refuses the body: it answers that itself)."""
    if path.endswith("/chat/completions"):
        from vllm.entrypoints.openai.chat_completion.protocol import (
            ChatCompletionRequest as Request,
        )
    else:
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest as Request
    try:
        parsed = Request.model_validate(data)
        limit = getattr(parsed, "max_completion_tokens", None) or parsed.max_tokens or 16
        return parsed.to_sampling_params(limit, {})
    except (ValueError, TypeError):
        return None


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


def openai_label_scores(
    response: Any,
    labels: Sequence[str],
    model: Any,
    *,
    choice: int = 0,
    allow_download: bool = False,
    **options: Any,
) -> LabelScores:
    """Semantic Softmax scores of an ``openai`` chat or completion response.

    Parameters
    ----------
    response : ``ChatCompletion`` / ``Completion`` (or their dict form) from a request
        built with :func:`openai_request`, or the list of chunks of a streaming one.
        Completions with ``echo: true`` are read from the generated part only.
    labels, **options : the same labels and options the request was sent with
    model : checkpoint directory or model name of the served model (the reader needs
        its tokenizer and output embeddings); a name not on this machine yet is
        refused unless ``allow_download=True`` (reading never downloads by itself)
    choice : which choice (``n > 1`` gives ``n``; chunks are grouped by their index)

    Raises ``ValueError`` when the choice carries no decision step (no generated token
    with log-probabilities, or a trigger never written) or its decision-step
    log-probabilities are NaN/inf.
    """
    cfg_options = {k: v for k, v in options.items() if k != "plugin"}
    request = _request_of(label_names(labels), cfg_options)
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
    step = _decision_step(client, request, generated)
    _, top, extra = steps[step]
    return _score_top_k(client, request, top, extra, generated, step)


def openai_label_probs(
    response: Any, labels: Sequence[str], model: Any, *, choice: int = 0, **options: Any
) -> dict[str, float]:
    """``{label: probability}`` of an ``openai`` response; see :func:`openai_label_scores`
    (a model name not on this machine needs ``allow_download=True``)."""
    scores = openai_label_scores(response, labels, model, choice=choice, **options)
    if scores.probs is None:
        raise ValueError(
            "no top-k token voted for any label and the label tokens are outside the "
            "returned top-k: the constrained-softmax fallback cannot be read from this "
            "response"
        )
    return scores.probs


# ---------------------------------------------------------------------------
# Batch classification (what `semsoft eval --backend vllm` runs)
# ---------------------------------------------------------------------------


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
    use_tqdm: bool = False,
    **overrides: Any,
) -> list[dict[str, Any]]:
    """Classify prompts on a vLLM engine; one dict per prompt, in order.

    The engine must have the processor loaded (``logits_processors=[...]`` or the
    installed entry point) for ``mode="constrain"``, and ``max_logprobs >= k``.

    Parameters
    ----------
    llm : ``vllm.LLM``
    prompts : strings (used as is) or chat message lists (chat template applied,
        continuing a final assistant message), tokenised exactly as
        :func:`semsoft_plugin.hf.classify` does
    labels : label names (at least two; a ``str`` is refused), or a LabelSet built with
        the engine's tokenizer (another tokenizer's is refused by name; its
        ``leading_space`` is used; verbalizers and variants do not travel to the engine
        and a set that has them is refused)
    config, **overrides : Semantic Softmax settings
    mode, trigger : see :func:`sampling_params`
    constrained : also return the exact constrained softmax; prompts whose label
        tokens were not all in the top-k get one extra one-token request
        (``logprob_token_ids``), run after the main batch
    keep_logprobs : also return the decision step's ``keep_logprobs`` highest raw
        log-probabilities (``top_logprobs``: token id -> log-prob); the engine needs
        ``max_logprobs >= max(k, keep_logprobs)``. ``semsoft eval --backend vllm``
        keeps them to score every method from one pass.
    token_ids : also return these tokens' raw decision-step log-probabilities
        (``token_logprobs``), read from the top-k where they are in it and otherwise
        from the same one-token follow-up request
    max_tokens : generation length (default: the longest label in characters + 2,
        256 with a trigger); 1 is enough when only the scores are wanted

    Returns
    -------
    list of dict with ``label``, ``probs`` and ``constrained_probs`` (label -> p),
    ``fallback``, ``coverage``, ``top_k_mass`` and ``text``, plus ``top_logprobs``
    and ``token_logprobs`` when asked for.
    """
    from vllm.inputs import TokensPrompt

    from semsoft_plugin.hf import encode_prompts, format_prompt

    cfg = (config or SemsoftConfig()).replace(**overrides)
    wanted = max(cfg.k, keep_logprobs)
    max_logprobs = llm.llm_engine.model_config.max_logprobs
    if max_logprobs != -1 and max_logprobs < wanted:
        name = "k" if wanted == cfg.k else "keep_logprobs"
        raise ValueError(
            f"this engine has max_logprobs={max_logprobs} < {name}={wanted}: create it with "
            f"LLM(..., max_logprobs={wanted}) (server: --max-logprobs {wanted})"
        )
    if keep_logprobs < 0:
        raise ValueError(f"keep_logprobs={keep_logprobs} must be >= 0")
    if isinstance(prompts, str) or not isinstance(prompts, Sequence):
        raise ValueError("prompts must be a list of strings or of chat message lists")
    client = _client_model(llm)
    vocab = client.embeddings.vocab_size
    extra_ids = [int(t) for t in dict.fromkeys(token_ids)]
    bad = [t for t in extra_ids if not 0 <= t < vocab]
    if bad:
        raise ValueError(f"token_ids {bad[:5]} lie outside the vocabulary (size {vocab})")
    encoded = encode_prompts(
        client.tokenizer, [format_prompt(client.tokenizer, p) for p in prompts]
    )
    token_prompts = [TokensPrompt(prompt_token_ids=ids) for ids in encoded]
    length = {} if max_tokens is None else {"max_tokens": max_tokens}
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
        **length,
    )
    request = _request_of(params, {})
    scoring = client.scoring(request)  # label-set errors surface here, before any work
    if isinstance(labels, LabelSet) and labels.label_tokens != scoring.labels.label_tokens:
        raise ValueError(
            f"LabelSet {list(labels.names)!r} has verbalizers or variants the engine does "
            "not know (it binds label names itself): pass the label names"
        )
    outputs = llm.generate(token_prompts, params, use_tqdm=use_tqdm)
    scores = []
    for i, out in enumerate(outputs):
        try:
            scores.append(label_scores(out, params, client))
        except ValueError as error:
            raise ValueError(f"prompt {i}: {error}") from None
    answer_ids = list(scoring.labels.answer_token_ids)
    steps = [
        {int(t): float(lp.logprob) for t, lp in out.outputs[0].logprobs[s.decision_step].items()}
        for s, out in zip(scores, outputs, strict=True)
    ]
    probe_ids = list(dict.fromkeys(answer_ids + extra_ids))
    missing = [
        i
        for i, s in enumerate(scores)
        if (s.constrained_probs is None and (constrained or s.fallback))
        or any(t not in steps[i] for t in extra_ids)
    ]
    if missing:
        # One-token follow-ups at the decision step, at most MAX_LOGPROB_TOKEN_IDS ids each.
        from vllm.sampling_params import MAX_LOGPROB_TOKEN_IDS

        follow = [
            TokensPrompt(
                prompt_token_ids=encoded[i]
                + list(outputs[i].outputs[0].token_ids[: scores[i].decision_step])
            )
            for i in missing
        ]
        for start in range(0, len(probe_ids), MAX_LOGPROB_TOKEN_IDS):
            chunk = probe_ids[start : start + MAX_LOGPROB_TOKEN_IDS]
            probe = SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=chunk)
            for i, out in zip(missing, llm.generate(follow, probe, use_tqdm=use_tqdm), strict=True):
                entries = out.outputs[0].logprobs[0]
                steps[i].update({t: float(entries[t].logprob) for t in chunk})
        for i in missing:
            if scores[i].constrained_probs is not None:
                continue
            # Scored again with every answer token's log-prob known: the constrained
            # softmax (and the pool with it) is then exact, as transformers has it.
            entries = outputs[i].outputs[0].logprobs[scores[i].decision_step]
            top = {
                int(t): float(lp.logprob)
                for t, lp in entries.items()
                if lp.rank is not None and lp.rank <= cfg.k
            }
            generated = list(outputs[i].outputs[0].token_ids)
            scores[i] = _score_top_k(
                client, request, top, steps[i], generated, scores[i].decision_step
            )
    results = []
    for s, out, step in zip(scores, outputs, steps, strict=True):
        result = {
            "label": s.label,
            "probs": s.probs,
            "constrained_probs": s.constrained_probs,
            "fallback": s.fallback,
            "coverage": s.coverage,
            "top_k_mass": s.top_k_mass,
            "text": out.outputs[0].text,
        }
        if keep_logprobs:
            ranked = out.outputs[0].logprobs[s.decision_step].items()
            result["top_logprobs"] = {
                int(t): float(lp.logprob)
                for t, lp in ranked
                if lp.rank is not None and lp.rank <= keep_logprobs
            }
        if extra_ids:
            result["token_logprobs"] = {t: step[t] for t in extra_ids}
        results.append(result)
    return results
