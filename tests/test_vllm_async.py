"""Async scheduling: placeholder output tokens (V1 runner). The CPU platform turns async
scheduling off, so the processor is driven through the runner's own per-step state
handling instead of an engine, with and without vLLM's placeholder repair.
"""

from __future__ import annotations

import pytest
import torch
from _vllm import MULTI, SENTIMENT, FreshConfig

vllm = pytest.importorskip("vllm")

from semsoft_plugin.core.labels import LabelSet  # noqa: E402
from semsoft_plugin.engines import vllm as sv  # noqa: E402
from semsoft_plugin.engines.vllm import params as sparams  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


class _CopyDone:
    """The runner's device-to-host copy event, already complete (the CPU backend has
    no events; on a GPU the runner waits on a CUDA event here)."""

    def synchronize(self) -> None:
        pass


def _async_runner_steps(proc, requests, steps, *, repaired, logits_for, vocab):
    """Drive ``proc`` through the V1 runner's own per-step state handling under async
    scheduling, on its real data structures (``InputBatch``, ``CachedRequestState``,
    ``BatchUpdateBuilder`` and the real ``Sampler``); only the forward pass is replaced
    by ``logits_for(step)``.

    Per step, as ``GPUModelRunner`` does: ``refresh_metadata`` (batch updates reach the
    processor), ``update_async_output_token_ids`` (the repair, which acts only when
    ``logitsprocs_need_output_token_ids``, i.e. ``repaired``), the sampler (which calls
    the processor), then ``_bookkeeping_sync``'s async branch: a ``-1`` placeholder is
    appended to each request's output-token list (the list object the processor was
    handed) and the sampled ids are kept for the next step's repair.

    Returns the truly sampled tokens per request, the request states and, per step,
    which rows the processor changed.
    """
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch

    batch = InputBatch(
        max_num_reqs=len(requests),
        max_model_len=512,
        max_num_batched_tokens=64,
        device=torch.device("cpu"),
        vocab_size=vocab,
        block_sizes=[16],
        max_num_blocks_per_req=[32],
        logitsprocs=LogitsProcessors([proc]),
        logitsprocs_need_output_token_ids=repaired,
    )
    states = []
    for i, params in enumerate(requests):
        state = CachedRequestState(
            req_id=f"req{i}",
            prompt_token_ids=[1, 2, 3],
            mm_features=[],
            sampling_params=params,
            # as GPUModelRunner._update_states: a per-request generator for seeded requests
            generator=None if params.seed is None else torch.Generator().manual_seed(params.seed),
            block_ids=([],),
            num_computed_tokens=0,
            output_token_ids=[],
        )
        batch.add_request(state)
        states.append(state)
    sampler = Sampler()
    sampled: list[list[int]] = [[] for _ in requests]
    touched: list[list[bool]] = []
    placeholders_seen = 0
    for step in range(steps):
        batch.refresh_metadata()
        batch.update_async_output_token_ids()
        logits = logits_for(step)
        original = logits.clone()
        output = sampler(logits, batch.sampling_metadata)
        touched.append([not torch.equal(logits[i], original[i]) for i in range(len(requests))])
        ids = output.sampled_token_ids
        for i, state in enumerate(states):
            sampled[i].append(int(ids[i, 0]))
            state.output_token_ids.extend([-1])
        placeholders_seen += sum(s.output_token_ids[-1] == -1 for s in states)
        batch.prev_req_id_to_index = {s.req_id: i for i, s in enumerate(states)}
        batch.set_async_sampled_token_ids(ids.cpu(), _CopyDone())
    assert placeholders_seen == steps * len(requests)  # the state really had placeholders
    for index, state in proc._active.items():  # the processor reads the runner's lists
        assert state.output_ids is states[index].output_token_ids
    return sampled, states, touched


def _labels_logits(rows, vocab, pushes):
    """Random logits per step; ``pushes[step][row] = token`` makes that token the
    model's clear favourite (to write a trigger before the decision)."""

    def logits_for(step):
        generator = torch.Generator().manual_seed(100 + step)
        logits = torch.randn(rows, vocab, generator=generator) * 3
        for row, token in pushes.get(step, {}).items():
            logits[row, token] = 60.0
        return logits

    return logits_for


@pytest.fixture(scope="module")
def async_setup(llm, tokenizer):
    config = llm.llm_engine.vllm_config
    labels = LabelSet(MULTI, tokenizer)
    trigger_ids = tokenizer.encode(" Answer:", add_special_tokens=False)
    assert tokenizer.decode(trigger_ids).endswith("Answer:")
    return config, labels, trigger_ids, config.model_config.get_vocab_size()


def _expect_label_then_eos(tokens, labels, eos):
    for sequence in labels.token_sequences:
        if tuple(tokens[: len(sequence)]) == sequence:
            assert tokens[len(sequence)] == eos
            return sequence
    raise AssertionError(f"{tokens} does not start with a label")


def _multi_token_requests() -> list:
    """Two-token labels, greedy and sampled, and behind a trigger: what a placeholder
    could derail."""
    return [
        sv.sampling_params(MULTI),
        sv.sampling_params(MULTI, temperature=1.0, seed=7),
        sv.sampling_params(MULTI, trigger="Answer:", max_tokens=12),
    ]


def test_async_placeholders_repaired_path_completes_labels_and_triggers(async_setup, tokenizer):
    """Processor passed explicitly (``logits_processors=``): vLLM repairs the ``-1``
    placeholders right before the sampler, so greedy and sampled multi-token labels
    and a trigger are followed, then EOS."""
    config, labels, trigger_ids, vocab = async_setup
    proc = sv.SemanticSoftmaxLogitsProcessor(FreshConfig(config.model_config), "cpu", False)
    requests = _multi_token_requests()
    pushes = {s: {2: t} for s, t in enumerate(trigger_ids)}
    torch.manual_seed(0)
    sampled, _, touched = _async_runner_steps(
        proc, requests, 8, repaired=True, logits_for=_labels_logits(3, vocab, pushes), vocab=vocab
    )
    eos = tokenizer.eos_token_id
    for row in (0, 1):
        sequence = _expect_label_then_eos(sampled[row], labels, eos)
        assert len(sequence) == 2 and all(touched[s][row] for s in range(len(sequence) + 1))
    t = len(trigger_ids)
    assert sampled[2][:t] == trigger_ids and not any(touched[s][2] for s in range(t))
    _expect_label_then_eos(sampled[2][t:], labels, eos)


def test_async_placeholders_entry_point_only_never_acts_on_a_placeholder(
    async_setup, tokenizer, caplog
):
    """Entry point only: the runner never repairs the placeholders. A greedy label is
    still completed (the processor records the greedy pick its own logits force); a
    sampled multi-token label and a trigger are left alone rather than forced from a
    ``-1``, and the processor says how to fix the engine."""
    import logging

    config, labels, trigger_ids, vocab = async_setup
    proc = sv.SemanticSoftmaxLogitsProcessor(FreshConfig(config.model_config), "cpu", False)
    requests = [
        *_multi_token_requests(),
        sv.sampling_params(SENTIMENT, temperature=1.0, seed=3),  # one-token labels
    ]
    pushes = {s: {2: t} for s, t in enumerate(trigger_ids)}
    torch.manual_seed(0)
    with caplog.at_level(logging.WARNING, logger=sv.__name__):
        sampled, states, touched = _async_runner_steps(
            proc,
            requests,
            6,
            repaired=False,
            logits_for=_labels_logits(4, vocab, pushes),
            vocab=vocab,
        )
    assert all(t == -1 for s in states for t in s.output_token_ids)  # never repaired
    eos = tokenizer.eos_token_id
    _expect_label_then_eos(sampled[0], labels, eos)
    # sampled multi-token label: decided at step 0, then nothing forced from a -1
    assert touched[0][1] and not any(touched[s][1] for s in range(1, 6))
    assert sampled[1][0] in labels.answer_token_ids
    # trigger: the search never reads a placeholder, so it never fires
    assert not any(touched[s][2] for s in range(6))
    # one-token labels: EOS needs no label, so it is forced anyway
    assert sampled[3][0] in LabelSet(SENTIMENT, tokenizer).answer_token_ids
    assert sampled[3][1] == eos
    assert "--logits-processors" in caplog.text and "placeholders" in caplog.text


def test_cpu_platform_turns_async_scheduling_off(checkpoint):
    """Why the placeholder tests drive the runner's structures instead of an engine:
    the CPU platform overrides ``async_scheduling=True`` (no end-to-end async run is
    possible here)."""
    from vllm.engine.arg_utils import EngineArgs

    config = EngineArgs(
        model=str(checkpoint), async_scheduling=True, enforce_eager=True, max_model_len=512,
        max_logprobs=64,  # k=50 needs it: admission refuses a k above it, naming it
    ).create_engine_config()  # fmt: skip
    assert config.scheduler_config.async_scheduling is False
    assert not sparams.unrepaired_output_tokens(config, "v1")
    config.scheduler_config.async_scheduling = True  # what a GPU engine would hold
    assert sparams.unrepaired_output_tokens(config, "v1")  # entry point only
    assert not sparams.unrepaired_output_tokens(config, "v2")
    # what such an engine could not follow is refused at admission, naming the fix
    for params in (
        sv.sampling_params(MULTI, trigger="Answer:"),
        sv.sampling_params(MULTI, temperature=1.0),
    ):
        with pytest.raises(ValueError, match="--no-async-scheduling"):
            sv.validate_params(params, vllm_config=config)
    for params in (sv.sampling_params(MULTI), sv.sampling_params(SENTIMENT, temperature=1.0)):
        sv.validate_params(params, vllm_config=config)  # greedy / one-token labels: served
    config.model_config.logits_processors = [sparams.ENTRY_POINT]
    assert not sparams.unrepaired_output_tokens(config, "v1")
    sv.validate_params(sv.sampling_params(MULTI, trigger="Answer:"), vllm_config=config)
