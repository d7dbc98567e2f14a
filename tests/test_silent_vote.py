"""The per-row pool decided by each row's silent vote (`SemsoftConfig.silent_vote`,
`preset("silent-vote")`): the core rule against a hand computation, its rows independent
of the batch, its refusals, and the one option name on the Python, CLI and HTTP paths."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

from semsoft_plugin import SemanticSoftmax, SemsoftConfig, constrained_softmax
from semsoft_plugin.app.config_args import add_config_arguments, config_from_args
from semsoft_plugin.core import request as sreq
from semsoft_plugin.core.config import PRESETS
from semsoft_plugin.core.silent_vote import silent_vote_mass, silent_vote_weight

# Two labels (a, b), a synonym of a (cos 0.8 to a, 0 to b) and a filler near neither.
A, B, SYN, FILLER = 0, 1, 2, 3
EMB = torch.tensor(
    [[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.8, 0.0, 0.6, 0.0], [0.0, 0.0, 0.0, 1.0]]
)


def _logits(p: list[float]) -> torch.Tensor:
    return torch.tensor(p, dtype=torch.float64).log().float()


def _score(p: list[float], **config: float) -> np.ndarray:
    scorer = SemanticSoftmax(EMB, [A, B], k=4, center=False, **config)
    return scorer(_logits(p)).probs.double().numpy()


def test_row_weight_is_its_silent_vote_hand_computed():
    p = [0.30, 0.10, 0.20, 0.40]  # a, b, synonym, filler
    m_out = 0.20 * 0.8  # the synonym's share of the kept mass times its closeness
    weight = 1.0 * (m_out - 0.1) / (1 - 0.1)  # a_max = 1, t = 0.1
    constrained = np.array([0.75, 0.25])
    # The residual vote at tau = 0: the synonym claims 0.16 for a, the rest follows
    # the constrained softmax.
    semantic = np.array([0.30 + m_out, 0.10]) + (1 - 0.56) * constrained
    pooled = constrained ** (1 - weight) * semantic**weight
    got = _score(p, semantic_weight=1.0, silent_vote=0.1)
    np.testing.assert_allclose(got, pooled / pooled.sum(), atol=1e-6)
    # The same row through the fixed pool at that weight: the rule only sets the weight.
    np.testing.assert_allclose(got, _score(p, semantic_weight=weight), atol=1e-6)


def test_a_row_without_a_silent_vote_is_the_constrained_softmax():
    # All kept mass on the labels and the filler: nothing to pool, whatever a_max.
    p = [0.05, 0.15, 1e-9, 0.80]
    for weight in (0.3, 1.0):
        np.testing.assert_allclose(
            _score(p, semantic_weight=weight, silent_vote=0.0),
            constrained_softmax(_logits(p), [A, B]).double().numpy(),
            atol=1e-6,
        )
    # A silent vote at or below the threshold is not pooled either.
    p = [0.30, 0.10, 0.20, 0.40]  # m_out = 0.16
    np.testing.assert_allclose(
        _score(p, semantic_weight=1.0, silent_vote=0.16), [0.75, 0.25], atol=1e-6
    )


def test_rows_never_depend_on_the_batch():
    generator = torch.Generator().manual_seed(0)
    emb = torch.randn(64, 8, generator=generator)
    logits = torch.randn(12, 64, generator=generator) * 3
    scorer = SemanticSoftmax(emb, [3, 9, 20], SemsoftConfig.preset("silent-vote"))
    batch = scorer(logits).probs
    weights = set()
    for i in range(logits.shape[0]):
        alone = scorer(logits[i]).probs
        torch.testing.assert_close(alone, batch[i], atol=1e-6, rtol=0)
        # the same row beside other rows, in another position
        mixed = scorer(torch.cat([logits[i:] * 2, logits[i : i + 1]])).probs[-1]
        torch.testing.assert_close(mixed, batch[i], atol=1e-6, rtol=0)
        weights.add(round(float((alone - scorer(logits[i]).constrained_probs).abs().sum()), 6))
    assert len(weights) > 1  # rows are pooled by different amounts


def test_weight_is_monotone_and_bounded():
    m = torch.linspace(0, 1, 101, dtype=torch.float64)
    for a_max, t in ((1.0, 0.0), (0.5, 0.4), (0.3, 0.9)):
        a = silent_vote_weight(m, a_max, t).flatten()
        assert a.shape == (101,) and bool((a.diff() >= 0).all())
        assert float(a.min()) == 0.0 and float(a.max()) == pytest.approx(a_max)
        assert bool((a[m <= t] == 0).all())
    with pytest.raises(ValueError, match="threshold=1.0"):
        silent_vote_weight(m, 0.5, 1.0)
    with pytest.raises(ValueError, match="weight=1.5"):
        silent_vote_weight(m, 1.5, 0.2)


def test_silent_vote_mass_counts_only_neighbours_outside_the_label_tokens():
    top_p = torch.tensor([[0.5, 0.3, 0.2], [0.0, 0.0, 0.0]])
    closeness = torch.tensor([[1.0, 0.5, 0.0], [1.0, 1.0, 1.0]])
    own = torch.tensor([[True, False, False], [False, False, False]])
    torch.testing.assert_close(
        silent_vote_mass(top_p, closeness, own), torch.tensor([0.15, 0.0], dtype=torch.float64)
    )


def test_preset_and_refusals_name_the_value():
    preset = SemsoftConfig.preset("silent-vote")
    assert "silent-vote" in PRESETS
    assert preset.silent_vote is not None and 0 < preset.semantic_weight <= 1
    assert SemsoftConfig().silent_vote is None
    for bad in (1.0, -0.1, float("nan"), "0.3", True):
        with pytest.raises(ValueError, match=r"silent_vote=.* must be None or a finite"):
            SemsoftConfig(semantic_weight=0.5, silent_vote=bad)
    with pytest.raises(ValueError, match="silent_vote=0.4 has no effect at semantic_weight=0"):
        SemsoftConfig(silent_vote=0.4)


def test_one_option_name_on_the_cli_and_http_paths():
    preset = SemsoftConfig.preset("silent-vote")
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    args = parser.parse_args(["--preset", "silent-vote"])
    assert config_from_args(args) == preset
    args = parser.parse_args(["--preset", "silent-vote", "--silent-vote", "0.25"])
    assert config_from_args(args) == preset.replace(silent_vote=0.25)
    args = parser.parse_args(["--preset", "pooled", "--silent-vote", "none"])
    assert config_from_args(args) == SemsoftConfig.preset("pooled")
    labels = {"semsoft_labels": ["joy", "anger"]}
    parsed = sreq.parse_request({**labels, "semsoft_preset": "silent-vote"})
    assert parsed is not None and parsed.config == preset
    parsed = sreq.parse_request(
        {**labels, "semsoft_semantic_weight": 0.7, "semsoft_silent_vote": 0.1}, server=True
    )
    assert parsed is not None and parsed.config == SemsoftConfig(
        semantic_weight=0.7, silent_vote=0.1
    )
    extra = sreq.build_request(["joy", "anger"], config=preset).to_extra_args()
    assert extra["semsoft_silent_vote"] == preset.silent_vote
    assert sreq.parse_request(extra).config == preset
    with pytest.raises(ValueError, match="semsoft_silent_vote=2"):
        sreq.parse_request({**labels, "semsoft_semantic_weight": 0.5, "semsoft_silent_vote": 2})


def test_readers_fetch_every_answer_token_for_a_per_row_pool():
    from semsoft_plugin.engines import scoring

    request = sreq.build_request(["joy", "anger"], semantic_weight=1.0, silent_vote=0.2)
    assert scoring._needed(request, fallback=False)
    assert not scoring._needed(sreq.build_request(["joy", "anger"], semantic_weight=1.0), False)


def test_eval_has_the_preset_as_a_method():
    from semsoft_eval.methods import METHODS

    assert "silent-vote" in METHODS
