"""`EngineSettings`: how a [`Classifier`][semsoft_plugin.app.classifier.Classifier] runs its
model, as one value the user passes whole (`Classifier(engine=EngineSettings(...))`).

None of these changes a score: they trade speed, memory and precision of the computation, and
two of them apply to one engine only, which the classifier's check refuses elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from semsoft_plugin.core.value_params import ValueParams

__all__ = ["EngineSettings"]


@dataclass(frozen=True)
class EngineSettings(ValueParams):
    """How the engine runs: a frozen value with scikit-learn's `get_params`/`set_params`
    (`GridSearchCV` reaches a field as `engine__batch_size`).

    Parameters
    ----------
    batch_size : int
        Texts per forward pass (transformers; vLLM schedules its own).
    progress : bool
        Show the adapter's progress bar.
    exact_head : bool
        Transformers: the decision step's logits from a float32 head when the model is
        bf16/fp16, so texts do not tie on bf16's grid (a named vLLM model always does so).
    dtype : str
        A named transformers model's weights (`"auto"`: bf16 where the CPU has native bf16,
        else float32). A vLLM engine's dtype goes in `engine_args`.
    engine_args : Mapping[str, Any] | None
        A named vLLM model's `vllm.LLM` arguments, e.g. `{"tensor_parallel_size": 4}`.

    Examples
    --------
    >>> EngineSettings(batch_size=16).set_params(progress=True)
    EngineSettings(batch_size=16, progress=True, exact_head=True, dtype='auto', engine_args=None)
    >>> EngineSettings(batch_size=0)
    Traceback (most recent call last):
        ...
    ValueError: EngineSettings(batch_size=0): must be a positive int
    """

    batch_size: int = 8
    progress: bool = False
    exact_head: bool = True
    dtype: str = "auto"
    engine_args: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        size = self.batch_size
        if isinstance(size, bool) or not isinstance(size, int | np.integer) or size < 1:
            _refuse("batch_size", size, "must be a positive int")
        for name in ("progress", "exact_head"):  # "no" is truthy: never read a flag by truth
            if not isinstance(getattr(self, name), bool | np.bool_):
                _refuse(name, getattr(self, name), "must be True or False")
        if not isinstance(self.dtype, str):
            _refuse("dtype", self.dtype, "must be a torch dtype name or 'auto'")
        if self.engine_args is not None and not isinstance(self.engine_args, Mapping):
            _refuse("engine_args", self.engine_args, "must be a mapping or None")


def _refuse(name: str, value: Any, why: str) -> None:
    raise ValueError(f"EngineSettings({name}={value!r}): {why}")
