"""Choosing and building a `semsoft_eval.backends.Backend`: the registry of engines.

`load_backend` builds one from a model name on a named engine, `as_backend`
wraps an already loaded model. This is the only module that knows the engines'
implementations, so it sits on top: it imports `semsoft_eval.backend_transformers`
and `semsoft_eval.backend_vllm`, and neither of them (nor
`semsoft_eval.backends`) imports it. Neither engine is imported here: those modules
import transformers and vLLM only when a method of theirs runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from semsoft_eval.backend_transformers import TransformersBackend
from semsoft_eval.backend_vllm import VLLMBackend
from semsoft_eval.backends import Backend, check_engine_args

__all__ = ["as_backend", "load_backend"]


def load_backend(
    model: str,
    engine: str = "transformers",
    *,
    seed: int = 0,
    engine_args: Mapping[str, Any] | None = None,
    dtype: str = "auto",
) -> Backend:
    """A backend for a model name or checkpoint directory on one engine.

    Parameters
    ----------
    model : str
        What `semsoft_plugin.engines.models.resolve` takes ("default", a name, a dir)
    engine : str
        `"transformers"` (or `"hf"`) or `"vllm"`
    seed : int
        The vLLM engine's seed (its sampling is repeatable through it on CPU)
    engine_args : Mapping[str, Any] | None
        `vllm.LLM` arguments (e.g. `{"tensor_parallel_size": 4}`); refused
        for transformers, where nothing would read them
    dtype : str
        Transformers weight dtype (vLLM: give `engine_args={"dtype": ...}`)
    """
    from semsoft_plugin.engines import models

    engine = check_engine_args(engine, engine_args)
    model_dir = models.resolve(model)
    if engine == "vllm":
        return VLLMBackend.load(model_dir, seed=seed, engine_args=engine_args)
    return TransformersBackend(*models.load(str(model_dir), dtype=dtype))


def as_backend(model: Any, tokenizer: Any = None) -> Backend:
    """The backend of an already loaded model: a transformers causal LM with its
    tokenizer, a `vllm.LLM` (tokenizer optional), or a `Backend` (returned as is).

    This is the one place that tells the engines apart by the object's type.
    """
    if isinstance(model, Backend):
        return model
    if type(model).__module__.split(".")[0] == "vllm":
        return VLLMBackend(model, tokenizer)
    if tokenizer is None:
        raise ValueError(f"a {type(model).__name__} model needs its tokenizer")
    return TransformersBackend(model, tokenizer)
