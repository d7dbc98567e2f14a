"""transformers adapter: a `LogitsProcessor` that records calibrated label probabilities.

Use it inside an ordinary `model.generate` call:

```python
proc = SemanticSoftmaxLogitsProcessor(model, LabelSet(labels, tokenizer), mode="constrain",
                                      eos_token_id=tokenizer.eos_token_id)
out = model.generate(**batch, logits_processor=LogitsProcessorList([proc]), max_new_tokens=5)
proc.results[0].probs      # calibrated label probabilities of batch row 0
```

or, for the common case, [`classify`][semsoft_plugin.engines.hf.classify]. It records a side
output without changing generation ("observe") or emits a label chosen from the calibrated
distribution ("constrain"). What it sees, and its per-thread state: docs/reference/api/hf.md.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from transformers import LogitsProcessor, LogitsProcessorList

from semsoft_plugin.core.config import SemsoftConfig
from semsoft_plugin.core.embeddings import from_model
from semsoft_plugin.core.labels import LabelSet
from semsoft_plugin.core.request import MODES, Mode, default_max_tokens
from semsoft_plugin.core.result import LabelResult
from semsoft_plugin.core.softmax import SemanticSoftmax, SemanticSoftmaxResult
from semsoft_plugin.core.tokens import OutputEmbeddings
from semsoft_plugin.engines.hf_beam_search import BEAM_MESSAGE, num_beams, refuse_beam_search
from semsoft_plugin.engines.prompting import (
    format_prompt,
    item_list,
    left_padded,
    pad_token_id,
    padding_batches,
)

__all__ = [
    "SemanticSoftmaxLogitsProcessor",
    "classify",
    "float32_head",
]


@dataclass
class _Run:
    """State of one generate call (one thread)."""

    last_input_ids: Tensor | None = None
    prompt_length: int = 0
    results: list[SemanticSoftmaxResult | None] = field(default_factory=list)
    logits: list[Tensor | None] = field(default_factory=list)
    # constrain mode: per row, the tokens still to force (label remainder, then EOS)
    forced: list[list[int]] = field(default_factory=list)
    chosen: list[int | None] = field(default_factory=list)


class SemanticSoftmaxLogitsProcessor(LogitsProcessor):
    """Records Semantic Softmax label probabilities at the decision step.

    Parameters
    ----------
    embeddings : Any
        A transformers model, Tensor (V, d) or OutputEmbeddings
        Output embeddings; a model's lm_head weight is used without a copy.
    labels : LabelSet
        Labels bound to the model's tokenizer. With `tokenizer` given, a LabelSet
        built with another tokenizer is refused (`ValueError` naming both); without
        it, one whose tokenizer is larger than the embedding matrix is.
    config : SemsoftConfig, optional
        Method settings; keyword `overrides` change single fields.
    mode : {"constrain", "observe"}
        `"constrain"` (default, as on every engine) writes `log P_sem` into the label
        answer tokens' scores (`-inf` elsewhere): greedy emits the calibrated argmax, the
        rest of the label is forced, then `eos_token_id` if given. `"observe"` leaves the
        scores untouched: generation is bit-identical to a run without the processor.
    trigger : str, optional
        Decide at the step right after the generated text ends with this string
        (e.g. `"Answer:"` or `"</think>"`) instead of at the first generated token.
        Needs `tokenizer`. The match must end in generated text (a trigger already
        complete at the end of the prompt is not a decision step: use the default).
    tokenizer : Any
        The model's tokenizer, needed for `trigger`; when given, `labels` is
        checked against it
    eos_token_id : int, optional
        In constrain mode, forced after the label so generation ends there.
    keep_logits : bool
        Also keep each row's decision-step scores (float32 `[V]`), e.g. to score
        several configurations from one forward pass.

    Examples
    --------
    Inside an ordinary `generate` call (constrain mode: the generated text is the label):

    ```python
    from transformers import LogitsProcessorList
    from semsoft_plugin import LabelSet
    from semsoft_plugin.engines import models
    from semsoft_plugin.engines.hf import SemanticSoftmaxLogitsProcessor

    model, tokenizer = models.load("smollm2-135m")
    labels = LabelSet(["positive", "negative"], tokenizer)
    proc = SemanticSoftmaxLogitsProcessor(model, labels, tokenizer=tokenizer,
                                          eos_token_id=tokenizer.eos_token_id)
    batch = tokenizer(["Review: I loved it. Sentiment:"], return_tensors="pt")
    model.generate(**batch, logits_processor=LogitsProcessorList([proc]), max_new_tokens=4)
    proc.results[0].probs    # tensor([p_positive, p_negative]), in the label set's order
    ```
    """

    def __init__(
        self,
        embeddings: Any,
        labels: LabelSet,
        config: SemsoftConfig | None = None,
        *,
        mode: Mode = "constrain",
        trigger: str | None = None,
        tokenizer: Any = None,
        eos_token_id: int | None = None,
        keep_logits: bool = False,
        **overrides: Any,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode={mode!r} must be one of {MODES}")
        if not isinstance(labels, LabelSet):
            raise ValueError(f"labels must be a LabelSet, got {type(labels).__name__}")
        if trigger is not None:
            if not isinstance(trigger, str) or not trigger:
                raise ValueError(f"trigger={trigger!r} must be a non-empty string")
            if tokenizer is None:
                raise ValueError("trigger needs the tokenizer to read the generated text")
        if not isinstance(embeddings, Tensor | OutputEmbeddings):
            embeddings = from_model(embeddings)
        if tokenizer is not None:
            labels.check_tokenizer(tokenizer, where="the transformers processor")
        else:
            rows = embeddings.vocab_size if isinstance(embeddings, OutputEmbeddings) else None
            labels.check_vocabulary(rows or embeddings.shape[0], where="the transformers processor")
        self.labels = labels
        self.scorer = SemanticSoftmax(embeddings, labels, config, **overrides)
        self.mode: Mode = mode
        self.trigger = trigger
        self.tokenizer = tokenizer
        self.eos_token_id = eos_token_id
        self.keep_logits = keep_logits
        self._answer_to_label = {t: i for i, t in enumerate(labels.answer_token_ids)}
        self._local = threading.local()

    # -- state ---------------------------------------------------------------
    @property
    def _run(self) -> _Run:
        run = getattr(self._local, "run", None)
        if run is None:
            run = self._local.run = _Run()
        return run

    def reset(self) -> None:
        """Forget this thread's generation state and results."""
        self._local.run = _Run()

    @property
    def results(self) -> list[SemanticSoftmaxResult | None]:
        """Per batch row of this thread's last generate call: the result, or None if
        that row never reached its decision step (e.g. the trigger never appeared)."""
        return list(self._run.results)

    @property
    def logits(self) -> list[Tensor | None]:
        """Per batch row, the decision-step scores (`keep_logits=True` only)."""
        if not self.keep_logits:
            raise ValueError("logits are kept only with keep_logits=True")
        return list(self._run.logits)

    @property
    def chosen_labels(self) -> list[int | None]:
        """Constrain mode: per row, the index of the label the generation emits."""
        return list(self._run.chosen)

    def _start_or_continue(self, input_ids: Tensor, scores: Tensor) -> _Run:
        run = self._run
        previous = run.last_input_ids
        continues = (
            previous is not None
            and previous.shape[0] == input_ids.shape[0]
            and input_ids.shape[1] == previous.shape[1] + 1
            and torch.equal(input_ids[:, :-1], previous)
        )
        if not continues:
            refuse_beam_search(previous, input_ids, scores)
            batch = input_ids.shape[0]
            run = self._local.run = _Run(
                prompt_length=input_ids.shape[1],
                results=[None] * batch,
                logits=[None] * batch,
                forced=[[] for _ in range(batch)],
                chosen=[None] * batch,
            )
        run.last_input_ids = input_ids
        return run

    # -- the step ------------------------------------------------------------
    def _deciding_rows(self, run: _Run, input_ids: Tensor) -> list[int]:
        undecided = [b for b, r in enumerate(run.results) if r is None]
        if self.trigger is None:
            return undecided if input_ids.shape[1] == run.prompt_length else []
        if not undecided or input_ids.shape[1] == run.prompt_length:
            return []
        # The match must end in generated text; it may start in the prompt ("Answer" + ":").
        window = min(input_ids.shape[1], len(self.trigger) + 2)
        tails = self.tokenizer.batch_decode(input_ids[undecided, -window:])
        return [b for b, tail in zip(undecided, tails, strict=True) if tail.endswith(self.trigger)]

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        run = self._start_or_continue(input_ids, scores)
        deciding = self._deciding_rows(run, input_ids)
        if deciding:
            rows = torch.tensor(deciding, device=scores.device)
            decision_scores = scores.index_select(0, rows)
            result = self.scorer(decision_scores)
            for j, b in enumerate(deciding):
                run.results[b] = SemanticSoftmaxResult(
                    *(t[j].detach().cpu() for t in result.__dict__.values())
                )
                if self.keep_logits:
                    run.logits[b] = decision_scores[j].detach().to(torch.float32).cpu().clone()
        if self.mode == "observe":
            return scores
        return self._constrain(run, scores, deciding)

    def _constrain(self, run: _Run, scores: Tensor, deciding: list[int]) -> Tensor:
        scores = scores.clone()
        answer_ids = torch.tensor(self.labels.answer_token_ids, device=scores.device)
        for b in range(scores.shape[0]):
            if b in deciding:
                # Only the label answer tokens stay, at log P_sem: greedy picks the
                # calibrated argmax, sampling draws from P_sem.
                probs = run.results[b].probs.to(scores.device, scores.dtype)  # type: ignore[union-attr]
                scores[b] = float("-inf")
                scores[b, answer_ids] = probs.clamp_min(1e-30).log()
                run.chosen[b] = -1  # known after this step's sample
            elif run.chosen[b] == -1:
                self._note_choice(run, b)
                if run.forced[b]:
                    scores[b] = float("-inf")
                    scores[b, run.forced[b].pop(0)] = 0.0
            elif run.forced[b]:
                scores[b] = float("-inf")
                scores[b, run.forced[b].pop(0)] = 0.0
        return scores

    def _note_choice(self, run: _Run, b: int) -> None:
        emitted = int(run.last_input_ids[b, -1])  # type: ignore[index]
        index = self._answer_to_label[emitted]
        run.chosen[b] = index
        remainder = list(self.labels.labels[index].token_ids[1:])
        if self.eos_token_id is not None:
            remainder.append(int(self.eos_token_id))
        run.forced[b] = remainder


# ---------------------------------------------------------------------------
# float32 head: exact decision-step logits from a bf16/fp16 model
# ---------------------------------------------------------------------------

# Output-embedding rows upcast per matmul: bounds the float32 copy (Qwen2.5's 151,936 x
# 1,536 head would be 0.9 GB in float32 at once; 16,384 rows are 100 MB).
_HEAD_CHUNK = 16384


@contextlib.contextmanager
def float32_head(model: Any) -> Iterator[None]:
    """Within the block, the model's output layer computes float32 logits.

    Why: a bf16 model's lm_head returns bf16 logits, rounded to 8 significant bits (a
    logit near 20 lands on a 1/8 grid), so different texts get identical probabilities
    and a row moves with the batch it is in. The hidden state entering the head is
    kept as the model computed it; only the head's product is taken in float32
    (the bf16 weights are exact in float32), which is what vLLM's
    `hf_overrides={"head_dtype": "float32"}` does. A float32 model is left as is.
    The cost is one float32 product per generated step: about `2 V d` flops per row.
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    if head is None or weight is None or weight.dtype == torch.float32:
        yield
        return

    def exact(module: Any, args: tuple[Any, ...], output: Tensor) -> Tensor:
        hidden = args[0].to(torch.float32)
        rows = module.weight
        out = torch.empty(
            (*hidden.shape[:-1], rows.shape[0]), dtype=torch.float32, device=hidden.device
        )
        for start in range(0, rows.shape[0], _HEAD_CHUNK):
            chunk = rows[start : start + _HEAD_CHUNK].to(torch.float32)
            torch.matmul(hidden, chunk.T, out=out[..., start : start + _HEAD_CHUNK])
        bias = getattr(module, "bias", None)
        return out if bias is None else out + bias.to(torch.float32)

    handle = head.register_forward_hook(exact)
    try:
        yield
    finally:
        handle.remove()


# ---------------------------------------------------------------------------
# classify: the common case in one call
# ---------------------------------------------------------------------------


def classify(
    model: Any,
    tokenizer: Any,
    inputs: Iterable[str | Sequence[Mapping[str, str]]],
    labels: Sequence[str] | LabelSet,
    *,
    config: SemsoftConfig | None = None,
    mode: Mode = "constrain",
    trigger: str | None = None,
    batch_size: int = 8,
    progress: bool | None = None,
    keep_logits: bool = False,
    max_tokens: int | None = None,
    generate_kwargs: Mapping[str, Any] | None = None,
    exact_head: bool = True,
    **overrides: Any,
) -> list[LabelResult]:
    """Classify inputs with calibrated label probabilities, one result per input.

    Parameters
    ----------
    model, tokenizer : Any
        A transformers causal LM and its tokenizer
    inputs : Iterable[str | Sequence[Mapping[str, str]]]
        Strings (used as is) or chat message lists (chat template applied), in
        any iterable (list, tuple, numpy array, pandas Series, generator)
    labels : Sequence[str] | LabelSet
        Label names (scored as leading-space whole words, see
        [`LabelSet`][semsoft_plugin.core.labels.LabelSet]) or a ready LabelSet
    config : SemsoftConfig | None
        Semantic Softmax settings
    **overrides : Any
        Semantic Softmax settings
    mode : Mode
        `"constrain"` (default): the generated text is the label; `"observe"`:
        generation is free and `label` is the calibrated argmax
    trigger : str | None
        Decide after this generated text (e.g. `"</think>"`) instead of at the
        first token; give `max_tokens` room to reach it
    batch_size : int
        Inputs per generate call (left-padded)
    progress : bool | None
        Show a progress bar; default when there is more than one batch
    keep_logits : bool
        Keep each input's raw decision-step scores in `.logits`
    max_tokens : int | None
        Generation length in tokens (default: the longest answer's UTF-8 bytes
        + 2, 256 with a trigger; `semsoft_plugin.core.request.default_max_tokens`)
    generate_kwargs : Mapping[str, Any] | None
        Extra `model.generate` arguments (default greedy)
    exact_head : bool
        Compute the logits with a float32 head when the model is bf16/fp16
        ([`float32_head`][semsoft_plugin.engines.hf.float32_head]): no ties from bf16 rounding, and
        scores that do not move with the batch by more than the hidden states do. False keeps the
        model's head.
    """
    from tqdm.auto import tqdm

    inputs = item_list(inputs, "inputs", "strings or chat message lists")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be a positive int")
    label_set = labels if isinstance(labels, LabelSet) else LabelSet(labels, tokenizer)
    eos = tokenizer.eos_token_id
    pad_id = pad_token_id(tokenizer)
    processor = SemanticSoftmaxLogitsProcessor(
        model,
        label_set,
        config,
        mode=mode,
        trigger=trigger,
        tokenizer=tokenizer,
        eos_token_id=eos,
        keep_logits=keep_logits,
        **overrides,
    )
    if max_tokens is None:
        answers = [label.answer_text.strip() for label in label_set.labels]
        max_tokens = default_max_tokens(answers, trigger)
    kwargs: dict[str, Any] = {
        "do_sample": False,
        "max_new_tokens": max_tokens,
        "pad_token_id": pad_id,
    }
    kwargs.update(generate_kwargs or {})
    beams = num_beams(model, kwargs)
    if beams > 1:
        raise ValueError(f"classify: num_beams={beams}: {BEAM_MESSAGE}")
    texts = [format_prompt(tokenizer, item) for item in inputs]
    batches = padding_batches([len(text) for text, _ in texts], batch_size)
    show = progress if progress is not None else len(batches) > 1
    results: list[LabelResult | None] = [None] * len(texts)
    device = next(model.parameters()).device
    for batch in tqdm(batches, desc="classify", unit="batch", disable=not show):
        encoded = left_padded(tokenizer, [texts[i] for i in batch], pad_id)
        processor.reset()
        head = float32_head(model) if exact_head else contextlib.nullcontext()
        with torch.inference_mode(), head:
            output = model.generate(
                **{k: v.to(device) for k, v in encoded.items()},
                logits_processor=LogitsProcessorList([processor]),
                **kwargs,
            )
        generated = output[:, encoded["input_ids"].shape[1] :]
        decoded = tokenizer.batch_decode(generated, skip_special_tokens=True)
        run_results = processor.results
        run_logits = processor.logits if keep_logits else [None] * len(batch)
        chosen = processor.chosen_labels
        for row, index in enumerate(batch):
            result = run_results[row]
            if result is None:
                raise ValueError(
                    f"input {index}: the decision step was never reached "
                    f"(trigger {trigger!r} not generated within {max_tokens} tokens)"
                )
            semantic = result.probs.tolist()
            choice = chosen[row]
            if choice == -1 and trigger is None:  # generation stopped right after the decision
                choice = processor._answer_to_label.get(int(generated[row, 0]), -1)
            if mode == "constrain" and choice is not None and choice >= 0:
                label = label_set.names[choice]
            else:
                label = label_set.names[int(result.probs.argmax())]
            results[index] = LabelResult(
                label=label,
                probs=dict(zip(label_set.names, semantic, strict=True)),
                constrained_probs=dict(
                    zip(label_set.names, result.constrained_probs.tolist(), strict=True)
                ),
                fallback=bool(result.fallback),
                coverage=float(result.coverage),
                text=decoded[row],
                logits=run_logits[row],
            )
    return [r for r in results if r is not None]
