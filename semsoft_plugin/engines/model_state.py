"""Digests of what a model's forward pass and a tokenizer's prompts depend on besides their
input (`module_state`, `tokenizer_state`): kept passes are read back only while both are
unchanged, so weights updated in place, a PEFT adapter switched, a hook added or a chat
template edited are seen. With the engines: a vLLM worker digests its own model with it.
"""

from __future__ import annotations

import hashlib
import itertools
from typing import Any

import torch
from torch import Tensor

__all__ = ["module_state", "tokenizer_state"]


def _word_sum(tensor: Tensor) -> int:
    """The tensor's bytes summed as 64-bit words (two's complement, wrapping): any change
    of its bytes changes it, except changes that cancel word for word. One pass over the
    memory, several times cheaper than a cryptographic hash."""
    raw = tensor.detach().reshape(-1).view(torch.uint8)
    whole = raw.numel() // 8 * 8
    total = int(raw[:whole].view(torch.int64).sum()) if whole else 0
    return total + int(raw[whole:].to(torch.int64).sum())


# The attributes of a PEFT tuner layer (`BaseTunerLayer`) that decide what its forward
# pass adds to the base layer without changing a weight.
_ADAPTER_SWITCHES = ("disable_adapters", "active_adapters", "merged_adapters", "scaling")


def module_state(model: Any) -> str:
    """A digest of what a torch module's forward pass reads besides its input: each
    parameter and buffer (name, dtype, shape and `_word_sum` of its bytes), each
    PEFT tuner layer's switches (`_ADAPTER_SWITCHES`) and the hooks registered on each
    submodule. Equal digests mean the same computation, as far as a pass can tell
    without running it (a weight on the `meta` device is named, not read)."""
    digest = hashlib.blake2b(digest_size=16)
    seen: set[int] = set()
    tensors = itertools.chain(
        model.named_parameters(remove_duplicate=False), model.named_buffers(remove_duplicate=False)
    )
    for name, tensor in tensors:
        if tensor is None or id(tensor) in seen:
            continue
        seen.add(id(tensor))
        words = "meta" if tensor.device.type == "meta" else _word_sum(tensor)
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|{words};".encode())
    for name, module in model.named_modules():
        switches = [
            repr(sorted(v.items()) if isinstance(v, dict) else v)
            for attr in _ADAPTER_SWITCHES
            if hasattr(module, "merged_adapters") and (v := getattr(module, attr, None)) is not None
        ]
        hooks = [
            tuple(getattr(module, kind, {}))
            for kind in ("_forward_hooks", "_forward_pre_hooks")
        ]
        if switches or any(hooks):
            digest.update(f"{name}|{switches}|{hooks};".encode())
    return digest.hexdigest()


def tokenizer_state(tokenizer: Any) -> str:
    """A digest of what a tokenizer does to a prompt: its class, chat template,
    vocabulary size, special tokens, and padding and truncation sides (an edited
    `chat_template` changes every prompt)."""
    parts = [
        type(tokenizer).__qualname__,
        getattr(tokenizer, "chat_template", None),
        len(tokenizer) if hasattr(tokenizer, "__len__") else None,
        getattr(tokenizer, "all_special_tokens", None),
        getattr(tokenizer, "padding_side", None),
        getattr(tokenizer, "truncation_side", None),
        getattr(tokenizer, "name_or_path", None),
    ]
    return hashlib.blake2b(repr(parts).encode(), digest_size=16).hexdigest()
