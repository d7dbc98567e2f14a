"""Method settings, shared by the core, every adapter, ``semsoft eval`` and ``semsoft tune``.

A config is a small JSON file (:meth:`SemsoftConfig.save` and ``semsoft tune`` write one;
``--config`` reads it; fields left out keep their defaults). The defaults::

    {"k": 50, "tau": 0.0, "center": true, "own_vote": true, "normalize_votes": true,
     "temperature": 1.0, "residual": true, "tau_quantile": null, "semantic_weight": 0.0,
     "nearest_vote": false}

Examples
--------
>>> from semsoft_plugin.core.config import SemsoftConfig
>>> config = SemsoftConfig(k=20)
>>> config.k, config.semantic_weight
(20, 0.0)
>>> config.replace(semantic_weight=0.3).semantic_weight   # a new config; this one is frozen
0.3
>>> SemsoftConfig.pooled().semantic_weight
0.3
>>> SemsoftConfig(k=0)
Traceback (most recent call last):
    ...
ValueError: k=0 must be an int in [1, 4096]
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["SemsoftConfig", "DEFAULT_K", "DEFAULT_TAU", "DEFAULT_CENTER"]

# Defaults chosen by measurement on the dev sets (docs/defaults.md).
DEFAULT_K = 50
DEFAULT_TAU = 0.0
DEFAULT_CENTER = True
DEFAULT_OWN_VOTE = True
DEFAULT_NORMALIZE_VOTES = True
DEFAULT_RESIDUAL = True
DEFAULT_TAU_QUANTILE: float | None = None
# 0: the default is the constrained softmax. No label-free setting, the semantic pool
# or the file mode, did no harm on every kind of data left out of its choice
# (docs/defaults.md); the pool is SemsoftConfig.pooled(), one name away.
DEFAULT_SEMANTIC_WEIGHT = 0.0
POOLED_SEMANTIC_WEIGHT = 0.3
DEFAULT_NEAREST_VOTE = False

MAX_K = 4096


@dataclass(frozen=True)
class SemsoftConfig:
    """Settings of Semantic Softmax.

    Parameters
    ----------
    k : int
        Number of top tokens kept from the unconstrained distribution (paper: 50).
    tau : float in [-1, 1)
        Cosine threshold: a token votes for a label with weight ``max(0, cos - tau)``.
    center : bool
        Subtract the mean output embedding before the cosine (corrects anisotropy).
    own_vote : bool
        A label's own tokens vote for that label only (keeps antonym labels apart).
    normalize_votes : bool
        Share each token's vote out among the labels instead of counting it per label.
    temperature : float > 0, finite
        Final temperature on ``log P_sem``; 1 leaves it unchanged. The whole range is
        valid: toward 0 it becomes a hard argmax (ties split evenly), toward the
        largest float the uniform distribution.
    residual : bool
        Graded votes with a residual: a kept token votes in proportion to how close it
        is to its nearest label (``max_l w(v, l) / (1 - tau_l)``, 1 for a label's own
        token), and the share of the top-K mass no label neighbour claims goes to the
        constrained softmax instead of being renormalised away. With no neighbours the
        result is exactly the constrained softmax. A token's claimed mass is always
        shared out among the labels by its weights, so ``normalize_votes`` only acts
        without the residual.
    tau_quantile : float in (0, 1), optional
        Derive each label's threshold from the model instead of using ``tau``:
        ``tau_l`` is this quantile of the cosines between a fixed sample of vocabulary
        rows and label ``l``'s embedding, so only tokens closer to the label than
        almost all unrelated tokens vote. No labelled data is needed.
    semantic_weight : float in [0, 1]
        How far to move from the constrained softmax toward the semantic distribution,
        as a log-linear pool: ``P ∝ P_con^(1 - a) · P_sem^a``. ``1`` is the semantic
        distribution alone (the paper), ``0`` the constrained softmax. The semantic
        votes are a noisy estimate of the model's preference (a few kept tokens, a
        cosine as weight), so a weight below 1 is a shrinkage. The default ``0`` is
        the constrained softmax: no label-free weight did no harm on every kind of data
        left out of its choice (``benchmarks/choose_defaults.py``, docs/defaults.md).
        :meth:`pooled` (``a = 0.3``) helps the over-confident kinds (emotions, question
        types) and costs a little on accurate ones (news topics, abuse).
    nearest_vote : bool
        With ``residual``: a kept token votes for its *nearest* label only, and claims
        the share of its mass given by its margin over the second nearest label,
        ``(w_1 - w_2) / (1 - tau)``, instead of sharing its claim among the labels in
        proportion to the cosines. Antonym labels (" yes"/" no") are close to each
        other and to each other's spellings, so a shared claim hands part of the
        strongest vote for one label (" No" for "no") to its antonym; a token equally
        near two labels claims nothing and its mass follows the constrained softmax.
    """

    k: int = DEFAULT_K
    tau: float = DEFAULT_TAU
    center: bool = DEFAULT_CENTER
    own_vote: bool = DEFAULT_OWN_VOTE
    normalize_votes: bool = DEFAULT_NORMALIZE_VOTES
    temperature: float = 1.0
    residual: bool = DEFAULT_RESIDUAL
    tau_quantile: float | None = DEFAULT_TAU_QUANTILE
    semantic_weight: float = DEFAULT_SEMANTIC_WEIGHT
    nearest_vote: bool = DEFAULT_NEAREST_VOTE

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or not 1 <= self.k <= MAX_K:
            raise ValueError(f"k={self.k!r} must be an int in [1, {MAX_K}]")
        if not isinstance(self.tau, int | float) or not -1.0 <= float(self.tau) < 1.0:
            raise ValueError(f"tau={self.tau!r} must be a float in [-1, 1)")
        for name in ("center", "own_vote", "normalize_votes", "residual", "nearest_vote"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be a bool")
        t = self.temperature
        if not isinstance(t, int | float) or isinstance(t, bool) or not math.isfinite(t) or t <= 0:
            raise ValueError(f"temperature={t!r} must be a finite float > 0")
        q = self.tau_quantile
        if q is not None and (
            isinstance(q, bool) or not isinstance(q, int | float) or not 0.0 < float(q) < 1.0
        ):
            raise ValueError(f"tau_quantile={q!r} must be None or a float in (0, 1)")
        if q is not None:
            object.__setattr__(self, "tau_quantile", float(q))
        a = self.semantic_weight
        if isinstance(a, bool) or not isinstance(a, int | float) or not 0.0 <= float(a) <= 1.0:
            raise ValueError(f"semantic_weight={a!r} must be a float in [0, 1]")
        object.__setattr__(self, "semantic_weight", float(a))
        object.__setattr__(self, "tau", float(self.tau))
        object.__setattr__(self, "temperature", float(self.temperature))

    @classmethod
    def paper(cls, *, k: int = 50, tau: float = 0.0) -> SemsoftConfig:
        """The paper's exact formula: raw cosines, no own-vote rule, no temperature."""
        return cls(
            k=k,
            tau=tau,
            center=False,
            own_vote=False,
            normalize_votes=False,
            residual=False,
            tau_quantile=None,
            semantic_weight=1.0,
            nearest_vote=False,
        )

    @classmethod
    def pooled(cls, *, k: int = 50) -> SemsoftConfig:
        """The semantic pool, label-free: the residual votes pooled with the constrained
        softmax at ``semantic_weight = 0.3`` (the default until the constrained softmax
        replaced it; docs/defaults.md says on which kinds of data it helps)."""
        return cls(k=k, semantic_weight=POOLED_SEMANTIC_WEIGHT)

    @classmethod
    def shared_votes(cls, *, k: int = 50) -> SemsoftConfig:
        """The project's first default (until 0.2): centred cosines at ``tau = 0``, own
        votes, and every kept token's whole mass shared out among the labels."""
        return cls(
            k=k,
            tau=0.0,
            center=True,
            own_vote=True,
            normalize_votes=True,
            residual=False,
            tau_quantile=None,
            semantic_weight=1.0,
            nearest_vote=False,
        )

    def replace(self, **changes: Any) -> SemsoftConfig:
        """A copy with some fields changed (``None`` values are ignored)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown Semantic Softmax option(s): {', '.join(sorted(unknown))}")
        changes = {k: v for k, v in changes.items() if v is not None}
        return dataclasses.replace(self, **changes) if changes else self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> SemsoftConfig:
        """Read a config file written by :meth:`save` or ``semsoft tune``."""
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ValueError(f"config file not found: {path}") from None
        except json.JSONDecodeError as error:
            raise ValueError(f"config file {path} is not valid JSON: {error}") from None
        if not isinstance(data, dict):
            raise ValueError(f"config file {path} must hold a JSON object")
        data.pop("comment", None)
        return cls().replace(**data)
