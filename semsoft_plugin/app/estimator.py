"""The scikit-learn estimator protocol, written out so that scikit-learn stays optional.

scikit-learn is an optional dependency (the ``eval`` extra) and ``import semsoft_plugin``
needs torch only, so :class:`~semsoft_plugin.app.classifier.Classifier` cannot inherit
``sklearn.base.BaseEstimator`` (importing it imports scikit-learn, about a second, and fails
without it). What scikit-learn asks of an estimator is a protocol, and this mixin is it:

* ``get_params`` / ``set_params``: the constructor's arguments, read from its signature
  and stored unchanged, as ``BaseEstimator`` does (``GridSearchCV``, ``Pipeline``'s
  ``step__param``);
* ``__sklearn_clone__`` (scikit-learn >= 1.3 calls it from ``clone``): a new, unfitted
  estimator with the same parameters, each deep-copied except those named in
  ``_shared_params``, which are passed by reference. ``clone`` would otherwise deep-copy
  every parameter that is not an estimator, a loaded model's weights included;
* derived state (a loaded model, a built label set) lives in one private cache,
  ``_runtime``, that is dropped when a parameter is assigned, and is neither pickled nor
  cloned: a copy rebuilds it from its parameters.

The tags (``__sklearn_tags__``) are the estimator's own, since only it knows what it is.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

__all__ = ["EstimatorProtocol"]

_REPR_WIDTH = 60  # a longer parameter repr (a loaded model) is shown as <its type>


class EstimatorProtocol:
    """``get_params``, ``set_params``, ``clone`` and ``repr`` as scikit-learn's
    ``BaseEstimator`` defines them, without importing scikit-learn."""

    # Parameters passed by reference to a clone instead of deep-copied (loaded models).
    _shared_params: tuple[str, ...] = ()

    @classmethod
    def _get_param_names(cls) -> list[str]:
        """The constructor's parameter names, sorted (as ``BaseEstimator``'s)."""
        skip = (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
        parameters = inspect.signature(cls.__init__).parameters.values()
        return sorted(p.name for p in parameters if p.name != "self" and p.kind not in skip)

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The estimator's parameters by name (with ``deep``, also those of parameters
        that are estimators themselves, as ``name__param``)."""
        out: dict[str, Any] = {}
        for key in self._get_param_names():
            value = getattr(self, key)
            if deep and hasattr(value, "get_params") and not isinstance(value, type):
                out.update((f"{key}__{k}", v) for k, v in value.get_params().items())
            out[key] = value
        return out

    def set_params(self, **params: Any) -> Any:
        """Set parameters by name (``name__param`` reaches into an estimator parameter);
        returns ``self``. Values are checked where they are used (``fit``, ``predict``),
        as scikit-learn asks: ``ValueError`` for an unknown name only."""
        valid = self.get_params(deep=True)
        nested: dict[str, dict[str, Any]] = {}
        for name, value in params.items():
            key, delim, sub = name.partition("__")
            if key not in valid:
                raise ValueError(
                    f"{name!r} is not a parameter of {type(self).__name__}; its parameters: "
                    f"{self._get_param_names()}"
                )
            if delim:
                nested.setdefault(key, {})[sub] = value
            else:
                setattr(self, key, value)
                valid[key] = value
        for key, sub_params in nested.items():
            valid[key].set_params(**sub_params)
        return self

    def __sklearn_clone__(self) -> Any:
        """A new unfitted estimator with a copy of each parameter; ``_shared_params`` (the
        loaded model) are the same objects, so a clone costs no copy of the weights."""
        params = self.get_params(deep=False)
        shared = {name: params.pop(name) for name in self._shared_params}
        return type(self)(**shared, **copy.deepcopy(params))

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if not name.startswith("_") and not name.endswith("_"):
            # a parameter changed: what was derived from the parameters is stale
            self.__dict__.pop("_runtime", None)

    def _cache(self) -> dict[Any, Any]:
        """The private cache of derived state (dropped when a parameter is assigned)."""
        return self.__dict__.setdefault("_runtime", {})

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_runtime", None)  # a loaded model is rebuilt, not pickled
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        """``Name(param=value, ...)`` for the parameters that differ from the defaults."""
        defaults = inspect.signature(type(self).__init__).parameters
        shown = []
        for name in sorted(self._get_param_names(), key=list(defaults).index):
            value = getattr(self, name)
            default = defaults[name].default
            if default is not inspect.Parameter.empty and _same(value, default):
                continue
            text = repr(value)
            if len(text) > _REPR_WIDTH or "\n" in text:
                text = f"<{type(value).__name__}>"
            shown.append(f"{name}={text}")
        return f"{type(self).__name__}({', '.join(shown)})"


def _same(value: Any, default: Any) -> bool:
    if value is default:
        return True
    if type(value) is not type(default):
        return False
    try:
        return bool(value == default)
    except (TypeError, ValueError):  # an array compares elementwise
        return False
