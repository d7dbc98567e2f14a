"""Steps 1-3 of the recipe: sample answers, turn `n_correct` into targets, guard the set.

* [`sample_items`][semsoft_eval.distill.targets.sample_items] samples `n` answers per question at `T` (paper: 10 at 0.7),
  grades each ([`grade`][semsoft_eval.distill.data.grade]), and keeps the modal answer,
  its agreement (the self-consistency confidence), `n_correct` and the target of
  `semsoft_eval.confidence.target_from_samples` (5% ... 95%);
* [`sample_cached`][semsoft_eval.distill.targets.sample_cached] does the same through a JSON cache (sampling is the slow step;
  never pickle), reused only when the model, questions and settings match;
* [`modal_filter`][semsoft_eval.distill.targets.modal_filter] is the paper's failing filter and [`guarded`][semsoft_eval.distill.targets.guarded] the
  label-entropy guard (`semsoft_eval.confidence.check_label_entropy`) as a
  report entry instead of an exception;
* [`build_examples`][semsoft_eval.distill.targets.build_examples] writes the SFT examples `" <modal answer>\\nConfidence: NN%"`
  (`shuffle_targets=True`: the control, same targets permuted across items).
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from semsoft_eval.confidence import check_label_entropy, format_confidence, target_from_samples
from semsoft_eval.distill.data import QAItem, grade, qa_prompt
from semsoft_eval.selfconsistency import generate

__all__ = [
    "SampledItem",
    "Example",
    "sample_items",
    "sample_cached",
    "summarise",
    "cache_key",
    "modal_filter",
    "guarded",
    "build_examples",
    "build_answer_examples",
]


@dataclass(frozen=True)
class SampledItem:
    """A question with its sampled answers and the confidence target they give.

    `n_parsed` counts the samples that were readable (a label named, or non-empty).
    """

    question: str
    aliases: tuple[str, ...]
    samples: tuple[str, ...]
    modal: str
    agreement: float
    n_correct: int
    n_parsed: int
    modal_correct: bool
    target: float

    @classmethod
    def from_json(cls, stored: dict[str, Any]) -> SampledItem:
        """The item as [`sample_cached`][semsoft_eval.distill.targets.sample_cached] stores it (`dataclasses.asdict`) read back."""
        return cls(
            **{**stored, "aliases": tuple(stored["aliases"]), "samples": tuple(stored["samples"])}
        )


@dataclass(frozen=True)
class Example:
    """One SFT example: a prompt (chat messages or text) and the completion taught.

    `target` is the confidence taught; `None` for an answer warm-up example, which
    teaches the answer alone.
    """

    prompt: Any
    completion: str
    target: float | None


def summarise(item: QAItem, texts: Sequence[str], *, match: str = "contains") -> SampledItem:
    """Modal answer, agreement, `n_correct` and target of one item's sampled texts.

    Unreadable samples never vote and count as wrong; ties go to the first sampled.
    """
    answers = [t.split("\n")[0].strip() for t in texts]
    graded = [grade(a, item, match=match) for a in answers]
    keys = [key for key, _ in graded]
    votes = Counter(k for k in keys if k is not None)
    modal, agreement, modal_correct = "", 0.0, False
    if votes:
        best = max(votes.values())
        index = next(i for i, k in enumerate(keys) if k is not None and votes[k] == best)
        # label tasks teach the label's name; open QA the modal answer as the model wrote it
        modal = keys[index] if item.labels is not None else answers[index]  # type: ignore[assignment]
        agreement, modal_correct = best / len(texts), graded[index][1]
    n_correct = sum(ok for _, ok in graded)
    return SampledItem(
        question=item.question,
        aliases=item.aliases,
        samples=tuple(answers),
        modal=modal,
        agreement=agreement,
        n_correct=n_correct,
        n_parsed=sum(k is not None for k in keys),
        modal_correct=modal_correct,
        target=target_from_samples(n_correct, len(texts)),
    )


def sample_items(
    model: Any,
    tokenizer: Any,
    items: Sequence[QAItem],
    *,
    n: int = 10,
    temperature: float = 0.7,
    seed: int = 0,
    batch_size: int = 4,
    max_tokens: int = 16,
    match: str = "contains",
    progress: bool | None = None,
) -> list[SampledItem]:
    """Sample `n` answers per question and derive the modal answer and the target."""
    prompts = [qa_prompt(tokenizer, item) for item in items]
    out = generate(
        model, tokenizer, prompts, n=n, temperature=temperature, seed=seed,
        max_tokens=max_tokens, batch_size=batch_size, stop=("\n",), progress=progress,
    )  # fmt: skip
    return [summarise(i, t, match=match) for i, t in zip(items, out.texts, strict=True)]


def sample_cached(
    model: Any,
    tokenizer: Any,
    items: Sequence[QAItem],
    cache: str | Path,
    *,
    key: dict[str, Any],
    resample: bool = False,
    **kwargs: Any,
) -> tuple[list[SampledItem], float | None]:
    """[`sample_items`][semsoft_eval.distill.targets.sample_items] through a JSON cache; returns the items and the seconds spent.

    The cache is used only when its `key` (model, questions, settings) equals `key`;
    the seconds are `None` when it was (and stored ones are reported by the caller).
    """
    cache = Path(cache)
    key = {**key, "questions": [i.question for i in items]}
    if cache.is_file() and not resample:
        stored = json.loads(cache.read_text())
        if stored.get("key") == key:
            return [SampledItem.from_json(s) for s in stored["items"]], None
    start = time.perf_counter()
    sampled = sample_items(model, tokenizer, items, **kwargs)
    seconds = time.perf_counter() - start
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(
        json.dumps(
            {
                "key": key,
                "seconds": round(seconds, 1),
                "items": [dataclasses.asdict(s) for s in sampled],
            }
        )
        + "\n"
    )
    return sampled, seconds


def cache_key(model_dir: str | Path, **settings: Any) -> dict[str, Any]:
    """What a cached sample depends on besides the questions: the checkpoint and settings."""
    return {"model": str(model_dir), **{k: settings[k] for k in sorted(settings)}}


def modal_filter(sampled: Sequence[SampledItem]) -> list[SampledItem]:
    """The paper's failing filter: only items whose modal answer is correct."""
    return [s for s in sampled if s.modal_correct]


def guarded(
    targets: Sequence[float],
    what: str,
    *,
    min_examples: int = 16,
    min_entropy_bits: float = 0.5,
    max_top_share: float = 0.9,
) -> dict[str, Any]:
    """The guard's figures, or `{"refused": message}` (also for too few examples)."""
    if len(targets) < min_examples:
        return {
            "refused": f"{what}: {len(targets)} examples, fewer than the "
            f"{min_examples} needed to train"
        }
    try:
        return check_label_entropy(
            list(targets), min_entropy_bits=min_entropy_bits, max_top_share=max_top_share,
            what=what,
        )  # fmt: skip
    except ValueError as error:
        return {"refused": str(error)}


def build_examples(
    tokenizer: Any,
    sampled: Sequence[SampledItem],
    *,
    shuffle_targets: bool = False,
    seed: int = 0,
) -> list[Example]:
    """SFT examples: the verbal prompt, then `" <modal answer>\\nConfidence: NN%"`.

    Items without any readable sampled answer teach nothing and are left out.
    `shuffle_targets` permutes the targets across the kept items (the control).
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


def build_answer_examples(tokenizer: Any, items: Sequence[QAItem]) -> list[Example]:
    """Answer warm-up examples: the plain question prompt, then `" <gold answer>"`.

    The paper starts from a model that already answers its task in the expected format
    (Gemma 3 4B on TriviaQA). A small model may not: SmolLM2-135M writes a label on
    about a third of SST-2 reviews greedily, so its sampled answers disagree by format
    noise more than by how hard the review is, and the targets carry little that can be
    learnt. Tuning the answer first, on items disjoint from the train and held-out
    sets, gives the recipe the model it presumes; no confidence is taught here.
    """
    if not items:
        raise ValueError("no warm-up items")
    return [
        Example(prompt=qa_prompt(tokenizer, item), completion=f" {item.aliases[0]}", target=None)
        for item in items
    ]
