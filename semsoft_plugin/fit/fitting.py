"""Fitting Semantic Softmax's settings on a few labels: the pure math (torch and numpy).

What is fitted: the pool weight `semantic_weight` over a small grid, with a final
temperature per grid entry (NLL is convex in `1/T`: a golden-section search on `log T`),
so temperature scaling of the constrained softmax is inside the search; the bias
corrections (`fit_probs(bias=...)`, `semsoft_plugin.fit.label_offsets`) and the caller's
probe (`external`) are more members of the family, `FAMILY`. The rule (`fit_probs`):
each member is scored out of fold, the temperature is the floor, and another member
replaces it only where it beats the start and the temperature by `margin` standard
errors and keeps macro-F1 (`f1_change`); its numbers are the fields of
[`FitPolicy`][semsoft_plugin.core.fit_policy.FitPolicy]. Everything is computed from
kept forward passes (`semsoft_plugin.core.kept_scores`); the temperature search and the
NLL are `semsoft_plugin.fit.temperature_scaling`, and
[`semsoft_plugin.fit.fit_family`][semsoft_plugin.fit.fit_family] runs the family.
Each part and why: docs/few-labels.md ("What is fitted", "The rule").
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from semsoft_plugin.core.config import SemsoftConfig, grid_entry
from semsoft_plugin.core.fit_policy import FitPolicy
from semsoft_plugin.fit.f1_guard import f1_change
from semsoft_plugin.fit.folds import MIN_ITEMS, check_fit_data, fold_count, stratified_folds
from semsoft_plugin.fit.label_offsets import (
    MEMBERS,
    apply_offset,
    check_members,
    checked_names,
    fit_member,
    member_out_of_fold,
)
from semsoft_plugin.fit.temperature_scaling import (
    apply_temperature,
    nll,
    succession_temperature,
)

__all__ = [
    "DEFAULT_WEIGHTS",
    "FAMILY",
    "SIMPLEST_FIRST",
    "External",
    "check_family",
    "cross_fit",
    "fit_probs",
    "fitted_probs",
    "grid_configs",
    "single_entries",
]

# The fit's family, in the order it reports them: the grid (pool weight, each entry with
# its temperature), a temperature on the start alone, the bias corrections
# (label_offsets.MEMBERS), and a probe on the decision step's hidden state (fitted by the
# caller: scikit-learn, semsoft_plugin.fit.probe).
FAMILY: tuple[str, ...] = ("grid", "temperature", *MEMBERS, "probe")
# The family by free parameters, fewest first: what the fit prefers among members that
# tie within the rule's margin (a temperature; a label-free offset with a temperature;
# the grid's weight with a temperature; an offset per label; a probe's weight matrix).
SIMPLEST_FIRST: tuple[str, ...] = ("temperature", "contextual", "batch", "grid", "offset", "probe")
# A procedure the caller fits: (train rows, held rows) -> [len(held), L] probabilities.
External = Callable[[np.ndarray, np.ndarray], np.ndarray]
# The pool weights searched by default: from the constrained softmax (0) to the
# semantic distribution alone (1).
DEFAULT_WEIGHTS: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(11))
# The core floors probabilities at this value before a log (core._tempered).
_FLOOR = 1e-30


# -- the grid ---------------------------------------------------------


def grid_configs(
    grid: Mapping[str, Sequence[Any]], start: SemsoftConfig | None = None
) -> list[SemsoftConfig]:
    """Every combination of the grid's values over `start` (unknown keys raise); an
    entry at `semantic_weight = 0` keeps the vote settings' defaults
    ([`grid_entry`][semsoft_plugin.core.config.grid_entry])."""
    start = start or SemsoftConfig()
    names = list(grid)
    for name in names:
        if not grid[name]:
            raise ValueError(f"grid value list for {name!r} is empty")
    return [
        grid_entry(start, dict(zip(names, values, strict=True)))
        for values in itertools.product(*(grid[n] for n in names))
    ]


def _log(probs: np.ndarray) -> np.ndarray:
    return np.log(np.clip(probs, _FLOOR, 1.0))


# -- the fit -------------------------------------------------------------------------


def _mean(values: np.ndarray, weights: np.ndarray | None) -> float:
    """The mean of per-item `values`, weighted by `weights` where given."""
    if weights is None:
        return float(values.mean())
    return float((weights * values).sum() / weights.sum())


def _mean_se(diff: np.ndarray, weights: np.ndarray | None) -> tuple[float, float]:
    """The mean of a paired per-item difference and its standard error; with `weights`
    as counts (an item of weight 2 is that item twice: the same figures as the items
    repeated)."""
    if weights is None:
        return float(diff.mean()), float(diff.std(ddof=1) / math.sqrt(len(diff)))
    total = float(weights.sum())
    mean = float((weights * diff).sum() / total)
    variance = float((weights * (diff - mean) ** 2).sum() / max(total - 1.0, 1e-12))
    return mean, math.sqrt(variance / total)


def _choose(
    log_grid: np.ndarray,
    targets: np.ndarray,
    temperature: bool,
    weights: np.ndarray | None = None,
    succession: bool = True,
) -> tuple[int, float, np.ndarray, np.ndarray]:
    """(entry, temperature) with the least training NLL (weighted by `weights` where
    given), each entry at its temperature held to the rule of succession
    (`semsoft_plugin.fit.temperature_scaling.succession_temperature`; `succession=False`:
    the hard labels' optimum); each entry's NLL and T."""
    scores = np.empty(len(log_grid))
    temps = np.ones(len(log_grid))
    for c, log_p in enumerate(log_grid):
        if temperature:
            temps[c] = succession_temperature(
                log_p, targets, sample_weight=weights, succession=succession
            )
        scores[c] = _mean(nll(apply_temperature(log_p, temps[c]), targets), weights)
    best = int(np.argmin(scores))  # the first of equal scores: the grid's order decides
    return best, float(temps[best]), scores, temps


def _check_targets(targets: Any, n: int, n_labels: int) -> np.ndarray:
    y = np.asarray(targets)
    if y.ndim != 1 or len(y) != n:
        raise ValueError(f"targets must be [N] = [{n}] label indices, got shape {y.shape}")
    if not np.issubdtype(y.dtype, np.integer) or (len(y) and (y.min() < 0 or y.max() >= n_labels)):
        raise ValueError(f"targets must be label indices in [0, {n_labels}), got {y[:8].tolist()}")
    return y.astype(np.int64)


def _out_of_fold(
    log_grid: np.ndarray,
    y: np.ndarray,
    fold_ids: np.ndarray,
    temperature: bool,
    weights: np.ndarray | None = None,
    succession: bool = True,
) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """Per-item probabilities `[N, L]` of the procedure "choose the entry and T on the
    other folds"."""
    out = np.empty(log_grid.shape[1:])
    choices = []
    for fold in np.unique(fold_ids):
        held = fold_ids == fold
        train_w = None if weights is None else weights[~held]
        c, t, _, _ = _choose(log_grid[:, ~held], y[~held], temperature, train_w, succession)
        out[held] = apply_temperature(log_grid[c, held], t)
        choices.append({"entry": c, "temperature": t})
    return out, choices


def fit_probs(
    grid: np.ndarray,
    start: np.ndarray,
    targets: Any,
    *,
    single: Mapping[str, int] | None = None,
    policy: FitPolicy | None = None,
    n_folds: int = 5,
    folds: np.ndarray | None = None,
    bias: Sequence[str] = (),
    content_free: np.ndarray | None = None,
    external: Mapping[str, External] | None = None,
    rows: np.ndarray | None = None,
    grid_size: int | None = None,
    sample_weight: Any = None,
) -> tuple[int, float, bool, dict[str, Any]]:
    """The fit on precomputed probabilities: `grid` `[C, N, L]` per grid entry,
    `start` `[N, L]` of the starting setting (scored as is). Returns `(entry,
    temperature, kept_default, stats)`.

    Procedures are checked out of fold against `start`: the whole grid with a
    temperature each, and each `single` entry (name -> grid entry, e.g. from
    `single_entries`: `start` at `T = 1`) with a temperature alone: one parameter, so
    less variance where only the temperature matters. `policy` (default `FitPolicy()`) is
    the rule and what it checks: its `family`, `temperature`, `margin`, floor, macro-F1
    guard, succession and `random_state`. The temperature always passes where the floor is
    on; any other member passes only if its gain passes the rule (module docstring). Of those that pass, the simplest (`SIMPLEST_FIRST`) whose
    out-of-fold NLL is within `margin` standard errors of the largest gain's (paired over
    items: the one-standard-error rule) wins, so a member with more free parameters is
    chosen only where the labels show it fits better, not where it ties by chance.
    `n_folds` is lowered to half the number of items when there are fewer; `folds`: a
    fold id per item (a caller's splitter) instead of stratified `n_folds` folds.

    `bias`: the bias members also checked (`label_offsets.MEMBERS`), on the
    `single["temperature"]` entry; `content_free` `[C, L]`: that entry on the
    content-free inputs (`"contextual"`). `stats["offset"]`: the adopted member's
    per-label log-offset (else None), which `fitted_probs` applies.

    `policy.family`: the procedures checked, by name (`FAMILY`; `None`: the grid, the
    `single` ones and `bias`). A bias member is named here instead of in `bias`; a
    `"temperature"` the grid has no entry for is the grid's own (one entry) and not
    checked twice. `external`: name -> a procedure the caller fits (`"probe"`):
    `fit(train, held)` gets row indices (into the caller's rows; `rows` says which
    of them these are, default all) and returns `[len(held), L]` probabilities of the
    held rows fitted on the train rows, so the same rule judges it out of fold.
    `grid_size`: the `"grid"` member searches the first entries only (the rest are
    there for the other members: the start at `T = 1`); default all.
    `sample_weight`: `[N]` non-negative weights counting the items (each item's NLL
    counts with its weight in every fit and in the rule's mean and standard error: integer
    weights give the figures of the items repeated); `None`: 1 each. An external member
    weighs its own fit.
    """
    policy = FitPolicy() if policy is None else policy
    family, temperature, margin, seed = (
        policy.family,
        policy.fit_score_temperature,
        policy.margin,
        policy.random_state,
    )
    y = _check_targets(targets, grid.shape[1], grid.shape[2])
    n = len(y)
    check_fit_data(y, n_folds, margin)
    w = _checked_weights(sample_weight, n)
    log_grid = _log(grid)
    start_nll = nll(start, y)
    n_labels = grid.shape[2]
    start_choice = start.argmax(1)
    fold_ids = stratified_folds(y, fold_count(n, n_folds), seed) if folds is None else folds
    n_used = len(np.unique(fold_ids))
    subsets = {"grid": np.arange(len(grid) if grid_size is None else grid_size)}
    # A one-entry grid's own member is the temperature on it: "temperature" is checked apart
    # only where the grid has more entries, or where the family leaves the grid out.
    if temperature and (len(grid) > 1 or (family is not None and "grid" not in family)):
        subsets.update({name: np.array([entry]) for name, entry in (single or {}).items()})
    external = dict(external or {})
    names, bias = _procedures(family, bias, subsets, external)
    if not names:
        raise ValueError(
            f"the fit family {list(family or ())} fits nothing here: 'temperature' needs "
            "fit_score_temperature=True and the start at T = 1 in the grid (single['temperature'])"
        )
    subsets = {k: v for k, v in subsets.items() if k in names}
    base_entry = check_members(bias, single, content_free)
    base = log_grid[base_entry]
    rows = np.arange(n) if rows is None else np.asarray(rows)
    checked: dict[str, dict[str, Any]] = {}
    for name in names:
        if name in external:
            oof = np.empty(grid.shape[1:])
            choices: list[dict[str, Any]] = []
            for fold in np.unique(fold_ids):
                held = fold_ids == fold
                oof[held] = external[name](rows[~held], rows[held])
                choices.append({"entry": base_entry, "temperature": 1.0})
        elif name in subsets:
            oof, choices = _out_of_fold(
                log_grid[subsets[name]], y, fold_ids, temperature, w, policy.succession
            )
            for choice in choices:
                choice["entry"] = int(subsets[name][choice["entry"]])
        else:
            oof, choices = member_out_of_fold(
                name, base, y, fold_ids, content_free=content_free, temperature=temperature,
                seed=seed, entry=base_entry, sample_weight=w, succession=policy.succession,
            )  # fmt: skip
        fitted_nll = nll(oof, y)
        diff = start_nll - fitted_nll
        gain, se = _mean_se(diff, w)
        choice = oof.argmax(1)
        change, change_se = f1_change(y, start_choice, choice, n_labels, w, seed=seed)
        shows_gain = gain > 0 and gain > margin * se
        checked[name] = {
            "keeps_decisions": bool(np.array_equal(choice, start_choice)),
            "gain": gain,
            "gain_se": se,
            "f1_change": change,
            "f1_change_se": change_se,
            "shows_gain": shows_gain,
            "passes": (policy.temperature_floor and name == "temperature")
            or (shows_gain and _keeps_f1(change, change_se, policy)),
            "nll": _mean(fitted_nll, w),
            "fold_choices": choices,
            "per_item": fitted_nll,
        }
    passing = _passing(checked)
    fallback = next((k for k in names if k not in external), names[0])  # "grid" if checked
    chosen = _simplest(passing, checked, margin) if passing else fallback
    offset = None
    if chosen in subsets:
        best, t, scores_all, temps_all = _choose(
            log_grid[subsets[chosen]], y, temperature, w, policy.succession
        )
        best = int(subsets[chosen][best])
    elif chosen in external:  # the caller fits it on all rows
        best, t = base_entry, 1.0
    else:
        t, b = fit_member(chosen, base, y, content_free=content_free, temperature=temperature,
                          seed=seed, sample_weight=w, succession=policy.succession)  # fmt: skip
        best, offset = base_entry, b.tolist()
    if chosen != "grid" or len(subsets["grid"]) != len(grid):  # the report lists every entry
        _, _, scores_all, temps_all = _choose(log_grid, y, temperature, w, policy.succession)
    stats = {
        "n": n,
        "n_folds": n_used,
        "procedure": chosen,
        "gain": checked[chosen]["gain"],
        "gain_se": checked[chosen]["gain_se"],
        "nll_start": _mean(start_nll, w),
        "nll_fitted": checked[chosen]["nll"],
        "procedures": {k: {x: v[x] for x in _REPORTED} for k, v in checked.items()},
        "scores": scores_all.tolist(),
        "temperatures": temps_all.tolist(),
        "fold_choices": checked[chosen]["fold_choices"],
        "offset": offset,
    }
    return best, t, not passing, stats


def _checked_weights(sample_weight: Any, n: int) -> np.ndarray | None:
    """`sample_weight` as `[n]` float64 counts: finite, >= 0, summing to at least the
    items a fit needs; `None` stays `None`."""
    if sample_weight is None:
        return None
    w = np.asarray(sample_weight, dtype=np.float64)
    if w.shape != (n,):
        raise ValueError(f"sample_weight must hold one weight per item ({n}), got shape {w.shape}")
    bad = np.flatnonzero(~np.isfinite(w) | (w < 0))
    if len(bad):
        raise ValueError(
            f"sample_weight[{bad[0]}] = {float(w[bad[0]])!r} must be a finite number >= 0"
        )
    if w.sum() < MIN_ITEMS:
        raise ValueError(
            f"sample_weight sums to {w.sum():g}: the weights count items (an item of weight 2 "
            f"is that item twice), and a fit needs the weight of at least {MIN_ITEMS} items"
        )
    return w


# What the fit's report gives of each checked member.
_REPORTED = ("gain", "gain_se", "f1_change", "f1_change_se", "shows_gain", "passes", "nll")


def _keeps_f1(change: float, change_se: float, policy: FitPolicy) -> bool:
    """The macro-F1 guard: the change less `f1_z` standard errors is at least
    `-f1_tolerance` (always true with the guard off)."""
    return not policy.f1_guard or change - policy.f1_z * change_se >= -policy.f1_tolerance


def _passing(checked: dict[str, dict[str, Any]]) -> list[str]:
    """The members the rule adopts from: those that pass it (the temperature, where the
    family has it, always does); where none does but one showed its gain and was stopped
    by the macro-F1 guard alone, the members that changed no decision out of fold with a
    gain above zero. The labels then show the start miscalibrated, and only a correction
    that keeps every decision is shown safe for them: keeping the start would throw that
    evidence away."""
    passing = [k for k, v in checked.items() if v["passes"]]
    if passing or not any(v["shows_gain"] for v in checked.values()):
        return passing
    return [k for k, v in checked.items() if v["gain"] > 0 and v["keeps_decisions"]]


def _simplest(passing: list[str], checked: dict[str, dict[str, Any]], margin: float) -> str:
    """The simplest passing member not worse than the best by `margin` paired
    standard errors of out-of-fold NLL."""
    best = max(passing, key=lambda k: checked[k]["gain"])
    rank = {m: i for i, m in enumerate(SIMPLEST_FIRST)}
    for name in sorted(passing, key=lambda k: rank.get(k, len(rank))):
        diff = checked[name]["per_item"] - checked[best]["per_item"]
        if name == best or diff.mean() <= margin * diff.std(ddof=1) / math.sqrt(len(diff)):
            return name
    return best


def _procedures(
    family: Sequence[str] | None,
    bias: Sequence[str],
    subsets: Mapping[str, np.ndarray],
    external: Mapping[str, External],
) -> tuple[list[str], list[str]]:
    """The procedures `fit_probs` checks, in order, and the bias members among
    them; an unknown name, or a member no one can fit here, is refused by name."""
    if family is None:
        return [*subsets, *bias, *external], list(bias)
    if bias:
        raise ValueError(f"name the bias members {list(bias)} in family, not in bias=")
    names = list(check_family(family))
    if not names:
        raise ValueError("family=() checks nothing: name at least one member of " + str(FAMILY))
    missing = [m for m in names if m not in (*subsets, *MEMBERS, *external, "temperature")]
    if missing:
        raise ValueError(
            f"fit family member {missing[0]!r} needs what the caller did not give (the probe: "
            "the decision step's hidden states, which this engine does not expose)"
        )
    names = [m for m in names if m != "temperature" or "temperature" in subsets]
    return names, [m for m in names if m in MEMBERS]


def check_family(family: Sequence[str]) -> tuple[str, ...]:
    """`family` as a tuple of member names of `FAMILY`, each once; an unknown
    name (or a string where a sequence of names is wanted) refused by name."""
    if isinstance(family, str):
        raise ValueError(f"fit family {family!r} must be a sequence of member names, e.g. "
                         f"({family!r},); members: {', '.join(FAMILY)}")  # fmt: skip
    return checked_names(family, FAMILY, "fit family member")


def fitted_probs(
    grid: np.ndarray,
    start: np.ndarray,
    entry: int,
    temperature: float,
    kept_default: bool,
    offset: Sequence[float] | None = None,
) -> np.ndarray:
    """What a fit's outcome gives on items: `start` as is when the rule kept it, else
    grid entry `entry` with its temperature (the core's last step) and, from a bias
    member, its per-label log-offset."""
    if kept_default:
        return start
    return apply_offset(_log(grid[entry]), temperature, 0.0 if offset is None else offset)


def cross_fit(
    grid: np.ndarray,
    start: np.ndarray,
    targets: Any,
    fold_ids: np.ndarray,
    **options: Any,
) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """Out-of-fold probabilities of the whole fit (rule included): each fold scored with
    what `fit_probs` chose on the other folds (`options` go to it). For honest
    figures, as `semsoft eval` cross-fits temperature scaling. A fold whose other
    folds hold fewer than the 4 items or the two labels a fit needs keeps `start`: no evidence is what
    the rule answers with the default, so a tiny evaluation still runs."""
    y = np.asarray(targets)
    out = np.empty_like(start)
    choices = []
    for fold in np.unique(fold_ids):
        held = fold_ids == fold
        if int((~held).sum()) < MIN_ITEMS or len(np.unique(y[~held])) < 2:
            out[held] = start[held]
            choices.append({"entry": None, "temperature": 1.0, "kept_default": True})
            continue
        train = np.flatnonzero(~held)
        entry, t, keep, stats = fit_probs(
            grid[:, ~held], start[~held], y[~held], rows=train, **options
        )
        external = (options.get("external") or {}).get(stats["procedure"])
        if external is not None and not keep:
            out[held] = external(train, np.flatnonzero(held))
        else:
            out[held] = fitted_probs(grid[:, held], start[held], entry, t, keep, stats["offset"])
        choices.append({"entry": entry, "temperature": t, "kept_default": keep,
                        "procedure": stats["procedure"], "offset": stats["offset"]})  # fmt: skip
    return out, choices


def single_entries(configs: Sequence[SemsoftConfig], start: SemsoftConfig) -> dict[str, int]:
    """The one-parameter procedures `fit_probs` checks beside the grid, where the
    grid has their entry: `"temperature"` (`start` at `T = 1`). (Temperature
    scaling of the constrained softmax as a third procedure was measured and dropped:
    one more choice among noisy out-of-fold estimates did not lower the test NLL,
    `docs/few-labels.md`.)"""
    wanted = {"temperature": start.replace(score_temperature=1.0)}
    out: dict[str, int] = {}
    for name, config in wanted.items():
        found = next((i for i, c in enumerate(configs) if c == config), None)
        if found is not None and found not in out.values():
            out[name] = found
    return out
