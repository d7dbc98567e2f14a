"""The one seam between the evaluation and an inference engine.

Everything the evaluation asks of a model goes through `Backend`: the decision step's
top-`k`, the log-probability of each label's whole token sequence, the engine's own label
scoring (vLLM's `/generative_scoring`), free generation and the output embeddings.
`evaluate`, `forward`, `selfconsistency` and `tune` never ask which engine they hold; only
`semsoft_eval.backend_factory` chooses an implementation, so a new engine is one module
implementing this protocol and one line there.

This module holds what every side shares (the protocol, its values, the engine names
`ENGINES`: `"transformers"` and `"vllm"`; `"hf"` is refused naming `"transformers"`) and
imports no backend: `backends` <- each engine's module <- `backend_factory`.
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
    "Prompt",
    "check_engine_args",
    "engine_name",
]

ENGINES = ("transformers", "vllm")

Prompt = tuple[str, bool]  # a formatted prompt text, and whether it holds special tokens


@dataclass
class DecisionStep:
    """The decision step of `N` prompts, as much of it as the methods need.

    `top_ids` / `top_values` are `[N, S]` (sorted, highest first) and
    `label_values` `[N, M]` for the `M` label token ids asked for. Values are raw
    logits (transformers) or log-probabilities (vLLM): they differ by one constant per
    row, which every method here is invariant to. `check` is `[N, L]`, the
    probabilities the engine's own adapter returned, to verify a rescoring.
    `hidden` is `[N, H]` float32, the last layer's hidden state at the decision step
    (what the output layer reads), where the engine gives it (transformers; vLLM with the
    worker extension that returns it, read back from the logits row), else None.
    """

    top_ids: Tensor
    top_values: Tensor
    label_values: Tensor
    check: Tensor
    vocab_size: int
    hidden: Tensor | None = None


@dataclass
class Generations:
    """`texts[i]`: the `n` texts generated for prompt `i`; `entropies[i][j]`: the
    raw next-token entropy (nats) at each step of text `j`'s first line, when kept."""

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
        """Top-`store_k` and the values of `token_ids` at the first generated token,
        through the engine's own Semantic Softmax adapter (observe mode)."""
        ...

    def sequence_logprobs(
        self, inputs: Sequence[Any], labels: LabelSet, *, batch_size: int = 8, progress: bool = True
    ) -> Tensor:
        """`[N, L]` log P(each label's whole answer token sequence | prompt)."""
        ...

    def label_token_logprobs(
        self, inputs: Sequence[Any], token_ids: Sequence[int], *, progress: bool = True
    ) -> Tensor:
        """`[N, M]` full-vocabulary log-probabilities of `token_ids` as the next token,
        read through the engine's own label scoring where it has one (vLLM's
        `/generative_scoring`); an engine without one refuses."""
        ...

    def generate(
        self,
        prompts: Sequence[Prompt],
        *,
        n: int,
        temperature: float,
        seed: int,
        max_tokens: int,
        stop: Sequence[str] = (),
        batch_size: int = 4,
        keep_entropy: bool = False,
        progress: bool | None = None,
    ) -> Generations:
        """`n` texts per formatted prompt (plain temperature sampling, greedy at 0).

        `batch_size` is the number of prompts per call where the engine is batched by
        hand (transformers); `keep_entropy` is refused where the engine cannot give it.
        """
        ...


def engine_name(value: Any, what: str = "backend") -> str:
    """The engine's name, checked: one of `ENGINES`; the old spelling `"hf"` is refused
    naming `"transformers"`, anything else naming the choices."""
    from semsoft_plugin.app.handles import check_backend

    if value is None or value not in ENGINES:
        check_backend(value)  # the old spelling: refused naming the new one, as Classifier does
        raise ValueError(f"{what}={value!r} must be one of {ENGINES}")
    return str(value)


def check_engine_args(engine: Any, engine_args: Mapping[str, Any] | None) -> str:
    """The engine's name; `engine_args` for an engine that reads none are refused."""
    engine = engine_name(engine)
    if engine_args and engine != "vllm":
        raise ValueError(f"engine_args {dict(engine_args)!r} apply only to backend='vllm'")
    return engine
