"""The transformers adapter on the real default model (SmolLM2-135M-Instruct)."""

from __future__ import annotations

import threading

import pytest
import torch
from transformers import LogitsProcessorList

from semsoft_plugin import LabelSet, SemanticSoftmax
from semsoft_plugin.core.embeddings import from_checkpoint, from_model
from semsoft_plugin.engines.hf import SemanticSoftmaxLogitsProcessor, classify
from semsoft_plugin.engines.prompting import format_prompt

pytestmark = pytest.mark.slow

LABELS = ["joy", "sadness", "anger", "fear"]
TEXTS = [
    "I just got the job, I can't stop smiling!",
    "My dog died this morning.",
    "They cancelled my flight again and nobody will answer the phone, this is outrageous and I am done.",
    "There is a strange noise downstairs.",
    "ok",
]


def chat(text: str) -> list[dict[str, str]]:
    return [
        {"role": "user", "content": f"Which emotion: {', '.join(LABELS)}?\nText: {text}"},
        {"role": "assistant", "content": "Emotion:"},
    ]


@pytest.fixture(scope="module")
def setup(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    return model, tokenizer, LabelSet(LABELS, tokenizer)


def encode_batch(tokenizer, texts):
    prompts = [format_prompt(tokenizer, chat(t))[0] for t in texts]
    tokenizer.padding_side = "left"
    return tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)


def test_observe_mode_is_bit_identical_and_records_raw_step(setup):
    model, tokenizer, labels = setup
    batch = encode_batch(tokenizer, TEXTS)
    kwargs = dict(max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    with torch.inference_mode():
        plain = model.generate(**batch, **kwargs, output_logits=True, return_dict_in_generate=True)
        proc = SemanticSoftmaxLogitsProcessor(model, labels, mode="observe")
        observed = model.generate(**batch, **kwargs, logits_processor=LogitsProcessorList([proc]))
    assert torch.equal(plain.sequences, observed)
    raw_first_step = plain.logits[0]
    expected = SemanticSoftmax(from_model(model), labels)(raw_first_step)
    for row, result in enumerate(proc.results):
        assert result is not None
        torch.testing.assert_close(result.semantic, expected.semantic[row])
        torch.testing.assert_close(result.constrained, expected.constrained[row])


def test_constrain_mode_emits_the_calibrated_argmax(setup):
    model, tokenizer, labels = setup
    results = classify(model, tokenizer, [chat(t) for t in TEXTS], labels, batch_size=2)
    for result in results:
        assert result.label in LABELS
        assert result.text.strip() == result.label
        assert result.label == max(result.probs, key=result.probs.get)
        assert sum(result.probs.values()) == pytest.approx(1.0, abs=1e-5)


def test_multi_token_label_is_forced_through(setup):
    model, tokenizer, _ = setup
    labels = ["annoyance", "disapproval", "joy"]  # the first two are two tokens on SmolLM2
    label_set = LabelSet(labels, tokenizer)
    assert set(label_set.multi_token_labels) == {"annoyance", "disapproval"}
    prompt = [
        {
            "role": "user",
            "content": "Which emotion: annoyance, disapproval or joy?\nText: Stop doing that, seriously.",
        },
        {"role": "assistant", "content": "Emotion:"},
    ]
    for cfg in ({"tau": 0.2, "semantic_weight": 1.0}, {"tau": 0.99, "semantic_weight": 1.0}):
        (result,) = classify(model, tokenizer, [prompt], label_set, **cfg)
        assert result.text.strip() == result.label
        assert result.label == max(result.probs, key=result.probs.get)


def test_sampling_emits_valid_labels(setup):
    model, tokenizer, labels = setup
    torch.manual_seed(0)
    results = classify(
        model,
        tokenizer,
        [chat(TEXTS[4])] * 6,
        labels,
        generate_kwargs={"do_sample": True, "temperature": 1.0},
    )
    assert all(r.text.strip() == r.label and r.label in LABELS for r in results)


def test_padded_batch_equals_one_by_one(setup):
    model, tokenizer, labels = setup
    batched = classify(model, tokenizer, [chat(t) for t in TEXTS], labels, batch_size=len(TEXTS))
    for text, together in zip(TEXTS, batched, strict=True):
        (alone,) = classify(model, tokenizer, [chat(text)], labels)
        assert alone.label == together.label
        for label in LABELS:
            assert alone.probs[label] == pytest.approx(together.probs[label], abs=2e-2)


def test_num_return_sequences_rows_are_recorded(setup):
    model, tokenizer, labels = setup
    batch = encode_batch(tokenizer, TEXTS[:2])
    proc = SemanticSoftmaxLogitsProcessor(
        model, labels, mode="constrain", eos_token_id=tokenizer.eos_token_id
    )
    torch.manual_seed(1)
    with torch.inference_mode():
        out = model.generate(
            **batch,
            logits_processor=LogitsProcessorList([proc]),
            max_new_tokens=3,
            do_sample=True,
            num_return_sequences=3,
            pad_token_id=tokenizer.pad_token_id,
        )
    assert len(proc.results) == 6 and all(r is not None for r in proc.results)
    generated = tokenizer.batch_decode(
        out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True
    )
    for text, chosen in zip(generated, proc.chosen_labels, strict=True):
        assert text.strip() == LABELS[chosen]


def test_trigger_decides_after_the_text(setup):
    model, tokenizer, labels = setup
    prompt = [
        {
            "role": "user",
            "content": "Text: I won the lottery!\nFirst write 'Answer:' then one emotion: joy, sadness, anger or fear.",
        },
        {"role": "assistant", "content": "Let me think. Answer"},
    ]
    text, _ = format_prompt(tokenizer, prompt)
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    proc = SemanticSoftmaxLogitsProcessor(
        model,
        labels,
        mode="constrain",
        trigger="Answer:",
        tokenizer=tokenizer,
        eos_token_id=tokenizer.eos_token_id,
    )
    # Force the trigger's last character to be generated so the decision comes after it.
    forced = tokenizer.encode(":", add_special_tokens=False)

    def force_colon(input_ids, scores):
        if input_ids.shape[1] == ids["input_ids"].shape[1]:
            scores = torch.full_like(scores, float("-inf"))
            scores[:, forced[0]] = 0
        return scores

    with torch.inference_mode():
        out = model.generate(
            **ids,
            logits_processor=LogitsProcessorList([force_colon, proc]),
            max_new_tokens=4,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )
    generated = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    assert proc.results[0] is not None
    assert generated.startswith(":")
    assert generated[1:].strip() in LABELS


def test_trigger_never_generated_leaves_none(setup):
    model, tokenizer, labels = setup
    batch = encode_batch(tokenizer, TEXTS[:1])
    proc = SemanticSoftmaxLogitsProcessor(
        model, labels, mode="observe", trigger="@@@never@@@", tokenizer=tokenizer
    )
    with torch.inference_mode():
        model.generate(
            **batch,
            logits_processor=LogitsProcessorList([proc]),
            max_new_tokens=2,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )
    assert proc.results == [None]


def test_threads_keep_separate_results(setup):
    model, tokenizer, labels = setup
    proc = SemanticSoftmaxLogitsProcessor(model, labels, mode="observe")
    seen: dict[int, list] = {}

    def run(index: int) -> None:
        batch = encode_batch(tokenizer, [TEXTS[index]] * (index + 1))
        with torch.inference_mode():
            model.generate(
                **batch,
                logits_processor=LogitsProcessorList([proc]),
                max_new_tokens=3,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )
        seen[index] = proc.results

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for index in range(3):
        assert len(seen[index]) == index + 1
        (alone,) = classify(model, tokenizer, [chat(TEXTS[index])], labels, mode="observe")
        assert seen[index][0].semantic.tolist() == pytest.approx(
            list(alone.probs.values()), abs=2e-2
        )


def test_embeddings_from_checkpoint_equal_the_model(setup, default_checkpoint):
    model, _, _ = setup
    from_file = from_checkpoint(default_checkpoint)
    assert torch.equal(from_file.weight, from_model(model).weight)


def test_bad_arguments(setup):
    model, tokenizer, labels = setup
    with pytest.raises(ValueError, match="mode='guess'"):
        SemanticSoftmaxLogitsProcessor(model, labels, mode="guess")
    with pytest.raises(ValueError, match="trigger needs the tokenizer"):
        SemanticSoftmaxLogitsProcessor(model, labels, trigger="Answer:")
    with pytest.raises(ValueError, match="batch_size=0"):
        classify(model, tokenizer, ["x"], labels, batch_size=0)
    with pytest.raises(ValueError, match="neither a string nor a list of chat messages"):
        classify(model, tokenizer, [42], labels)


# --- hostile inputs (issue 17) --------------------------------------------------


def test_beam_search_is_refused_naming_num_beams(setup):
    from transformers import GenerationConfig

    model, tokenizer, labels = setup
    items = [chat(t) for t in TEXTS[:3]]
    with pytest.raises(ValueError, match="num_beams=2"):
        classify(model, tokenizer, items, LABELS, generate_kwargs={"num_beams": 2})
    beams = GenerationConfig(num_beams=3, do_sample=False, max_new_tokens=3)
    with pytest.raises(ValueError, match="num_beams=3"):
        classify(model, tokenizer, items, LABELS, generate_kwargs={"generation_config": beams})
    # model.generate with the processor: refused at the first step, not 6 rows recorded
    proc = SemanticSoftmaxLogitsProcessor(model, labels, mode="observe")
    batch = encode_batch(tokenizer, TEXTS[:2])
    with pytest.raises(ValueError, match="num_beams"):
        model.generate(
            **batch,
            num_beams=3,
            do_sample=False,
            max_new_tokens=3,
            logits_processor=LogitsProcessorList([proc]),
            pad_token_id=tokenizer.eos_token_id,
        )
    # greedy right after still works in the same thread
    classify(model, tokenizer, items[:1], LABELS)


def test_rows_reordered_between_steps_are_refused(setup):
    """Any loop that reorders rows (what beam search does) is caught too."""
    model, tokenizer, labels = setup
    proc = SemanticSoftmaxLogitsProcessor(model, labels, mode="observe")
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    vocab = model.config.vocab_size
    proc(ids, torch.randn(2, vocab))
    swapped = torch.tensor([[4, 5, 6, 7], [1, 2, 3, 8]])
    with pytest.raises(ValueError, match="num_beams"):
        proc(swapped, torch.randn(2, vocab))


@pytest.mark.parametrize(
    ("labels", "match"), [("joy,sadness", "list of strings"), (["joy"], "one label")]
)
def test_classify_label_list_rule(setup, labels, match):
    model, tokenizer, _ = setup
    with pytest.raises(ValueError, match=match):
        classify(model, tokenizer, [chat(TEXTS[0])], labels)


def test_label_set_of_another_tokenizer_is_refused(setup, foreign_tokenizer):
    model, tokenizer, _ = setup
    foreign = LabelSet(LABELS, foreign_tokenizer)
    with pytest.raises(ValueError, match=r"tiny-wordlevel.*transformers processor"):
        SemanticSoftmaxLogitsProcessor(model, foreign, tokenizer=tokenizer)
    with pytest.raises(ValueError, match="tiny-wordlevel"):
        classify(model, tokenizer, [chat(TEXTS[0])], foreign)


def test_tiny_temperature_in_classify_is_a_hard_argmax(setup):
    model, tokenizer, _ = setup
    (result,) = classify(model, tokenizer, [chat(TEXTS[1])], LABELS, score_temperature=1e-45)
    probs = torch.tensor(list(result.probs.values()))
    assert torch.isfinite(probs).all() and float(probs.sum()) == pytest.approx(1.0)
    assert float(probs.max()) == pytest.approx(1.0) and result.probs[result.label] == 1.0
