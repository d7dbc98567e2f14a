"""One forward pass per item through the user code path, kept on disk for method sweeps.

``semsoft eval`` and ``semsoft tune`` never score items with a second implementation:
the decision-step logits come from :func:`semsoft_plugin.hf.classify` with
``keep_logits=True`` (the transformers adapter users call), and every method is then
computed from those logits with :class:`semsoft_plugin.core.SemanticSoftmax`.

What is kept per item is lossless for every method here: the top ``store_k`` logits
(Semantic Softmax with any ``k <= store_k`` sees exactly the same kept tokens, and
``P_sem`` is a ratio, so the softmax normaliser over the rest of the vocabulary
cancels) and the logits of every label answer token and own-token variant (the
constrained softmax, contextual calibration, temperature scaling). :meth:`Forward.logits`
rebuilds ``[N, V]`` rows with ``-inf`` elsewhere, which the core treats as masked tokens.

The vLLM backend (:func:`collect_vllm`) keeps the same things from
:func:`semsoft_plugin.vllm.classify_vllm`: the decision step's raw top-``store_k``
log-probabilities and the label tokens' raw log-probabilities. Log-probabilities are
the logits minus one constant per row, and every method here is invariant to that
constant (softmaxes over subsets of one row, and the temperature divides the
difference), so the same :class:`Forward` serves both engines.

The cache is a safetensors file (never pickle) named by a hash of everything that
changes the logits: model directory, prompts, labels, ``store_k``, the backend.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from semsoft_plugin.labels import LabelSet

__all__ = [
    "CONTENT_FREE",
    "STORE_K",
    "VLLM_STORE_K",
    "Forward",
    "collect",
    "collect_vllm",
    "sequence_logprobs",
    "sequence_logprobs_vllm",
]

STORE_K = 1024
# vLLM returns each kept log-probability as a Python object; 256 covers the tune grid
# (k <= 200) and the largest k a server request may ask (semsoft_plugin.vllm.MAX_K).
VLLM_STORE_K = 256
CONTENT_FREE = ("N/A", "", "[MASK]")  # Zhao et al. (2021)
_FORMAT = 1  # bump when what is stored changes


@dataclass
class Forward:
    """Decision-step logits of N items (and of the content-free inputs), compressed.

    Attributes
    ----------
    top_ids, top_logits : ``[N, S]`` the S highest raw logits per item and their token ids
    label_ids : ``[M]`` answer and own-variant token ids of every label
    label_logits : ``[N, M]`` their raw logits
    cf_top_ids, cf_top_logits, cf_label_logits : the same for the content-free inputs
    vocab_size : width of the original logits rows
    semantic_check : ``[N, L]`` the ``probs`` classify returned (its own config), to
        verify that rescoring from the cache reproduces the adapter
    sequence_logprob : ``[N, L]`` log P(whole label sequence | prompt), or None
    seconds : wall time of the classify forward passes (all items)
    sequence_seconds : wall time of the extra sequence passes (0 if none)
    """

    top_ids: Tensor
    top_logits: Tensor
    label_ids: Tensor
    label_logits: Tensor
    cf_top_ids: Tensor
    cf_top_logits: Tensor
    cf_label_logits: Tensor
    vocab_size: int
    semantic_check: Tensor
    sequence_logprob: Tensor | None
    seconds: float
    sequence_seconds: float = 0.0

    @property
    def n(self) -> int:
        return int(self.top_ids.shape[0])

    @property
    def store_k(self) -> int:
        return int(self.top_ids.shape[1])

    def logits(self, rows: slice | Tensor | None = None, *, content_free: bool = False) -> Tensor:
        """Rebuilt ``[n, V]`` float32 logits, ``-inf`` outside the stored tokens."""
        ids, values, labels = (
            (self.cf_top_ids, self.cf_top_logits, self.cf_label_logits)
            if content_free
            else (self.top_ids, self.top_logits, self.label_logits)
        )
        if rows is not None:
            ids, values, labels = ids[rows], values[rows], labels[rows]
        full = torch.full((ids.shape[0], self.vocab_size), float("-inf"), dtype=torch.float32)
        full.scatter_(1, self.label_ids.expand(ids.shape[0], -1), labels)
        full.scatter_(1, ids, values)
        return full

    def content_free(self) -> Forward:
        """The content-free inputs' passes as a :class:`Forward` of their own."""
        return dataclasses.replace(
            self,
            top_ids=self.cf_top_ids,
            top_logits=self.cf_top_logits,
            label_logits=self.cf_label_logits,
            semantic_check=self.semantic_check[:0],
            sequence_logprob=None,
        )

    def chunks(self, size: int = 256) -> Iterator[Tensor]:
        for start in range(0, self.n, size):
            yield self.logits(slice(start, start + size))

    def to_tensors(self) -> dict[str, Tensor]:
        out = {k: v.contiguous() for k, v in self.__dict__.items() if isinstance(v, Tensor)}
        return out

    def save(self, path: Path) -> None:
        from safetensors.torch import save_file

        meta = {
            "vocab_size": str(self.vocab_size),
            "seconds": repr(self.seconds),
            "sequence_seconds": repr(self.sequence_seconds),
            "format": str(_FORMAT),
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        save_file(self.to_tensors(), str(partial), metadata=meta)
        partial.replace(path)

    @classmethod
    def load(cls, path: Path) -> Forward:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as handle:
            meta = handle.metadata()
            tensors = {k: handle.get_tensor(k) for k in handle.keys()}  # noqa: SIM118
        return cls(
            **{
                k: tensors.get(k)
                for k in cls.__dataclass_fields__
                if k not in ("vocab_size", "seconds", "sequence_seconds")
            },
            vocab_size=int(meta["vocab_size"]),
            seconds=float(meta["seconds"]),
            sequence_seconds=float(meta["sequence_seconds"]),
        )


def _label_token_ids(labels: LabelSet) -> list[int]:
    ids = list(labels.answer_token_ids)
    ids += [t for label in labels.labels for t in label.own_token_ids if t not in ids]
    return ids


def _compress(
    logits: Sequence[Tensor], store_k: int, label_ids: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    stacked = torch.stack([row.to(torch.float32) for row in logits])
    values, ids = torch.topk(stacked, min(store_k, stacked.shape[1]), dim=-1)
    return ids, values, stacked.index_select(1, label_ids)


def _timed_sequence(
    labels: LabelSet, wanted: bool, run: Callable[[], Tensor]
) -> tuple[Tensor | None, float]:
    if not (wanted and labels.multi_token_labels):
        return None, 0.0
    start = time.perf_counter()
    return run(), time.perf_counter() - start


def _read_cache(
    cache_file: Path | None,
    labels: LabelSet,
    sequence: bool,
    run: Callable[[Forward], Tensor],
) -> Forward | None:
    """The kept passes, extended (and saved again) with the sequence pass if asked."""
    if cache_file is None or not cache_file.is_file():
        return None
    forward = Forward.load(cache_file)
    if forward.sequence_logprob is None:
        seq, seconds = _timed_sequence(labels, sequence, lambda: run(forward))
        if seq is not None:
            forward.sequence_logprob, forward.sequence_seconds = seq, seconds
            forward.save(cache_file)
    return forward


def cache_key(**parts: Any) -> str:
    blob = json.dumps({**parts, "format": _FORMAT}, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:20]


def sequence_logprobs(
    model: Any,
    tokenizer: Any,
    inputs: Sequence[Any],
    labels: LabelSet,
    *,
    batch_size: int = 8,
    progress: bool = True,
) -> Tensor:
    """``[N, L]`` log-probability of each label's whole answer token sequence.

    One prompt pass per item (batched, with the KV cache), then all multi-token labels'
    continuations in one batched pass on copies of that cache. Only called when some
    label is multi-token; otherwise the sequence probability is the first-token one and
    the normalised result equals the constrained softmax.
    """
    from tqdm.auto import tqdm

    # The adapter's own prompt formatting and padding, so both passes see the same tokens.
    from semsoft_plugin.hf import format_prompt, left_padded

    sequences = labels.token_sequences
    multi = [i for i, s in enumerate(sequences) if len(s) > 1]
    pad_id = (
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    )
    first_ids = torch.tensor([s[0] for s in sequences])
    prompts = [format_prompt(tokenizer, item) for item in inputs]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i][0]))
    out = torch.zeros((len(prompts), len(sequences)), dtype=torch.float32)
    width = max((len(sequences[i]) - 1 for i in multi), default=0)
    device = next(model.parameters()).device
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    for batch in tqdm(batches, desc="sequence", unit="batch", disable=not progress):
        encoded = left_padded(tokenizer, [prompts[i] for i in batch], pad_id)
        input_ids, mask = encoded["input_ids"], encoded["attention_mask"]
        positions = (mask.cumsum(-1) - 1).clamp_min(0)
        with torch.inference_mode():
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
                full_mask = torch.cat([mask.repeat_interleave(len(multi), 0), cont_mask], dim=1)
                start = positions[:, -1:].repeat_interleave(len(multi), 0) + 1
                second = model(
                    input_ids=cont.to(device),
                    attention_mask=full_mask.to(device),
                    position_ids=(start + torch.arange(width)).to(device),
                    past_key_values=cache,
                )
                step_log_p = torch.log_softmax(second.logits.float().cpu(), dim=-1)  # [rows, W, V]
                for r in range(rows):
                    label = multi[r % len(multi)]
                    seq = sequences[label]
                    rest = torch.tensor(seq[1:])
                    scores[r // len(multi), label] += step_log_p[
                        r, torch.arange(len(rest)), rest
                    ].sum()
        out[batch] = scores
    return out


def collect(
    model: Any,
    tokenizer: Any,
    inputs: Sequence[Any],
    content_free: Sequence[Any],
    labels: LabelSet,
    *,
    store_k: int = STORE_K,
    batch_size: int = 8,
    sequence: bool = False,
    progress: bool = True,
    cache_file: Path | None = None,
    classify_kwargs: Mapping[str, Any] | None = None,
) -> Forward:
    """Forward passes through ``semsoft_plugin.hf.classify`` (observe mode, one new token).

    With ``cache_file`` an existing cache is read instead (and a new one written);
    a cache without the sequence log-probabilities is extended when ``sequence`` asks.
    """
    from semsoft_plugin.hf import classify

    def sequence_pass(_: Forward | None = None) -> Tensor:
        return sequence_logprobs(
            model, tokenizer, inputs, labels, batch_size=batch_size, progress=progress
        )

    cached = _read_cache(cache_file, labels, sequence, sequence_pass)
    if cached is not None:
        return cached
    label_ids = torch.tensor(_label_token_ids(labels))
    kwargs = {"mode": "observe", "keep_logits": True, "batch_size": batch_size, "max_new_tokens": 1}
    kwargs.update(classify_kwargs or {})
    start = time.perf_counter()
    results = classify(model, tokenizer, list(inputs), labels, progress=progress, **kwargs)
    seconds = time.perf_counter() - start
    cf_results = classify(model, tokenizer, list(content_free), labels, progress=False, **kwargs)
    check = torch.tensor(
        np.array([[r.probs[n] for n in labels.names] for r in results]), dtype=torch.float32
    )
    forward = _assemble(
        _compress([r.logits for r in results], store_k, label_ids),
        _compress([r.logits for r in cf_results], store_k, label_ids),
        label_ids,
        check,
        vocab_size=int(results[0].logits.shape[-1]),
        seconds=seconds,
    )
    return _finish(forward, labels, sequence, sequence_pass, cache_file)


def _assemble(
    kept: tuple[Tensor, Tensor, Tensor],
    cf_kept: tuple[Tensor, Tensor, Tensor],
    label_ids: Tensor,
    check: Tensor,
    *,
    vocab_size: int,
    seconds: float,
) -> Forward:
    """A :class:`Forward` from the ``(top_ids, top_values, label_values)`` of the items
    and of the content-free inputs."""
    (ids, values, label_logits), (cf_ids, cf_values, cf_label_logits) = kept, cf_kept
    return Forward(
        top_ids=ids,
        top_logits=values,
        label_ids=label_ids,
        label_logits=label_logits,
        cf_top_ids=cf_ids,
        cf_top_logits=cf_values,
        cf_label_logits=cf_label_logits,
        vocab_size=vocab_size,
        semantic_check=check.to(torch.float32),
        sequence_logprob=None,
        seconds=seconds,
    )


def _finish(
    forward: Forward,
    labels: LabelSet,
    sequence: bool,
    run: Callable[[Forward], Tensor],
    cache_file: Path | None,
) -> Forward:
    """Add the sequence pass if asked, and keep the result."""
    forward.sequence_logprob, forward.sequence_seconds = _timed_sequence(
        labels, sequence, lambda: run(forward)
    )
    if cache_file is not None:
        forward.save(cache_file)
    return forward


def cache_path(
    cache_dir: Path,
    model_dir: Path,
    texts: Sequence[str],
    label_names: Sequence[str],
    template: Mapping[str, Any],
    store_k: int,
    backend: str = "hf",
) -> Path:
    """Where the forward passes of this (model, items, labels, prompt, engine) are kept."""
    digest = hashlib.sha256("\x1f".join(texts).encode()).hexdigest()
    # hf keys carry no backend, so caches written before the vLLM backend stay valid.
    engine = {} if backend == "hf" else {"backend": backend}
    key = cache_key(
        model=str(Path(model_dir).resolve()),
        texts=digest,
        labels=list(label_names),
        template=dict(template),
        store_k=store_k,
        **engine,
    )
    return Path(cache_dir) / f"{Path(model_dir).name}-{key}.safetensors"


# ---------------------------------------------------------------------------
# vLLM backend
# ---------------------------------------------------------------------------


def _vllm_token_prompts(llm: Any, inputs: Sequence[Any]) -> list[list[int]]:
    from semsoft_plugin.hf import encode_prompts, format_prompt

    tokenizer = llm.get_tokenizer()
    return encode_prompts(tokenizer, [format_prompt(tokenizer, item) for item in inputs])


def sequence_logprobs_vllm(
    llm: Any,
    inputs: Sequence[Any],
    labels: LabelSet,
    first: Tensor,
    *,
    progress: bool = True,
) -> Tensor:
    """``[N, L]`` log-probability of each label's whole answer token sequence, on vLLM.

    ``first`` is ``[N, L]``, the raw log-probability of each label's first token at
    the decision step (already kept by :func:`collect_vllm`). Every later token of a
    multi-token label is one request ``prompt + label[:j]`` with ``max_tokens=1`` that
    asks for exactly that token's log-probability (``logprob_token_ids``): the shared
    prompt is served from vLLM's prefix cache, where ``prompt_logprobs`` would
    re-run every prompt in full.
    """
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    encoded = _vllm_token_prompts(llm, inputs)
    sequences = labels.token_sequences
    out = first.to(torch.float32).clone()
    places: list[tuple[int, int, int]] = []  # item, label, token
    requests = []
    params = []
    for i, ids in enumerate(encoded):
        for label, seq in enumerate(sequences):
            for j in range(1, len(seq)):
                places.append((i, label, seq[j]))
                requests.append(TokensPrompt(prompt_token_ids=ids + list(seq[:j])))
                params.append(
                    SamplingParams(
                        max_tokens=1, temperature=0.0, logprob_token_ids=[seq[j]], detokenize=False
                    )
                )
    if requests:
        outputs = llm.generate(requests, params, use_tqdm=progress)
        for (i, label, token), output in zip(places, outputs, strict=True):
            out[i, label] += float(output.outputs[0].logprobs[0][token].logprob)
    return out


def collect_vllm(
    llm: Any,
    inputs: Sequence[Any],
    content_free: Sequence[Any],
    labels: LabelSet,
    *,
    store_k: int = VLLM_STORE_K,
    sequence: bool = False,
    progress: bool = True,
    cache_file: Path | None = None,
) -> Forward:
    """Forward passes through :func:`semsoft_plugin.vllm.classify_vllm` (one token each).

    The engine needs ``max_logprobs >= store_k``. The kept values are raw
    log-probabilities (see the module docstring for why that is lossless here).
    """
    from semsoft_plugin.vllm import classify_vllm, output_embeddings

    label_ids = torch.tensor(_label_token_ids(labels))
    first_columns = [_label_token_ids(labels).index(seq[0]) for seq in labels.token_sequences]

    def sequence_pass(forward: Forward) -> Tensor:
        first = forward.label_logits[:, first_columns]
        return sequence_logprobs_vllm(llm, inputs, labels, first, progress=progress)

    cached = _read_cache(cache_file, labels, sequence, sequence_pass)
    if cached is not None:
        return cached

    def run(items: Sequence[Any], show: bool) -> list[dict[str, Any]]:
        return classify_vllm(
            llm,
            list(items),
            labels.names,
            keep_logprobs=store_k,
            token_ids=label_ids.tolist(),
            max_tokens=1,
            use_tqdm=show,
        )

    start = time.perf_counter()
    results = run(inputs, progress)
    seconds = time.perf_counter() - start
    cf_results = run(content_free, False)
    check = torch.tensor([[r["probs"][n] for n in labels.names] for r in results])
    forward = _assemble(
        _kept_logprobs(results, label_ids),
        _kept_logprobs(cf_results, label_ids),
        label_ids,
        check,
        vocab_size=output_embeddings(llm).vocab_size,
        seconds=seconds,
    )
    return _finish(forward, labels, sequence, sequence_pass, cache_file)


def _kept_logprobs(
    results: Sequence[Mapping[str, Any]], label_ids: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """``classify_vllm`` results as the ``top_ids``, ``top_logits``, ``label_logits`` of
    :class:`Forward` (top rows sorted, highest first)."""
    widths = {len(r["top_logprobs"]) for r in results}
    if len(widths) != 1:
        raise ValueError(f"the engine returned ragged top log-probabilities (widths {widths})")
    ids = torch.tensor([list(r["top_logprobs"]) for r in results], dtype=torch.long)
    values = torch.tensor([list(r["top_logprobs"].values()) for r in results], dtype=torch.float32)
    values, order = values.sort(dim=1, descending=True)
    labels = torch.tensor(
        [[r["token_logprobs"][t] for t in label_ids.tolist()] for r in results],
        dtype=torch.float32,
    )
    return ids.gather(1, order), values, labels
