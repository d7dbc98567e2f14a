"""SemsoftConfig's settings: the presets, the refused combinations, replace() and None,
and the old option names refused with the new one on every path a user can send them."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from semsoft_plugin.core.config import (
    PRESETS,
    RENAMED,
    SILENT_VOTE_THRESHOLD,
    SILENT_VOTE_WEIGHT,
    VOTES,
    SemsoftConfig,
)
from semsoft_plugin.core.softmax import semantic_softmax


def test_presets_are_the_named_settings():
    assert SemsoftConfig.preset("constrained") == SemsoftConfig()
    assert SemsoftConfig.preset("pooled") == SemsoftConfig(semantic_weight=0.3)
    assert SemsoftConfig.preset("paper") == SemsoftConfig(
        center=False, own_vote=False, vote="per_label", semantic_weight=1.0
    )
    assert SemsoftConfig.preset("shared") == SemsoftConfig(vote="shared", semantic_weight=1.0)
    assert SemsoftConfig.preset("silent-vote") == SemsoftConfig(
        semantic_weight=SILENT_VOTE_WEIGHT, silent_vote=SILENT_VOTE_THRESHOLD
    )
    assert set(PRESETS) == {"constrained", "pooled", "paper", "shared", "silent-vote"}
    assert not hasattr(SemsoftConfig, "paper") and not hasattr(SemsoftConfig, "pooled")


def test_presets_give_different_scores():
    g = torch.Generator().manual_seed(3)
    logits, emb = torch.randn(64, generator=g) * 3, torch.randn(64, 8, generator=g)
    # Tokens 4-6 mean labels 1-3 and hold the most mass: a silent vote the silent-vote
    # preset pools (a row without one it leaves as the constrained softmax).
    emb[4:7] = emb[1:4]
    logits[4:7] += 6.0
    scores = {
        name: semantic_softmax(logits, emb, [1, 2, 3], SemsoftConfig.preset(name))
        for name in PRESETS
    }
    names = sorted(scores)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not torch.allclose(scores[a], scores[b]), (a, b)


def test_unknown_preset_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown preset 'papr'; known: constrained, pooled"):
        SemsoftConfig.preset("papr")


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"tau": 0.1}, r"tau=0.1 has no effect at semantic_weight=0.*leave tau at its default"),
        ({"vote": "shared"}, "vote='shared' has no effect at semantic_weight=0"),
        ({"vote": "per_label"}, "vote='per_label' has no effect at semantic_weight=0"),
        ({"vote": "nearest"}, "vote='nearest' has no effect at semantic_weight=0"),
        ({"tau_quantile": 0.9}, "tau_quantile=0.9 has no effect at semantic_weight=0"),
        ({"center": False}, "center=False has no effect at semantic_weight=0"),
        ({"own_vote": False}, "own_vote=False has no effect at semantic_weight=0"),
        (
            {"semantic_weight": 1.0, "tau": 0.2, "tau_quantile": 0.9},
            r"tau=0.2 has no effect with tau_quantile=0.9.*tau_quantile=None to use tau",
        ),
        ({"vote": "paper"}, "vote='paper' must be one of 'residual', 'nearest'"),
        ({"k": None}, "k=None must be an integer"),
        ({"vote": None}, "vote=None must be one of"),
    ],
)
def test_ignored_or_bad_settings_are_refused_by_name(changes, match):
    with pytest.raises(ValueError, match=match):
        SemsoftConfig().replace(**changes)


def test_k_and_the_score_temperature_are_allowed_at_weight_zero():
    cfg = SemsoftConfig(k=7, score_temperature=2.0)
    assert (cfg.k, cfg.score_temperature, cfg.semantic_weight) == (7, 2.0, 0.0)


def test_every_vote_is_allowed_with_a_positive_weight():
    for vote in VOTES:
        assert SemsoftConfig(vote=vote, semantic_weight=0.5).vote == vote


def test_replace_keeps_none_as_a_value():
    cfg = SemsoftConfig(tau_quantile=0.9, semantic_weight=1.0)
    assert cfg.replace(tau_quantile=None).tau_quantile is None
    assert cfg.replace().tau_quantile == 0.9


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_old_names_are_refused_with_the_new_one(old, tmp_path):
    new = RENAMED[old]
    with pytest.raises(ValueError, match=rf"^{old}: renamed: use {new}"):
        SemsoftConfig().replace(**{old: 1.0})
    path = tmp_path / "old.json"
    path.write_text(json.dumps({old: True}))
    with pytest.raises(ValueError, match=rf"config file .*old.json: {old}: renamed: use {new}"):
        SemsoftConfig.load(path)


def test_vote_rename_says_which_value_replaces_which_booleans():
    with pytest.raises(ValueError, match=r"'shared' \(residual=False, normalize_votes=True\)"):
        SemsoftConfig().replace(normalize_votes=True)


def test_the_same_refusals_over_http():
    from semsoft_plugin.core.request import parse_request

    base = {"semsoft_labels": ["yes", "no"]}
    with pytest.raises(ValueError, match="semsoft_temperature: renamed: use semsoft_score_temperature"):
        parse_request({**base, "semsoft_temperature": 2.0})
    with pytest.raises(ValueError, match="semsoft_residual: renamed: use semsoft_vote"):
        parse_request({**base, "semsoft_residual": 1})
    with pytest.raises(ValueError, match="semsoft_vote='shared' has no effect at semantic_weight"):
        parse_request({**base, "semsoft_vote": "shared"})
    with pytest.raises(ValueError, match="semsoft_vote='x' must be one of 'residual'"):
        parse_request({**base, "semsoft_vote": "x", "semsoft_semantic_weight": 1.0})
    with pytest.raises(ValueError, match=r"semsoft_preset='papr' must be one of 'constrained'"):
        parse_request({**base, "semsoft_preset": "papr"})


def test_http_preset_is_the_base_and_keys_override_it():
    from semsoft_plugin.core.request import parse_request

    base = {"semsoft_labels": ["yes", "no"]}
    request = parse_request({**base, "semsoft_preset": "paper", "semsoft_k": 9})
    assert request is not None
    assert request.config == SemsoftConfig.preset("paper").replace(k=9)
    shared = parse_request({**base, "semsoft_preset": "shared", "semsoft_vote": "per_label"})
    assert shared is not None and shared.config.vote == "per_label"
    # The round trip a client request takes keeps every field (no preset key needed).
    again = parse_request(request.to_extra_args())
    assert again is not None and again.config == request.config


def test_sampling_params_keywords_refuse_the_old_method_temperature():
    pytest.importorskip("vllm")
    from semsoft_plugin.engines.vllm.params import sampling_params

    with pytest.raises(ValueError, match="method_temperature: renamed: use score_temperature"):
        sampling_params(["yes", "no"], method_temperature=2.0)
    params = sampling_params(["yes", "no"], score_temperature=2.0, temperature=0.7)
    assert params.temperature == 0.7
    assert params.extra_args["semsoft_score_temperature"] == 2.0


def test_a_settings_record_naming_an_old_option_is_refused(tmp_path):
    from semsoft_plugin.app.file_settings import check_settings, settings_path

    out = tmp_path / "out.csv"
    now = {"model": "m", **{f"config.{k}": v for k, v in SemsoftConfig().to_dict().items()}}
    then = {**now, "config.temperature": 1.0, "config.residual": True}
    settings_path(out).write_text(json.dumps({"settings": then}))
    with pytest.raises(ValueError, match="records config.residual: renamed: use vote"):
        check_settings(out, now)
    settings_path(out).write_text(json.dumps({"settings": now}))
    check_settings(out, now)  # the same settings: resumed


def test_grids_build_valid_configs_and_refuse_a_search_of_nothing():
    from semsoft_plugin.fit.fitting import grid_configs

    paper = SemsoftConfig.preset("paper")
    configs = grid_configs({"semantic_weight": (0.0, 0.5)}, paper)
    assert configs[0] == SemsoftConfig()  # weight 0: the vote settings at their defaults
    assert configs[1] == paper.replace(semantic_weight=0.5)  # the start's otherwise
    with pytest.raises(ValueError, match="tau=0.2 has no effect at semantic_weight=0"):
        grid_configs({"tau": (0.0, 0.2)})  # the default weight 0, not searched


# Each field set away from its default, with a pool weight at which every vote setting
# acts: a field whose change leaves the scores unchanged is an option with no effect.
_EFFECTIVE_CHANGES = [
    ("k", 5),
    ("tau", 0.3),
    ("center", False),
    ("own_vote", False),
    ("vote", "nearest"),
    ("vote", "shared"),
    ("vote", "per_label"),
    ("score_temperature", 2.0),
    ("semantic_weight", 1.0),
    ("tau_quantile", 0.9),
    ("silent_vote", 0.0),
]


def test_every_field_is_in_the_effect_list():
    assert {f.name for f in dataclasses.fields(SemsoftConfig)} == {n for n, _ in _EFFECTIVE_CHANGES}


@pytest.mark.parametrize(("name", "value"), _EFFECTIVE_CHANGES)
def test_each_option_changes_the_scores(name, value):
    generator = torch.Generator().manual_seed(0)
    embeddings = torch.randn(64, 8, generator=generator)
    logits = torch.randn(4, 64, generator=generator) * 3
    labels = [0, 1, 2]
    base = SemsoftConfig(semantic_weight=0.5)
    before = semantic_softmax(logits, embeddings, labels, config=base)
    after = semantic_softmax(logits, embeddings, labels, config=base.replace(**{name: value}))
    assert (after - before).abs().max() > 1e-4, f"{name}={value!r} had no effect"
