"""The process-wide cache of kept forward passes: each text scored once.

A pass at the decision step depends on no Semantic Softmax setting (`semantic_weight`,
`vote`, `tau`, `score_temperature`) nor on a fitted correction: those are applied to what
the pass *keeps* (`KeptPass`: the top `k` raw scores, every label token's, the hidden
state). So every [`Classifier`][semsoft_plugin.app.classifier.Classifier] keeps its passes
here, shared by the process (so by every clone), and a text scored again with what its
pass depends on unchanged is read back, never run again. That is its key (`pass_key`):
the model and its state now (`module_state`), the tokenizer and its state now
(`tokenizer_state`), the engine and its head, the label tokens, `k` and the whole prompt.
A read-back pass is the same numbers as a computed one, so the cache never changes a
score. It is bounded (`DEFAULT_MAX_BYTES`, least recently used dropped; `set_max_bytes`).
What the key holds, what it costs and why the batch is not in it: docs/few-labels.md
("With scikit-learn").
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

__all__ = [
    "DEFAULT_MAX_BYTES",
    "PASSES",
    "KeptPass",
    "PassCache",
    "model_token",
    "pass_key",
    "set_max_bytes",
]

DEFAULT_MAX_BYTES = 256 * 2**20


@dataclass(frozen=True)
class KeptPass:
    """One text's decision step, as kept.

    Attributes
    ----------
    top_ids : Tensor
        `[S]` the token ids of the `S` highest raw scores, highest first.
    top_logits : Tensor
        `[S]` those scores (logits, or vLLM's log-probabilities).
    label_logits : Tensor
        `[M]` the raw scores of every label token (`label_token_ids` order).
    hidden : Tensor | None
        `[H]` the output layer's input at the decision step, where it was read.
    """

    top_ids: Tensor
    top_logits: Tensor
    label_logits: Tensor
    hidden: Tensor | None = None

    @property
    def nbytes(self) -> int:
        """The bytes its tensors hold."""
        parts = (self.top_ids, self.top_logits, self.label_logits, self.hidden)
        return sum(t.element_size() * t.nelement() for t in parts if t is not None)


class PassCache:
    """A thread-safe LRU of kept passes bounded by their bytes.

    Parameters
    ----------
    max_bytes : int
        The bound; the least recently used passes are dropped beyond it (0: keep none).

    Attributes
    ----------
    hits : int
        Passes read back since the last `clear`.
    misses : int
        Passes asked for and not found since the last `clear`.
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = int(max_bytes)
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[Hashable, KeptPass] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """The bytes held now."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable, *, hidden: bool = False) -> KeptPass | None:
        """The pass kept under `key` (with `hidden`: only one that kept the hidden
        state), marked as just used; `None` if there is none."""
        with self._lock:
            found = self._entries.get(key)
            if found is None or (hidden and found.hidden is None):
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return found

    def put(self, key: Hashable, kept: KeptPass) -> None:
        """Keep `kept` under `key`, dropping the least recently used beyond the bound
        (a pass larger than the bound is not kept)."""
        size = kept.nbytes
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            if size > self.max_bytes:
                return
            self._entries[key] = kept
            self._bytes += size
            self._shrink()

    def drop_model(self, token: int) -> None:
        """Drop every pass of the model `model_token` numbered `token`."""
        with self._lock:
            for key in [k for k in self._entries if isinstance(k, tuple) and k[0] == token]:
                self._bytes -= self._entries.pop(key).nbytes

    def clear(self) -> None:
        """Drop every pass and reset the counts."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0
            self.hits = self.misses = 0

    def resize(self, max_bytes: int) -> int:
        """Bound the cache to `max_bytes` (0 keeps nothing), dropping the least recently
        used passes beyond it; returns the old bound."""
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"max_bytes={max_bytes!r} must be an int >= 0")
        with self._lock:
            old, self.max_bytes = self.max_bytes, max_bytes
            self._shrink()
        return old

    def _shrink(self) -> None:
        while self._bytes > self.max_bytes and self._entries:
            self._bytes -= self._entries.popitem(last=False)[1].nbytes


PASSES = PassCache()

_TOKENS: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_STRONG: dict[int, int] = {}  # objects that cannot be weakly referenced: by id, kept alive
_KEEP: list[Any] = []
_COUNTER = itertools.count(1)
_TOKEN_LOCK = threading.Lock()


def model_token(obj: Any) -> int:
    """A number naming `obj` (a loaded model or tokenizer) for as long as it lives,
    never reused by another object (an `id` can be); when it is freed, its passes are
    dropped from `PASSES`."""
    with _TOKEN_LOCK:
        try:
            found = _TOKENS.get(obj)
        except TypeError:  # not weakly referenceable: kept alive, numbered by id
            if id(obj) not in _STRONG:
                _STRONG[id(obj)] = next(_COUNTER)
                _KEEP.append(obj)
            return _STRONG[id(obj)]
        if found is None:
            found = next(_COUNTER)
            _TOKENS[obj] = found
            weakref.finalize(obj, PASSES.drop_model, found)
        return found


def pass_key(
    model: Any,
    tokenizer: Any,
    engine: tuple[Hashable, ...],
    labels: tuple[int, ...],
    k: int,
    state: str,
) -> tuple[Hashable, ...]:
    """The part of a pass's key every text of one scorer shares (the text's prompt is
    added per text).

    Parameters
    ----------
    model : Any
        The loaded model (by identity) whose weights run the pass.
    tokenizer : Any
        Its tokenizer (by identity).
    engine : tuple[Hashable, ...]
        The engine and its settings that shape the scores (name, weights' dtype, head).
    labels : tuple[int, ...]
        The label tokens kept (`kept_scores.label_token_ids`).
    k : int
        The top scores kept.
    state : str
        The model's and the tokenizer's state now (`module_state`, `tokenizer_state`):
        a model or tokenizer changed in place gets new keys.
    """
    return (model_token(model), model_token(tokenizer), engine, labels, int(k), state)


def set_max_bytes(max_bytes: int) -> int:
    """Bound `PASSES` to `max_bytes` (0 keeps nothing); returns the old bound."""
    return PASSES.resize(max_bytes)
