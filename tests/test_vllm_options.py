"""The vLLM adapter's request options, checked without an engine: what
``sampling_params`` puts in ``extra_args`` and how it round-trips, the limits and refusals
of ``validate_params`` and of the admission middleware on plain JSON bodies, the
declared entry point, and readers that must not download a model.

These need the vLLM package (the adapter imports it) but start no engine, so they run in
CI's fast lane; the checks that need no vLLM at all are in ``test_vllm_reference.py``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tomllib
from importlib.metadata import EntryPoint
from types import SimpleNamespace

import pytest
from _vllm import EMOTIONS, ROOT, SENTIMENT, VLLM_REFUSED

vllm = pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402

from semsoft_plugin import SemsoftConfig  # noqa: E402
from semsoft_plugin.core import request as sreq  # noqa: E402
from semsoft_plugin.engines import openai as sopenai  # noqa: E402
from semsoft_plugin.engines import scoring  # noqa: E402
from semsoft_plugin.engines import vllm as sv  # noqa: E402
from semsoft_plugin.engines.vllm import middleware as sadm  # noqa: E402
from semsoft_plugin.engines.vllm.params import ENTRY_POINT  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_options_roundtrip_and_flat_values():
    params = sv.sampling_params(
        EMOTIONS, k=40, tau=0.1, center=False, semantic_weight=1.0, trigger="Answer:"
    )
    request = sreq.parse_request(params.extra_args)
    assert request.labels == tuple(EMOTIONS)
    assert (request.config.k, request.config.tau, request.config.center) == (40, 0.1, False)
    assert request.trigger == "Answer:" and request.mode == "constrain"
    assert params.logprobs == 40 and params.temperature == 0.0
    for value in params.extra_args.values():  # what vllm_xargs accepts
        assert isinstance(value, str | int | float) or all(isinstance(v, str) for v in value)
    assert sreq.parse_request({"other": 1}) is None
    assert sv.validate_params(SamplingParams(max_tokens=3)) is None
    # the vote rule and tau_quantile travel too (an unset quantile is omitted)
    assert "semsoft_tau_quantile" not in params.extra_args
    config = SemsoftConfig(vote="nearest", tau_quantile=0.9, semantic_weight=0.5)
    extra = sreq.SemsoftRequest(tuple(EMOTIONS), config, "constrain", None, True).to_extra_args()
    assert sreq.parse_request(extra).config == config


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"semsoft_labels": [f"l{i}" for i in range(sreq.SERVER_MAX_LABELS + 1)]},
            "SERVER_MAX_LABELS=64",
        ),
        (
            {"semsoft_labels": ["a" * (sreq.SERVER_MAX_LABEL_BYTES + 1), "b"]},
            "SERVER_MAX_LABEL_BYTES",
        ),
        ({"semsoft_labels": ["a", "b"], "semsoft_k": sreq.SERVER_MAX_K + 1}, "SERVER_MAX_K"),
        ({"semsoft_labels": ["a", "b"], "semsoft_k": 0}, "k=0"),
        ({"semsoft_labels": ["a", "b"], "semsoft_tau": "high"}, "semsoft_tau"),
        ({"semsoft_labels": ["a", "b"], "semsoft_center": 2}, "semsoft_center"),
        ({"semsoft_labels": ["a", "b"], "semsoft_mode": "force"}, "semsoft_mode"),
        ({"semsoft_labels": ["a", "b"], "semsoft_kk": 3}, "unknown semsoft option"),
        ({"semsoft_labels": "a,b"}, "list of strings"),
        ({"semsoft_labels": ["a", "a"]}, "twice"),
        ({"semsoft_labels": ["a", ""]}, "non-empty"),
        ({"semsoft_k": 5}, "without 'semsoft_labels'"),
        # the server's hostile-input table: each names the option, its value and range
        (
            {"semsoft_labels": ["a", "b"], "semsoft_k": float("inf")},
            r"semsoft_k=inf .*\[1, SERVER_MAX_K=256\]",
        ),
        (
            {"semsoft_labels": ["a", "b"], "semsoft_k": float("nan")},
            r"semsoft_k=nan .*\[1, SERVER_MAX_K=256\]",
        ),
        (
            {"semsoft_labels": ["a", "b"], "semsoft_k": True},
            r"semsoft_k=True .*\[1, SERVER_MAX_K=256\]",
        ),
        (
            {"semsoft_labels": ["a", "b"], "semsoft_k": 10**19},
            "semsoft_k=10000000000000000000 must",
        ),
        (
            {"semsoft_labels": ["a", "b"], "semsoft_mode": "m" * 10**5},
            r"semsoft_mode='m{36}\.\.\. must be one of",
        ),
        ({"semsoft_labels": ["a", "b"], "semsoft_k": 5.5}, "semsoft_k=5.5 must be an integer"),
        ({"semsoft_labels": ["a", "b"], "semsoft_k": "5"}, "semsoft_k='5' must be an integer"),
        (
            {"semsoft_labels": ["a", "b"], "semsoft_tau": float("nan")},
            r"semsoft_tau=nan .*\[-1, 1\)",
        ),
        ({"semsoft_labels": ["a", "b"], "semsoft_tau": 1.5}, r"semsoft_tau=1.5 .*\[-1, 1\)"),
        (
            {"semsoft_labels": ["a", "b"], "semsoft_score_temperature": 0},
            "semsoft_score_temperature=0.0 .*> 0",
        ),
        (
            {"semsoft_labels": ["a", "b"], "semsoft_temperature": 2},
            "semsoft_temperature: renamed: use semsoft_score_temperature",
        ),
        (
            {"semsoft_labels": ["a", "b"], "semsoft_tau_quantile": 1.5},
            r"semsoft_tau_quantile=1.5 .*\(0, 1\)",
        ),
        (
            {"semsoft_labels": ["a", "b"], "semsoft_tau_quantile": float("nan")},
            r"semsoft_tau_quantile=nan .*\(0, 1\)",
        ),
        ({"semsoft_labels": ["a", "b"], "semsoft_center": "yes"}, "semsoft_center='yes'"),
        ({"semsoft_labels": ["a", "b"], "semsoft_vote": 1}, "semsoft_vote=1 must be one of"),
        ({"semsoft_labels": ["a", "b"], "semsoft_mode": ["x"]}, r"semsoft_mode=\['x'\]"),
        (
            {"semsoft_labels": ["a", "b"], "semsoft_trigger": "é" * 40},
            "SERVER_MAX_TRIGGER_BYTES=64",
        ),
        ({"semsoft_labels": ["\ud800", "b"]}, "not valid Unicode"),
        ({"semsoft_labels": ["é" * 33, "b"]}, "SERVER_MAX_LABEL_BYTES=64"),
        ({"semsoft_labels": ["a", 3]}, "label 3 is not a non-empty string"),
    ],
)
def test_bad_options_are_refused_with_the_limit_named(extra, message):
    """What the server's admission middleware refuses (``server=True``: an HTTP client's
    request); in-process the method's ranges apply instead of the SERVER_* ones."""
    params = SamplingParams(max_tokens=3, logprobs=20, extra_args=extra)
    with pytest.raises(ValueError, match=message):
        sv.validate_params(params, server=True)
    if "SERVER_" not in message:  # the same refusal in-process (vLLM's admission hook)
        with pytest.raises(ValueError, match=message):
            sv.SemanticSoftmaxLogitsProcessor.validate_params(params)


def test_a_number_beyond_float_range_is_refused_not_raised():
    """Raw JSON (what the admission middleware reads) holds integers of any size; vLLM
    refuses them only later, in ``SamplingParams``. The check must answer with a
    message (HTTP 400), never let ``OverflowError`` out (HTTP 500)."""
    body = json.dumps(
        {"prompt": "x", "vllm_xargs": {"semsoft_labels": ["a", "b"], "semsoft_tau": 10**400}}
    )
    message = sadm._check_http_body(body.encode(), "/v1/completions", None)
    assert message is not None and re.match(r"semsoft_tau=10{36}\.\.\. must be a finite", message)


def test_incompatible_sampling_settings_are_refused():
    with pytest.raises(ValueError, match="max_logprobs >= 50"):
        sv.validate_params(SamplingParams(logprobs=20, extra_args={"semsoft_labels": ["a", "b"]}))
    with pytest.raises(ValueError, match="repetition_penalty"):
        sv.sampling_params(SENTIMENT, repetition_penalty=1.2)
    with pytest.raises(ValueError, match="logit_bias"):
        sv.sampling_params(SENTIMENT, logit_bias={5: 1.0})
    # observe mode leaves generation to the user, penalties included
    assert sv.sampling_params(SENTIMENT, mode="observe", repetition_penalty=1.2).logprobs == 50


def test_routes_places_and_cutting_stops_are_refused_before_the_engine():
    """Issue 26 items 10-12 without a server: the middleware's verdict on each route and
    place, and the stop checks of validate_params (no tokenizer needed)."""
    good = sopenai.openai_request(SENTIMENT)["extra_body"]["vllm_xargs"]
    body = {"model": "m", "prompt": "x", "vllm_xargs": {**good, "semsoft_k": True}}
    for path in ("/invocations", "/v1/chat/completions/batch", "/v1/messages", "/v1/responses"):
        message = sadm._check_http_body(json.dumps(body).encode(), path, None)
        assert message is not None and f"not supported on {path}" in message, (path, message)
    generate = {"token_ids": [1], "sampling_params": {"extra_args": {"semsoft_labels": SENTIMENT}}}
    message = sadm._check_http_body(json.dumps(generate).encode(), "/inference/v1/generate", None)
    assert message is not None and "semsoft_labels (in sampling_params.extra_args)" in message
    plain = {"model": "m", "prompt": "x", "max_tokens": 3}
    assert sadm._check_http_body(json.dumps(plain).encode(), "/invocations", None) is None
    top = {**body, "vllm_xargs": good, "semsoft_k": 7}
    message = sadm._check_http_body(json.dumps(top).encode(), "/v1/completions", None)
    assert message is not None and "send semsoft options in vllm_xargs" in message
    near = {**body, "vllm_xargs": {"SEMSOFT_LABELS": SENTIMENT}}
    message = sadm._check_http_body(json.dumps(near).encode(), "/v1/completions", None)
    assert message is not None and "did you mean 'semsoft_labels'" in message
    for stop in ([" pos"], "negative", ["ive"]):
        with pytest.raises(ValueError, match="would cut the label"):
            sv.sampling_params(SENTIMENT, stop=stop)
    assert sv.sampling_params(SENTIMENT, stop=["\n", "."]).stop == ["\n", "."]
    assert sv.sampling_params(SENTIMENT, mode="observe", stop=[" pos"]).stop == [" pos"]


def test_entry_point_declared_in_pyproject_loads_the_class():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    value = declared["vllm.logits_processors"]["semsoft"]
    assert value == ENTRY_POINT
    entry = EntryPoint(name="semsoft", value=value, group="vllm.logits_processors")
    assert entry.load() is sv.SemanticSoftmaxLogitsProcessor


ROUND_TRIP = [
    {},
    {"k": 30, "tau": 0.1, "center": False, "own_vote": False, "semantic_weight": 1.0},
    {"vote": "nearest", "tau_quantile": 0.9, "semantic_weight": 0.5, "mode": "observe",
     "leading_space": False},  # fmt: skip
    {"score_temperature": 2.0, "trigger": "Answer:", "config": SemsoftConfig(k=12)},
    {"vote": "per_label", "config": SemsoftConfig.preset("shared")},
    {"config": SemsoftConfig.preset("silent-vote")},  # a per-row pool: one option name
    {"semantic_weight": 1.0, "silent_vote": 0.2},
]


@pytest.mark.parametrize("options", ROUND_TRIP)
def test_request_round_trips_through_extra_args_and_the_openai_body(options):
    """One parsed object: what sampling_params puts in extra_args and what openai_request
    puts in vllm_xargs (sent as JSON) parse to the request that was built."""
    built = sreq.build_request(EMOTIONS, **options)
    offline = sreq.parse_request(sv.sampling_params(EMOTIONS, **options).extra_args)
    body = json.loads(json.dumps(sopenai.openai_request(EMOTIONS, **options)["extra_body"]))
    assert offline is not None and offline.row_key is not None  # its own, minted
    assert dataclasses.replace(offline, row_key=None) == built
    assert sreq.parse_request(body["vllm_xargs"]) == built
    assert sopenai.openai_request(EMOTIONS, **options).semsoft == built


@pytest.mark.parametrize(
    ("labels", "match"),
    [("positive,negative", "list of strings"), (["positive"], "one label"), ([], "empty")],
)
def test_vllm_helpers_apply_the_label_list_rule(labels, match):
    with pytest.raises(ValueError, match=match):
        sv.sampling_params(labels)
    with pytest.raises(ValueError, match=match):
        sopenai.openai_request(labels)


def test_readers_never_start_a_download(monkeypatch):
    import huggingface_hub

    calls = []

    def snapshot_download(repo_id, **kwargs):
        calls.append(kwargs)
        raise FileNotFoundError(f"{repo_id} is not in the local cache")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    response = {"choices": [{"logprobs": {"content": []}}]}
    for read in (
        lambda: sv.label_probs(SimpleNamespace(outputs=[]), SENTIMENT, "owner/name"),
        lambda: sopenai.openai_label_probs(response, SENTIMENT, "owner/name"),
        lambda: scoring.output_embeddings("owner/name"),
    ):
        with pytest.raises(ValueError, match="allow_download=True"):
            read()
    assert calls and all(call.get("local_files_only") is True for call in calls)
    with pytest.raises(ValueError, match="could not provide it"):
        scoring.output_embeddings("owner/name", allow_download=True)
    assert calls[-1]["local_files_only"] is False


@pytest.mark.parametrize("name", sorted(VLLM_REFUSED))
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_vllm_validation_errors_and_beam_search_are_answered_not_raised(name, path):
    """Issue 34 items 4 and 6, engine-free: the middleware's check answers each of vLLM's
    own SamplingParams refusals (``VLLMValidationError``, not a ``ValueError``) and beam
    search with a message naming the field and the value, instead of raising (the server
    test sends them over one kept-alive connection)."""
    fields, message = VLLM_REFUSED[name]
    api = "chat" if path.endswith("chat/completions") else "completions"
    request = sopenai.openai_request(SENTIMENT, api=api)
    body = {"model": "m", **request.pop("extra_body"), **request, **fields}
    body.update(
        {"messages": [{"role": "user", "content": "hi"}]} if api == "chat" else {"prompt": "hi"}
    )
    answer = sadm._check_http_body(json.dumps(body).encode(), path, None)
    assert answer is not None and re.search(message, answer), answer
