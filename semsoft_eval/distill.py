"""``semsoft distill``: distil self-consistency into a stated confidence (Cacioli, 2026).

The recipe, each step a function:

1. :func:`sample_items`: sample ``n`` answers per question at ``T`` (paper: 10 at 0.7),
   count the samples that match a gold alias (``n_correct``) and take the modal answer;
2. :func:`~semsoft_plugin.confidence.target_from_samples`: ``n_correct`` -> a confidence
   target (5% ... 95%);
3. :func:`~semsoft_plugin.confidence.check_label_entropy`: refuse a collapsed target set
   (the paper's modal-filter failure) before any training;
4. :func:`build_examples` and :func:`train_lora`: LoRA SFT (peft; rank 16, alpha 32)
   on "<modal answer>\\nConfidence: NN%" after the question, so the model answers and
   states its confidence in one pass; ``shuffle_targets=True`` builds the paper's control
   (the same targets permuted across items: same entropy, no link to the item);
5. :func:`save_adapter`: the adapter in the standard peft layout
   (``adapter_config.json`` + ``adapter_model.safetensors``), loadable with
   ``PeftModel.from_pretrained`` and by vLLM's LoRA support (``LoRARequest``);
6. :func:`evaluate_items`: on held-out questions, verbal AUROC2, ceiling rate and accuracy
   before and after, against the single-pass logit entropy of the same greedy answer and
   10-sample self-consistency (agreement with the modal answer).

:func:`run_distill` chains them (what the command runs) and writes ``report.json``,
``samples.json`` (reused when the settings match) and the adapters under ``--out``.

The prompt (all steps, before and after): the user message
``"Answer the question with a short phrase.\\nQuestion: <q>?"`` (plus
:data:`~semsoft_eval.selfconsistency.VERBAL_INSTRUCTION` where a confidence is asked
for) and the pre-filled assistant prefix ``"Answer:"``.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from semsoft_eval.selfconsistency import (
    VERBAL_INSTRUCTION,
    consistency,
    generate,
    verbal_readings,
)
from semsoft_eval.confidence import (
    auroc2,
    ceiling_rate,
    check_label_entropy,
    format_confidence,
    match_answer,
    split_answer_confidence,
    target_from_samples,
)
from semsoft_plugin.hf import format_prompt

__all__ = [
    "QAItem",
    "SampledItem",
    "Example",
    "load_nq",
    "split_items",
    "qa_prompt",
    "sample_items",
    "modal_filter",
    "build_examples",
    "train_lora",
    "save_adapter",
    "load_adapter",
    "evaluate_items",
    "run_distill",
    "add_parser",
    "run",
]

QA_INSTRUCTION = "Answer the question with a short phrase."
ANSWER_PREFIX = "Answer:"
DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class QAItem:
    question: str
    aliases: tuple[str, ...]


@dataclass(frozen=True)
class SampledItem:
    """A question with its sampled answers and the confidence target they give."""

    question: str
    aliases: tuple[str, ...]
    samples: tuple[str, ...]
    modal: str
    agreement: float
    n_correct: int
    modal_correct: bool
    target: float


@dataclass(frozen=True)
class Example:
    """One SFT example: a prompt (chat messages or text) and the completion taught."""

    prompt: Any
    completion: str
    target: float


# --- data ----------------------------------------------------------------------------


def load_nq(path: str | Path | None = None) -> list[QAItem]:
    """NQ-open (JSONL ``{question, answer: [aliases]}``); default: the shared dev split."""
    if path is None:
        from semsoft_eval.data import data_dir

        path = data_dir() / "nq_open" / "dev.jsonl"
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"question file not found: {path}")
    items = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            question, aliases = record["question"], record["answer"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise ValueError(
                f"{path}:{number} is not a JSON object with 'question' and 'answer'"
            ) from None
        if isinstance(aliases, str):
            aliases = [aliases]
        items.append(QAItem(str(question), tuple(str(a) for a in aliases)))
    if not items:
        raise ValueError(f"{path} holds no questions")
    return items


def split_items(
    items: Sequence[QAItem], n_train: int, n_eval: int, seed: int = 0
) -> tuple[list[QAItem], list[QAItem]]:
    """Disjoint random train and held-out sets."""
    if n_train < 1 or n_eval < 1:
        raise ValueError(f"need at least one train and one eval item, got {n_train}, {n_eval}")
    if n_train + n_eval > len(items):
        raise ValueError(
            f"--train-items {n_train} + --eval-items {n_eval} exceed the {len(items)} questions"
        )
    order = np.random.default_rng(seed).permutation(len(items))
    return [items[i] for i in order[:n_train]], [
        items[i] for i in order[n_train : n_train + n_eval]
    ]


def qa_prompt(tokenizer: Any, question: str, *, verbal: bool = False) -> Any:
    """The question as chat messages ending with the ``"Answer:"`` prefix (text without a template)."""
    question = question.strip().rstrip("?") + "?"
    user = f"{QA_INSTRUCTION}\nQuestion: {question}"
    if verbal:
        user += f"\n\n{VERBAL_INSTRUCTION}"
    if getattr(tokenizer, "chat_template", None) is None:
        return f"{user}\n{ANSWER_PREFIX}"
    return [{"role": "user", "content": user}, {"role": "assistant", "content": ANSWER_PREFIX}]


# --- 1-2: sample and build targets -------------------------------------------------------


def sample_items(
    model: Any,
    tokenizer: Any,
    items: Sequence[QAItem],
    *,
    n: int = 10,
    temperature: float = 0.7,
    seed: int = 0,
    batch_size: int = 4,
    max_new_tokens: int = 16,
    match: str = "contains",
    progress: bool | None = None,
) -> list[SampledItem]:
    """Sample ``n`` answers per question and derive the modal answer and the target."""
    prompts = [qa_prompt(tokenizer, item.question) for item in items]
    out = generate(
        model, tokenizer, prompts, n=n, temperature=temperature, seed=seed,
        max_new_tokens=max_new_tokens, batch_size=batch_size, stop=("\n",), progress=progress,
    )  # fmt: skip
    sampled = []
    for item, texts in zip(items, out.texts, strict=True):
        answers = [split_answer_confidence(t)[0] for t in texts]
        c = consistency(answers, item.aliases, match=match)
        assert c.n_correct is not None and c.modal_correct is not None  # gold was given
        sampled.append(
            SampledItem(
                question=item.question,
                aliases=item.aliases,
                samples=tuple(answers),
                modal=c.modal,
                agreement=c.agreement,
                n_correct=c.n_correct,
                modal_correct=c.modal_correct,
                target=target_from_samples(c.n_correct, n),
            )
        )
    return sampled


def modal_filter(sampled: Sequence[SampledItem]) -> list[SampledItem]:
    """The paper's failing filter: only items whose modal answer is correct."""
    return [s for s in sampled if s.modal_correct]


def build_examples(
    tokenizer: Any,
    sampled: Sequence[SampledItem],
    *,
    shuffle_targets: bool = False,
    seed: int = 0,
) -> list[Example]:
    """SFT examples: the verbal prompt, then ``" <modal answer>\\nConfidence: NN%"``.

    Items without any non-empty sampled answer teach nothing and are left out.
    ``shuffle_targets`` permutes the targets across the kept items (the control).
    """
    kept = [s for s in sampled if s.modal]
    targets = [s.target for s in kept]
    if shuffle_targets:
        random.Random(seed).shuffle(targets)
    return [
        Example(
            prompt=qa_prompt(tokenizer, s.question, verbal=True),
            completion=f" {s.modal}\n{format_confidence(t)}",
            target=t,
        )
        for s, t in zip(kept, targets, strict=True)
    ]


# --- 4-5: train and save ------------------------------------------------------------------


def _tokenize(tokenizer: Any, example: Example) -> tuple[list[int], list[int]]:
    text, special = format_prompt(tokenizer, example.prompt)
    prompt_ids = tokenizer.encode(text, add_special_tokens=not special)
    answer_ids = tokenizer.encode(example.completion, add_special_tokens=False)
    if tokenizer.eos_token_id is not None:
        answer_ids.append(tokenizer.eos_token_id)  # teach the model to stop after the number
    return prompt_ids + answer_ids, [-100] * len(prompt_ids) + answer_ids


def train_lora(
    model: Any,
    tokenizer: Any,
    examples: Sequence[Example],
    *,
    rank: int = 16,
    alpha: int = 32,
    dropout: float = 0.05,
    target_modules: Sequence[str] = DEFAULT_TARGET_MODULES,
    lr: float = 5e-4,
    epochs: int = 2,
    batch_size: int = 8,
    max_steps: int | None = None,
    seed: int = 0,
    autocast: bool = True,
    progress: bool | None = None,
) -> tuple[Any, list[float]]:
    """LoRA SFT of ``model`` on ``examples`` (loss on the completion tokens only).

    Returns the peft model (``model`` is wrapped in place) and the loss of each step.
    Give a float32 model: bf16 LoRA weights under AdamW lose small updates; the forward
    pass runs under bf16 autocast (``autocast=False`` turns that off).
    """
    from peft import LoraConfig, get_peft_model
    from tqdm.auto import tqdm

    if not examples:
        raise ValueError("no training examples")
    for name, value in (
        ("rank", rank),
        ("alpha", alpha),
        ("epochs", epochs),
        ("batch_size", batch_size),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive int")
    if max_steps is not None and max_steps < 1:
        raise ValueError(f"max_steps={max_steps!r} must be a positive int")
    if not lr > 0:
        raise ValueError(f"lr={lr!r} must be positive")
    pad_id = (
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    )
    encoded = [_tokenize(tokenizer, e) for e in examples]
    torch.manual_seed(seed)
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=list(target_modules),
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, config)
    optimizer = torch.optim.AdamW(
        [p for p in peft_model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0
    )
    steps_per_epoch = math.ceil(len(encoded) / batch_size)
    total = steps_per_epoch * epochs if max_steps is None else max_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: max(0.0, 1.0 - step / total)
    )  # linear decay to zero
    device = next(peft_model.parameters()).device
    rng = random.Random(seed)
    losses: list[float] = []
    peft_model.train()
    bar = tqdm(total=total, desc="lora sft", unit="step", disable=progress is False)
    while len(losses) < total:
        order = list(range(len(encoded)))
        rng.shuffle(order)
        for start in range(0, len(order), batch_size):
            if len(losses) >= total:
                break
            rows = [encoded[i] for i in order[start : start + batch_size]]
            width = max(len(ids) for ids, _ in rows)
            input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
            labels = torch.full((len(rows), width), -100, dtype=torch.long)
            attention = torch.zeros((len(rows), width), dtype=torch.long)
            for r, (ids, lab) in enumerate(rows):  # right padding: training needs no cache
                input_ids[r, : len(ids)] = torch.tensor(ids)
                labels[r, : len(lab)] = torch.tensor(lab)
                attention[r, : len(ids)] = 1
            # bf16 autocast over float32 weights: about 2x faster on CPU, full-precision updates
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                loss = peft_model(
                    input_ids=input_ids.to(device),
                    attention_mask=attention.to(device),
                    labels=labels.to(device),
                ).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(peft_model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
            bar.update()
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    bar.close()
    peft_model.eval()
    return peft_model, losses


def save_adapter(peft_model: Any, out_dir: str | Path, info: dict[str, Any] | None = None) -> Path:
    """Save the adapter (peft layout, safetensors) and, beside it, ``distill.json``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(str(out), safe_serialization=True)
    if info is not None:
        (out / "distill.json").write_text(json.dumps(info, indent=2) + "\n")
    return out


def load_adapter(base: Any, adapter_dir: str | Path, *, merge: bool = True) -> Any:
    """``base`` with a saved adapter applied (merged: as fast as the base model)."""
    from peft import PeftModel

    model = PeftModel.from_pretrained(base, str(adapter_dir))
    model = model.merge_and_unload() if merge else model
    model.eval()
    return model


# --- 6: held-out evaluation ---------------------------------------------------------------


def _undefined_to_none(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 4)


def evaluate_items(
    model: Any,
    tokenizer: Any,
    items: Sequence[QAItem],
    *,
    batch_size: int = 8,
    match: str = "contains",
    max_new_tokens: int = 24,
    progress: bool | None = None,
) -> dict[str, Any]:
    """Verbal confidence and single-pass logit entropy of the greedy answer on held-out items.

    AUROC2 of the stated confidence is computed over items with a readable confidence
    (``n_unparsed`` are left out and counted); the logit-entropy AUROC2 (confidence =
    minus the mean raw next-token entropy over the answer line) over all items, for the
    same greedy answers. AUROC2 is ``None`` where only one class occurs.
    """
    prompts = [qa_prompt(tokenizer, item.question, verbal=True) for item in items]
    readings = verbal_readings(
        model, tokenizer, prompts, batch_size=batch_size, max_new_tokens=max_new_tokens,
        keep_entropy=True, progress=progress,
    )  # fmt: skip
    correct = np.array(
        [
            match_answer(r.answer, item.aliases, mode=match)
            for r, item in zip(readings, items, strict=True)
        ]  # type: ignore[arg-type]
    )
    stated = [
        (r.confidence, c)
        for r, c in zip(readings, correct, strict=True)
        if r.confidence is not None
    ]
    conf = np.array([s[0] for s in stated], dtype=np.float64)
    hits = np.array([s[1] for s in stated], dtype=bool)
    entropy = np.array(
        [r.answer_entropy if r.answer_entropy is not None else np.log(1e6) for r in readings]
    )  # an empty answer line counts as maximally uncertain
    return {
        "n": len(items),
        "accuracy": round(float(correct.mean()), 4),
        "n_unparsed": len(items) - len(stated),
        "one_pass": sum(not r.prefilled and r.confidence is not None for r in readings),
        "verbal_auroc2": _undefined_to_none(auroc2(hits, conf)) if len(stated) else None,
        "ceiling_rate": round(ceiling_rate(conf), 4) if len(stated) else None,
        "mean_confidence": round(float(conf.mean()), 4) if len(stated) else None,
        "distinct_confidences": len({round(c, 2) for c in conf}),
        "entropy_auroc2": _undefined_to_none(auroc2(correct, -entropy)),
        "examples": [
            {
                "question": item.question,
                "text": r.text,
                "confidence": r.confidence,
                "correct": bool(c),
            }
            for item, r, c in list(zip(items, readings, correct, strict=True))[:5]
        ],
    }


def self_consistency_metrics(sampled: Sequence[SampledItem]) -> dict[str, Any]:
    """Self-consistency on held-out items: confidence = agreement with the modal answer."""
    hits = np.array([s.modal_correct for s in sampled], dtype=bool)
    agreement = np.array([s.agreement for s in sampled])
    return {
        "n": len(sampled),
        "accuracy": round(float(hits.mean()), 4),
        "auroc2": _undefined_to_none(auroc2(hits, agreement)),
        "ceiling_rate": round(ceiling_rate(agreement), 4),
    }


# --- the whole recipe -----------------------------------------------------------------------


@dataclass
class DistillConfig:
    """Settings of :func:`run_distill` (the command's flags)."""

    model: str = "default"
    data: str | None = None
    out: str = "runs/distill"
    train_items: int = 200
    eval_items: int = 100
    n: int = 10
    temperature: float = 0.7
    seed: int = 0
    match: str = "contains"
    sample_batch_size: int = 4
    eval_batch_size: int = 8
    max_new_tokens: int = 16
    rank: int = 16
    alpha: int = 32
    lr: float = 5e-4
    epochs: int = 2
    batch_size: int = 8
    max_steps: int | None = None
    min_entropy_bits: float = 0.5
    max_top_share: float = 0.9
    min_train_examples: int = 16
    control: bool = True
    modal_filter_run: bool = True
    backend: str = "transformers"
    device: str = "auto"
    resample: bool = False
    progress: bool | None = None


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _load(config: DistillConfig, dtype: str) -> tuple[Any, Any]:
    from semsoft_plugin import models

    model, tokenizer = models.load(config.model, dtype=dtype)
    return model.to(_device(config.device)), tokenizer


def _sample_all(
    config: DistillConfig, items: list[QAItem], model_dir: Path, cache: Path
) -> list[SampledItem]:
    key = {
        "model": str(model_dir),
        "questions": [i.question for i in items],
        **{k: getattr(config, k) for k in ("n", "temperature", "seed", "match", "max_new_tokens")},
    }
    if cache.is_file() and not config.resample:
        stored = json.loads(cache.read_text())
        if stored.get("key") == key:
            return [
                SampledItem(**{**s, "aliases": tuple(s["aliases"]), "samples": tuple(s["samples"])})
                for s in stored["items"]
            ]
    kwargs = dict(
        n=config.n, temperature=config.temperature, seed=config.seed,
        max_new_tokens=config.max_new_tokens, match=config.match, progress=config.progress,
    )  # fmt: skip
    if config.backend == "vllm":
        from vllm import LLM

        llm = LLM(model=str(model_dir), seed=config.seed, dtype="bfloat16")
        sampled = sample_items(llm, llm.get_tokenizer(), items, **kwargs)
        del llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    else:
        model, tokenizer = _load(config, "bfloat16")
        sampled = sample_items(
            model, tokenizer, items, batch_size=config.sample_batch_size, **kwargs
        )
        del model
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(
        json.dumps({"key": key, "items": [dataclasses.asdict(s) for s in sampled]}) + "\n"
    )
    return sampled


def _train_and_evaluate(
    config: DistillConfig,
    name: str,
    examples: list[Example],
    eval_items: list[QAItem],
    out: Path,
    guard: dict[str, Any],
) -> dict[str, Any]:
    model, tokenizer = _load(config, "float32")
    peft_model, losses = train_lora(
        model, tokenizer, examples, rank=config.rank, alpha=config.alpha, lr=config.lr,
        epochs=config.epochs, batch_size=config.batch_size, max_steps=config.max_steps,
        seed=config.seed, progress=config.progress,
    )  # fmt: skip
    adapter = save_adapter(
        peft_model,
        out / f"adapter-{name}",
        {
            "run": name,
            "examples": len(examples),
            "guard": guard,
            "config": dataclasses.asdict(config),
        },
    )
    del peft_model, model
    gc.collect()
    base, tokenizer = _load(config, "bfloat16")
    tuned = load_adapter(base, adapter)
    metrics = evaluate_items(
        tuned, tokenizer, eval_items, batch_size=config.eval_batch_size, match=config.match,
        progress=config.progress,
    )  # fmt: skip
    return {
        "adapter": str(adapter),
        "examples": len(examples),
        "guard": guard,
        "loss_first": round(losses[0], 4),
        "loss_last": round(float(np.mean(losses[-5:])), 4),
        "steps": len(losses),
        "heldout": metrics,
    }


def _guarded(config: DistillConfig, targets: list[float], what: str) -> dict[str, Any]:
    """The guard's figures, or ``{"refused": message}``; also refuses too few examples."""
    if len(targets) < config.min_train_examples:
        return {
            "refused": f"{what}: {len(targets)} examples, fewer than the "
            f"{config.min_train_examples} needed to train"
        }
    try:
        return check_label_entropy(
            targets, min_entropy_bits=config.min_entropy_bits,
            max_top_share=config.max_top_share, what=what,
        )  # fmt: skip
    except ValueError as error:
        return {"refused": str(error)}


def run_distill(config: DistillConfig) -> dict[str, Any]:
    """The whole recipe (see the module docstring); returns and writes ``report.json``.

    Raises ``ValueError`` when the main training set (all items) is refused by the guard.
    """
    from semsoft_plugin import models

    if config.match not in ("exact", "contains"):
        raise ValueError(f"match={config.match!r} must be 'exact' or 'contains'")
    if config.backend not in ("transformers", "vllm"):
        raise ValueError(f"backend={config.backend!r} must be 'transformers' or 'vllm'")
    start = time.perf_counter()
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = models.resolve(config.model)
    train, held = split_items(
        load_nq(config.data), config.train_items, config.eval_items, config.seed
    )
    sampled = _sample_all(config, train + held, model_dir, out / "samples.json")
    sampled_train, sampled_held = sampled[: len(train)], sampled[len(train) :]
    timings = {"sample_s": round(time.perf_counter() - start, 1)}
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    report: dict[str, Any] = {
        "config": dataclasses.asdict(config),
        "model_dir": str(model_dir),
        "train_targets": {
            f"{round(t * 100)}%": int(c)
            for t, c in zip(
                *np.unique([s.target for s in sampled_train], return_counts=True), strict=True
            )
        },
        "runs": {},
    }
    examples = build_examples(tokenizer, sampled_train, seed=config.seed)
    guard = _guarded(config, [e.target for e in examples], "training set (all items)")
    if "refused" in guard:
        (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
        raise ValueError(guard["refused"])

    base, tokenizer = _load(config, "bfloat16")
    report["baselines"] = {
        "before": evaluate_items(
            base,
            tokenizer,
            held,
            batch_size=config.eval_batch_size,
            match=config.match,
            progress=config.progress,
        ),  # fmt: skip
        "self_consistency": self_consistency_metrics(sampled_held),
    }
    del base
    timings["baseline_s"] = round(time.perf_counter() - start, 1)

    report["runs"]["distilled"] = _train_and_evaluate(
        config, "distilled", examples, held, out, guard
    )
    timings["distilled_s"] = round(time.perf_counter() - start, 1)
    if config.control:
        shuffled = build_examples(tokenizer, sampled_train, shuffle_targets=True, seed=config.seed)
        report["runs"]["shuffled"] = _train_and_evaluate(
            config, "shuffled", shuffled, held, out,
            _guarded(config, [e.target for e in shuffled], "shuffled control"),
        )  # fmt: skip
        timings["shuffled_s"] = round(time.perf_counter() - start, 1)
    if config.modal_filter_run:
        filtered = build_examples(tokenizer, modal_filter(sampled_train), seed=config.seed)
        guard_filtered = _guarded(config, [e.target for e in filtered], "modal-filter training set")
        if "refused" in guard_filtered:
            report["runs"]["modal_filter"] = {"examples": len(filtered), "guard": guard_filtered}
        else:
            report["runs"]["modal_filter"] = _train_and_evaluate(
                config, "modal-filter", filtered, held, out, guard_filtered
            )
    timings["total_s"] = round(time.perf_counter() - start, 1)
    report["timings"] = timings
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def format_markdown(report: dict[str, Any]) -> str:
    """The held-out figures as a Markdown table."""

    def cell(value: Any) -> str:
        if value is None:
            return "n/a"
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    rows = ["| run | examples | accuracy | verbal AUROC2 | ceiling rate (>=90%) | unparsed | one pass | logit-entropy AUROC2 |",
            "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    entries = [("before (base model)", None, report["baselines"]["before"])]
    for name, run in report["runs"].items():
        if "heldout" in run:
            entries.append((f"after: {name}", run["examples"], run["heldout"]))
    for name, examples, m in entries:
        rows.append(
            f"| {name} | {cell(examples)} | {cell(m['accuracy'])} | {cell(m['verbal_auroc2'])} | "
            f"{cell(m['ceiling_rate'])} | {m['n_unparsed']}/{m['n']} | {m['one_pass']}/{m['n']} | "
            f"{cell(m['entropy_auroc2'])} |"
        )
    sc = report["baselines"]["self_consistency"]
    rows.append(
        f"| self-consistency (n={report['config']['n']}, modal answer) | - | {cell(sc['accuracy'])} | "
        f"{cell(sc['auroc2'])} (agreement) | {cell(sc['ceiling_rate'])} | - | - | - |"
    )
    lines = ["\n".join(rows), ""]
    for name, run in report["runs"].items():
        if "refused" in run.get("guard", {}):
            lines.append(
                f"{name}: refused by the guard ({run['examples']} examples): {run['guard']['refused']}"
            )
    return "\n".join(lines)


# --- command line ------------------------------------------------------------------------


def add_parser(subparsers: Any) -> None:
    """Register ``semsoft distill``."""
    d = DistillConfig()
    parser = subparsers.add_parser(
        "distill",
        help="distil self-consistency into a stated confidence (LoRA)",
        description="Sample answers to open questions, turn the share of correct samples into "
        "a confidence target, refuse a collapsed target set, LoRA-tune the model to answer with "
        "'Confidence: NN%%', and evaluate on held-out questions (Cacioli 2026).",
    )
    parser.add_argument(
        "--model", default=d.model, help="'default', 'qwen2.5-coder-1.5b' or a checkpoint dir"
    )
    parser.add_argument(
        "--data", default=d.data, help="JSONL {question, answer: [aliases]} (default: NQ-open dev)"
    )
    parser.add_argument(
        "--out", default=d.out, help="output directory (adapters, samples.json, report.json)"
    )
    parser.add_argument("--train-items", type=int, default=d.train_items)
    parser.add_argument("--eval-items", type=int, default=d.eval_items)
    parser.add_argument("--n", type=int, default=d.n, help="samples per question")
    parser.add_argument("--temperature", type=float, default=d.temperature)
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument(
        "--match", choices=("contains", "exact"), default=d.match, help="answer matching rule"
    )
    parser.add_argument("--sample-batch-size", type=int, default=d.sample_batch_size)
    parser.add_argument("--eval-batch-size", type=int, default=d.eval_batch_size)
    parser.add_argument("--rank", type=int, default=d.rank, help="LoRA rank")
    parser.add_argument("--alpha", type=int, default=d.alpha, help="LoRA alpha")
    parser.add_argument("--lr", type=float, default=d.lr)
    parser.add_argument("--epochs", type=int, default=d.epochs)
    parser.add_argument("--batch-size", type=int, default=d.batch_size, help="SFT batch size")
    parser.add_argument(
        "--max-steps", type=int, default=d.max_steps, help="stop SFT after this many steps"
    )
    parser.add_argument(
        "--min-entropy",
        type=float,
        default=d.min_entropy_bits,
        help="guard: minimum target entropy (bits)",
    )
    parser.add_argument(
        "--max-top-share",
        type=float,
        default=d.max_top_share,
        help="guard: largest share of one target",
    )
    parser.add_argument(
        "--no-control", action="store_true", help="skip the shuffled-target control"
    )
    parser.add_argument("--no-modal-filter", action="store_true", help="skip the modal-filter run")
    parser.add_argument(
        "--backend", choices=("transformers", "vllm"), default=d.backend, help="sampling engine"
    )
    parser.add_argument("--device", default=d.device, help="auto, cpu or cuda")
    parser.add_argument("--resample", action="store_true", help="ignore a matching samples.json")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """``semsoft distill``: run the recipe and print the held-out table."""
    config = DistillConfig(
        model=args.model, data=args.data, out=args.out, train_items=args.train_items,
        eval_items=args.eval_items, n=args.n, temperature=args.temperature, seed=args.seed,
        match=args.match, sample_batch_size=args.sample_batch_size,
        eval_batch_size=args.eval_batch_size, rank=args.rank, alpha=args.alpha, lr=args.lr,
        epochs=args.epochs, batch_size=args.batch_size, max_steps=args.max_steps,
        min_entropy_bits=args.min_entropy, max_top_share=args.max_top_share,
        control=not args.no_control, modal_filter_run=not args.no_modal_filter,
        backend=args.backend, device=args.device, resample=args.resample,
    )  # fmt: skip
    report = run_distill(config)
    print(json.dumps(report, indent=2) if args.json else format_markdown(report))
    print(f"report: {Path(config.out) / 'report.json'}")
    return 0
