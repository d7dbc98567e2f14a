"""Questions for `semsoft distill`: open QA (NQ-open) and label tasks asked as questions.

The recipe needs a task on which the model is right on a fair share of items, or every
target is 5% and the label-entropy guard refuses the set. SmolLM2-135M is right on about
2% of NQ-open questions but on about half of SST-2 reviews asked as a free-answer
question, so a label set can be asked as a question: the model writes a word, and the
word is graded against the gold label (case, punctuation and a few synonyms forgiven;
a word that names no label is unreadable, counted as wrong and reported as the parse
rate, never guessed).

The prompt (all steps, before and after training): the user message (the task's
question, plus `semsoft_eval.selfconsistency.VERBAL_INSTRUCTION` where a
confidence is asked for) and the pre-filled assistant prefix `"Answer:"`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from semsoft_eval.confidence import match_answer, normalize_answer, split_answer_confidence
from semsoft_eval.selfconsistency import VERBAL_INSTRUCTION, match_label

__all__ = [
    "QAItem",
    "TASKS",
    "SYNONYMS",
    "QA_INSTRUCTION",
    "ANSWER_PREFIX",
    "load_nq",
    "load_label_task",
    "load_task",
    "split_items",
    "split_items_with_warmup",
    "qa_prompt",
    "grade",
]

QA_INSTRUCTION = "Answer the question with a short phrase."
ANSWER_PREFIX = "Answer:"
TASKS = ("nq", "sst2")
SST2_QUESTION = "Is this movie review positive or negative? Answer with one word."

# Words a small model writes for a label instead of its name. Only unambiguous ones:
# a word not listed here or matched by ``match_label`` is unreadable, never guessed.
SYNONYMS: Mapping[str, tuple[str, ...]] = {
    "positive": ("good", "favorable", "favourable", "pos"),
    "negative": ("bad", "unfavorable", "unfavourable", "neg"),
}


@dataclass(frozen=True)
class QAItem:
    """One question and its gold answer(s).

    `labels` is set for a label task asked as a question (the gold answer is one of
    them); `None` for open QA, where `aliases` are the accepted answers.
    """

    question: str
    aliases: tuple[str, ...]
    labels: tuple[str, ...] | None = field(default=None)


def load_nq(path: str | Path | None = None) -> list[QAItem]:
    """NQ-open (JSONL `{question, answer: [aliases]}`); default: the built-in dev split
    (`nq` in `semsoft_eval.data.SOURCES`, refused in one line where it is absent)."""
    if path is None:
        from semsoft_eval.data import SOURCES, builtin_root

        path = builtin_root("nq", own_file="--input") / SOURCES["nq"].files[0]
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
        question = str(question).strip().rstrip("?") + "?"
        items.append(QAItem(f"{QA_INSTRUCTION}\nQuestion: {question}", tuple(map(str, aliases))))
    if not items:
        raise ValueError(f"{path} holds no questions")
    return items


def load_label_task(name: str = "sst2") -> list[QAItem]:
    """A built-in label set asked as a free-answer question (only `"sst2"` so far)."""
    if name != "sst2":
        raise ValueError(f"label task {name!r} is not supported; give one of {TASKS}")
    from semsoft_eval.data import load_builtin

    data = load_builtin("sst2")
    labels = tuple(data.labels)
    return [
        QAItem(f"{SST2_QUESTION}\nReview: {text.strip()}", (labels[int(y)],), labels)
        for text, y in zip(data.texts, data.targets, strict=True)
    ]


def load_task(task: str, path: str | Path | None = None) -> list[QAItem]:
    """`"nq"` (`path`: an NQ-style JSONL) or `"sst2"`."""
    if task == "nq":
        return load_nq(path)
    if path is not None:
        raise ValueError(f"--data is for the nq task only, not {task!r}")
    if task not in TASKS:
        raise ValueError(f"task={task!r} must be one of {', '.join(TASKS)}")
    return load_label_task(task)


def split_items(
    items: Sequence[QAItem], n_train: int, n_eval: int, seed: int = 0
) -> tuple[list[QAItem], list[QAItem]]:
    """Disjoint random train and held-out sets."""
    train, held, _ = split_items_with_warmup(items, n_train, n_eval, 0, seed)
    return train, held


def split_items_with_warmup(
    items: Sequence[QAItem], n_train: int, n_eval: int, n_warmup: int, seed: int = 0
) -> tuple[list[QAItem], list[QAItem], list[QAItem]]:
    """Disjoint random train, held-out and answer warm-up sets.

    The train and held-out sets are the ones [`split_items`][semsoft_eval.distill.data.split_items] gives for the same
    seed (one permutation, cut in order), so adding a warm-up changes neither.
    """
    if n_train < 1 or n_eval < 1:
        raise ValueError(f"need at least one train and one eval item, got {n_train}, {n_eval}")
    if n_warmup < 0:
        raise ValueError(f"--warmup-items {n_warmup} must be >= 0")
    if n_train + n_eval + n_warmup > len(items):
        raise ValueError(
            f"--train-items {n_train} + --eval-items {n_eval} + --warmup-items {n_warmup} "
            f"exceed the {len(items)} questions"
        )
    order = np.random.default_rng(seed).permutation(len(items))
    cuts = np.cumsum([n_train, n_eval, n_warmup])
    train, held, warm = np.split(order[: cuts[-1]], cuts[:-1])
    return [items[i] for i in train], [items[i] for i in held], [items[i] for i in warm]


def qa_prompt(tokenizer: Any, item: QAItem | str, *, verbal: bool = False) -> Any:
    """Chat messages ending with the `"Answer:"` prefix (plain text without a template)."""
    user = item.question if isinstance(item, QAItem) else str(item)
    if verbal:
        user += f"\n\n{VERBAL_INSTRUCTION}"
    if getattr(tokenizer, "chat_template", None) is None:
        return f"{user}\n{ANSWER_PREFIX}"
    return [{"role": "user", "content": user}, {"role": "assistant", "content": ANSWER_PREFIX}]


def read_label(answer: str, labels: Sequence[str]) -> int | None:
    """The label an answer names (its name, then `SYNONYMS`), or `None`."""
    found = match_label(answer, labels)
    if found is not None:
        return found
    words = normalize_answer(split_answer_confidence(answer)[0]).split()
    hits = {i for i, label in enumerate(labels) for w in words[:3] if w in SYNONYMS.get(label, ())}
    return hits.pop() if len(hits) == 1 else None


def grade(answer: str, item: QAItem, *, match: str = "contains") -> tuple[str | None, bool]:
    """`(canonical answer or None when unreadable, correct)` for one generated answer.

    Label tasks: the canonical answer is the label named; open QA: the normalised text
    (`None` when empty), correct when it matches a gold alias (`match`).
    """
    text = split_answer_confidence(answer)[0]
    if item.labels is not None:
        index = read_label(text, item.labels)
        if index is None:
            return None, False
        return item.labels[index], item.labels[index] in item.aliases
    norm = normalize_answer(text)
    if not norm:
        return None, False
    return norm, bool(
        match_answer(text, item.aliases, mode="exact" if match == "exact" else "contains")
    )
