"""Output embeddings from a loaded model or straight from a checkpoint (safetensors).

The vLLM adapter gets a config, not the weights, so it reads the one tensor it needs
from the checkpoint files: `lm_head.weight`, or the input embedding when the model
ties its word embeddings. Only that tensor is read (safetensors memory-maps the
file); no pickle, no full model load.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from semsoft_plugin.core.tokens import OutputEmbeddings

__all__ = ["from_model", "from_checkpoint", "OUTPUT_TENSOR_NAMES", "TIED_TENSOR_NAMES"]

OUTPUT_TENSOR_NAMES = ("lm_head.weight", "model.lm_head.weight", "output.weight")
TIED_TENSOR_NAMES = (
    "model.embed_tokens.weight",
    "embed_tokens.weight",
    "transformer.wte.weight",
    "model.embeddings.word_embeddings.weight",
    "language_model.model.embed_tokens.weight",
    "model.language_model.embed_tokens.weight",
)


def from_model(model: Any, vocab_size: int | None = None) -> OutputEmbeddings:
    """The lm_head weight of a loaded transformers model, without copying it."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    weight = getattr(head, "weight", None)
    if not isinstance(weight, torch.Tensor):
        raise ValueError(f"{type(model).__name__} exposes no output embedding weight")
    return OutputEmbeddings(weight, vocab_size=vocab_size)


def _tied(config: dict[str, Any]) -> bool:
    if "tie_word_embeddings" in config:
        return bool(config["tie_word_embeddings"])
    text_config = config.get("text_config")
    if isinstance(text_config, dict) and "tie_word_embeddings" in text_config:
        return bool(text_config["tie_word_embeddings"])
    return False


def from_checkpoint(
    path: str | Path,
    *,
    vocab_size: int | None = None,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
) -> OutputEmbeddings:
    """Read the output embeddings of a safetensors checkpoint directory.

    Parameters
    ----------
    path : str | Path
        Checkpoint directory (`config.json` and `*.safetensors`)
    vocab_size : int | None
        Number of real tokens; rows past it (padding) are ignored
    dtype : torch.dtype | None
        Cast the matrix to this dtype (default: as stored)
    device : str | torch.device
        Where the matrix lives
    """
    from safetensors import safe_open

    root = Path(path)
    config_file = root / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{root} is not a checkpoint directory (no config.json)")
    config = json.loads(config_file.read_text())
    index_file = root / "model.safetensors.index.json"
    if index_file.is_file():
        weight_map: dict[str, str] = json.loads(index_file.read_text())["weight_map"]
    else:
        files = sorted(root.glob("*.safetensors"))
        if not files:
            raise ValueError(f"{root} holds no *.safetensors file")
        weight_map = {}
        for file in files:
            with safe_open(str(file), framework="pt") as handle:
                for key in handle.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    weight_map[key] = file.name
    names = list(OUTPUT_TENSOR_NAMES)
    if _tied(config) or not any(n in weight_map for n in names):
        names = [n for n in names if n in weight_map] + list(TIED_TENSOR_NAMES)
    for name in names:
        if name in weight_map:
            with safe_open(
                str(root / weight_map[name]), framework="pt", device=str(device)
            ) as handle:
                weight = handle.get_tensor(name)
            break
    else:
        raise ValueError(
            f"{root}: no output embedding tensor found (looked for {', '.join(names)})"
        )
    if dtype is not None:
        weight = weight.to(dtype)
    if vocab_size is None:
        vocab_size = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")
        vocab_size = min(int(vocab_size), weight.shape[0]) if vocab_size else None
    return OutputEmbeddings(weight, vocab_size=vocab_size)
