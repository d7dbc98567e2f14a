"""The logits processor driven through vLLM's own interfaces: the V1 ``BatchUpdate``
protocol (opted-out rows untouched through adds, moves and removals; refused label sets
ended), the ways vLLM loads it (class, class string, entry point, both at once), and the
Model Runner V2 code path against the installed ABC (no Triton on CPU).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from _vllm import (
    CLASH,
    EMOTIONS,
    SENTIMENT,
    FreshConfig,
    installed_entry_points,
    without_entry_points,
)

vllm = pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402
from vllm.v1.sample.logits_processor import BatchUpdate  # noqa: E402

from semsoft_plugin import SemanticSoftmax  # noqa: E402
from semsoft_plugin.core.labels import LabelSet  # noqa: E402
from semsoft_plugin.engines import scoring  # noqa: E402
from semsoft_plugin.engines import vllm as sv  # noqa: E402
from semsoft_plugin.engines.vllm import params as sv_params  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_v1_processor_never_writes_opted_out_rows(llm):
    """The V1 interface driven directly: opted-out rows are bitwise untouched, through
    adds, moves and removals of the persistent batch."""
    from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

    config = FreshConfig(llm.llm_engine.vllm_config.model_config)
    proc = sv.SemanticSoftmaxLogitsProcessor(config, torch.device("cpu"), False)
    opted, plain = sv.sampling_params(SENTIMENT), SamplingParams(max_tokens=3)
    outputs: list[list[int]] = [[], [], []]
    proc.update_state(
        BatchUpdate(
            batch_size=3,
            removed=[],
            added=[
                (0, plain, [1, 2], outputs[0]),
                (1, opted, [1, 2], outputs[1]),
                (2, plain, [3], outputs[2]),
            ],
            moved=[],
        )
    )
    vocab = config.model_config.get_vocab_size()
    logits = torch.randn(3, vocab)
    original = logits.clone()
    proc.apply(logits)
    assert torch.equal(logits[0], original[0]) and torch.equal(logits[2], original[2])
    assert torch.isfinite(logits[1]).sum() == len(SENTIMENT)
    # swap rows 0 and 1: the opted-in request now sits at row 0
    proc.update_state(
        BatchUpdate(batch_size=3, removed=[], added=[], moved=[(0, 1, MoveDirectionality.SWAP)])
    )
    logits = original.clone()
    proc.apply(logits)
    assert torch.equal(logits[1], original[1]) and torch.equal(logits[2], original[2])
    assert torch.isfinite(logits[0]).sum() == len(SENTIMENT)
    proc.update_state(BatchUpdate(batch_size=2, removed=[0], added=[], moved=[]))
    logits = original.clone()
    assert proc.apply(logits) is logits and torch.equal(logits, original)


def test_refused_label_set_is_ended_not_run_unconstrained(llm):
    """Should a refused label set reach the engine without the admission check, the
    processor ends it at its first step (EOS only) instead of leaving it free."""
    config = FreshConfig(llm.llm_engine.vllm_config.model_config)
    proc = sv.SemanticSoftmaxLogitsProcessor(config, torch.device("cpu"), False)
    outputs: list[int] = []
    proc.update_state(
        BatchUpdate(
            batch_size=1, removed=[], added=[(0, sv.sampling_params(CLASH), [1], outputs)], moved=[]
        )
    )
    logits = torch.randn(1, config.model_config.get_vocab_size())
    proc.apply(logits)
    eos = llm.get_tokenizer().eos_token_id
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [eos]


# ---------------------------------------------------------------------------
# Loading paths
# ---------------------------------------------------------------------------


def test_loading_by_class_string_and_double_load(llm):
    from vllm.v1.sample.logits_processor import build_logitsprocs

    config = llm.llm_engine.vllm_config
    for spec in ([sv.SemanticSoftmaxLogitsProcessor], [sv_params.ENTRY_POINT]):
        with pytest.MonkeyPatch.context() as patch:
            without_entry_points(patch)
            built = build_logitsprocs(config, torch.device("cpu"), False, False, spec)
        ours = [p for p in built.all if isinstance(p, sv.SemanticSoftmaxLogitsProcessor)]
        assert len(ours) == 1
    # The engine fixture already holds an active processor for this config, so copies
    # built for it stand down: a class both installed and passed acts once.
    assert all(p.inert for p in ours)
    fresh = FreshConfig(config.model_config)
    first = sv.SemanticSoftmaxLogitsProcessor(fresh, torch.device("cpu"), False)
    second = sv.SemanticSoftmaxLogitsProcessor(fresh, torch.device("cpu"), False)
    assert (first.inert, second.inert) == (False, True)


@pytest.mark.skipif(not installed_entry_points(), reason="package not installed (pip install -e .)")
def test_installed_entry_point_is_loaded_by_both_runners(llm):
    from vllm.v1.sample.logits_processor import _load_logitsprocs_plugins
    from vllm.v1.worker.gpu.sample.logits_processor.loader import _load_v2_logitsprocs_plugins

    assert sv.SemanticSoftmaxLogitsProcessor in _load_logitsprocs_plugins()
    assert sv.SemanticSoftmaxLogitsProcessor in _load_v2_logitsprocs_plugins()


# ---------------------------------------------------------------------------
# Model Runner V2 (no Triton on CPU: its code path against the installed ABC)
# ---------------------------------------------------------------------------


def test_model_runner_v2_code_path(llm, tokenizer, checkpoint):
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.worker.gpu.sample.logits_processor import (
        LogitsContext,
        LogitsProcRequestState,
        build_custom_logits_processors_params_validator,
    )
    from vllm.v1.worker.gpu.sample.logits_processor.loader import _load_v2_logitsprocs_by_fqcns

    assert (
        _load_v2_logitsprocs_by_fqcns([sv_params.ENTRY_POINT, sv.SemanticSoftmaxLogitsProcessor])
        == [sv.SemanticSoftmaxLogitsProcessor] * 2
    )
    validate = build_custom_logits_processors_params_validator([sv_params.ENTRY_POINT])
    # In-process: the method's ranges (the SERVER_* limits are the HTTP middleware's).
    with pytest.raises(VLLMValidationError, match="MAX_LABELS=1000"):
        validate(SamplingParams(logprobs=50, extra_args={"semsoft_labels": ["a"] * 1001}))

    config = llm.llm_engine.vllm_config
    vocab = config.model_config.get_vocab_size()
    slots, max_len = 4, 64
    all_tokens = torch.zeros((slots, max_len), dtype=torch.int64)
    prompt_len = np.zeros(slots, dtype=np.int32)
    state = LogitsProcRequestState(
        device=torch.device("cpu"),
        max_num_reqs=slots,
        vocab_size=vocab,
        all_token_ids=SimpleNamespace(gpu=all_tokens),
        prompt_len=SimpleNamespace(np=prompt_len),
        prefill_len=SimpleNamespace(np=prompt_len.copy()),
        total_len=SimpleNamespace(gpu=torch.zeros(slots, dtype=torch.int32)),
    )
    proc = sv.SemanticSoftmaxLogitsProcessor(FreshConfig(config.model_config), state)
    assert isinstance(proc, vllm.v1.worker.gpu.sample.logits_processor.LogitsProcessor)
    labels = LabelSet(EMOTIONS, tokenizer)
    multi = labels.index(labels.multi_token_labels[0])
    params = sv.sampling_params(EMOTIONS)
    assert proc.add_request(0, params) is True
    assert proc.add_request(1, SamplingParams(max_tokens=4)) is False
    assert proc.add_request(2, params) is True
    assert proc.add_request(3, params) is True
    prompt_len[:] = [10, 10, 30, 10]
    # slot 3 already sampled the multi-token label's first token: it is forced on
    sequence = labels.token_sequences[multi]
    all_tokens[3, 10] = sequence[0]

    torch.manual_seed(0)
    logits = torch.randn(4, vocab) * 3
    original = logits.clone()
    # rows in a shuffled order: row -> slot
    idx = np.array([2, 0, 3, 1])
    # slot 2 is a partial prefill (20 of 30 prompt tokens), slot 0 at its decision
    # step, slot 3 at output 1, slot 1 opted out
    seq_lens = np.array([20, 10, 11, 10])
    ctx = LogitsContext(
        expanded_idx_mapping=torch.tensor(idx),
        idx_mapping=torch.tensor(idx),
        idx_mapping_np=idx,
        expanded_local_pos=torch.zeros(4, dtype=torch.int64),
        input_ids=torch.zeros(4, dtype=torch.int64),
        pos=torch.tensor(seq_lens - 1),
        seq_lens_upper_bound_np=seq_lens,
    )
    out = proc.apply(logits, ctx)
    assert torch.equal(out[0], original[0])  # partial prefill: untouched
    assert torch.equal(out[3], original[3])  # opted out: untouched
    want = SemanticSoftmax(scoring.client_model(checkpoint).embeddings, labels)(
        original[1]
    ).probs
    answer = list(labels.answer_token_ids)
    finite = torch.isfinite(out[1]).nonzero().flatten().tolist()
    assert sorted(finite) == sorted(answer)
    assert torch.allclose(out[1, answer].exp(), want, atol=1e-5)
    assert torch.isfinite(out[2]).nonzero().flatten().tolist() == [sequence[1]]

    # A recycled slot is fully re-initialised by add_request.
    assert proc.add_request(0, SamplingParams(max_tokens=2)) is False
    again = proc.apply(original.clone(), ctx)
    assert torch.equal(again[1], original[1])
