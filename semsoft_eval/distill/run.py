"""The whole recipe (`semsoft distill`): three arms and the signals side by side.

[`run_distill`][semsoft_eval.distill.run.run_distill] samples train and held-out items once
(cached), builds the targets and trains three arms as in Cacioli (2026): `all items` (the
rescue), `shuffled` (the control: the same targets permuted across items) and `modal
filter` (only items whose modal answer is right; the guard refuses its collapsed targets,
reported, not raised). With `warmup_items > 0` a first LoRA teaches the answer alone and is
merged before anything else ([`build_answer_examples`][semsoft_eval.distill.targets.build_answer_examples]).

A main set the guard refuses raises `ValueError`. `report.json` holds the held-out verbal
confidence before and after each arm, the one-pass signals of
[`semsoft_eval.distill.evaluation`][semsoft_eval.distill.evaluation], their cost and the
training time; [`format_markdown`][semsoft_eval.distill.tables.format_markdown] makes tables.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from semsoft_eval.confidence import auroc2
from semsoft_eval.distill.data import load_task, split_items_with_warmup
from semsoft_eval.distill.evaluation import (
    Signal,
    closeness,
    label_signals,
    score,
    self_consistency_signal,
    stated_value_signal,
    stated_values,
    verbal_signal,
)
from semsoft_eval.distill.targets import (
    Example,
    build_answer_examples,
    build_examples,
    cache_key,
    guarded,
    modal_filter,
    sample_cached,
)
from semsoft_eval.distill.training import load_adapter, save_adapter, train_lora

__all__ = [
    "DistillConfig",
    "run_distill",
    "load_student",
    "read_verbal",
    "read_arm",
]


@dataclass
class DistillConfig:
    """Settings of [`run_distill`][semsoft_eval.distill.run.run_distill] (the command's flags)."""

    model: str = "default"
    task: str = "sst2"
    data: str | None = None
    out: str = "runs/distill"
    train_items: int = 100
    eval_items: int = 50
    n: int = 10
    temperature: float = 0.7
    seed: int = 0
    match: str = "contains"
    sample_batch_size: int = 4
    eval_batch_size: int = 8
    eval_max_tokens: int = 12  # the answer line and "Confidence: NN%"
    max_tokens: int | None = None  # sampling; default: 4 (label task), 16 (open QA)
    rank: int = 16
    alpha: int = 32
    lr: float = 5e-4
    epochs: int = 2
    batch_size: int = 8
    warmup_items: int = 0  # answer warm-up on items disjoint from train and held-out
    warmup_epochs: int = 1
    warmup_lr: float | None = None  # None: lr (kept apart so arms can be retuned on one teacher)
    max_steps: int | None = None
    min_entropy_bits: float = 0.5
    max_top_share: float = 0.9
    min_train_examples: int = 16
    control: bool = True
    modal_filter_run: bool = True
    modal_filter_train: bool = True  # False: only check its guard (saves an arm's time)
    device: str = "auto"
    resample: bool = False
    progress: bool | None = None


def load_student(config: DistillConfig, warmup: Path | None = None) -> tuple[Any, Any]:
    """The model in float32 on its device; with `warmup`, that adapter merged in."""
    from semsoft_plugin.engines import models

    model, tokenizer = models.load(config.model, dtype="float32")
    if warmup is not None:
        model = load_adapter(model, warmup)
    device = "cuda" if config.device == "auto" and torch.cuda.is_available() else config.device
    return model.to("cpu" if device == "auto" else device), tokenizer


def _finite(value: float) -> float | None:
    """Rounded for the report; `None` where undefined (AUROC2 of one class is NaN)."""
    return round(float(value), 4) if np.isfinite(value) else None


def _targets(examples: list[Example]) -> list[float]:
    return [e.target for e in examples if e.target is not None]


def _warmup_lr(config: DistillConfig) -> float:
    return config.lr if config.warmup_lr is None else config.warmup_lr


def _warmup_settings(config: DistillConfig) -> dict[str, Any]:
    return {
        "warmup_items": config.warmup_items, "warmup_epochs": config.warmup_epochs,
        "lr": _warmup_lr(config), "rank": config.rank, "alpha": config.alpha,
        "batch_size": config.batch_size, "seed": config.seed,
    }  # fmt: skip


def _answer_warmup(config: DistillConfig, items: list[Any], out: Path) -> dict[str, Any]:
    """Train (or reuse, when its settings match) the answer warm-up adapter."""
    adapter = out / "adapter-answer-warmup"
    settings = _warmup_settings(config)
    info_file = adapter / "distill.json"
    if info_file.is_file() and not config.resample:
        info = json.loads(info_file.read_text())
        if info.get("settings") == settings and info.get("questions") == [
            i.question for i in items
        ]:
            return {**info["report"], "reused": True}
    model, tokenizer = load_student(config)
    start = time.perf_counter()
    peft_model, losses = train_lora(
        model, tokenizer, build_answer_examples(tokenizer, items), rank=config.rank,
        alpha=config.alpha, lr=_warmup_lr(config), epochs=config.warmup_epochs,
        batch_size=config.batch_size, seed=config.seed, progress=config.progress,
    )  # fmt: skip
    report = {
        "adapter": str(adapter),
        "items": len(items),
        "epochs": config.warmup_epochs,
        "steps": len(losses),
        "loss_first": round(losses[0], 4) if losses else None,
        "loss_last": round(float(np.mean(losses[-5:])), 4) if losses else None,
        "train_s": round(time.perf_counter() - start, 1),
    }
    save_adapter(
        peft_model,
        adapter,
        {"run": "answer warm-up", "settings": settings, "report": report,
         "questions": [i.question for i in items]},
    )  # fmt: skip
    del peft_model, model
    gc.collect()
    return {**report, "reused": False}


def read_verbal(
    config: DistillConfig, model: Any, tokenizer: Any, items: list[Any], tag: str
) -> tuple[Signal, Signal]:
    """The greedy verbal confidence and its logit entropy, read with the run's settings."""
    return verbal_signal(
        model, tokenizer, items, name=tag, batch_size=config.eval_batch_size, match=config.match,
        max_tokens=config.eval_max_tokens, progress=config.progress,
    )  # fmt: skip


def _arm(
    config: DistillConfig,
    name: str,
    examples: list[Any],
    held: list[Any],
    out: Path,
    guard: dict[str, Any],
    teacher: Any,
    warmup: Path | None,
    held_targets: list[float],
) -> dict[str, Any]:
    model, tokenizer = load_student(config, warmup)
    start = time.perf_counter()
    peft_model, losses = train_lora(
        model, tokenizer, examples, rank=config.rank, alpha=config.alpha, lr=config.lr,
        epochs=config.epochs, batch_size=config.batch_size, max_steps=config.max_steps,
        seed=config.seed, progress=config.progress,
    )  # fmt: skip
    train_s = time.perf_counter() - start
    adapter = save_adapter(
        peft_model,
        out / f"adapter-{name.replace(' ', '-')}",
        {
            "run": name,
            "examples": len(examples),
            "guard": guard,
            "config": dataclasses.asdict(config),
            # the adapter applies on top of this one, merged (None: the plain model)
            "base_adapter": None if warmup is None else str(warmup),
        },
    )
    del peft_model, model
    gc.collect()
    base, tokenizer = load_student(config, warmup)
    tuned = load_adapter(base, adapter)  # what a user gets: the adapter read back from disk
    readings = read_arm(config, name, tuned, tokenizer, held, teacher, held_targets)
    del tuned, base
    gc.collect()
    return {
        "adapter": str(adapter),
        "examples": len(examples),
        "guard": guard,
        "steps": len(losses),
        "loss_first": round(losses[0], 4) if losses else None,
        "loss_last": round(float(np.mean(losses[-5:])), 4) if losses else None,
        "train_s": round(train_s, 1),
        "train_s_per_example_epoch": round(train_s / (len(examples) * config.epochs), 3),
        **readings,
    }


def read_arm(
    config: DistillConfig,
    name: str,
    tuned: Any,
    tokenizer: Any,
    held: list[Any],
    teacher: Signal,
    held_targets: list[float],
) -> dict[str, Any]:
    """A trained student's held-out readings, as the report keeps them.

    The greedy statement (and its logit entropy), the expected stated value, how often
    each confidence was stated, and the AUROC2 of the held-out targets themselves against
    this student's correctness: what a student that repeated the teacher exactly would get.
    """
    verbal, entropy = read_verbal(config, tuned, tokenizer, held, f"verbal after ({name})")
    expected = stated_value_signal(tuned, tokenizer, held, verbal)
    return {
        "verbal": score(verbal),
        "verbal_closeness_to_self_consistency": closeness(verbal, teacher),
        "target_ceiling_auroc2": _finite(auroc2(verbal.correct, held_targets)),
        "stated_values": stated_values(verbal),
        "verbal_expected": {
            **score(expected),
            "closeness_to_self_consistency": closeness(expected, teacher),
        },
        "logit_entropy": score(entropy),
    }


def run_distill(config: DistillConfig) -> dict[str, Any]:
    """The whole recipe (see the module docstring); returns and writes `report.json`."""
    from semsoft_plugin.engines import models

    if config.match not in ("exact", "contains"):
        raise ValueError(f"match={config.match!r} must be 'exact' or 'contains'")
    start = time.perf_counter()
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    items = load_task(config.task, config.data)
    label_task = items[0].labels is not None
    max_new = config.max_tokens or (4 if label_task else 16)
    train, held, warm_items = split_items_with_warmup(
        items, config.train_items, config.eval_items, config.warmup_items, config.seed
    )
    warmup_report = _answer_warmup(config, warm_items, out) if warm_items else None
    warmup = Path(warmup_report["adapter"]) if warmup_report else None
    model, tokenizer = load_student(config, warmup)
    settings = dict(
        n=config.n, temperature=config.temperature, seed=config.seed, match=config.match,
        max_tokens=max_new,
    )  # fmt: skip
    key = cache_key(models.resolve(config.model), **settings)
    if warmup_report:  # the teacher is the warmed-up model: its samples are its own
        key["warmup"] = _warmup_settings(config)
    sampled, sample_s = sample_cached(
        model, tokenizer, train + held, out / "samples.json",
        key=key, resample=config.resample,
        batch_size=config.sample_batch_size, progress=config.progress, **settings,
    )  # fmt: skip
    if sample_s is None:  # from the cache: the seconds it took when it was sampled
        sample_s = json.loads((out / "samples.json").read_text()).get("seconds")
    sampled_train, sampled_held = sampled[: len(train)], sampled[len(train) :]
    train_samples = [a for s in sampled_train for a in s.samples]
    report: dict[str, Any] = {
        "config": dataclasses.asdict(config),
        "model_dir": str(models.resolve(config.model)),
        "answer_warmup": warmup_report,
        "sampling": {
            "items": len(sampled),
            "seconds": sample_s,
            "train_accuracy_of_samples": round(
                sum(s.n_correct for s in sampled_train) / max(1, len(train_samples)), 4
            ),
            "train_parse_rate_of_samples": round(
                sum(s.n_parsed for s in sampled_train) / max(1, len(train_samples)), 4
            ),
        },
        "train_targets": {
            f"{round(t * 100)}%": int(c)
            for t, c in zip(
                *np.unique([s.target for s in sampled_train], return_counts=True), strict=True
            )
        },
        "runs": {},
    }
    guard_kw: dict[str, Any] = dict(
        min_examples=config.min_train_examples, min_entropy_bits=config.min_entropy_bits,
        max_top_share=config.max_top_share,
    )  # fmt: skip
    examples = build_examples(tokenizer, sampled_train, seed=config.seed)
    guard = guarded(_targets(examples), "training set (all items)", **guard_kw)
    if "refused" in guard:
        (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
        raise ValueError(guard["refused"])

    held_targets = [s.target for s in sampled_held]
    teacher = self_consistency_signal(sampled_held, sample_s * len(held) / len(sampled))
    before, entropy = read_verbal(config, model, tokenizer, held, "verbal before")
    one_pass = [entropy]
    if label_task:
        one_pass += label_signals(model, tokenizer, held, batch_size=config.eval_batch_size)
    report["heldout"] = {
        "self_consistency": score(teacher),
        "verbal_before": {
            **score(before),
            "closeness_to_self_consistency": closeness(before, teacher),
        },
        "one_pass": {
            s.name.replace("verbal before logit entropy", "logit entropy"): {
                **score(s),
                "closeness_to_self_consistency": closeness(s, teacher),
            }
            for s in one_pass
        },
    }
    if not label_task:
        report["heldout"]["one_pass_note"] = (
            "constrained and Semantic Softmax top probability need a label set: "
            "they do not apply to open QA"
        )
    del model
    gc.collect()
    timings: dict[str, Any] = {"sample_and_baselines_s": round(time.perf_counter() - start, 1)}

    report["runs"]["all items"] = _arm(
        config, "all items", examples, held, out, guard, teacher, warmup, held_targets
    )
    if config.control:
        shuffled = build_examples(tokenizer, sampled_train, shuffle_targets=True, seed=config.seed)
        report["runs"]["shuffled"] = _arm(
            config, "shuffled", shuffled, held, out,
            guarded(_targets(shuffled), "shuffled control", **guard_kw), teacher, warmup,
            held_targets,
        )  # fmt: skip
    if config.modal_filter_run:
        filtered = build_examples(tokenizer, modal_filter(sampled_train), seed=config.seed)
        guard_f = guarded(_targets(filtered), "modal-filter training set", **guard_kw)
        if "refused" in guard_f or not config.modal_filter_train:
            report["runs"]["modal filter"] = {"examples": len(filtered), "guard": guard_f}
        else:
            report["runs"]["modal filter"] = _arm(
                config, "modal filter", filtered, held, out, guard_f, teacher, warmup, held_targets
            )
    timings["total_s"] = round(time.perf_counter() - start, 1)
    report["timings"] = timings
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report
