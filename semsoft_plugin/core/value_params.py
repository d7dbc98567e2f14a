"""scikit-learn's parameter protocol for a frozen settings value (`SemsoftConfig`,
`FitPolicy`, `EngineSettings`), so `GridSearchCV` reaches a field as `config__k`.

A frozen value is never changed in place: `set_params` returns a copy, which the
classifier's own `set_params` stores, and `clone` keeps the same object.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Self

__all__ = ["ValueParams"]


class ValueParams:
    """`get_params`/`set_params`/`__sklearn_clone__` for a frozen dataclass."""

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The fields by name (`deep` is scikit-learn's; a value nests nothing)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    def set_params(self, **params: Any) -> Self:
        """A copy with these fields replaced, an unknown one refused by name."""
        names = {f.name for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        unknown = sorted(set(params) - names)
        if unknown:
            raise ValueError(f"{type(self).__name__} has no field {unknown[0]!r}")
        return dataclasses.replace(self, **params)  # type: ignore[type-var]

    def __sklearn_clone__(self) -> Self:
        return self
