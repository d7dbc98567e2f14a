"""The transformers `semsoft_eval.backends.Backend`.

The decision step goes through the adapter users call
([`semsoft_plugin.engines.hf.classify`][semsoft_plugin.engines.hf.classify] with `keep_logits=True`), so the evaluation never
scores items with a second implementation. Prompt formatting and left padding are the
adapter's (`semsoft_plugin.engines.hf.format_prompt`, `semsoft_plugin.engines.hf.left_padded`),
so every pass here sees the tokens the adapter sees.

The decision step also keeps the last layer's hidden state at the decision position
(`DecisionStep.hidden`, the `probe` method's features): the input of the output
layer, read by a forward pre-hook on it during the same `generate` call
(`semsoft_plugin.engines.hf_hidden.HiddenAtDecision`, which `Classifier` uses
too), so it costs no extra pass. (It is `output_hidden_states=True`'s last entry at the last position:
transformers applies the final norm before storing it.)
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from semsoft_eval.backends import DecisionStep, Generations, Prompt
from semsoft_plugin.core.kept_scores import compress
from semsoft_plugin.core.labels import LabelSet
from semsoft_plugin.core.tokens import OutputEmbeddings
from semsoft_plugin.engines.hf_hidden import HiddenAtDecision

__all__ = ["STORE_K", "TransformersBackend"]

STORE_K = 1024  # top logits kept per item (the tune grid has k <= 200)


def _pad_id(tokenizer: Any) -> int:
    pad_id = (
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    )
    if pad_id is None:
        raise ValueError("the tokenizer has neither a pad nor an eos token id")
    return int(pad_id)


def _by_length(encoded: Sequence[Sequence[int]], batch_size: int) -> list[list[int]]:
    """Prompt indices in batches of similar length (less padding)."""
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


class TransformersBackend:
    """A transformers causal LM and its tokenizer."""

    name = "transformers"

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self._embeddings: OutputEmbeddings | None = None

    def embeddings(self) -> OutputEmbeddings:
        if self._embeddings is None:
            from semsoft_plugin.core.embeddings import from_model

            self._embeddings = from_model(self.model)
        return self._embeddings

    def max_store_k(self) -> int:
        return STORE_K

    @property
    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def decision_step(
        self,
        inputs: Sequence[Any],
        labels: LabelSet,
        token_ids: Sequence[int],
        *,
        store_k: int,
        batch_size: int = 8,
        progress: bool = True,
    ) -> DecisionStep:
        from semsoft_plugin.engines.hf import classify

        with HiddenAtDecision(self.model) as hidden:
            results = classify(
                self.model, self.tokenizer, list(inputs), labels, mode="observe",
                keep_logits=True, batch_size=batch_size, max_tokens=1, progress=progress,
            )  # fmt: skip
        kept = [r.logits for r in results]
        if any(row is None for row in kept):
            raise ValueError("the adapter kept no decision-step logits (keep_logits=True)")
        rows = torch.stack(typing.cast(list[Tensor], kept))
        ids, values, label_values = compress(rows, store_k, torch.tensor(list(token_ids)))
        probs = [r.probs for r in results]
        if any(row is None for row in probs):  # the transformers adapter always scores
            raise ValueError("the adapter returned a result without label probabilities")
        check = np.array(
            [[row[n] for n in labels.names] for row in typing.cast(list[dict[str, float]], probs)]
        )
        return DecisionStep(
            top_ids=ids,
            top_values=values,
            label_values=label_values,
            check=torch.tensor(check, dtype=torch.float32),
            vocab_size=int(rows.shape[-1]),
            hidden=hidden.rows(self.tokenizer, list(inputs), batch_size),
        )

    def sequence_logprobs(
        self, inputs: Sequence[Any], labels: LabelSet, *, batch_size: int = 8, progress: bool = True
    ) -> Tensor:
        """One prompt pass per item (batched, with the KV cache), then every multi-token
        label's continuation in one batched pass on copies of that cache."""
        from tqdm.auto import tqdm

        from semsoft_plugin.engines.hf import float32_head
        from semsoft_plugin.engines.prompting import format_prompt, left_padded

        tokenizer, model = self.tokenizer, self.model
        sequences = labels.token_sequences
        multi = [i for i, s in enumerate(sequences) if len(s) > 1]
        pad_id = _pad_id(tokenizer)
        first_ids = torch.tensor([s[0] for s in sequences])
        prompts = [format_prompt(tokenizer, item) for item in inputs]
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i][0]))
        out = torch.zeros((len(prompts), len(sequences)), dtype=torch.float32)
        width = max((len(sequences[i]) - 1 for i in multi), default=0)
        device = self._device
        batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
        for batch in tqdm(batches, desc="sequence", unit="batch", disable=not progress):
            encoded = left_padded(tokenizer, [prompts[i] for i in batch], pad_id)
            input_ids, mask = encoded["input_ids"], encoded["attention_mask"]
            positions = (mask.cumsum(-1) - 1).clamp_min(0)
            with torch.inference_mode(), float32_head(model):
                first = model(
                    input_ids=input_ids.to(device),
                    attention_mask=mask.to(device),
                    position_ids=positions.to(device),
                    use_cache=bool(multi),
                    logits_to_keep=1,
                )
                log_p = torch.log_softmax(first.logits[:, -1].float().cpu(), dim=-1)
                scores = log_p.index_select(1, first_ids)
                if multi:
                    rows = len(batch) * len(multi)
                    cache = first.past_key_values
                    cache.batch_repeat_interleave(len(multi))
                    cont = torch.full((rows, width), pad_id, dtype=torch.long)
                    cont_mask = torch.zeros((rows, width), dtype=torch.long)
                    for r in range(rows):
                        seq = sequences[multi[r % len(multi)]]
                        cont[r, : len(seq) - 1] = torch.tensor(seq[:-1])
                        cont_mask[r, : len(seq) - 1] = 1
                    full_mask = torch.cat([mask.repeat_interleave(len(multi), 0), cont_mask], 1)
                    start = positions[:, -1:].repeat_interleave(len(multi), 0) + 1
                    second = model(
                        input_ids=cont.to(device),
                        attention_mask=full_mask.to(device),
                        position_ids=(start + torch.arange(width)).to(device),
                        past_key_values=cache,
                    )
                    step_log_p = torch.log_softmax(second.logits.float().cpu(), dim=-1)
                    for r in range(rows):
                        label = multi[r % len(multi)]
                        rest = torch.tensor(sequences[label][1:])
                        scores[r // len(multi), label] += step_log_p[
                            r, torch.arange(len(rest)), rest
                        ].sum()
            out[batch] = scores
        return out

    def label_token_logprobs(
        self, inputs: Sequence[Any], token_ids: Sequence[int], *, progress: bool = True
    ) -> Tensor:
        """Refused: transformers has no label-scoring endpoint of its own to compare with
        (its softmax over the label tokens is the `constrained` method)."""
        raise ValueError(
            "generative-scoring is vLLM's own label scoring (/generative_scoring): "
            "run it with backend='vllm' (--backend vllm); on transformers the same "
            "softmax over the label tokens is the 'constrained' method"
        )

    def generate(
        self,
        prompts: Sequence[Prompt],
        *,
        n: int,
        temperature: float,
        seed: int,
        max_tokens: int,
        stop: Sequence[str] = (),
        batch_size: int = 4,
        keep_entropy: bool = False,
        progress: bool | None = None,
    ) -> Generations:
        """`model.generate` with `num_return_sequences=n`; the global RNG is restored."""
        from tqdm.auto import tqdm

        from semsoft_plugin.engines.prompting import encode_prompts, left_padded

        tokenizer = self.tokenizer
        pad_id = _pad_id(tokenizer)
        batches = _by_length(encode_prompts(tokenizer, prompts), batch_size)
        texts: list[list[str]] = [[] for _ in prompts]
        entropies: list[list[list[float]]] = [[] for _ in prompts]
        sample = temperature > 0
        kwargs: dict[str, Any] = {
            "max_new_tokens": max_tokens,
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
        device = self._device
        show = progress if progress is not None else len(batches) > 1
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for batch in tqdm(batches, desc="generate", unit="batch", disable=not show):
                encoded = left_padded(tokenizer, [prompts[i] for i in batch], pad_id)
                width = encoded["input_ids"].shape[1]
                with torch.inference_mode():
                    out = self.model.generate(
                        input_ids=encoded["input_ids"].to(device),
                        attention_mask=encoded["attention_mask"].to(device),
                        **kwargs,
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
                                self._answer_line_entropy(generated[j], step_entropy[j], pad_id)
                            )
        return Generations(texts, entropies if keep_entropy else None)

    def _answer_line_entropy(self, token_ids: Tensor, entropy: Tensor, pad_id: int) -> list[float]:
        """Step entropies of the first answer line (up to a newline or the end of the text)."""
        kept: list[float] = []
        special = set(self.tokenizer.all_special_ids) | {pad_id}
        for step, token in enumerate(token_ids.tolist()):
            if token in special:
                break
            piece = self.tokenizer.decode([token])
            if "\n" not in piece:
                kept.append(float(entropy[step]))
                continue
            if piece.split("\n")[0].strip():
                kept.append(float(entropy[step]))  # this token ends the answer line
            if kept:
                break
            # a newline before any answer text: the answer line has not started yet
        return kept
