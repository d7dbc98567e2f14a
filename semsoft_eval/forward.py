"""One forward pass per item through the user code path, kept on disk for method sweeps.

`semsoft eval` and `semsoft tune` never score items with a second implementation: the
decision step comes from the engine's own adapter through a `semsoft_eval.backends.Backend`,
and every method is computed from the kept values with
[`semsoft_plugin.core.softmax.SemanticSoftmax`][semsoft_plugin.core.softmax.SemanticSoftmax].
What is kept (the top `store_k` values, every label token's) is lossless for every method
here, and one `Forward` serves transformers' logits and vLLM's log-probabilities alike:
why, in docs/evaluation.md ("The kept forward passes").

The cache is a safetensors file (never pickle) named by a hash of everything that
changes the logits: model directory, prompts, labels, `store_k`, the engine.
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

import torch
from torch import Tensor

from semsoft_eval.backends import Backend, engine_name
from semsoft_plugin.core.calibration import CONTENT_FREE
from semsoft_plugin.core.kept_scores import compress, label_token_ids
from semsoft_plugin.core.labels import LabelSet

__all__ = [
    "CONTENT_FREE",
    "Forward",
    "assemble",
    "cache_path",
    "collect",
    "compress",
    "label_token_ids",
]

# Bump when what is stored changes. 2: transformers logits from a float32 head.
_FORMAT = 2


@dataclass
class Forward:
    """Decision-step logits of N items (and of the content-free inputs), compressed.

    Attributes
    ----------
    top_ids, top_logits : Tensor
        `[N, S]` the S highest raw logits per item and their token ids
    label_ids : Tensor
        `[M]` answer and own-variant token ids of every label
    label_logits : Tensor
        `[N, M]` their raw logits
    cf_top_ids, cf_top_logits, cf_label_logits : Tensor
        The same for the content-free inputs
    vocab_size : int
        Width of the original logits rows
    semantic_check : Tensor
        `[N, L]` the `probs` classify returned (its own config), to
        verify that rescoring from the cache reproduces the adapter
    sequence_logprob : Tensor | None
        `[N, L]` log P(whole label sequence | prompt), or None
    seconds : float
        Wall time of the classify forward passes (all items)
    sequence_seconds : float
        Wall time of the extra sequence passes (0 if none)
    hidden : Tensor | None
        `[N, H]` float32 last-layer hidden state at the decision step (the
        `probe` method's features), or None: the engine gives none (vLLM's generate
        runner) or the cache predates it (`collect(hidden=True)` adds it)
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
    hidden: Tensor | None = None

    @property
    def n(self) -> int:
        return int(self.top_ids.shape[0])

    @property
    def store_k(self) -> int:
        return int(self.top_ids.shape[1])

    def logits(self, rows: slice | Tensor | None = None, *, content_free: bool = False) -> Tensor:
        """Rebuilt `[n, V]` float32 logits, `-inf` outside the stored tokens."""
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
        """The content-free inputs' passes as a `Forward` of their own."""
        return dataclasses.replace(
            self,
            top_ids=self.cf_top_ids,
            top_logits=self.cf_top_logits,
            label_logits=self.cf_label_logits,
            semantic_check=self.semantic_check[:0],
            sequence_logprob=None,
            hidden=None,
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
        stored: dict[str, Any] = {
            k: tensors.get(k)
            for k in cls.__dataclass_fields__
            if k not in ("vocab_size", "seconds", "sequence_seconds")
        }
        return cls(
            **stored,
            vocab_size=int(meta["vocab_size"]),
            seconds=float(meta["seconds"]),
            sequence_seconds=float(meta["sequence_seconds"]),
        )


def assemble(
    kept: tuple[Tensor, Tensor, Tensor],
    cf_kept: tuple[Tensor, Tensor, Tensor],
    label_ids: Tensor,
    check: Tensor,
    *,
    vocab_size: int,
    seconds: float,
    hidden: Tensor | None = None,
) -> Forward:
    """A `Forward` from the `(top_ids, top_values, label_values)` of the items
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
        hidden=hidden,
    )


def _timed_sequence(
    labels: LabelSet, wanted: bool, run: Callable[[], Tensor]
) -> tuple[Tensor | None, float]:
    if not (wanted and labels.multi_token_labels):
        return None, 0.0
    start = time.perf_counter()
    return run(), time.perf_counter() - start


def collect(
    backend: Backend,
    inputs: Sequence[Any],
    content_free: Sequence[Any],
    labels: LabelSet,
    *,
    store_k: int | None = None,
    batch_size: int = 8,
    sequence: bool = False,
    progress: bool = True,
    cache_file: Path | None = None,
    hidden: bool = False,
) -> Forward:
    """The decision step of the items and the content-free inputs on `backend`.

    `store_k` defaults to what the backend can keep (`backend.max_store_k()`). With
    `cache_file` an existing cache is read instead (and a new one written); a cache
    without the sequence log-probabilities is extended when `sequence` asks, and one
    without the decision step's hidden states (written before they were kept) when
    `hidden` asks and the backend gives them (the decision step is run again).
    """

    def sequence_pass() -> Tensor:
        return backend.sequence_logprobs(inputs, labels, batch_size=batch_size, progress=progress)

    if cache_file is not None and cache_file.is_file():
        forward = Forward.load(cache_file)
        if forward.sequence_logprob is None:
            seq, seconds = _timed_sequence(labels, sequence, sequence_pass)
            if seq is not None:
                forward.sequence_logprob, forward.sequence_seconds = seq, seconds
                forward.save(cache_file)
        if hidden and forward.hidden is None:
            again = backend.decision_step(
                inputs, labels, forward.label_ids.tolist(), store_k=forward.store_k,
                batch_size=batch_size, progress=progress,
            )  # fmt: skip
            if again.hidden is not None:
                forward.hidden = again.hidden
                forward.save(cache_file)
        return forward
    store_k = backend.max_store_k() if store_k is None else store_k
    label_ids = torch.tensor(label_token_ids(labels))
    common = {"store_k": store_k, "batch_size": batch_size}
    start = time.perf_counter()
    items = backend.decision_step(inputs, labels, label_ids.tolist(), progress=progress, **common)
    seconds = time.perf_counter() - start
    cf = backend.decision_step(content_free, labels, label_ids.tolist(), progress=False, **common)
    forward = assemble(
        (items.top_ids, items.top_values, items.label_values),
        (cf.top_ids, cf.top_values, cf.label_values),
        label_ids,
        items.check,
        vocab_size=items.vocab_size,
        seconds=seconds,
        hidden=items.hidden,
    )
    forward.sequence_logprob, forward.sequence_seconds = _timed_sequence(
        labels, sequence, sequence_pass
    )
    if cache_file is not None:
        forward.save(cache_file)
    return forward


def cache_key(**parts: Any) -> str:
    blob = json.dumps({**parts, "format": _FORMAT}, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:20]


def cache_path(
    cache_dir: Path,
    model_dir: Path,
    texts: Sequence[str],
    label_names: Sequence[str],
    template: Mapping[str, Any],
    store_k: int,
    backend: str = "transformers",
) -> Path:
    """Where the forward passes of this (model, items, labels, prompt, engine) are kept."""
    digest = hashlib.sha256("\x1f".join(texts).encode()).hexdigest()
    # transformers keys carry no engine, so caches written before the vLLM backend (and
    # read by benchmarks/choose_defaults.py) stay valid.
    backend = engine_name(backend)
    engine = {} if backend == "transformers" else {"backend": backend}
    key = cache_key(
        model=str(Path(model_dir).resolve()),
        texts=digest,
        labels=list(label_names),
        template=dict(template),
        store_k=store_k,
        **engine,
    )
    return Path(cache_dir) / f"{Path(model_dir).name}-{key}.safetensors"
