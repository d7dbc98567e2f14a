"""The hidden state read back from the decision step's logits row (core/logits_inverse):
exact on a real model in float32, a fitted probe gives the same scores from it as from the
hook, and a row edited before the processor (a bias, a mask) is refused by its residual."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _probe import fit_plain

from semsoft_plugin.fit.logits_inverse import DEFAULT_TOLERANCE, LogitsInverse


@pytest.fixture(scope="module")
def rows(default_checkpoint):
    """Eight decision-step rows of SmolLM2-135M in float32: (hidden states, logits, W)."""
    from semsoft_plugin.engines import models

    model, tokenizer = models.load(str(default_checkpoint), dtype="float32")
    texts = ["I loved it.", "Awful.", "The plot was fine, I guess.", "Best film of the year!",
             "Boring and long.", "A masterpiece.", "Never again.", "It was okay."]  # fmt: skip
    hidden, logits = [], []
    with torch.inference_mode():
        for text in texts:
            ids = tokenizer(f"Review: {text}\nSentiment:", return_tensors="pt").input_ids
            out = model(input_ids=ids, output_hidden_states=True)
            hidden.append(out.hidden_states[-1][0, -1])
            logits.append(out.logits[0, -1])
    return torch.stack(hidden), torch.stack(logits), model.get_output_embeddings().weight.detach()


@pytest.fixture(scope="module")
def inverse(rows) -> LogitsInverse:
    return LogitsInverse(rows[2])


def test_the_hidden_state_comes_back_from_float32_logits(rows, inverse) -> None:
    hidden, logits, _ = rows
    back = inverse.read(logits)
    error = (back.hidden - hidden).norm(dim=1) / hidden.norm(dim=1)
    assert float(error.max()) < 1e-5, error
    assert back.readable.all() and float(back.residual.max()) < 1e-3


def test_a_probe_scores_the_logits_row_as_it_scores_the_hook(rows, inverse) -> None:
    hidden, logits, weight = rows
    x = hidden.double().numpy()
    probe = fit_plain(np.r_[x, x + 0.01], np.r_[np.arange(8) % 2, np.arange(8) % 2], 2)
    back = inverse.read(logits)
    np.testing.assert_allclose(probe.probs(back.hidden.numpy()), probe.probs(x), atol=1e-4)


def test_a_row_edited_before_the_processor_is_not_read(rows, inverse) -> None:
    logits = rows[1]
    edited = logits.clone()
    edited[0, 1234] += 2.0  # logit_bias on one token
    edited[1, 5:] = float("-inf")  # a grammar mask
    edited[2] = 30 * torch.tanh(edited[2] / 30)  # soft-capping
    edited[3] = edited[3] / 0.7  # a temperature applied earlier is a scaled h: still W h
    back = inverse.read(edited)
    assert back.readable.tolist() == [False, False, False, True, True, True, True, True]
    assert back.residual[1] == float("inf") and float(back.residual[0]) > 1.5
    # A bf16 head rounds each logit: within the stated tolerance, and h stays close.
    rounded = inverse.read(logits.bfloat16().float())
    assert rounded.readable.all() and float(rounded.residual.max()) < DEFAULT_TOLERANCE
    exact = inverse.read(logits).hidden
    assert float(((rounded.hidden - exact).norm(dim=1) / exact.norm(dim=1)).max()) < 1e-2


def test_refusals_name_the_bad_value() -> None:
    with pytest.raises(ValueError, match="full column rank"):
        LogitsInverse(torch.zeros(20, 4))
    with pytest.raises(ValueError, match="vocab_size=4"):
        LogitsInverse(torch.randn(20, 4), vocab_size=4)
    inverse = LogitsInverse(torch.randn(20, 4))
    with pytest.raises(ValueError, match=r"need \[N, >= 20\]"):
        inverse.read(torch.randn(2, 10))
    with pytest.raises(ValueError, match="tolerance=nan"):
        inverse.read(torch.randn(2, 20), tolerance=float("nan"))


TEXTS = ["I loved it.", "Awful.", "The plot was fine, I guess.", "Best film of the year!",
         "Boring and long.", "A masterpiece.", "Never again.", "It was okay.",
         "Wonderful acting.", "A waste of time.", "Not bad at all.", "Dull."]  # fmt: skip


@pytest.fixture(scope="module")
def hook_rows(default_checkpoint):
    """SmolLM2-135M in float32 through transformers' classify: the decision step's hidden
    states as the hook reads them, and the logits rows of the same pass."""
    from semsoft_plugin.engines import hf, models
    from semsoft_plugin.engines.hf_hidden import HiddenAtDecision

    model, tokenizer = models.load(str(default_checkpoint), dtype="float32")
    prompts = [f"Review: {t}\nSentiment:" for t in TEXTS]
    with HiddenAtDecision(model) as hook:
        results = hf.classify(model, tokenizer, prompts, ["positive", "negative", "neutral"],
                              batch_size=4, keep_logits=True, max_tokens=1)  # fmt: skip
    hidden = hook.rows(tokenizer, prompts, 4)
    logits = torch.stack([r.logits for r in results])
    return hidden, logits, model.get_output_embeddings().weight.detach()


def test_the_logits_row_probe_equals_the_hook_probe(hook_rows) -> None:
    """The core's probe on the logits row gives the hook probe's rows within 1e-4
    (float32, SmolLM2), with a label never seen in training (its add-one floor)."""
    from semsoft_plugin.fit.row_probe import probe_distribution

    hidden, logits, weight = hook_rows
    x = hidden.double().numpy()
    targets = np.array([0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 0, 1])  # label 2 never seen
    probe = fit_plain(x, targets, 3)
    rows = probe.on_logits(LogitsInverse(weight)).apply(logits)
    assert rows.readable.all()
    want = probe.probs(x)
    np.testing.assert_allclose(rows.probs.numpy(), want, atol=1e-4)
    np.testing.assert_allclose(want[:, 2], 1.0 / (12 + 3))
    # One rule: LinearProbe's rows are the core function's on the same scores.
    scores = ((x - probe.mean) / probe.scale) @ probe.weight.T + probe.bias
    core = probe_distribution(torch.from_numpy(scores), probe.seen.tolist(), 3, 12).numpy()
    np.testing.assert_array_equal(want, core)


def test_the_logits_row_probe_refuses_a_row_it_cannot_read(hook_rows) -> None:
    """An edited row is not scored (readable False, the uniform row, never NaN); the
    other rows of the batch come out exactly as they do alone."""
    hidden, logits, weight = hook_rows
    x = hidden.double().numpy()
    probe = fit_plain(x, np.arange(12) % 2, 2).on_logits(LogitsInverse(weight))
    edited = logits[:4].clone()
    edited[1, 99] += 3.0
    edited[2, 10:] = float("-inf")
    rows = probe.apply(edited)
    assert rows.readable.tolist() == [True, False, False, True]
    assert torch.isfinite(rows.probs).all()
    torch.testing.assert_close(rows.probs[1], torch.full((2,), 0.5, dtype=torch.float64))
    for i in (0, 3):
        torch.testing.assert_close(rows.probs[i], probe.apply(logits[i]).probs[0])
    assert probe.nbytes == (2 * weight.shape[1] + 2) * 8


def test_probe_distribution_refuses_bad_shapes() -> None:
    from semsoft_plugin.fit.row_probe import probe_distribution

    with pytest.raises(ValueError, match=r"need \[N, S\] and \[S\]"):
        probe_distribution(torch.zeros(2, 3), [0, 1], 3, 5)
    with pytest.raises(ValueError, match="must lie in"):
        probe_distribution(torch.zeros(2, 2), [0, 3], 3, 5)
    with pytest.raises(ValueError, match="distinct"):
        probe_distribution(torch.zeros(2, 2), [1, 1], 3, 5)
