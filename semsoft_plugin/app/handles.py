"""The model behind a [`Classifier`][semsoft_plugin.app.classifier.Classifier]: loaded once per
process and shared by every copy of the classifier.

scikit-learn copies an estimator often (`clone` for every `GridSearchCV` candidate and
fold, a `Pipeline`'s steps), and a copy must not copy the weights. So the model is a
parameter that copies cheaply: **a name** (`"default"`, a checkpoint directory) is loaded
on first use and kept here, keyed by what was loaded (backend, resolved path, dtype or
engine arguments), for the life of the process, and every classifier naming it shares one
set of weights (a worker process, `n_jobs > 1`, loads its own once); **a loaded object**
(a transformers model, a `vllm.LLM`) is passed to copies by reference
(`Classifier.__sklearn_clone__`). `forget` drops the models loaded by name.
See docs/few-labels.md ("With scikit-learn").
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BACKENDS",
    "Loaded",
    "check_backend",
    "engine_of",
    "forget",
    "hidden_refusal",
    "is_vllm",
    "loaded",
]

BACKENDS = ("transformers", "vllm")
# Old spellings of an engine, refused naming the new one.
_RENAMED_BACKENDS = {"hf": "transformers"}

_LOCK = threading.Lock()  # one load at a time; a second caller waits and shares it
_LOADED: dict[tuple[str, str, str], Loaded] = {}


@dataclass(frozen=True)
class Loaded:
    """A model ready to score: the model, its tokenizer and the engine it runs on."""

    model: Any
    tokenizer: Any
    backend: str

    def context_length(self) -> int | None:
        """Tokens the model attends to: the vLLM engine's `max_model_len`, else the
        transformers config's `max_position_embeddings` (`None` if it has none)."""
        if self.backend == "vllm":
            return int(self.model.llm_engine.model_config.max_model_len)
        n = getattr(getattr(self.model, "config", None), "max_position_embeddings", None)
        return int(n) if isinstance(n, int) and n > 0 else None

    def state(self) -> str:
        """The model's and the tokenizer's state now, for the keys of kept passes
        (`model_state.module_state`, `model_state.tokenizer_state`). A vLLM engine's
        weights are read in its worker (the worker extension's `semsoft_weights_state`);
        an engine without it gets a state never seen before, so its passes are never
        read back."""
        from semsoft_plugin.engines.model_state import module_state, tokenizer_state

        if self.backend == "vllm":
            from semsoft_plugin.engines.vllm.reader_tables import weights_state

            weights = weights_state(self.model) or secrets.token_hex(16)
        else:
            weights = module_state(self.model)
        return f"{weights}:{tokenizer_state(self.tokenizer)}"

    def embeddings(self) -> Any:
        """The model's output embeddings (the rows Semantic Softmax compares)."""
        if self.backend == "vllm":
            from semsoft_plugin.engines.scoring import output_embeddings

            return output_embeddings(self.model)
        from semsoft_plugin.core.embeddings import from_model

        return from_model(self.model)


def is_vllm(model: Any) -> bool:
    """Whether `model` is a `vllm.LLM` (told by its module, without importing vLLM)."""
    return type(model).__module__.split(".")[0] == "vllm" and hasattr(model, "llm_engine")


def check_backend(backend: Any) -> None:
    """`ValueError` unless `backend` is `None` or one of `BACKENDS`; an old
    spelling (`"hf"`) is refused naming the new one (`"transformers"`).

    Parameters
    ----------
    backend : Any
        The `backend` parameter.
    """
    if backend in _RENAMED_BACKENDS:
        raise ValueError(
            f"backend={backend!r} is now spelled {_RENAMED_BACKENDS[backend]!r} (the "
            "transformers engine has one name)"
        )
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} must be one of {BACKENDS} or None")


def hidden_refusal(clf: Any) -> str | None:
    """Why the classifier's engine cannot return the decision step's hidden state (a
    `vllm.LLM` given without the worker extension that returns it), or None (transformers,
    or an engine built here by name, which has it)."""
    if not is_vllm(clf.model):
        return None
    from semsoft_plugin.engines.vllm.reader_tables import hidden_refusal as refusal

    return refusal(clf.model)


def engine_of(clf: Any) -> str:
    """`"vllm"` or `"transformers"`: the engine a classifier's `model` and
    `backend` name, told without loading anything (so a setting the engine cannot
    honour fails first)."""
    check_backend(clf.backend)
    return "vllm" if clf.backend == "vllm" or is_vllm(clf.model) else "transformers"


def check_engine_args(
    model: Any, backend: str | None, dtype: str, engine_args: Mapping[str, Any] | None
) -> None:
    """`ValueError` where `dtype` or `engine_args` would be ignored: `engine_args` build a
    vLLM engine named here, `dtype` loads a transformers model named here, and a loaded
    model has its own (what `Classifier` checks before loading, and `loaded` as it loads)."""
    if not isinstance(model, str | os.PathLike):
        if engine_args or dtype != "auto":
            raise ValueError(
                "engine_args and dtype apply to a model loaded by name, not to the loaded "
                f"{type(model).__name__} given"
            )
        return
    if engine_args and backend != "vllm":
        raise ValueError(f"engine_args {dict(engine_args)!r} apply only to backend='vllm'")
    if backend == "vllm" and dtype != "auto":
        raise ValueError(f"dtype={dtype!r}: give a vLLM engine's dtype in engine_args")


def loaded(
    model: Any,
    tokenizer: Any,
    *,
    backend: str | None,
    dtype: str,
    engine_args: Mapping[str, Any] | None,
    k: int,
) -> Loaded:
    """The model a classifier's parameters name, loaded (once per process) or as given.

    Parameters
    ----------
    model : Any
        A name or path (`str` / `os.PathLike`), or a loaded transformers model
        or `vllm.LLM`
    tokenizer : Any
        The loaded model's tokenizer; `None` for a name or a `vllm.LLM`
    backend : str | None
        `"transformers"`, `"vllm"`, or `None`: the loaded model's own,
        `"transformers"` for a name
    dtype : str
        Transformers weights of a named model (`"auto"`: `models.default_dtype()`)
    engine_args : Mapping[str, Any] | None
        A named model's `vllm.LLM` arguments
    k : int
        The kept top-k: a vLLM engine built here gets `max_logprobs = k`
    """
    check_backend(backend)
    if isinstance(model, str | os.PathLike):
        if tokenizer is not None:
            raise ValueError(
                f"tokenizer={type(tokenizer).__name__} is given with the model named "
                f"{str(model)!r}, which loads its own: give a loaded model with it, or no tokenizer"
            )
        check_engine_args(model, backend, dtype, engine_args)
        return _by_name(str(model), backend or "transformers", dtype, dict(engine_args or {}), k)
    found = "vllm" if is_vllm(model) else "transformers"
    if backend is not None and backend != found:
        raise ValueError(
            f"backend={backend!r}, but the model is a {type(model).__name__} ({found})"
        )
    check_engine_args(model, backend, dtype, engine_args)
    if tokenizer is None:
        if found != "vllm":
            raise ValueError("tokenizer is None: give the model's tokenizer")
        tokenizer = model.get_tokenizer()
    return Loaded(model, tokenizer, found)


def _by_name(name: str, backend: str, dtype: str, engine_args: dict[str, Any], k: int) -> Loaded:
    from semsoft_plugin.engines import models

    path = str(models.resolve(name))
    if backend == "transformers":
        setting = models.default_dtype() if dtype == "auto" else dtype
    else:
        engine_args = {"max_logprobs": k, **engine_args}
        # The decision step's logits from a float32 head (vLLM's own option): in bf16 they
        # fall on a coarse grid, so different texts tie and scores move with the batch.
        overrides = dict(engine_args.get("hf_overrides") or {})
        engine_args["hf_overrides"] = {"head_dtype": "float32", **overrides}
        setting = json.dumps(engine_args, sort_keys=True, default=repr)
    key = (backend, path, setting)
    with _LOCK:
        if key not in _LOADED:
            _LOADED[key] = _load(path, backend, setting, engine_args)
        return _LOADED[key]


def _load(path: str, backend: str, dtype: str, engine_args: dict[str, Any]) -> Loaded:
    if backend == "transformers":
        from semsoft_plugin.engines import models

        model, tokenizer = models.load(path, dtype=dtype)
        return Loaded(model, tokenizer, "transformers")
    from vllm import LLM

    from semsoft_plugin.engines.vllm.params import ENTRY_POINT
    from semsoft_plugin.engines.vllm.reader_tables import EXTENSION

    # If the entry point is installed too, the second copy of the processor stands down.
    # The worker extension returns the hidden states the processor reads back from the
    # logits rows (the probe): the one channel out of the engine.
    engine_args = {"worker_extension_cls": EXTENSION, **engine_args}
    llm = LLM(path, logits_processors=[ENTRY_POINT], **engine_args)
    return Loaded(llm, llm.get_tokenizer(), "vllm")


def forget() -> int:
    """Drop every model loaded by name (classifiers still holding one keep it); how many."""
    with _LOCK:
        count = len(_LOADED)
        _LOADED.clear()
    return count
