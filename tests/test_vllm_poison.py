"""Hostile inputs to an offline engine (issue 17): a NaN row beside good ones, rows that
cannot be scored, a flood of refused label sets, and a ``LabelSet`` built on another
tokenizer. ``poison_llm`` puts a test-only processor before semsoft's that writes NaN.
"""

from __future__ import annotations

import pytest
import torch
from _vllm import (
    ATOL,
    ENGINE_ARGS,
    PROMPTS,
    SENTIMENT,
    FreshConfig,
    token_prompt,
    without_entry_points,
)

vllm = pytest.importorskip("vllm")

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.v1.sample.logits_processor import LogitsProcessor as V1LogitsProcessor  # noqa: E402
from vllm.v1.sample.logits_processor import process_dict_updates  # noqa: E402

from semsoft_plugin.core.labels import LabelSet  # noqa: E402
from semsoft_plugin.engines import scoring  # noqa: E402
from semsoft_plugin.engines import vllm as sv  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


class PoisonRows(V1LogitsProcessor):
    """Test-only, placed before semsoft's processor in the engine's list: writes NaN
    into every row of the requests whose ``extra_args`` carry ``test_poison``, at every
    step (a model that produced NaN logits for one input, as the next processor sees
    it)."""

    def __init__(self, vllm_config, device, is_pin_memory) -> None:
        self.rows: dict[int, bool] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update) -> None:
        def poisoned(params, _prompt, _output):
            return True if (params.extra_args or {}).get("test_poison") else None

        process_dict_updates(self.rows, batch_update, poisoned)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row in self.rows:
            if row < logits.shape[0]:
                logits[row] = float("nan")
        return logits


@pytest.fixture(scope="session")
def poison_llm(checkpoint):
    """Session-scoped like conftest's engines: an in-process engine torn down mid-session
    takes vLLM's process-wide parallel state with it, and every engine still open (the
    session's `llm`) then fails its next step."""
    with pytest.MonkeyPatch.context() as patch:
        without_entry_points(patch)
        engine = LLM(
            str(checkpoint),
            logits_processors=[PoisonRows, sv.SemanticSoftmaxLogitsProcessor],
            **ENGINE_ARGS,
        )
    yield engine


def test_a_nan_row_leaves_its_neighbours_alone(poison_llm):
    """One opted-in row is NaN: the engine batch goes on, the plain request beside it is
    answered as alone, the other opted-in request is scored and constrained as alone,
    the poisoned one is left as the engine had it and its reader says why."""
    tokenizer = poison_llm.get_tokenizer()
    poisoned = sv.sampling_params(SENTIMENT, extra_args={"test_poison": 1})
    neighbour = sv.sampling_params(SENTIMENT)
    plain = SamplingParams(max_tokens=7, temperature=0, logprobs=5)
    prompts = [
        token_prompt(tokenizer, PROMPTS["review"]),
        token_prompt(tokenizer, "The capital of France is"),
        token_prompt(tokenizer, PROMPTS["short"]),
    ]
    batch = poison_llm.generate(prompts, [poisoned, plain, neighbour], use_tqdm=False)

    alone_plain = poison_llm.generate([prompts[1]], plain, use_tqdm=False)[0]
    assert batch[1].outputs[0].token_ids == alone_plain.outputs[0].token_ids
    assert batch[1].outputs[0].text.strip()

    alone = poison_llm.generate([prompts[2]], neighbour, use_tqdm=False)[0]
    got, want = (
        sv.label_scores(batch[2], neighbour, poison_llm),
        sv.label_scores(alone, neighbour, poison_llm),
    )
    assert batch[2].outputs[0].text.strip() == got.label == want.label
    assert got.label == max(got.probs, key=got.probs.__getitem__)  # constrained: argmax
    for label in SENTIMENT:
        assert got.probs[label] == pytest.approx(want.probs[label], abs=ATOL)

    # Left exactly as the engine had it: the same tokens as the poisoned row opted out.
    opted_out = SamplingParams(
        max_tokens=poisoned.max_tokens,
        temperature=0,
        logprobs=poisoned.logprobs,
        extra_args={"test_poison": 1},
    )
    untouched = poison_llm.generate([prompts[0]], opted_out, use_tqdm=False)[0]
    assert batch[0].outputs[0].token_ids == untouched.outputs[0].token_ids
    with pytest.raises(ValueError, match=r"could not score .*NaN"):
        sv.label_scores(batch[0], poisoned, poison_llm)


def test_v1_rows_that_cannot_be_scored_are_left_as_they_are(poison_llm):
    """NaN, +inf and fully masked rows at the decision step: apply() does not raise,
    leaves them bitwise as they were and still constrains the good row."""
    from vllm.v1.sample.logits_processor import BatchUpdate

    config = FreshConfig(poison_llm.llm_engine.vllm_config.model_config)
    proc = sv.SemanticSoftmaxLogitsProcessor(config, torch.device("cpu"), False)
    opted, plain = sv.sampling_params(SENTIMENT), SamplingParams(max_tokens=3)
    added = [(i, opted, [1, 2, i], []) for i in range(4)] + [(4, plain, [5], [])]
    proc.update_state(BatchUpdate(batch_size=5, removed=[], added=added, moved=[]))
    logits = torch.randn(5, config.model_config.get_vocab_size())
    logits[0, 7] = float("nan")
    logits[1, 9] = float("inf")
    logits[2] = float("-inf")
    original = logits.clone()
    proc.apply(logits)
    for row in (0, 1, 2, 4):
        torch.testing.assert_close(logits[row], original[row], equal_nan=True, rtol=0, atol=0)
    assert torch.isfinite(logits[3]).sum() == len(SENTIMENT)
    # later steps of a row left unscored are not forced either
    for _, _, _, output in added[:3]:
        output.append(0)
    logits = original.clone()
    proc.apply(logits)
    for row in range(3):
        torch.testing.assert_close(logits[row], original[row], equal_nan=True, rtol=0, atol=0)


def test_refused_label_sets_keep_the_warning_record_bounded(poison_llm, caplog):
    from vllm.v1.sample.logits_processor import BatchUpdate

    config = FreshConfig(poison_llm.llm_engine.vllm_config.model_config)
    proc = sv.SemanticSoftmaxLogitsProcessor(config, torch.device("cpu"), False)
    # " annoy0" and " annoy0x" start with the same token: each set is refused by the
    # tokenizer, each with its own message.
    count = 3 * scoring.CACHE_SIZE
    for i in range(count):
        params = sv.sampling_params([f"annoy{i}", f"annoy{i}x"])
        proc.update_state(
            BatchUpdate(batch_size=1, removed=[], added=[(0, params, [1], [])], moved=[])
        )
        proc.update_state(BatchUpdate(batch_size=0, removed=[0], added=[], moved=[]))
    assert len(proc._warned) <= scoring.CACHE_SIZE
    assert any("annoy" in key and f"annoy{count - 1}" in key for key in proc._warned)
    caplog.clear()
    with caplog.at_level("WARNING", logger=sv.__name__):
        again = sv.sampling_params([f"annoy{count - 1}", f"annoy{count - 1}x"])
        proc.update_state(
            BatchUpdate(batch_size=1, removed=[], added=[(0, again, [1], [])], moved=[])
        )
    assert not caplog.records  # a recent refusal is not logged twice


def test_classify_vllm_refuses_a_label_set_of_another_tokenizer(poison_llm, foreign_tokenizer):
    with pytest.raises(ValueError, match=r"tiny-wordlevel.*classify_vllm|classify_vllm.*tiny"):
        sv.classify_vllm(poison_llm, ["x"], LabelSet(SENTIMENT, foreign_tokenizer))
    tokenizer = poison_llm.get_tokenizer()
    with pytest.raises(ValueError, match="verbalizers or variants"):
        sv.classify_vllm(
            poison_llm, ["x"], LabelSet(SENTIMENT, tokenizer, verbalizers={"positive": "good"})
        )
    own = LabelSet(SENTIMENT, tokenizer)
    (result,) = sv.classify_vllm(poison_llm, [PROMPTS["short"]], own, max_tokens=1)
    assert result.probs.keys() == set(SENTIMENT)
