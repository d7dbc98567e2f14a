"""The decision step's hidden state on transformers: the output layer's input at the
last position, read by a forward pre-hook during the adapter's own `generate` call.

A probe on it ("hidden calibration", Cho et al., NAACL 2025) separates labels the label
logits confuse; reading it here costs no extra pass. It is `output_hidden_states=True`'s
last entry at the last position (transformers applies the final norm before storing it).
vLLM's generate runner returns no hidden states; there the processor reads the same state
back from the logits row (`h = W⁺ z`, `classify_vllm(hidden=True)`).
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch import Tensor

__all__ = ["HiddenAtDecision"]


class HiddenAtDecision:
    """Within the block, the output layer's input at the last position of each call
    (with `max_tokens=1`, one call per batch: the decision step)."""

    def __init__(self, model: Any) -> None:
        self.head = (
            model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        )
        self.calls: list[Tensor] = []
        self._handle: Any = None

    def __enter__(self) -> HiddenAtDecision:
        if self.head is not None:
            owner = threading.get_ident()

            def keep(module: Any, args: tuple[Any, ...]) -> None:
                # A hook sees every thread's forward: keep only this block's thread's, so
                # two concurrent generate calls on one model do not read each other's rows.
                if threading.get_ident() == owner:
                    self.calls.append(args[0][:, -1].detach().to(torch.float32).cpu())

            self._handle = self.head.register_forward_pre_hook(keep)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            self._handle.remove()

    def rows(self, tokenizer: Any, inputs: list[Any], batch_size: int) -> Tensor | None:
        """`[N, H]` in input order: `classify` batches by
        [`padding_batches`][semsoft_plugin.engines.prompting.padding_batches] of the formatted prompts, so the
        same call says which input each captured row is; a mismatch is refused."""
        from semsoft_plugin.engines.prompting import format_prompt, padding_batches

        if self.head is None:
            return None
        texts = [format_prompt(tokenizer, item)[0] for item in inputs]
        batches = padding_batches([len(text) for text in texts], batch_size)
        sizes = [len(c) for c in self.calls]
        if sizes != [len(b) for b in batches]:
            raise ValueError(
                f"the output layer ran on batches of {sizes[:8]}, not classify's "
                f"{[len(b) for b in batches][:8]}: the decision step's hidden states cannot be "
                "matched to the inputs"
            )
        out = torch.empty((len(inputs), self.calls[0].shape[-1]) if self.calls else (0, 0))
        for batch, rows in zip(batches, self.calls, strict=True):
            out[batch] = rows
        return out
