"""The per-request options of Semantic Softmax and their limits, parsed once.

A request opts in by carrying flat `semsoft_*` keys: in `SamplingParams.extra_args`
offline, in `vllm_xargs` over HTTP, in the extra body an OpenAI client sends.
`parse_request` reads them into one frozen `SemsoftRequest` that the vLLM admission
checks, the engine processor and the readers all work from, parsed once per process
(`semsoft_plugin.engines.vllm.parsed` finds it again; the keys cross the process
boundary, the object does not). No engine import here, so the OpenAI client helpers work
without vLLM.

The limits (`SERVER_MAX_K`, `SERVER_MAX_LABELS`, ...) bound the work one untrusted server
request can ask for. They apply to requests that arrive over HTTP only
(`parse_request(..., server=True)`); in-process use (offline `vllm.LLM`, `classify_vllm`,
`Classifier(backend="vllm")`, the engine processor) gets the method's own ranges
(`labels.MAX_LABELS`, `config.MAX_K`).
"""

from __future__ import annotations

import dataclasses
import math
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

from semsoft_plugin.core.config import (
    MAX_K,
    PRESETS,
    SemsoftConfig,
    config_field_specs,
    renamed_message,
)
from semsoft_plugin.core.labels import MAX_LABELS, label_names
from semsoft_plugin.core.text_rules import is_blank

__all__ = [
    "RESPONSE_LABEL_LOGPROBS",
    "SERVER_MAX_K",
    "SERVER_MAX_LABELS",
    "SERVER_MAX_LABEL_BYTES",
    "SERVER_MAX_TRIGGER_BYTES",
    "Mode",
    "SemsoftRequest",
    "build_request",
    "mint_row_key",
    "parse_request",
]

# One default mode on every engine: "constrain" (a classifier is asked for a label).
Mode = Literal["constrain", "observe"]
MODES = ("constrain", "observe")

# extra_args keys; flat values only so the same keys work in ``vllm_xargs``.
KEY_LABELS = "semsoft_labels"
KEY_MODE = "semsoft_mode"
KEY_TRIGGER = "semsoft_trigger"
KEY_LEADING_SPACE = "semsoft_leading_space"
# A named SemsoftConfig.preset as the base; the other semsoft_<field> keys override it.
KEY_PRESET = "semsoft_preset"
# The name of a fit the engine loaded at start (never a path: engines/vllm/fits.py).
KEY_FIT = "semsoft_fit"
# Keep the decision step's hidden state, read back from its logits row, in the engine's
# worker table for the offline reader (Classifier.fit's probe on vLLM); never over HTTP.
KEY_HIDDEN = "semsoft_hidden"
# The key of this request's rows in the engine's worker table (a fitted row, a kept hidden
# state), minted by semsoft for each request (`mint_row_key`: `sampling_params` and
# `classify_vllm` offline, the admission middleware on a server), never chosen by a client:
# two requests never share a row, whatever else they have in common.
KEY_ROW_KEY = "semsoft_row_key"
ROW_KEY_HEX = 32
# The response field in which the server's admission middleware returns each choice's
# fitted label probabilities, or why the fit was not applied to it.
RESPONSE_FITTED = "semsoft_fitted"
# A fit name: letters, digits, '.', '_' and '-', at most MAX_FIT_NAME characters, not
# starting with '.' (a file stem in the operator's fit folder, never a path).
MAX_FIT_NAME = 64
# The response field in which the server's admission middleware returns the label
# answer tokens' raw log-probs that the decision step's top-k lacks ({"token_id:N": lp}).
RESPONSE_LABEL_LOGPROBS = "semsoft_label_logprobs"
# One key per SemsoftConfig field, generated from its table (config.config_field_specs).
_CONFIG_KEYS = {f"semsoft_{f.name}": f.name for f in dataclasses.fields(SemsoftConfig)}
_KEYS = {
    KEY_LABELS, KEY_MODE, KEY_TRIGGER, KEY_LEADING_SPACE, KEY_PRESET, KEY_FIT, KEY_HIDDEN,
    KEY_ROW_KEY, *_CONFIG_KEYS,
}  # fmt: skip

# The keys that may accompany semsoft_fit: the fit's probe gives the scores, so every other
# Semantic Softmax setting (and a preset) would change nothing and is refused by name.
FIT_KEYS = (
    KEY_LABELS, KEY_MODE, KEY_TRIGGER, KEY_LEADING_SPACE, KEY_FIT, KEY_HIDDEN, KEY_ROW_KEY,
    "semsoft_k",
)  # fmt: skip

# Server clients are untrusted: these bound the work and memory one request can ask
# for. Named SERVER_* because they are tighter than the method's own ranges
# (config.MAX_K, labels.MAX_LABELS), which apply to local use. A label of at most
# SERVER_MAX_LABEL_BYTES UTF-8 bytes is at most that many tokens (+1 for the leading
# space) on byte-level tokenizers.
SERVER_MAX_LABELS = 64
SERVER_MAX_LABEL_BYTES = 64
SERVER_MAX_TRIGGER_BYTES = 64
SERVER_MAX_K = 256


@dataclass(frozen=True)
class SemsoftRequest:
    """The options of one opted-in request, parsed and checked.

    Attributes
    ----------
    labels : tuple[str, ...]
        Label names, in the order results are reported
    config : SemsoftConfig
        Semantic Softmax settings
    mode : Mode
        `"constrain"` (the emitted text is a label chosen from `P_sem`) or
        `"observe"` (generation untouched; scores only)
    trigger : str | None
        Decide after this generated text instead of at the first token
    leading_space : bool
        Labels are scored as whole words after a space
    fit : str | None
        The name of a fit the engine loaded at start (`semsoft_fit`): its
        probabilities replace the scores, and in constrain mode the label follows them
    hidden : bool
        Keep the decision step's hidden state, read back from its logits row
        (`semsoft_hidden`), in the engine's worker table for an offline reader
        (`classify_vllm(hidden=True)`); refused from a server client
    row_key : str | None
        The key of this request's rows in the engine's worker table
        (`semsoft_row_key`, 32 hex digits), minted by semsoft for each request
        (`mint_row_key`), under which its one parse is found again in a process;
        required with `fit` or `hidden`, refused from a server client
    """

    labels: tuple[str, ...]
    config: SemsoftConfig
    mode: Mode = "constrain"
    trigger: str | None = None
    leading_space: bool = True
    fit: str | None = None
    hidden: bool = False
    row_key: str | None = None

    def to_extra_args(self) -> dict[str, Any]:
        """Flat `extra_args` / `vllm_xargs` (str, int, float or lists of str)."""
        args: dict[str, Any] = {KEY_LABELS: list(self.labels), KEY_MODE: self.mode}
        for key, name in _CONFIG_KEYS.items():
            value = getattr(self.config, name)
            if value is None:  # an unset option (tau_quantile): the default applies
                continue
            if self.fit is not None and key not in FIT_KEYS:  # the fit gives the scores
                continue
            args[key] = int(value) if isinstance(value, bool) else value
        args[KEY_LEADING_SPACE] = int(self.leading_space)
        if self.trigger is not None:
            args[KEY_TRIGGER] = self.trigger
        if self.fit is not None:
            args[KEY_FIT] = self.fit
        if self.hidden:
            args[KEY_HIDDEN] = 1
        if self.row_key is not None:
            args[KEY_ROW_KEY] = self.row_key
        return args

    @property
    def keeps_rows(self) -> bool:
        """Whether the engine keeps a row for this request in its worker table (a fit's
        row or a hidden state), which then needs the request's own `row_key`."""
        return self.fit is not None or self.hidden

    @property
    def key(self) -> tuple[Any, ...]:
        """What a resolved label set depends on (the trigger and mode do not)."""
        return (self.labels, self.leading_space, self.config)


_FLAG_RULE = "a boolean (true/false or 0/1)"
# k's range: the server's for HTTP requests, the method's (SemsoftConfig's) in-process.
_K_RULES = {
    True: (SERVER_MAX_K, f"an integer in [1, SERVER_MAX_K={SERVER_MAX_K}]"),
    False: (MAX_K, f"an integer in [1, MAX_K={MAX_K}]"),
}
_LABEL_LIMITS = {
    True: (SERVER_MAX_LABELS, f"SERVER_MAX_LABELS={SERVER_MAX_LABELS}"),
    False: (MAX_LABELS, f"MAX_LABELS={MAX_LABELS}"),
}


def config_rules() -> dict[str, str]:
    """What each `semsoft_<field>` key must be: the field's rule from the config
    table (`k`'s range depends on where the request came from: `_K_RULES`)."""
    return {name: str(spec["rule"]) for name, spec in config_field_specs().items()}


_RULES = config_rules()


def show_value(value: Any, limit: int = 40) -> str:
    """`repr(value)` cut to `limit` characters, for error messages about client
    values of any size."""
    try:
        text = repr(value)
    except ValueError:  # an int too long for str()
        return "<an integer too long to print>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _refuse(key: str, value: Any, rule: str) -> ValueError:
    return ValueError(f"{key}={show_value(value)} must be {rule}")


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
    """UTF-8 length of `text`; None for a lone surrogate (JSON allows `"\\ud800"`,
    no tokenizer does)."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return None


def _option(key: str, name: str, value: Any, server: bool) -> Any:
    """One method option, type-checked (a bool is not a number, NaN and inf are not
    finite, a fraction is not an integer); ranges are left to [`SemsoftConfig`][semsoft_plugin.core.config.SemsoftConfig],
    except k's (`SERVER_MAX_K` for a server request, `MAX_K` otherwise)."""
    max_k, k_rule = _K_RULES[server]
    rule = k_rule if name == "k" else _RULES[name]
    spec = config_field_specs()[name]
    if spec["kind"] is bool:
        return _flag(key, value)
    if spec["kind"] is str:
        if not isinstance(value, str) or value not in spec.get("choices", ()):
            raise _refuse(key, value, rule)
        return value
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
    if not 1 <= value <= max_k:
        raise _refuse(key, value, rule)
    return int(value)


def parse_request(
    extra_args: Mapping[str, Any] | None, *, server: bool = False
) -> SemsoftRequest | None:
    """The semsoft options in `extra_args`, or None when the request did not opt in.

    A request opts in by carrying `semsoft_labels`. Every option is checked here, once,
    with the same rules as [`SemsoftConfig`][semsoft_plugin.core.config.SemsoftConfig]. Raises
    `ValueError` naming the option, its value (cut to a few characters) and what is
    allowed; the server answers it with HTTP 400.

    `server=True` for a request that arrived over HTTP (an untrusted client): the
    `SERVER_*` size limits apply (labels, label and trigger bytes, k). Otherwise the
    method's own ranges apply, the same on every engine used in-process
    (`MAX_LABELS` labels, `k <= MAX_K`, any label or trigger length).

    Every call parses: a vLLM request is parsed once per process and found again by
    its row key (`semsoft_plugin.engines.vllm.parsed`).
    """
    if not extra_args:
        return None
    check_near_misses(extra_args)
    present = {k for k in extra_args if isinstance(k, str) and k.startswith("semsoft_")}
    if not present:
        return None
    row_key = _row_key(extra_args, server)
    options = {k: v for k, v in extra_args.items() if k != KEY_ROW_KEY}
    request = _parse(options, present - {KEY_ROW_KEY}, server)
    return request if row_key is None else dataclasses.replace(request, row_key=row_key)


def mint_row_key() -> str:
    """A fresh `semsoft_row_key` (128 random bits, hex): the key of one request's rows in
    the engine's worker table, never shared with another request."""
    return secrets.token_hex(ROW_KEY_HEX // 2)


def _row_key(extra_args: Mapping[str, Any], server: bool) -> str | None:
    """The request's `semsoft_row_key`, checked; a server client's is refused (the
    server's admission middleware mints each request's own)."""
    if KEY_ROW_KEY not in extra_args:
        return None
    value = extra_args[KEY_ROW_KEY]
    if server:
        raise ValueError(
            f"{KEY_ROW_KEY} is minted by the server for each request (its rows in the "
            "engine belong to it alone); a client cannot set it: drop it"
        )
    if (
        not isinstance(value, str)
        or len(value) != ROW_KEY_HEX
        or any(c not in "0123456789abcdef" for c in value)
    ):
        raise _refuse(
            KEY_ROW_KEY, value, f"{ROW_KEY_HEX} lower-case hex digits, minted by mint_row_key()"
        )
    return value


def near_misses(keys: Iterable[Any]) -> list[tuple[str, str | None]]:
    """Keys that look like semsoft options but are not spelled as one (`SEMSOFT_LABELS`,
    `semsoft-labels`, `semsoftLabels`), each with the key it most likely means."""
    found = []
    for key in keys:
        if not isinstance(key, str) or key in _KEYS or key.startswith("semsoft_"):
            continue
        folded = key.strip().lower().replace("-", "_").replace(" ", "_").replace(".", "_")
        if not folded.replace("_", "").startswith("semsoft"):
            continue
        squashed = folded.replace("_", "")
        meant = next((k for k in sorted(_KEYS) if k.replace("_", "") == squashed), None)
        found.append((key, meant))
    return found


def check_near_misses(mapping: Mapping[Any, Any], where: str = "") -> None:
    """`ValueError` naming a near-miss semsoft key: without this the request would
    carry no `semsoft_labels` and run unconstrained without a word."""
    misses = near_misses(mapping)
    if misses:
        key, meant = misses[0]
        hint = f"did you mean {meant!r}? " if meant else ""
        raise ValueError(
            f"{show_value(key)}{where} looks like a semsoft option but is not one: {hint}semsoft "
            "keys are lower-case with underscores (known: semsoft_labels, semsoft_mode, "
            "semsoft_k, ...); as sent it would be ignored (a request without semsoft_labels "
            "runs unconstrained)"
        )


def _parse(extra_args: Mapping[str, Any], present: set[str], server: bool) -> SemsoftRequest:
    if KEY_LABELS not in extra_args:
        raise ValueError(
            f"semsoft options {show_value(sorted(present))} given without {KEY_LABELS!r} "
            "(the label list)"
        )
    unknown = present - _KEYS
    for key in sorted(unknown):
        renamed = renamed_message(key[len("semsoft_") :], "semsoft_")
        if renamed:
            raise ValueError(renamed)
    if unknown:
        raise ValueError(
            f"unknown semsoft option(s) {show_value(sorted(unknown), 80)}; known: {sorted(_KEYS)}"
        )
    labels = extra_args[KEY_LABELS]
    if isinstance(labels, str) or not isinstance(labels, Sequence):
        raise ValueError(f"{KEY_LABELS} must be a list of strings, got {show_value(labels)}")
    max_labels, labels_rule = _LABEL_LIMITS[server]
    if not 2 <= len(labels) <= max_labels:
        raise ValueError(f"{KEY_LABELS} has {len(labels)} labels; allowed: 2 to {labels_rule}")
    for label in labels:
        if not isinstance(label, str) or is_blank(label):
            raise ValueError(f"{KEY_LABELS}: label {show_value(label)} is not a non-empty string")
        size = _utf8_bytes(label)
        if size is None:
            raise ValueError(f"{KEY_LABELS}: label {show_value(label)} is not valid Unicode")
        if server and size > SERVER_MAX_LABEL_BYTES:
            raise ValueError(
                f"{KEY_LABELS}: label {show_value(label, 24)} is longer than "
                f"SERVER_MAX_LABEL_BYTES={SERVER_MAX_LABEL_BYTES} UTF-8 bytes"
            )
    try:  # the rule of every path, on labels now known to be short
        label_names(list(labels))
    except ValueError as error:
        raise ValueError(f"{KEY_LABELS}: {error}") from None

    overrides: dict[str, Any] = {}
    for key, name in _CONFIG_KEYS.items():
        if key in extra_args:
            overrides[name] = _option(key, name, extra_args[key], server)
    preset = extra_args.get(KEY_PRESET, "constrained")
    if not isinstance(preset, str) or preset not in PRESETS:
        raise _refuse(KEY_PRESET, preset, "one of " + ", ".join(repr(p) for p in PRESETS))
    try:
        config = SemsoftConfig.preset(preset).replace(**overrides)
    except ValueError as error:  # SemsoftConfig names the field: "tau=1.5 must be ..."
        raise ValueError(f"semsoft_{error}") from None

    mode = extra_args.get(KEY_MODE, "constrain")
    if not isinstance(mode, str) or mode not in MODES:
        raise _refuse(KEY_MODE, mode, f"one of {MODES}")
    trigger = extra_args.get(KEY_TRIGGER)
    if trigger is not None:
        rule = "a non-empty string"
        if server:
            rule += f" of at most SERVER_MAX_TRIGGER_BYTES={SERVER_MAX_TRIGGER_BYTES} UTF-8 bytes"
        if not isinstance(trigger, str) or not trigger:
            raise _refuse(KEY_TRIGGER, trigger, rule)
        size = _utf8_bytes(trigger)
        if size is None or (server and size > SERVER_MAX_TRIGGER_BYTES):
            raise _refuse(KEY_TRIGGER, trigger, rule)
    leading_space = _flag(KEY_LEADING_SPACE, extra_args.get(KEY_LEADING_SPACE, True))
    fit = extra_args.get(KEY_FIT)
    if fit is not None:
        fit = fit_name(fit)
        check_fit_company(sorted(present - set(FIT_KEYS)))
    hidden = _flag(KEY_HIDDEN, extra_args.get(KEY_HIDDEN, False))
    if hidden and server:
        raise ValueError(
            f"{KEY_HIDDEN} keeps a hidden state in the engine for an offline reader "
            "(Classifier.fit, semsoft eval); a server client names a fit (semsoft_fit) instead"
        )
    return SemsoftRequest(
        tuple(labels), config, cast(Mode, mode), trigger, leading_space, fit, hidden
    )


def check_fit_company(keys: Sequence[str]) -> None:
    """`ValueError` naming `keys`, settings given beside `semsoft_fit` that the fit makes
    meaningless (its probe gives the scores), with the keys that may accompany it."""
    if keys:
        raise ValueError(
            f"{show_value(list(keys), 120)} beside {KEY_FIT}: the fit's probe gives the "
            "scores, so these settings would change nothing; the semsoft keys that may "
            f"accompany {KEY_FIT} are {', '.join(FIT_KEYS)}"
        )


def fit_name(value: Any) -> str:
    """`value` if it is a fit name (letters, digits, `.`, `_`, `-`; at most
    `MAX_FIT_NAME` characters; not starting with `.`), else `ValueError` naming it: a
    request names a fit the engine loaded, never a path."""
    if (
        not isinstance(value, str)
        or not 0 < len(value) <= MAX_FIT_NAME
        or value.startswith(".")
        or not all(c.isascii() and (c.isalnum() or c in "._-") for c in value)
    ):
        raise _refuse(
            KEY_FIT,
            value,
            f"the name of a fit the server loaded (letters, digits, '.', '_', '-'; at most "
            f"{MAX_FIT_NAME} characters; never a path)",
        )
    return value


def build_request(
    labels: Sequence[str],
    *,
    config: SemsoftConfig | None = None,
    mode: Mode = "constrain",
    trigger: str | None = None,
    leading_space: bool = True,
    server: bool = False,
    fit: str | None = None,
    hidden: bool = False,
    **method: Any,
) -> SemsoftRequest:
    """A checked `SemsoftRequest` from Python arguments (not from a request body).

    Parameters
    ----------
    labels : Sequence[str]
        Label names (a list of at least two distinct strings; a LabelSet gives
        its names)
    config : SemsoftConfig | None
        Semantic Softmax settings; `method` keywords (`k`, `tau`, ...)
        override it
    mode : Mode
        See `SemsoftRequest`
    trigger : str | None
        See `SemsoftRequest`
    leading_space : bool
        See `SemsoftRequest`
    fit : str | None
        See `SemsoftRequest`
    hidden : bool
        See `SemsoftRequest`
    server : bool
        The request is for a server (the `SERVER_*` limits apply, see
        `parse_request`); False for an in-process engine

    The options take the same round trip a request takes
    (`SemsoftRequest.to_extra_args` then `parse_request`), so a request
    built here is refused exactly when the engine (or the server) would refuse it, and
    what comes back is what it parses.
    """
    cfg = (config or SemsoftConfig()).replace(**method)
    if fit is not None:  # the fit gives the scores: any other setting is refused by name
        unset = SemsoftConfig(k=cfg.k)
        check_fit_company(
            [
                f"semsoft_{f.name}"
                for f in dataclasses.fields(cfg)
                if getattr(cfg, f.name) != getattr(unset, f.name)
            ]
        )
    request = SemsoftRequest(
        tuple(label_names(labels)), cfg, mode, trigger, leading_space, fit, hidden
    )
    parsed = parse_request(request.to_extra_args(), server=server)
    assert parsed is not None  # it carries semsoft_labels
    return parsed


def default_max_tokens(answers: Sequence[str], trigger: str | None) -> int:
    """The default generation length in tokens, the same on every engine: room for the
    longest answer, or 256 when a trigger must be written first.

    A token spells at least one byte, so the longest answer's UTF-8 bytes + 2 (a
    leading space, EOS) hold it under any tokenizer; a client without the tokenizer
    can compute that bound, so transformers uses it too and one prompt generates the
    same text on every engine. EOS ends the generation earlier."""
    return 256 if trigger else max(len(a.encode("utf-8")) for a in answers) + 2


# Every key a request may carry (tests/test_docs_names.py checks each documented one).
KNOWN_KEYS = frozenset(_KEYS)
