"""The identity of a run that applies a fit (`run_identity`): its labels, its prompt and
its model's output layer, found from a model name, a checkpoint folder, a loaded transformers
model or a `vllm.LLM`. Here, with the engines, because it resolves model names and reads
loaded engines; the identity itself and its checks are the saved fit's
(`semsoft_plugin.fit.fit_file.FitIdentity`).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from semsoft_plugin.engines import models
from semsoft_plugin.fit.fit_file import FitIdentity, output_layer_sha256, output_layer_width

__all__ = ["model_checkpoint", "run_identity"]


def _loaded_layer_width(model: Any) -> int | None:
    layer = getattr(model, "get_output_embeddings", lambda: None)()
    weight: Any = getattr(layer, "weight", None)
    return int(weight.shape[1]) if getattr(weight, "ndim", 0) == 2 else None


def model_checkpoint(model: Any) -> Path | None:
    """The checkpoint folder a loaded model was read from, or None when it cannot be told.

    Parameters
    ----------
    model : Any
        A transformers model or a `vllm.LLM`.

    Returns
    -------
    Path or None
        The folder, when the model names one that holds safetensors weights.
    """
    engine = getattr(getattr(model, "llm_engine", None), "model_config", None)
    name = getattr(engine, "model", None) or getattr(model, "name_or_path", None)
    name = name or getattr(getattr(model, "config", None), "_name_or_path", None)
    if name and Path(str(name)).is_dir() and any(Path(str(name)).glob("*.safetensors")):
        return Path(str(name))
    return None


def _loaded_layer_sha256(model: Any) -> str | None:
    """sha256 of a loaded transformers model's output layer as it is in memory (its
    dtype named), for a model given loaded whose checkpoint folder cannot be found."""
    import torch

    layer = getattr(model, "get_output_embeddings", lambda: None)()
    weight = getattr(layer, "weight", None)
    if not isinstance(weight, torch.Tensor):
        return None
    tensor = weight.detach().cpu().contiguous()
    digest = hashlib.sha256(json.dumps(["loaded", str(tensor.dtype), list(tensor.shape)]).encode())
    digest.update(tensor.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def run_identity(
    labels: Any, prompt: Any, model: Any, *, allow_download: bool = False
) -> FitIdentity:
    """The identity of a run that applies a fit: its labels, prompt and model.

    Parameters
    ----------
    labels : sequence of str
        The labels in the prompt's order.
    prompt : PromptTemplate
        The prompt template.
    model : Any
        A model name or checkpoint directory, a loaded transformers model or a
        `vllm.LLM`.
    allow_download : bool
        Whether a known model name not yet cached may be fetched to find its
        checkpoint (the command line, which loads it next anyway).

    Returns
    -------
    FitIdentity
        What `FitIdentity.check_run` compares a fit with.

    Raises
    ------
    ValueError
        When the model's output layer cannot be found.
    """
    width: int | None
    if isinstance(model, str | os.PathLike):
        resolved = models.resolve(str(model), allow_download=allow_download)
        layer, width = output_layer_sha256(resolved), output_layer_width(resolved)
    else:
        folder = model_checkpoint(model)
        found = output_layer_sha256(folder) if folder is not None else _loaded_layer_sha256(model)
        if found is None:
            raise ValueError(
                f"the output layer of the {type(model).__name__} given cannot be found, so a "
                "fit cannot be tied to it: load the model by name or checkpoint folder"
            )
        layer = found
        width = output_layer_width(folder) if folder is not None else _loaded_layer_width(model)
    return FitIdentity(tuple(labels), dict(prompt.to_dict()), layer, width)
