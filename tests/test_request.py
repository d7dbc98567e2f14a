"""The per-request options (semsoft_plugin.core.request): parsed once, no engine needed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from semsoft_plugin.core.config import MAX_K
from semsoft_plugin.core.labels import MAX_LABELS
from semsoft_plugin.core.request import (
    SERVER_MAX_K,
    SERVER_MAX_LABELS,
    build_request,
    parse_request,
)

LABELS = ["positive", "negative"]


def test_request_and_openai_modules_import_no_engine():
    code = (
        "import sys, semsoft_plugin.core.request, semsoft_plugin.engines.openai; "
        "print([m for m in sys.modules if m.split('.')[0] in ('vllm', 'transformers')])"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_same_options_parse_to_equal_objects_never_shared_by_look():
    """A parse is found again by its owner's row key (engines.vllm.parsed), never by
    what the options look like: equal options give equal, separate objects."""
    args = build_request(LABELS, k=7, tau=0.2, semantic_weight=0.5).to_extra_args()
    first = parse_request(args)
    again = parse_request(dict(args))
    assert again == first and again is not first
    assert first == build_request(LABELS, k=7, tau=0.2, semantic_weight=0.5)


def test_cache_keeps_types_apart():
    assert parse_request({"semsoft_labels": LABELS, "semsoft_k": 1}).config.k == 1
    with pytest.raises(ValueError, match=r"semsoft_k=True .*SERVER_MAX_K"):
        parse_request({"semsoft_labels": LABELS, "semsoft_k": True}, server=True)
    with pytest.raises(ValueError, match="semsoft_k"):
        parse_request({"semsoft_labels": LABELS, "semsoft_k": SERVER_MAX_K + 1}, server=True)
    # unhashable values are checked too
    with pytest.raises(ValueError, match="semsoft_labels"):
        parse_request({"semsoft_labels": [{"a": 1}, "b"]})


def test_build_request_refuses_what_the_server_refuses():
    with pytest.raises(ValueError, match="SERVER_MAX_LABELS"):
        build_request([f"l{i}" for i in range(65)], server=True)
    with pytest.raises(ValueError, match="twice"):
        build_request(["a", "a"])


def test_server_limits_apply_to_server_requests_only():
    """In-process use gets the method's ranges, as transformers does; the SERVER_* limits
    bound what an untrusted HTTP client may ask for."""
    args = {
        "semsoft_labels": [f"label{i}" for i in range(SERVER_MAX_LABELS + 1)] + ["é" * 40],
        "semsoft_k": SERVER_MAX_K + 44,
        "semsoft_trigger": "é" * 40,
    }
    local = parse_request(args)
    assert (len(local.labels), local.config.k) == (SERVER_MAX_LABELS + 2, 300)
    with pytest.raises(ValueError, match=f"allowed: 2 to SERVER_MAX_LABELS={SERVER_MAX_LABELS}"):
        parse_request(args, server=True)
    assert parse_request(args) == local
    for key, value, rule in (
        ("semsoft_k", SERVER_MAX_K + 1, "SERVER_MAX_K=256"),
        ("semsoft_trigger", "é" * 40, "SERVER_MAX_TRIGGER_BYTES=64"),
        ("semsoft_labels", ["é" * 40, "b"], "SERVER_MAX_LABEL_BYTES=64"),
    ):
        request = {"semsoft_labels": LABELS, key: value}
        assert parse_request(request) is not None
        with pytest.raises(ValueError, match=rule):
            parse_request(request, server=True)
    # the method's own ranges, named
    with pytest.raises(ValueError, match=rf"semsoft_k={MAX_K + 1} .*\[1, MAX_K={MAX_K}\]"):
        parse_request({"semsoft_labels": LABELS, "semsoft_k": MAX_K + 1})
    too_many = [f"l{i}" for i in range(MAX_LABELS + 1)]
    with pytest.raises(ValueError, match=f"allowed: 2 to MAX_LABELS={MAX_LABELS}"):
        parse_request({"semsoft_labels": too_many})
    with pytest.raises(ValueError, match=f"exceed the limit of {MAX_LABELS}"):
        build_request(too_many)


@pytest.mark.parametrize(
    ("key", "meant"),
    [
        ("SEMSOFT_LABELS", "semsoft_labels"),
        ("semsoft-labels", "semsoft_labels"),
        ("semsoftLabels", "semsoft_labels"),
        ("Semsoft_K", "semsoft_k"),
        ("semsoft.mode", "semsoft_mode"),
    ],
)
def test_near_miss_keys_are_refused_by_name(key, meant):
    """Issue 26 item 12: a near-miss of a semsoft key used to leave the request without
    semsoft_labels, so it ran unconstrained without a word."""
    with pytest.raises(ValueError, match=f"{key!r} looks like a semsoft option.*{meant!r}"):
        parse_request({key: LABELS})
    with pytest.raises(ValueError, match=f"{key!r} looks like a semsoft option"):
        parse_request({**build_request(LABELS).to_extra_args(), key: 1})
    assert parse_request({"temperature_semsoft": 1, "other": 2}) is None


@pytest.mark.parametrize(
    "labels, match",
    [
        # Issue 34 item 7, over HTTP: two Unicode spellings of 'café' were two labels.
        (
            ["caf\u00e9", "cafe\u0301"],
            r"semsoft_labels: labels '.+' \(U\+0063 U\+0061 U\+0066 U\+00E9\) and '.+' "
            r"\(U\+0063 U\+0061 U\+0066 U\+0065 U\+0301\) print alike \(equal after NFC",
        ),
        (["yes\x00", "no"], r"semsoft_labels: label 'yes\\x00' holds .*U\+0000"),
        (["\u200b", "no"], r"semsoft_labels: label '\\u200b' is .*empty"),
        (["yes", "yes"], r"semsoft_labels: label 'yes' appears twice"),
    ],
)
def test_request_labels_follow_the_one_label_rule(labels, match):
    with pytest.raises(ValueError, match=match):
        parse_request({"semsoft_labels": labels})
    with pytest.raises(ValueError, match=match.removeprefix("semsoft_labels: ")):
        build_request(labels)
