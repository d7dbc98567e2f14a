"""semsoft distill: grading, targets, the guard, a one-step TRL LoRA run and the tables."""

from __future__ import annotations

import dataclasses
import json

import pytest

from semsoft_eval.confidence import check_label_entropy, target_from_samples
from semsoft_eval.distill import (
    DistillConfig,
    Example,
    QAItem,
    SampledItem,
    Signal,
    build_answer_examples,
    build_examples,
    closeness,
    format_markdown,
    grade,
    guarded,
    load_adapter,
    load_nq,
    load_task,
    modal_filter,
    qa_prompt,
    run_distill,
    sample_cached,
    save_adapter,
    score,
    split_items,
    split_items_with_warmup,
    stated_value_signal,
    summarise,
    train_lora,
    verbal_signal,
)

SST = ("negative", "positive")


def _item(n_correct: int, modal_correct: bool, k: int = 0) -> SampledItem:
    return SampledItem(
        question=f"question {k}",
        aliases=("gold",),
        samples=("gold",) * n_correct + ("other",) * (10 - n_correct),
        modal="gold" if modal_correct else "other",
        agreement=max(n_correct, 10 - n_correct) / 10,
        n_correct=n_correct,
        n_parsed=10,
        modal_correct=modal_correct,
        target=target_from_samples(n_correct),
    )


class _ChatTokenizer:  # build_examples only asks whether a chat template exists
    chat_template = "{{ messages }}"


def test_label_answers_are_graded_synonym_tolerant_and_unreadable_is_wrong() -> None:
    item = QAItem("Is this review positive or negative?\nReview: fine", ("positive",), SST)
    assert grade(" Positive.", item) == ("positive", True)
    assert grade("good", item) == ("positive", True)  # a listed synonym
    assert grade("NEGATIVE!", item) == ("negative", False)
    assert grade("It is a film", item) == (None, False)  # names no label: never guessed
    assert grade("", item) == (None, False)
    qa = QAItem("Question: capital of France?", ("Paris",))
    assert grade("It is Paris", qa) == ("it is paris", True)


def test_summarise_counts_correct_samples_and_unreadable_ones_never_vote() -> None:
    item = QAItem("q", ("positive",), SST)
    texts = ["positive"] * 6 + ["negative"] * 2 + ["hmm", "???"]
    s = summarise(item, texts)
    assert (s.n_correct, s.n_parsed, s.modal, s.agreement) == (6, 8, "positive", 0.6)
    assert s.modal_correct and s.target == target_from_samples(6) == 0.60
    # all unreadable: no modal answer, target 5%, and the item teaches nothing
    empty = summarise(item, ["what"] * 10)
    assert (empty.modal, empty.n_correct, empty.target) == ("", 0, 0.05)
    assert build_examples(_ChatTokenizer(), [empty]) == []


def test_modal_filter_collapses_targets_and_the_guard_refuses_it() -> None:
    counts = [10] * 80 + [9] * 3 + [8, 7] + [5] * 3 + [3] * 2 + [1] * 4 + [0] * 6
    items = [_item(c, modal_correct=c >= 6, k=k) for k, c in enumerate(counts)]
    examples = build_examples(_ChatTokenizer(), items)
    assert check_label_entropy([e.target for e in examples])["entropy_bits"] > 1.0
    kept = build_examples(_ChatTokenizer(), modal_filter(items))
    assert len(kept) == 85
    refused = guarded([e.target for e in kept], "modal-filter set")
    assert "label entropy collapse" in refused["refused"] and "94.1% of 85" in refused["refused"]
    assert "Train on all items instead of a filtered subset" in refused["refused"]  # remedy
    assert "fewer than the 16" in guarded([0.5] * 3, "tiny set")["refused"]


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


def test_loaders_and_split() -> None:
    items = load_nq()  # the built-in NQ-open rows: tests/data carries the first 24
    assert len(items) == 24
    assert items[0].aliases == ("14 December 1972 UTC", "December 1972")
    assert items[0].question.endswith("Question: when was the last time anyone was on the moon?")
    sst = load_task("sst2")  # 24 negative and 24 positive reviews
    assert len(sst) == 48 and sst[0].labels == SST and sst[0].aliases == ("negative",)
    train, held = split_items(sst, 30, 12, seed=0)
    assert len(train) == 30 and len(held) == 12
    assert not {i.question for i in train} & {i.question for i in held}
    with pytest.raises(ValueError, match="exceed the 24 questions"):
        split_items(items, 20, 5)
    with pytest.raises(ValueError, match="'emotions'"):
        load_task("emotions")


def test_warmup_items_are_disjoint_and_leave_train_and_held_out_unchanged() -> None:
    sst = load_task("sst2")
    train, held = split_items(sst, 20, 10, seed=3)
    train_w, held_w, warm = split_items_with_warmup(sst, 20, 10, 18, seed=3)
    assert (train_w, held_w) == (train, held) and len(warm) == 18
    seen = {i.question for i in train + held}
    assert not seen & {i.question for i in warm}
    with pytest.raises(ValueError, match="--warmup-items 19"):
        split_items_with_warmup(sst, 20, 10, 19)
    with pytest.raises(ValueError, match="-1"):
        split_items_with_warmup(sst, 20, 10, -1)


def test_answer_examples_teach_the_gold_answer_and_no_confidence() -> None:
    items = load_task("sst2")[:3]
    examples = build_answer_examples(_ChatTokenizer(), items)
    assert [e.completion for e in examples] == [f" {i.aliases[0]}" for i in items]
    assert all(e.target is None and "Confidence" not in e.completion for e in examples)
    # the plain question prompt, the one the teacher samples with (no confidence asked)
    assert examples[0].prompt == qa_prompt(_ChatTokenizer(), items[0])
    with pytest.raises(ValueError, match="no warm-up items"):
        build_answer_examples(_ChatTokenizer(), [])


def test_score_and_table_on_a_tiny_set() -> None:
    right = Signal(
        "s", [True, True, False, False], [0.9, 0.8, 0.3, None], True, 2.0, "1", [1, 1, 1, 0]
    )
    m = score(right)
    assert m["auroc2"] == 1.0 and m["n_scored"] == 3 and m["parse_rate"] == 0.75
    assert m["ceiling_rate"] == pytest.approx(1 / 3, abs=1e-4) and m["seconds_per_item"] == 0.5
    flipped = Signal("t", [True, True, False, False], [0.1, 0.2, 0.7, 0.8], True, 0.0, "1")
    assert score(flipped)["auroc2"] == 0.0
    assert closeness(flipped, right) == -1.0
    assert closeness(Signal("c", [True] * 4, [0.5] * 4, True, 0, "1"), right) is None
    row = {**m, "closeness_to_self_consistency": 0.5}
    report = {
        "heldout": {
            "self_consistency": m,
            "verbal_before": row,
            "one_pass": {"logit entropy": row},
        },
        "runs": {
            "all items": {
                "examples": 4,
                "guard": {"entropy_bits": 1.5},
                "steps": 1,
                "loss_first": 2.0,
                "loss_last": 1.0,
                "train_s": 3.0,
                "verbal": m,
                "verbal_closeness_to_self_consistency": 0.2,
                "target_ceiling_auroc2": 0.9,
                "train_fit_spearman": 0.25,
                "train_fit_items": 4,
                "stated_values": {"95%": 3, "none": 1},
            },  # fmt: skip
            "modal filter": {"examples": 2, "guard": {"refused": "too few"}},
        },
    }
    table = format_markdown(report)
    assert "| verbal, after: all items | 0.500 | 1.000 |" in table
    assert "modal filter: refused by the guard: too few" in table
    notes = table.split("\n\n")[-1].splitlines()
    assert notes == [
        "all items: AUROC2 of the held-out targets themselves against this arm's correctness "
        "(a student that repeated the teacher exactly): 0.900",
        "all items: on 4 of its own training items, Spearman of the expected stated value "
        "with the targets it was taught: 0.250",
        "all items: confidences stated (greedy): 95% x3, none x1",
        "modal filter: refused by the guard: too few",
    ]


@pytest.mark.slow
def test_sampling_one_trl_step_adapter_round_trip_and_evaluation(
    model_and_tokenizer, default_checkpoint, tmp_path
):
    import torch
    from transformers import AutoModelForCausalLM

    model, tokenizer = model_and_tokenizer
    items = load_task("sst2")[:3]
    key = {"model": "smoke", "n": 3}
    sampled, seconds = sample_cached(
        model, tokenizer, items, tmp_path / "s.json", key=key, n=3, max_tokens=3
    )
    assert seconds is not None and [len(s.samples) for s in sampled] == [3, 3, 3]
    for s in sampled:
        assert 0 <= s.n_correct <= s.n_parsed <= 3 and s.target == target_from_samples(
            s.n_correct, 3
        )
    again, cached = sample_cached(model, tokenizer, items, tmp_path / "s.json", key=key, n=3)
    assert cached is None and again == sampled  # the cache is read back, not resampled

    examples = [
        Example(qa_prompt(tokenizer, i, verbal=True), f" {i.aliases[0]}\nConfidence: 70%", 0.7)
        for i in items
    ]
    student = AutoModelForCausalLM.from_pretrained(default_checkpoint, dtype="float32")
    peft_model, losses = train_lora(
        student, tokenizer, examples, max_steps=1, batch_size=2, progress=False
    )
    assert len(losses) == 1 and losses[0] > 0
    adapter = save_adapter(peft_model, tmp_path / "adapter", {"run": "smoke"})
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (16, 32)
    assert (adapter / "adapter_model.safetensors").is_file()
    assert not list(adapter.glob("*.bin"))  # safetensors only, never pickle

    probe = tokenizer("Review: a fine film", return_tensors="pt")
    with torch.inference_mode():
        trained = peft_model(**probe).logits
    base = AutoModelForCausalLM.from_pretrained(default_checkpoint, dtype="float32")
    with torch.inference_mode():
        untouched = base(**probe).logits
    tuned = load_adapter(base, adapter)
    with torch.inference_mode():
        reloaded = tuned(**probe).logits
    assert not torch.allclose(trained, untouched, atol=1e-4)  # the step changed the model
    torch.testing.assert_close(reloaded, trained, atol=1e-4, rtol=1e-4)  # and it reloads

    verbal, entropy = verbal_signal(tuned, tokenizer, items[:2], batch_size=2, max_tokens=10)
    m = score(verbal)
    assert m["n"] == 2 and 0 <= m["accuracy"] <= 1 and 0 <= m["parse_rate"] <= 1
    assert all(c is None or 0 <= c <= 1 for c in verbal.confidence)
    assert all(c is not None and c <= 0 for c in entropy.confidence)


@pytest.mark.slow
def test_expected_stated_value_is_a_probability_weighted_mean() -> None:
    from semsoft_plugin.engines import models

    # float32 as in the run: in bf16 a cached and an uncached pass differ by ~0.1 nats
    model, tokenizer = models.load("smollm2-135m", dtype="float32")
    items = load_task("sst2")[:2]
    verbal = Signal("v", [True, False], [0.7, 0.7], True, 0.0, "1", answers=[" positive"] * 2)
    expected = stated_value_signal(model, tokenizer, items, verbal)
    assert expected.correct == verbal.correct
    # the shared-prefix cache gives what one full forward pass per statement gives
    import torch

    from semsoft_eval.confidence import PAPER_TARGETS, format_confidence
    from semsoft_plugin.engines.prompting import encode_prompts, format_prompt

    values = sorted(set(PAPER_TARGETS.values()))
    prompt = encode_prompts(
        tokenizer, [format_prompt(tokenizer, qa_prompt(tokenizer, items[0], verbal=True))]
    )[0]
    totals = []
    for v in values:
        tail = tokenizer.encode(
            f" positive\n{format_confidence(v / 100)}", add_special_tokens=False
        ) + [tokenizer.eos_token_id]
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([prompt + tail])).logits[0].double()
        logp = torch.log_softmax(logits, dim=-1)[len(prompt) - 1 : -1]
        totals.append(logp.gather(1, torch.tensor(tail)[:, None]).sum())
    full = float(torch.softmax(torch.stack(totals), 0) @ torch.tensor(values, dtype=torch.double))
    assert expected.confidence[0] == pytest.approx(full / 100, abs=1e-6)
    assert all(c is not None and 0.05 <= c <= 0.95 for c in expected.confidence)
    # only the statements given can be chosen: one value leaves no choice
    single = stated_value_signal(model, tokenizer, items, verbal, values=(35,))
    assert single.confidence == pytest.approx([0.35, 0.35])
    with pytest.raises(ValueError, match="same items"):
        stated_value_signal(model, tokenizer, items[:1], verbal)
    with pytest.raises(ValueError, match="values=.*120"):
        stated_value_signal(model, tokenizer, items, verbal, values=(50, 120))


@pytest.mark.slow
def test_run_distill_with_an_answer_warmup_end_to_end(tmp_path) -> None:
    """Every stage on a tiny set: the warm-up adapter is trained once, then reused."""
    config = DistillConfig(
        model="smollm2-135m", out=str(tmp_path / "run"), train_items=4, eval_items=2,
        warmup_items=2, n=2,
        max_steps=1, batch_size=2, min_train_examples=1, min_entropy_bits=0.0,
        max_top_share=1.0, control=False, modal_filter_run=False, eval_max_tokens=6,
        progress=False,
    )  # fmt: skip
    report = run_distill(config)
    warm = report["answer_warmup"]
    assert warm["items"] == 2 and warm["steps"] == 1 and warm["reused"] is False
    adapter = tmp_path / "run" / "adapter-answer-warmup"
    assert (adapter / "adapter_model.safetensors").is_file()
    arm = report["runs"]["all items"]
    info = json.loads((tmp_path / "run" / "adapter-all-items" / "distill.json").read_text())
    assert info["base_adapter"] == str(adapter)  # the arm's adapter applies on top of it
    assert arm["steps"] == 1 and "verbal_expected" in arm and "target_ceiling_auroc2" in arm
    assert (
        json.loads((tmp_path / "run" / "samples.json").read_text())["key"]["warmup"]["warmup_items"]
        == 2
    )  # the teacher's samples are the warmed-up model's, cached as such
    assert "answer warm-up" in format_markdown(report)
    again = run_distill(config)
    assert again["answer_warmup"]["reused"] is True
    # the arms retuned at another rate keep the same teacher when --warmup-lr pins its rate
    retuned = run_distill(dataclasses.replace(config, lr=2 * config.lr, warmup_lr=config.lr))
    assert retuned["answer_warmup"]["reused"] is True
    assert retuned["runs"]["all items"]["steps"] == 1
