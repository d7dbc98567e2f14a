"""Self-consistency and verbal confidence, through transformers or vLLM.

Two baselines from Cacioli (2026) beside Semantic Softmax, and the generation code the
distillation recipe (:mod:`semsoft_eval.distill`) samples with:

* **self-consistency**: ``n`` answers sampled at ``T = 0.7`` (paper: ``n = 10``); the
  confidence in an answer is the share of samples that agree with it. transformers
  samples with ``num_return_sequences=n``, vLLM with ``SamplingParams(n=n)``; pass a
  ``vllm.LLM`` as ``model`` to use vLLM (imported lazily, only then).
* **verbal confidence**: the model is asked for its answer and "Confidence: NN%" and the
  statement is read with :func:`semsoft_eval.confidence.parse_confidence`. Small models
  often answer and stop; when the first greedy pass states no confidence, a second pass
  pre-fills ``"\\nConfidence:"`` after the answer line and reads the number that follows.
  Both passes are greedy. How many items needed the second pass is reported
  (``VerbalReading.prefilled``): a model that learned the format needs none.

For label sets (``semsoft eval --methods self-consistency,verbal``) a generated answer is
mapped to a label by :func:`match_label` (exact, then whole word, then an unambiguous
prefix); anything else is unparseable, counted and never guessed.

Prompts are strings (used as they are) or chat message lists (chat template applied; a
final assistant message such as ``"Emotion:"`` is continued), as in
:func:`semsoft_plugin.hf.classify`.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from semsoft_eval.confidence import (
    match_answer,
    normalize_answer,
    split_answer_confidence,
)
from semsoft_plugin.hf import format_prompt

__all__ = [
    "VERBAL_INSTRUCTION",
    "CONFIDENCE_PREFILL",
    "Consistency",
    "SelfConsistencyResult",
    "VerbalReading",
    "generate",
    "consistency",
    "match_label",
    "self_consistency",
    "self_consistency_probs",
    "verbal_prompt",
    "verbal_readings",
    "verbal_probs",
]

logger = logging.getLogger(__name__)

Prompt = str | Sequence[Mapping[str, str]]

# No example number in the wording: small models copy it ("Confidence: NN%" came back
# as "NN%", "like 40%" as 40% for every item).
VERBAL_INSTRUCTION = (
    'Then, on a new line, write "Confidence:" followed by your confidence that the '
    "answer is correct, as a percentage from 0 to 100."
)
CONFIDENCE_PREFILL = "\nConfidence:"


def _is_vllm(model: Any) -> bool:
    return type(model).__module__.split(".")[0] == "vllm"


def _check_positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive int")
    return value


@dataclass
class _Batch:
    texts: list[list[str]]
    entropies: list[list[float]] | None  # per prompt and sample: entropy (nats) of each step


def _generate_hf(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[tuple[str, bool]],
    *,
    n: int,
    temperature: float,
    seed: int,
    max_new_tokens: int,
    batch_size: int,
    stop: Sequence[str],
    keep_entropy: bool,
    progress: bool | None,
) -> _Batch:
    from tqdm.auto import tqdm

    pad_id = (
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    )
    if pad_id is None:
        raise ValueError("the tokenizer has neither a pad nor an eos token id")
    from semsoft_plugin.hf import encode_prompts

    encoded = encode_prompts(tokenizer, prompts)
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))  # less padding
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    texts: list[list[str]] = [[] for _ in prompts]
    entropies: list[list[list[float]]] = [[] for _ in prompts]
    sample = temperature > 0
    kwargs: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "pad_token_id": pad_id,
        "do_sample": sample,
        "num_return_sequences": n,
        "return_dict_in_generate": True,
        "output_logits": keep_entropy,
    }
    if sample:
        # Plain temperature sampling, as in the paper: no top-k/top-p truncation from
        # the checkpoint's generation config.
        kwargs.update(temperature=temperature, top_k=0, top_p=1.0)
    if stop:
        kwargs.update(stop_strings=list(stop), tokenizer=tokenizer)
    device = next(model.parameters()).device
    show = progress if progress is not None else len(batches) > 1
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for batch in tqdm(batches, desc="generate", unit="batch", disable=not show):
            width = max(len(encoded[i]) for i in batch)
            input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
            attention = torch.zeros((len(batch), width), dtype=torch.long)
            for row, index in enumerate(batch):
                input_ids[row, width - len(encoded[index]) :] = torch.tensor(encoded[index])
                attention[row, width - len(encoded[index]) :] = 1
            with torch.inference_mode():
                out = model.generate(
                    input_ids=input_ids.to(device), attention_mask=attention.to(device), **kwargs
                )
            generated = out.sequences[:, width:]
            decoded = tokenizer.batch_decode(generated, skip_special_tokens=True)
            step_entropy = None
            if keep_entropy:
                logits = torch.stack(out.logits, 1).float()  # [B*n, steps, V], raw
                step_entropy = torch.distributions.Categorical(logits=logits).entropy()
            for row, index in enumerate(batch):
                for j in range(row * n, (row + 1) * n):
                    texts[index].append(decoded[j])
                    if step_entropy is not None:
                        entropies[index].append(
                            _answer_line_entropy(tokenizer, generated[j], step_entropy[j], pad_id)
                        )
    return _Batch(texts, entropies if keep_entropy else None)


def _answer_line_entropy(
    tokenizer: Any, token_ids: torch.Tensor, entropy: torch.Tensor, pad_id: int
) -> list[float]:
    """Step entropies of the first answer line (up to a newline or the end of the text)."""
    kept: list[float] = []
    special = set(tokenizer.all_special_ids) | {pad_id}
    for step, token in enumerate(token_ids.tolist()):
        if token in special:
            break
        piece = tokenizer.decode([token])
        if "\n" not in piece:
            kept.append(float(entropy[step]))
            continue
        if piece.split("\n")[0].strip():
            kept.append(float(entropy[step]))  # this token ends the answer line
        if kept:
            break
        # a newline before any answer text: the answer line has not started yet
    return kept


def _generate_vllm(
    llm: Any,
    tokenizer: Any,
    prompts: Sequence[tuple[str, bool]],
    *,
    n: int,
    temperature: float,
    seed: int,
    max_new_tokens: int,
    stop: Sequence[str],
) -> _Batch:
    from vllm import SamplingParams
    from vllm.platforms import current_platform

    from semsoft_plugin.hf import encode_prompts

    encoded = encode_prompts(tokenizer, prompts)
    # vLLM 0.32's CPU runner fails ("CPU Generator does not use offset") when a request
    # with its own seed has a sample discarded under chunked prefill; on CPU the
    # engine's seed (LLM(seed=...)) makes the sampling repeatable instead.
    own_seed = {} if current_platform.is_cpu() else {"seed": seed}
    params = SamplingParams(
        n=n,
        temperature=temperature,
        top_k=0 if temperature > 0 else -1,
        top_p=1.0,
        **own_seed,
        max_tokens=max_new_tokens,
        stop=list(stop) or None,
    )
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in encoded], params, use_tqdm=False)
    return _Batch([[o.text for o in out.outputs] for out in outputs], None)


def generate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Prompt],
    *,
    n: int = 1,
    temperature: float = 0.0,
    seed: int = 0,
    max_new_tokens: int = 16,
    batch_size: int = 4,
    stop: Sequence[str] = (),
    keep_entropy: bool = False,
    progress: bool | None = None,
) -> _Batch:
    """``n`` generated texts per prompt (greedy at ``temperature=0``), in prompt order.

    Parameters
    ----------
    model : a transformers causal LM or a ``vllm.LLM``
    tokenizer : its tokenizer (for vLLM, ``None`` takes ``llm.get_tokenizer()``)
    prompts : strings or chat message lists
    n : samples per prompt (``num_return_sequences`` / ``SamplingParams(n=...)``)
    temperature : ``0`` is greedy and needs ``n == 1``
    seed : sampling seed (transformers: the global RNG is restored afterwards)
    max_new_tokens : generation length limit
    batch_size : prompts per transformers ``generate`` call (each expands to ``n`` rows)
    stop : strings that end a generation early (the text keeps them on transformers)
    keep_entropy : transformers only: keep the entropy of the raw next-token distribution
        at each step of each text's first line (the single-pass logit-entropy baseline)
    """
    if isinstance(prompts, str) or not isinstance(prompts, Sequence):
        raise ValueError("prompts must be a list of strings or of chat message lists")
    _check_positive("n", n)
    _check_positive("max_new_tokens", max_new_tokens)
    _check_positive("batch_size", batch_size)
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature={temperature!r} must be >= 0")
    if temperature == 0 and n > 1:
        raise ValueError(f"n={n} greedy generations would be identical: give a temperature > 0")
    if _is_vllm(model):
        if keep_entropy:
            raise ValueError("keep_entropy needs a transformers model, not vLLM")
        tokenizer = tokenizer if tokenizer is not None else model.get_tokenizer()
    formatted = [format_prompt(tokenizer, p) for p in prompts]
    if not formatted:
        return _Batch([], [] if keep_entropy else None)
    if _is_vllm(model):
        return _generate_vllm(
            model, tokenizer, formatted, n=n, temperature=temperature, seed=seed,
            max_new_tokens=max_new_tokens, stop=stop,
        )  # fmt: skip
    return _generate_hf(
        model, tokenizer, formatted, n=n, temperature=temperature, seed=seed,
        max_new_tokens=max_new_tokens, batch_size=batch_size, stop=stop,
        keep_entropy=keep_entropy, progress=progress,
    )  # fmt: skip


# --- open answers: agreement with the modal answer and the n_correct target ---------------


@dataclass(frozen=True)
class Consistency:
    """What ``n`` sampled answers to one question say.

    ``modal`` is the commonest non-empty answer (normalised; ties go to the first
    sampled), ``agreement`` the share of all ``n`` samples that agree with it (the
    self-consistency confidence), ``n_correct`` how many samples match a gold alias
    (``None`` without gold).
    """

    modal: str
    agreement: float
    n: int
    n_valid: int
    n_correct: int | None
    modal_correct: bool | None


def consistency(
    answers: Sequence[str],
    aliases: Sequence[str] | None = None,
    *,
    match: str = "contains",
) -> Consistency:
    """Modal answer, agreement and (with gold ``aliases``) ``n_correct`` of sampled answers.

    Answers that normalise to nothing never vote and never count as correct.
    """
    if not answers:
        raise ValueError("no answers given")
    keys = [normalize_answer(a) for a in answers]
    votes = Counter(k for k in keys if k)
    if votes:
        best = max(votes.values())
        modal_key = next(k for k in keys if k and votes[k] == best)
        modal = next(a for a, k in zip(answers, keys, strict=True) if k == modal_key)
        agreement = best / len(answers)
    else:
        modal, agreement = "", 0.0
    n_correct = modal_correct = None
    if aliases is not None:
        n_correct = sum(match_answer(a, aliases, mode=match) for a in answers)  # type: ignore[arg-type]
        modal_correct = bool(modal) and match_answer(modal, aliases, mode=match)  # type: ignore[arg-type]
    return Consistency(
        modal, agreement, len(answers), sum(votes.values()), n_correct, modal_correct
    )


# --- label sets ----------------------------------------------------------------------


def match_label(text: str, labels: Sequence[str]) -> int | None:
    """Index of the label a generated answer names, or ``None`` when it names none.

    Read from the answer line (:func:`~semsoft_eval.confidence.split_answer_confidence`),
    compared after SQuAD normalisation: an exact match; else the label found as whole
    words earliest in the answer (the longest at the same place); else a unique prefix
    relation of at least 3 characters between the answer's first word and one label
    ("disappoint" -> "disappointment", "joyful" -> "joy"). Never a nearest guess.
    """
    answer, _ = split_answer_confidence(text)
    answer = normalize_answer(answer)
    if not answer:
        return None
    names = [normalize_answer(label) for label in labels]
    if answer in names:
        return names.index(answer)
    padded = f" {answer} "
    found = [(padded.find(f" {name} "), -len(name), i) for i, name in enumerate(names) if name]
    found = [f for f in found if f[0] >= 0]
    if found:
        return min(found)[2]
    first = answer.split()[0]
    if len(first) < 3:
        return None
    related = [
        i for i, name in enumerate(names)
        if len(name) >= 3 and (name.startswith(first) or first.startswith(name))
    ]  # fmt: skip
    return related[0] if len(related) == 1 else None


def _label_tokens(tokenizer: Any, labels: Sequence[str]) -> int:
    return max(len(tokenizer.encode(" " + label, add_special_tokens=False)) for label in labels)


def _check_labels(labels: Sequence[str]) -> list[str]:
    if isinstance(labels, str) or len(labels) < 2:
        raise ValueError(f"labels={labels!r}: give a list of at least two labels")
    return list(labels)


@dataclass
class SelfConsistencyResult:
    """Vote shares ``[N, L]`` and what could not be read.

    ``n_unparsed``: samples naming no label (excluded from the vote); ``n_uniform``: rows
    where no sample named a label (given the uniform distribution).
    """

    probs: np.ndarray
    samples: list[list[str]]
    n_unparsed: int
    n_uniform: int


def self_consistency(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Prompt],
    labels: Sequence[str],
    *,
    n: int = 10,
    temperature: float = 0.7,
    seed: int = 0,
    batch_size: int = 4,
    max_new_tokens: int | None = None,
    progress: bool | None = None,
) -> SelfConsistencyResult:
    """Sample ``n`` answers per prompt and return each label's share of the readable votes."""
    labels = _check_labels(labels)
    if _is_vllm(model) and tokenizer is None:
        tokenizer = model.get_tokenizer()
    if max_new_tokens is None:
        max_new_tokens = _label_tokens(tokenizer, labels) + 4
    out = generate(
        model, tokenizer, prompts, n=n, temperature=temperature, seed=seed,
        max_new_tokens=max_new_tokens, batch_size=batch_size, stop=("\n",), progress=progress,
    )  # fmt: skip
    probs = np.zeros((len(prompts), len(labels)))
    unparsed = uniform = 0
    for row, texts in enumerate(out.texts):
        for text in texts:
            choice = match_label(text, labels)
            if choice is None:
                unparsed += 1
            else:
                probs[row, choice] += 1
        total = probs[row].sum()
        if total == 0:
            probs[row] = 1.0 / len(labels)
            uniform += 1
        else:
            probs[row] /= total
    return SelfConsistencyResult(probs, out.texts, unparsed, uniform)


def self_consistency_probs(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    labels: list[str],
    *,
    n: int = 10,
    temperature: float = 0.7,
    seed: int = 0,
    batch_size: int = 4,
) -> np.ndarray:
    """Self-consistency label probabilities ``[N, L]``: vote shares of ``n`` sampled answers.

    Samples that name no label are left out of the vote; a row where none does is
    uniform. Both counts are logged (:func:`self_consistency` returns them).
    """
    result = self_consistency(
        model, tokenizer, prompts, labels, n=n, temperature=temperature, seed=seed,
        batch_size=batch_size,
    )  # fmt: skip
    logger.info(
        "self-consistency: %d of %d samples named no label; %d of %d rows uniform",
        result.n_unparsed, n * len(prompts), result.n_uniform, len(prompts),
    )  # fmt: skip
    return result.probs


# --- verbal confidence -------------------------------------------------------------


def verbal_prompt(prompt: Prompt, instruction: str = VERBAL_INSTRUCTION) -> Prompt:
    """The prompt with the request for a stated confidence.

    A chat message list gets ``instruction`` appended to its last user message (a final
    assistant answer prefix stays where it is). A plain string is returned unchanged:
    where the user part ends in it is unknown, and the pre-filled ``"Confidence:"`` pass
    of :func:`verbal_readings` asks for the number instead.
    """
    if isinstance(prompt, str):
        return prompt
    messages = [dict(m) for m in prompt]
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    if not users:
        raise ValueError("a chat prompt for verbal confidence needs a user message")
    last = users[-1]
    messages[last]["content"] = f"{messages[last]['content']}\n\n{instruction}"
    return messages


@dataclass(frozen=True)
class VerbalReading:
    """One greedy answer with its stated confidence (``None``: nothing parseable)."""

    text: str
    answer: str
    confidence: float | None
    prefilled: bool
    answer_entropy: float | None = None  # mean raw next-token entropy of the answer line


def verbal_readings(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Prompt],
    *,
    batch_size: int = 8,
    max_new_tokens: int = 24,
    prefill: bool = True,
    keep_entropy: bool = False,
    progress: bool | None = None,
) -> list[VerbalReading]:
    """Greedy answers and the confidences stated with them.

    ``prompts`` are used as given (wrap them with :func:`verbal_prompt` to ask for a
    confidence). Items whose first pass states none get a second greedy pass with
    ``"\\nConfidence:"`` pre-filled after the answer line (``prefill=False`` skips it).
    """
    if _is_vllm(model) and tokenizer is None:
        tokenizer = model.get_tokenizer()
    first = generate(
        model, tokenizer, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size,
        keep_entropy=keep_entropy, progress=progress,
    )  # fmt: skip
    texts = [t[0] for t in first.texts]
    split = [split_answer_confidence(t) for t in texts]
    missing = [i for i, (_, conf) in enumerate(split) if conf is None]
    second: dict[int, float | None] = {}
    if prefill and missing:
        # The prompt text as the model saw it, the answer line, then the pre-filled cue.
        continued = [
            format_prompt(tokenizer, prompts[i])[0] + texts[i].split("\n")[0] + CONFIDENCE_PREFILL
            for i in missing
        ]
        special = [format_prompt(tokenizer, prompts[i])[1] for i in missing]
        out = _continue(model, tokenizer, continued, special, batch_size, progress)
        for i, text in zip(missing, out, strict=True):
            second[i] = split_answer_confidence("Confidence:" + text)[1]
    readings = []
    for i, (answer, conf) in enumerate(split):
        entropy = None
        if first.entropies is not None and first.entropies[i][0]:
            entropy = float(np.mean(first.entropies[i][0]))
        readings.append(
            VerbalReading(
                text=texts[i],
                answer=answer,
                confidence=conf if i not in second else second[i],
                prefilled=i in second,
                answer_entropy=entropy,
            )
        )
    return readings


def _continue(
    model: Any,
    tokenizer: Any,
    texts: list[str],
    special: list[bool],
    batch_size: int,
    progress: bool | None,
) -> list[str]:
    """Greedy continuations of already formatted prompt texts (the pre-filled pass)."""
    pairs = list(zip(texts, special, strict=True))
    if _is_vllm(model):
        out = _generate_vllm(
            model, tokenizer, pairs, n=1, temperature=0.0, seed=0, max_new_tokens=6, stop=("\n",)
        )
    else:
        out = _generate_hf(
            model, tokenizer, pairs, n=1, temperature=0.0, seed=0, max_new_tokens=6,
            batch_size=batch_size, stop=("\n",), keep_entropy=False, progress=progress,
        )  # fmt: skip
    return [t[0] for t in out.texts]


def verbal_probs(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    labels: list[str],
    *,
    batch_size: int = 8,
) -> tuple[np.ndarray, int]:
    """Verbal-confidence label probabilities ``[N, L]`` and the number of unparsed items.

    Each prompt is wrapped with :func:`verbal_prompt`; the label named by the greedy
    answer gets the stated confidence and the other labels share the rest equally. An
    item whose answer names no label, or that states no readable confidence even after
    the pre-filled pass, gets the uniform distribution and is counted.
    """
    labels = _check_labels(labels)
    if _is_vllm(model) and tokenizer is None:
        tokenizer = model.get_tokenizer()
    readings = verbal_readings(
        model, tokenizer, [verbal_prompt(p) for p in prompts], batch_size=batch_size,
        max_new_tokens=_label_tokens(tokenizer, labels) + 12,
    )  # fmt: skip
    size = len(labels)
    probs = np.full((len(prompts), size), 1.0 / size)
    unparsed = 0
    for row, reading in enumerate(readings):
        choice = match_label(reading.answer, labels)
        if choice is None or reading.confidence is None:
            unparsed += 1
            continue
        probs[row] = (1.0 - reading.confidence) / (size - 1)
        probs[row, choice] = reading.confidence
    logger.info(
        "verbal: %d of %d items unparsed (uniform); %d needed the pre-filled pass",
        unparsed, len(prompts), sum(r.prefilled for r in readings),
    )  # fmt: skip
    return probs, unparsed
