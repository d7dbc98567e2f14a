"""The method's settings: one table, read by the flags, HTTP keys and config files (docs/method.md).

Examples
--------
>>> from semsoft_plugin.core.config import SemsoftConfig
>>> config = SemsoftConfig(k=20)
>>> config.k, config.semantic_weight
(20, 0.0)
>>> config.replace(semantic_weight=0.3).semantic_weight   # a new config; this one is frozen
0.3
>>> SemsoftConfig.preset("pooled").semantic_weight
0.3
>>> SemsoftConfig(k=0)
Traceback (most recent call last):
ValueError: k=0 must be an integer in [1, 4096]
"""

from __future__ import annotations

import dataclasses
import json
import math
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from semsoft_plugin.core.value_params import ValueParams

__all__ = [
    "POLICY_KEY",
    "DEFAULT_CENTER",
    "DEFAULT_K",
    "DEFAULT_TAU",
    "PRESETS",
    "RENAMED",
    "VOTES",
    "SemsoftConfig",
    "config_field_specs",
    "grid_entry",
    "read_config_bytes",
    "read_file_bytes",
    "read_config_file",
    "renamed_message",
]

# The key under which a fit file records the policy its fit ran under (`FitPolicy`).
POLICY_KEY = "fit_policy"

# Defaults chosen by measurement on the dev sets (docs/defaults.md).
DEFAULT_K = 50
DEFAULT_TAU = 0.0
DEFAULT_CENTER = True
DEFAULT_OWN_VOTE = True
DEFAULT_VOTE = "residual"
DEFAULT_TAU_QUANTILE: float | None = None
# 0: the default is the constrained softmax. No label-free setting, the semantic pool
# or the file mode, did no harm on every kind of data left out of its choice
# (docs/defaults.md); the pool is SemsoftConfig.preset("pooled"), one name away.
DEFAULT_SEMANTIC_WEIGHT = 0.0
POOLED_SEMANTIC_WEIGHT = 0.3
# preset("silent-vote"): the per-row pool (core/silent_vote.py), its two parameters chosen
# on the 14 dev pairs by the do-no-harm rule (benchmarks/silent_vote.py). Left one kind
# out it harmed 4 of 14 pairs and left the emotion sets' ECE as it was: a preset, not the
# default (docs/defaults.md).
SILENT_VOTE_WEIGHT = 0.5
SILENT_VOTE_THRESHOLD = 0.6

MAX_K = 4096
# The settings that only shape the semantic votes: no effect at semantic_weight = 0.
VOTE_SETTINGS = ("vote", "tau", "tau_quantile", "center", "own_vote", "silent_vote")

# The vote rules. "residual" and "nearest" send the mass no label neighbour claims to
# the constrained softmax; "shared" and "per_label" renormalise the votes (the paper).
VOTES = ("residual", "nearest", "shared", "per_label")

# Old option names (never released) -> the field that replaced them: refused with the
# new name wherever a user can still send them (Python keywords, a config file, a
# settings record, an HTTP key, a CLI flag).
RENAMED = {
    "temperature": "score_temperature",
    "method_temperature": "score_temperature",
    "residual": "vote",
    "normalize_votes": "vote",
    "nearest_vote": "vote",
}
_VOTE_VALUES = (
    "'residual' (was residual=True), 'nearest' (residual=True, nearest_vote=True), "
    "'shared' (residual=False, normalize_votes=True) or 'per_label' (residual=False, "
    "normalize_votes=False)"
)


def renamed_message(name: str, prefix: str = "") -> str | None:
    """`"temperature: renamed: use score_temperature"` for an old option name (with
    `prefix` on both names, e.g. `semsoft_` or `--`), `None` for any other."""
    new = RENAMED.get(name)
    if new is None:
        return None
    if prefix == "--":
        name, new = name.replace("_", "-"), new.replace("_", "-")
    values = f" with one of {_VOTE_VALUES}" if new == "vote" else ""
    return f"{prefix}{name}: renamed: use {prefix}{new}{values}"


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _finite(value: Any) -> bool:
    try:
        return _number(value) and math.isfinite(value)
    except OverflowError:  # an int beyond the float range (JSON allows any size)
        return False


def _spec(
    kind: type, rule: str, ok: Callable[[Any], bool], help: str, **extra: Any
) -> dict[str, Any]:
    """One row of the table's metadata (`kind`: the value type a flag or a key is read
    as; `rule`: what a value must be, in words; `ok`: the check; `help`: one line for
    `--help` and the docs). The default stays in `field(default=...)`, where the API
    reference reads it."""
    return {"kind": kind, "rule": rule, "ok": ok, "help": help, **extra}


@dataclass(frozen=True)
class SemsoftConfig(ValueParams):
    """Settings of Semantic Softmax.

    Parameters
    ----------
    k : int in [1, 4096]
        Number of top tokens kept from the unconstrained distribution (paper: 50). At
        `semantic_weight = 0` it still sets the reported coverage and the kept top-k.
    tau : float in [-1, 1)
        Cosine threshold: a token votes for a label with weight `max(0, cos - tau)`.
    center : bool
        Subtract the mean output embedding before the cosine (corrects anisotropy).
    own_vote : bool
        A label's own tokens vote for that label only (keeps antonym labels apart).
    vote : {"residual", "nearest", "shared", "per_label"}
        How the kept tokens' votes become a distribution: `"residual"` (the default; the
        mass no label neighbour claims stays with the constrained softmax), `"nearest"`
        (research option), `"shared"` or `"per_label"` (research option; the paper's
        counting). Each rule: docs/method.md ("Decisions").
    score_temperature : float > 0, finite
        Final temperature on the scores (`log P`); 1 leaves them unchanged. The whole
        range is valid: toward 0 it becomes a hard argmax (ties split evenly), toward
        the largest float the uniform distribution. Not the engine's sampling
        `temperature`.
    tau_quantile : float in (0, 1), optional (research option)
        Each label's threshold `tau_l` from the model instead of `tau`: this quantile of
        the cosines between a fixed sample of vocabulary rows and label `l`'s embedding,
        so only tokens closer than almost all unrelated ones vote (no labels needed);
        `tau` must then keep its default value
    semantic_weight : float in [0, 1]
        The log-linear pool `P ∝ P_con^(1 - a) · P_sem^a`: `1` the semantic distribution
        alone (the paper), `0` (the default) the constrained softmax, where the vote settings
        have no effect and must keep their defaults; `preset("pooled")` is `a = 0.3`. Why
        that default, and where the pool helps: docs/defaults.md.
    silent_vote : float in [0, 1), optional
        Each row's pool weight from its own silent vote `m_out`
        ([silent_vote_mass][semsoft_plugin.core.silent_vote.silent_vote_mass]):
        `semantic_weight * clamp((m_out - silent_vote) / (1 - silent_vote), 0, 1)`; `None`
        (the default): one weight for every row. docs/defaults.md ("The silent vote, row by row")

    Notes
    -----
    Build one by its fields, by [`preset`][semsoft_plugin.core.config.SemsoftConfig.preset] (`"constrained"`, `"pooled"`, `"silent-vote"`,
    `"paper"`, `"shared"`), or by [`replace`][semsoft_plugin.core.config.SemsoftConfig.replace] on another. A combination that
    would be ignored raises `ValueError` naming the value and what to do.

    Examples
    --------
    >>> from semsoft_plugin import SemsoftConfig
    >>> SemsoftConfig().semantic_weight      # the default: the constrained softmax
    0.0
    >>> pooled = SemsoftConfig.preset("pooled")
    >>> pooled.semantic_weight
    0.3
    >>> pooled.replace(k=20).k             # a new config; this one is frozen
    20
    >>> SemsoftConfig.load("fitted.json")   # doctest: +SKIP

    A config file (`save`, what `semsoft tune` writes) and `--config` take the same fields.
    """

    k: int = field(default=DEFAULT_K, metadata=_spec(
        int, f"an integer in [1, {MAX_K}]",
        lambda v: isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_K,
        "top-K tokens kept from the unconstrained distribution (also the reported coverage)",
    ))  # fmt: skip
    tau: float = field(default=DEFAULT_TAU, metadata=_spec(
        float, "a finite number in [-1, 1)",
        lambda v: _finite(v) and -1.0 <= v < 1.0,
        "cosine threshold: a kept token votes for a label with weight max(0, cos - tau)",
    ))  # fmt: skip
    center: bool = field(default=DEFAULT_CENTER, metadata=_spec(
        bool, "a boolean (true/false or 0/1)",
        lambda v: isinstance(v, bool),
        "subtract the mean output embedding before the cosine",
    ))  # fmt: skip
    own_vote: bool = field(default=DEFAULT_OWN_VOTE, metadata=_spec(
        bool, "a boolean (true/false or 0/1)",
        lambda v: isinstance(v, bool),
        "a label's own tokens vote for that label only",
    ))  # fmt: skip
    vote: str = field(default=DEFAULT_VOTE, metadata=_spec(
        str, "one of " + ", ".join(repr(v) for v in VOTES),
        lambda v: isinstance(v, str) and v in VOTES,
        "the vote rule: residual (default), nearest (research), shared, per_label (the "
        "paper's counting; research)",
        choices=VOTES,
    ))  # fmt: skip
    score_temperature: float = field(default=1.0, metadata=_spec(
        float, "a finite number > 0",
        lambda v: _finite(v) and v > 0,
        "final temperature on the scores (not the engine's sampling temperature); 1: none",
    ))  # fmt: skip
    tau_quantile: float | None = field(default=DEFAULT_TAU_QUANTILE, metadata=_spec(
        float, "None or a finite number in (0, 1)",
        lambda v: v is None or (_finite(v) and 0.0 < v < 1.0),
        "research option: each label's threshold is this quantile of unrelated tokens' "
        "cosines (instead of tau)",
        nullable=True,
    ))  # fmt: skip
    semantic_weight: float = field(default=DEFAULT_SEMANTIC_WEIGHT, metadata=_spec(
        float, "a finite number in [0, 1]",
        lambda v: _finite(v) and 0.0 <= v <= 1.0,
        "pool weight toward the semantic distribution: 0 (default) is the constrained "
        "softmax, 0.3 the semantic pool (preset pooled), 1 the semantic votes alone",
    ))  # fmt: skip
    silent_vote: float | None = field(default=None, metadata=_spec(
        float, "None or a finite number in [0, 1)",
        lambda v: v is None or (_finite(v) and 0.0 <= v < 1.0),
        "per-row pool: a row's weight is semantic_weight * clamp((m - t) / (1 - t), 0, 1), "
        "m its silent vote (top-K mass on label neighbours), t this value; none: one weight",
        nullable=True,
    ))  # fmt: skip

    def __post_init__(self) -> None:
        for spec in dataclasses.fields(self):
            value = getattr(self, spec.name)
            if not spec.metadata["ok"](value):
                raise ValueError(f"{spec.name}={value!r} must be {spec.metadata['rule']}")
            if spec.metadata["kind"] is float and value is not None:
                object.__setattr__(self, spec.name, float(value))
        self._refuse_ignored()

    def _refuse_ignored(self) -> None:
        """Combinations where a setting would have no effect raise, naming it."""
        if self.tau_quantile is not None and self.tau != DEFAULT_TAU:
            raise ValueError(
                f"tau={self.tau!r} has no effect with tau_quantile={self.tau_quantile!r}, "
                "which sets each label's threshold: give one of them (tau_quantile=None "
                "to use tau)"
            )
        if self.semantic_weight == 0.0:
            defaults = SemsoftConfig.__dataclass_fields__
            for name in VOTE_SETTINGS:
                value, default = getattr(self, name), defaults[name].default
                if value != default:
                    raise ValueError(
                        f"{name}={value!r} has no effect at semantic_weight=0 (the scores "
                        f"are then the constrained softmax): leave {name} at its default "
                        f"{default!r}, or set semantic_weight > 0 (e.g. preset 'pooled')"
                    )

    @classmethod
    def preset(cls, name: str) -> SemsoftConfig:
        """A named set of settings (`PRESETS`); change fields with [`replace`][semsoft_plugin.core.config.SemsoftConfig.replace].

        `"constrained"` is the default (the constrained softmax); `"pooled"` the
        semantic pool, label-free (`semantic_weight = 0.3`; docs/defaults.md says on
        which kinds of data it helps); `"paper"` the paper's exact formula (raw
        cosines, no own-vote rule, per-label votes, the semantic distribution alone);
        `"shared"` the project's first default (until 0.2: centred cosines at
        `tau = 0`, own votes, every kept token's whole mass shared out);
        `"silent-vote"` the per-row pool, each row's weight decided by its own silent
        vote (the `silent_vote` field; docs/defaults.md says where it helps).
        """
        if not isinstance(name, str) or name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
        return cls(**PRESETS[name])

    def replace(self, **changes: Any) -> SemsoftConfig:
        """A copy with some fields changed. `None` is a value: `tau_quantile=None`
        resets it, and `None` for a field that cannot be `None` is refused."""
        names = {f.name for f in dataclasses.fields(self)}
        for name in sorted(set(changes) - names):
            raise ValueError(
                renamed_message(name)
                or f"unknown Semantic Softmax option {name!r}; known: {', '.join(sorted(names))}"
            )
        return dataclasses.replace(self, **changes) if changes else self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> SemsoftConfig:
        """Read a config file written by `save` or `semsoft tune`."""
        return cls.from_dict(read_config_file(path), f"config file {path}")

    @classmethod
    def from_dict(cls, data: Any, source: str) -> SemsoftConfig:
        """The config a file's JSON object holds (a `comment` key is ignored, a fit's
        `"fit_policy"` record is checked; an unknown or refused field raises `ValueError`
        naming `source`)."""
        if not isinstance(data, dict):
            raise ValueError(f"{source} must hold a JSON object")
        if POLICY_KEY in data:  # the record of how a fit was made: checked, not a setting
            from semsoft_plugin.core.fit_policy import FitPolicy

            FitPolicy.from_dict(data[POLICY_KEY], source)
        fields = {key: value for key, value in data.items() if key not in ("comment", POLICY_KEY)}
        try:
            return cls().replace(**fields)
        except ValueError as error:
            raise ValueError(f"{source}: {error}") from None


def read_file_bytes(path: str | Path, what: str) -> bytes:
    """A regular file's bytes, every way of failing one line naming the file: missing, a
    folder, not a regular file (a FIFO or a device would block or never end), a link
    loop or no permission.

    Parameters
    ----------
    path : str or Path
        The file.
    what : str
        What the file is, for the messages.

    Returns
    -------
    bytes
        Its content.
    """
    path = Path(path)
    try:
        mode = path.stat().st_mode
        if stat.S_ISDIR(mode):
            raise ValueError(f"{what} {path} is a folder, not a file")
        if not stat.S_ISREG(mode):
            raise ValueError(
                f"{what} {path} is not a regular file (a FIFO, socket or device, which a "
                "read could wait on for ever): give a file"
            )
        return path.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{what} not found: {path}") from None
    except OSError as error:  # a link loop (ELOOP), no permission
        raise ValueError(f"{what} {path} cannot be read ({error.strerror or error})") from None


def read_config_bytes(path: str | Path, what: str = "config file") -> tuple[Any, bytes]:
    """A JSON file's value and its bytes, every way of failing one line naming the file.

    Parameters
    ----------
    path : str or Path
        The file.
    what : str
        What the file is, for the messages.

    Returns
    -------
    tuple
        The parsed value and the raw bytes (hashed by the settings record).

    Raises
    ------
    ValueError
        For a missing file, a folder, a link loop or an unreadable file, bytes that are
        not UTF-8, text that is not JSON, a `NaN` or `Infinity` constant, or nesting
        too deep to read.
    """
    path = Path(path)
    data = read_file_bytes(path, what)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{what} {path} is not UTF-8 text (byte 0x{data[error.start]:02x} at offset "
            f"{error.start}): not a JSON file"
        ) from None

    def constant(name: str) -> Any:
        raise ValueError(f"{what} {path} holds {name}, which is not a number JSON allows")

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for key, value in pairs:
            if key in found:  # readers disagree on which one wins: never guess
                raise ValueError(f"{what} {path} holds the key {key!r} twice: keep one")
            found[key] = value
        return found

    try:
        value = json.loads(text, parse_constant=constant, object_pairs_hook=unique)
    except json.JSONDecodeError as error:
        raise ValueError(f"{what} {path} is not valid JSON: {error}") from None
    except RecursionError:
        raise ValueError(f"{what} {path} is nested too deep to be a config") from None
    return value, data


def read_config_file(path: str | Path) -> Any:
    """A config file's JSON value (`read_config_bytes`, without the bytes).

    Parameters
    ----------
    path : str or Path
        The file.

    Returns
    -------
    Any
        The parsed value.
    """
    return read_config_bytes(path)[0]


PRESETS: Mapping[str, Mapping[str, Any]] = {
    "constrained": {},
    "pooled": {"semantic_weight": POOLED_SEMANTIC_WEIGHT},
    "paper": {"center": False, "own_vote": False, "vote": "per_label", "semantic_weight": 1.0},
    "shared": {"vote": "shared", "semantic_weight": 1.0},
    "silent-vote": {"semantic_weight": SILENT_VOTE_WEIGHT, "silent_vote": SILENT_VOTE_THRESHOLD},
}


def grid_entry(start: SemsoftConfig, changes: Mapping[str, Any]) -> SemsoftConfig:
    """`start.replace(**changes)` for a searched grid. An entry whose searched
    `semantic_weight` is 0 is the constrained softmax, where the vote settings have no
    effect and are refused unless default: there they go back to their defaults, the
    start's and the grid's alike (the scores are the same; the grid then holds that entry
    more than once). A grid that searches a vote setting at an unsearched weight 0 is
    refused as given (it would search nothing)."""
    if "semantic_weight" in changes and changes["semantic_weight"] == 0:
        defaults = SemsoftConfig()
        changes = {**changes, **{name: getattr(defaults, name) for name in VOTE_SETTINGS}}
    return start.replace(**changes)


def config_field_specs() -> dict[str, Mapping[str, Any]]:
    """The table: field name -> its metadata (`kind`, `rule`, `ok`, `help`, and
    `choices` / `nullable` where they apply), in field order."""
    return {f.name: f.metadata for f in dataclasses.fields(SemsoftConfig)}
