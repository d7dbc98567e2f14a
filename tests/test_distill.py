"""semsoft distill: the recipe's steps, the modal-filter refusal, and a smoke run on SmolLM2."""

from __future__ import annotations

import json

import pytest

from semsoft_eval.confidence import target_from_samples
from semsoft_eval.distill import (
    QAItem,
    SampledItem,
    build_examples,
    check_label_entropy,
    evaluate_items,
    load_adapter,
    load_nq,
    modal_filter,
    sample_items,
    save_adapter,
    split_items,
    train_lora,
)


def _item(n_correct: int, modal_correct: bool, k: int = 0) -> SampledItem:
    return SampledItem(
        question=f"question {k}",
        aliases=("gold",),
        samples=("gold",) * n_correct + ("other",) * (10 - n_correct),
        modal="gold" if modal_correct else "other",
        agreement=max(n_correct, 10 - n_correct) / 10,
        n_correct=n_correct,
        modal_correct=modal_correct,
        target=target_from_samples(n_correct),
    )


class _ChatTokenizer:  # build_examples only asks whether a chat template exists
    chat_template = "{{ messages }}"


def test_modal_filter_collapses_targets_and_the_guard_refuses_it() -> None:
    # All items of a model that is mostly right: 80% at 95%, still a usable spread ...
    counts = [10] * 80 + [9] * 3 + [8, 7] + [5] * 3 + [3] * 2 + [1] * 4 + [0] * 6
    items = [_item(c, modal_correct=c >= 6, k=k) for k, c in enumerate(counts)]
    examples = build_examples(_ChatTokenizer(), items)
    assert check_label_entropy([e.target for e in examples])["entropy_bits"] > 1.0
    # ... filtered to items whose modal answer is correct: nearly all at 95%.
    kept = build_examples(_ChatTokenizer(), modal_filter(items))
    assert len(kept) == 85
    with pytest.raises(ValueError, match=r"label entropy collapse.*94\.1% of 85 .* are 95%"):
        check_label_entropy([e.target for e in kept], what="modal-filter set")


def test_examples_teach_answer_and_confidence_and_the_control_shuffles() -> None:
    items = [_item(c, c >= 5, k) for k, c in enumerate(range(11))]
    examples = build_examples(_ChatTokenizer(), items)
    assert examples[7].completion == " gold\nConfidence: 70%"
    assert examples[0].completion == " other\nConfidence: 5%"
    assert examples[0].prompt[-1] == {"role": "assistant", "content": "Answer:"}
    assert "Confidence:" in examples[0].prompt[0]["content"]
    shuffled = build_examples(_ChatTokenizer(), items, shuffle_targets=True, seed=1)
    assert sorted(e.target for e in shuffled) == sorted(e.target for e in examples)
    assert [e.target for e in shuffled] != [e.target for e in examples]
    assert [e.completion.split("\n")[0] for e in shuffled] == [
        e.completion.split("\n")[0] for e in examples
    ]


def test_nq_loader_and_split() -> None:
    items = load_nq()
    assert len(items) == 3610
    assert items[0].aliases == ("14 December 1972 UTC", "December 1972")
    train, held = split_items(items, 30, 20, seed=0)
    assert len(train) == 30 and len(held) == 20
    assert not {i.question for i in train} & {i.question for i in held}
    with pytest.raises(ValueError, match="exceed"):
        split_items(items, 3000, 1000)


@pytest.mark.slow
def test_smoke_distillation_on_the_default_model(model_and_tokenizer, default_checkpoint, tmp_path):
    from transformers import AutoModelForCausalLM

    model, tokenizer = model_and_tokenizer
    questions = [
        QAItem("what is the capital of france", ("Paris",)),
        QAItem("how many legs does a spider have", ("eight", "8")),
        QAItem("who wrote romeo and juliet", ("William Shakespeare", "Shakespeare")),
        QAItem("what colour is the sky on a clear day", ("blue",)),
    ]
    sampled = sample_items(model, tokenizer, questions, n=3, max_new_tokens=8, batch_size=4)
    assert [len(s.samples) for s in sampled] == [3, 3, 3, 3]
    for s in sampled:
        assert 0 <= s.n_correct <= 3 and s.target == target_from_samples(s.n_correct, 3)
    examples = build_examples(tokenizer, sampled)
    assert examples and all("\nConfidence: " in e.completion for e in examples)

    student = AutoModelForCausalLM.from_pretrained(default_checkpoint, dtype="float32")
    peft_model, losses = train_lora(student, tokenizer, examples, max_steps=3, batch_size=2)
    assert len(losses) == 3 and all(loss > 0 for loss in losses)
    adapter = save_adapter(peft_model, tmp_path / "adapter", {"run": "smoke"})
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (16, 32)
    assert (adapter / "adapter_model.safetensors").is_file()
    assert not list(adapter.glob("*.bin"))  # safetensors only, never pickle

    base = AutoModelForCausalLM.from_pretrained(default_checkpoint, dtype="bfloat16")
    tuned = load_adapter(base, adapter)
    metrics = evaluate_items(tuned, tokenizer, questions[:2], batch_size=2)
    assert metrics["n"] == 2 and 0 <= metrics["accuracy"] <= 1
    assert (
        metrics["n_unparsed"] + len([e for e in metrics["examples"] if e["confidence"] is not None])
        == 2
    )
