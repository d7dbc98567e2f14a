"""What a few-label fit adds on top of its settings, applied to each row alone, and the
config file that carries it (``Classifier.fit``, ``semsoft tune``, ``semsoft classify
--config``).

A fit (:mod:`semsoft_plugin.core.fit_family`) gives a :class:`SemsoftConfig`, and where a
bias member or the probe won, a correction no config field can hold:

* ``"offset"``, ``"batch"``, ``"contextual"``: a per-label log-offset added to the
  config's log-probabilities, ``softmax(log p + offset)``;
* ``"probe"``: logistic regression on the decision step's hidden state
  (:class:`~semsoft_plugin.app.probe.LinearProbe`), whose probabilities replace them.

Both are fixed numbers estimated once on the labelled rows, so a row's score never
depends on the rows beside it (batch calibration's offset is the mean of the *fitted*
rows, not of the rows being predicted).

The file is the config JSON ``semsoft tune`` always wrote, with one more key when a
correction was adopted::

    {"k": 50, ..., "score_temperature": 0.8,
     "fitted": {"procedure": "offset", "labels": ["negative", "positive"],
                "offset": [0.31, -0.31]}}

and for the probe ``"probe": "<name>.probe.safetensors"``, its weights beside the JSON
(safetensors, never pickle). A file without ``"fitted"`` is a plain config; a plain
``SemsoftConfig.load`` refuses one with it by name (``unknown ... option(s): fitted``)
rather than drop the correction.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from semsoft_plugin.core.config import SemsoftConfig, read_config_file

if TYPE_CHECKING:
    import numpy as np

    from semsoft_plugin.app.probe import LinearProbe

__all__ = ["FittedCorrection", "load_fitted", "save_fitted"]

_KEY = "fitted"
_OFFSET_MEMBERS = ("offset", "batch", "contextual")


@dataclass(frozen=True)
class FittedCorrection:
    """A fit's correction after its config (module docstring).

    Attributes
    ----------
    procedure : the family member that won (``"offset"``, ``"batch"``, ``"contextual"``
        or ``"probe"``)
    labels : the label names, the column order of ``offset`` and of the probe
    offset : per-label log-offsets (a bias member), else None
    probe : the probe (``"probe"``), else None
    """

    procedure: str
    labels: tuple[str, ...]
    offset: tuple[float, ...] | None = None
    probe: LinearProbe | None = None

    def __post_init__(self) -> None:
        if self.procedure in _OFFSET_MEMBERS:
            ok = self.offset is not None and len(self.offset) == len(self.labels)
        else:
            ok = self.procedure == "probe" and self.probe is not None
            ok = ok and self.probe.n_labels == len(self.labels)  # type: ignore[union-attr]
        if not ok:
            raise ValueError(
                f"a fitted correction {self.procedure!r} over {len(self.labels)} labels needs "
                f"{'an offset per label' if self.procedure in _OFFSET_MEMBERS else 'a probe'}"
                f" (members: {', '.join((*_OFFSET_MEMBERS, 'probe'))})"
            )

    @property
    def needs_hidden(self) -> bool:
        """Whether applying it reads the decision step's hidden state."""
        return self.probe is not None

    def check_labels(self, names: Any) -> None:
        """``ValueError`` unless ``names`` are the fitted labels (any order)."""
        if sorted(names) != sorted(self.labels):
            raise ValueError(
                f"the fitted correction ({self.procedure}) is for the labels "
                f"{list(self.labels)}, not {list(names)}: fit again for these labels"
            )

    def apply(self, probs: np.ndarray, classes: Any, hidden: Any = None) -> np.ndarray:
        """``[N, L]`` probabilities in ``classes`` order, corrected row by row (``hidden``:
        ``[N, H]``, needed by the probe)."""
        import numpy as np

        self.check_labels(classes)
        order = [self.labels.index(c) for c in classes]
        if self.probe is not None:
            if hidden is None:
                raise ValueError("the probe needs the decision step's hidden states")
            return np.asarray(self.probe.probs(hidden)[:, order], dtype=np.float64)
        offset = np.asarray(self.offset, dtype=np.float64)[order]
        z = np.log(np.clip(np.asarray(probs, dtype=np.float64), 1e-30, 1.0)) + offset
        z = np.exp(z - z.max(1, keepdims=True))
        out: np.ndarray = z / z.sum(1, keepdims=True)
        return out

    def to_dict(self, probe_file: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"procedure": self.procedure, "labels": list(self.labels)}
        if self.offset is not None:
            out["offset"] = [float(v) for v in self.offset]
        if probe_file is not None:
            out["probe"] = probe_file
        return out


def save_fitted(
    path: str | Path, config: SemsoftConfig, correction: FittedCorrection | None
) -> None:
    """Write ``config`` and, if given, ``correction`` (the probe's weights to
    ``<stem>.probe.safetensors`` beside ``path``)."""
    path = Path(path)
    data: dict[str, Any] = config.to_dict()
    if correction is not None:
        probe_file = None
        if correction.probe is not None:
            probe_file = f"{path.stem}.probe.safetensors"
            correction.probe.save(path.parent / probe_file, correction.labels)
        data[_KEY] = correction.to_dict(probe_file)
    path.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")


def load_fitted(path: str | Path) -> tuple[SemsoftConfig, FittedCorrection | None]:
    """The config of a file written by :func:`save_fitted` (or any config file), and its
    correction (None for a plain config)."""
    path = Path(path)
    data = read_config_file(path)
    if not isinstance(data, dict) or _KEY not in data:
        return SemsoftConfig.from_dict(data, f"config file {path}"), None
    fitted = data.pop(_KEY)
    config = SemsoftConfig.from_dict(data, f"config file {path}")
    if not isinstance(fitted, dict) or not isinstance(fitted.get("labels"), list):
        raise ValueError(f"config file {path}: 'fitted' must be an object with 'labels'")
    labels = tuple(str(name) for name in fitted["labels"])
    probe = None
    if fitted.get("probe") is not None:
        from semsoft_plugin.app.probe import LinearProbe

        probe, probe_labels = LinearProbe.load(path.parent / str(fitted["probe"]))
        if tuple(probe_labels) != labels:
            raise ValueError(
                f"{fitted['probe']}: the probe's labels {probe_labels} are not {labels}"
            )
    offset = fitted.get("offset")
    if offset is not None:
        if not isinstance(offset, list) or not all(isinstance(v, int | float) for v in offset):
            raise ValueError(f"config file {path}: 'fitted.offset' must be a list of numbers")
        offset = tuple(float(v) for v in offset)
    return config, FittedCorrection(str(fitted.get("procedure")), labels, offset, probe)
