"""The one seam between the evaluation and an inference engine.

Everything the evaluation asks of a model goes through :class:`Backend`: the decision
step's top-``k`` (what every Semantic Softmax method and baseline is scored from), the
log-probability of each label's whole token sequence, free generation (self-consistency,
verbal confidence, the distillation recipe's sampling) and the output embeddings the
adapters score with. ``evaluate``, ``forward``, ``selfconsistency`` and ``tune`` hold a
backend and never ask which engine it is; only :func:`load_backend` and
:func:`as_backend` choose an implementation, so a new engine is one module implementing
this protocol and one line in each of them.

Engine names are ``"transformers"`` and ``"vllm"`` (:data:`ENGINES`); ``"hf"`` is
accepted as an alias for transformers (``semsoft classify --backend hf`` is documented).
Neither engine is imported here: :mod:`semsoft_eval.backend_transformers` and
:mod:`semsoft_eval.backend_vllm` are imported only when a backend of theirs is built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from torch import Tensor

if TYPE_CHECKING:
    from semsoft_plugin.core.labels import LabelSet
    from semsoft_plugin.core.tokens import OutputEmbeddings

__all__ = [
    "ENGINES",
    "Backend",
    "DecisionStep",
    "Generations",
    "as_backend",
    "check_engine_args",
    "engine_name",
    "load_backend",
]

ENGINES = ("transformers", "vllm")
_ALIASES = {"hf": "transformers"}

Prompt = tuple[str, bool]  # a formatted prompt text, and whether it holds special tokens


@dataclass
class DecisionStep:
    """The decision step of ``N`` prompts, as much of it as the methods need.

    ``top_ids`` / ``top_values`` are ``[N, S]`` (sorted, highest first) and
    ``label_values`` ``[N, M]`` for the ``M`` label token ids asked for. Values are raw
    logits (transformers) or log-probabilities (vLLM): they differ by one constant per
    row, which every method here is invariant to. ``check`` is ``[N, L]``, the
    probabilities the engine's own adapter returned, to verify a rescoring.
    """

    top_ids: Tensor
    top_values: Tensor
    label_values: Tensor
    check: Tensor
    vocab_size: int


@dataclass
class Generations:
    """``texts[i]``: the ``n`` texts generated for prompt ``i``; ``entropies[i][j]``: the
    raw next-token entropy (nats) at each step of text ``j``'s first line, when kept."""

    texts: list[list[str]]
    entropies: list[list[list[float]]] | None = None


@runtime_checkable
class Backend(Protocol):
    """What the evaluation needs from an engine (see the module docstring)."""

    name: str
    """``"transformers"`` or ``"vllm"``: for reports and cache keys, never for branching."""
    model: Any
    tokenizer: Any

    def embeddings(self) -> OutputEmbeddings:
        """The output embeddings this engine's adapter scores with."""
        ...

    def max_store_k(self) -> int:
        """How many top values per decision step this backend can keep."""
        ...

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
        """Top-``store_k`` and the values of ``token_ids`` at the first generated token,
        through the engine's own Semantic Softmax adapter (observe mode)."""
        ...

    def sequence_logprobs(
        self, inputs: Sequence[Any], labels: LabelSet, *, batch_size: int = 8, progress: bool = True
    ) -> Tensor:
        """``[N, L]`` log P(each label's whole answer token sequence | prompt)."""
        ...

    def generate(
        self,
        prompts: Sequence[Prompt],
        *,
        n: int,
        temperature: float,
        seed: int,
        max_new_tokens: int,
        stop: Sequence[str] = (),
        batch_size: int = 4,
        keep_entropy: bool = False,
        progress: bool | None = None,
    ) -> Generations:
        """``n`` texts per formatted prompt (plain temperature sampling, greedy at 0).

        ``batch_size`` is the number of prompts per call where the engine is batched by
        hand (transformers); ``keep_entropy`` is refused where the engine cannot give it.
        """
        ...


def engine_name(value: Any, what: str = "backend") -> str:
    """The engine's one spelling (``"hf"`` -> ``"transformers"``); anything else is refused."""
    name = _ALIASES.get(value, value) if isinstance(value, str) else value
    if name not in ENGINES:
        raise ValueError(f"{what}={value!r} must be one of {ENGINES} (or 'hf' for transformers)")
    return str(name)


def check_engine_args(engine: Any, engine_args: Mapping[str, Any] | None) -> str:
    """The engine's name; ``engine_args`` for an engine that reads none are refused."""
    engine = engine_name(engine)
    if engine_args and engine != "vllm":
        raise ValueError(f"engine_args {dict(engine_args)!r} apply only to backend='vllm'")
    return engine


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
    model : what :func:`semsoft_plugin.engines.models.resolve` takes ("default", a name, a dir)
    engine : ``"transformers"`` (or ``"hf"``) or ``"vllm"``
    seed : the vLLM engine's seed (its sampling is repeatable through it on CPU)
    engine_args : ``vllm.LLM`` arguments (e.g. ``{"tensor_parallel_size": 4}``); refused
        for transformers, where nothing would read them
    dtype : transformers weight dtype (vLLM: give ``engine_args={"dtype": ...}``)
    """
    from semsoft_plugin.engines import models

    engine = check_engine_args(engine, engine_args)
    model_dir = models.resolve(model)
    if engine == "vllm":
        from semsoft_eval.backend_vllm import VLLMBackend

        return VLLMBackend.load(model_dir, seed=seed, engine_args=engine_args)
    from semsoft_eval.backend_transformers import TransformersBackend

    return TransformersBackend(*models.load(str(model_dir), dtype=dtype))


def as_backend(model: Any, tokenizer: Any = None) -> Backend:
    """The backend of an already loaded model: a transformers causal LM with its
    tokenizer, a ``vllm.LLM`` (tokenizer optional), or a :class:`Backend` (returned as is).

    This is the one place that tells the engines apart by the object's type.
    """
    if isinstance(model, Backend):
        return model
    if type(model).__module__.split(".")[0] == "vllm":
        from semsoft_eval.backend_vllm import VLLMBackend

        return VLLMBackend(model, tokenizer)
    if tokenizer is None:
        raise ValueError(f"a {type(model).__name__} model needs its tokenizer")
    from semsoft_eval.backend_transformers import TransformersBackend

    return TransformersBackend(model, tokenizer)
