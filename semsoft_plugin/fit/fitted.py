"""What a few-label fit adds on top of its settings, applied to each row alone, and the
config file that carries it (`Classifier.fit`, `semsoft tune`, `semsoft classify
--config`).

A fit ([`semsoft_plugin.fit.fit_family`][semsoft_plugin.fit.fit_family]) gives a
[`SemsoftConfig`][semsoft_plugin.core.config.SemsoftConfig] and, where a bias member or the
probe won, a correction no config field can hold: a per-label log-offset (`"offset"`,
`"batch"`, `"contextual"`: `softmax(log p + offset)`) or the probe on the decision step's
hidden state (`semsoft_plugin.fit.probe.LinearProbe`). Both are fixed numbers estimated
once on the labelled rows, so a row's score never depends on the rows beside it. The file
is the config JSON with one more key, `"fitted"` (its schema and checks:
`semsoft_plugin.fit.fit_file`); a plain `SemsoftConfig.load` refuses a file with it by name
rather than drop the correction. An example file: docs/few-labels.md ("The fit file").
"""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from semsoft_plugin.core.config import (
    POLICY_KEY,
    SemsoftConfig,
    read_config_bytes,
    read_file_bytes,
)
from semsoft_plugin.core.fit_policy import FitPolicy
from semsoft_plugin.core.text_rules import code_points
from semsoft_plugin.fit.fit_file import (
    FIT_FORMAT,
    UPGRADABLE_FORMATS,
    FitIdentity,
    checked_block_keys,
    checked_identity,
    checked_offset,
    file_sha256,
    probe_file_name,
    probe_path,
)

if TYPE_CHECKING:
    import numpy as np

    from semsoft_plugin.fit.probe import LinearProbe

__all__ = ["FitFile", "FittedCorrection", "read_fit", "save_fitted", "upgrade_fit"]

_KEY = "fitted"
_OFFSET_MEMBERS = ("offset", "batch", "contextual")


def _nfc(name: str) -> str:
    return unicodedata.normalize("NFC", name)


@dataclass(frozen=True)
class FittedCorrection:
    """A fit's correction after its config (module docstring).

    Attributes
    ----------
    procedure : str
        The family member that won (`"offset"`, `"batch"`, `"contextual"`
        or `"probe"`)
    labels : tuple[str, ...]
        The label names, the column order of `offset` and of the probe
    offset : tuple[float, ...] | None
        Per-label log-offsets (a bias member), else None
    probe : LinearProbe | None
        The probe (`"probe"`), else None
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
        """`ValueError` unless `names` are the fitted labels (any order; compared
        after NFC, as labels are, so a fit saved with NFD labels serves NFC ones)."""
        if sorted(map(_nfc, names)) != sorted(map(_nfc, self.labels)):
            theirs = ", ".join(code_points(name) for name in self.labels)
            ours = ", ".join(code_points(name) for name in names)
            raise ValueError(
                f"the fitted correction ({self.procedure}) is for the labels {theirs}, not "
                f"{ours}: fit again for these labels"
            )

    def apply(self, probs: np.ndarray, classes: Any, hidden: Any = None) -> np.ndarray:
        """`[N, L]` probabilities in `classes` order, corrected row by row (`hidden`:
        `[N, H]`, needed by the probe)."""
        import numpy as np

        self.check_labels(classes)
        fitted = [_nfc(name) for name in self.labels]
        order = [fitted.index(_nfc(c)) for c in classes]
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


@dataclass(frozen=True)
class FitFile:
    """A config file as read and checked whole (`read_fit`).

    Attributes
    ----------
    path : Path
        The file.
    config : SemsoftConfig
        Its settings.
    correction : FittedCorrection or None
        Its correction; None for a plain config file.
    identity : FitIdentity or None
        What the fit was made on (labels, prompt, output layer); None for a plain
        config file.
    sha256 : str
        The sha256 of the fit's bytes: the file's, then its probe file's (what a
        settings record names the fit by, so `--resume` refuses either changed).
    policy : FitPolicy or None
        The policy the fit ran under (`"fit_policy"`); None where the file records none
        (a hand-written config, a fit from before format 4).
    """

    path: Path
    config: SemsoftConfig
    correction: FittedCorrection | None
    identity: FitIdentity | None
    sha256: str
    policy: FitPolicy | None = None

    def check_run(self, run: FitIdentity | None) -> None:
        """Refuse a run that does not match the fit (nothing to check for a plain
        config, or without a run to check).

        Parameters
        ----------
        run : FitIdentity or None
            The run's labels, prompt and output layer.
        """
        if self.identity is not None and run is not None:
            self.identity.check_run(run, f"fit file {self.path}")
            probe = None if self.correction is None else self.correction.probe
            if probe is not None and run.hidden_size is not None:
                if len(probe.mean) != run.hidden_size:
                    raise ValueError(
                        f"fit file {self.path}: its probe reads hidden states of size "
                        f"{len(probe.mean)}, this model's are {run.hidden_size}"
                    )


def save_fitted(
    path: str | Path,
    config: SemsoftConfig,
    correction: FittedCorrection | None,
    identity: FitIdentity | None = None,
    policy: FitPolicy | None = None,
) -> None:
    """Write `config` and, if given, `correction` with what it was fitted on, and the
    policy the fit ran under.

    Parameters
    ----------
    path : str or Path
        The fit file (JSON). A probe's weights go beside it, to
        `probe_file_name(path)` (`fit.json.probe.safetensors`).
    config : SemsoftConfig
        The fitted settings.
    correction : FittedCorrection or None
        The correction a bias member or the probe adds; None writes a plain config.
    identity : FitIdentity or None
        The labels, prompt and output layer the fit was made on; needed with a
        correction.
    policy : FitPolicy or None
        The fit's policy (`FitResult.policy`), recorded as `"fit_policy"`.
    """
    path = Path(path)
    data: dict[str, Any] = config.to_dict()
    if policy is not None:
        data[POLICY_KEY] = policy.to_dict()
    if correction is not None:
        if identity is None:
            raise ValueError(
                "a fitted correction is saved with the labels, prompt and model it was "
                "fitted on (identity=FitIdentity(...))"
            )
        if tuple(identity.labels) != tuple(correction.labels):
            raise ValueError(
                f"the correction's labels {list(correction.labels)} are not the fit's "
                f"{list(identity.labels)}"
            )
        probe_file = None
        block = {"format": FIT_FORMAT, "procedure": correction.procedure, **identity.to_dict()}
        if correction.probe is not None:
            probe_file = probe_file_name(path)
            correction.probe.save(path.parent / probe_file, correction.labels)
            block["probe_sha256"] = file_sha256((path.parent / probe_file).read_bytes())
        block.update(correction.to_dict(probe_file))
        data[_KEY] = block
    path.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")


def read_fit(path: str | Path) -> FitFile:
    """A config file, checked whole: its settings and, under `"fitted"`, the
    correction and what it was fitted on (`semsoft_plugin.fit.fit_file`).

    Parameters
    ----------
    path : str or Path
        The file (`save_fit`'s, `semsoft tune`'s, or a plain config file).

    Returns
    -------
    FitFile
        The checked file.

    Raises
    ------
    ValueError
        One line naming the file and the bad value: unreadable, not JSON, a file from
        before this format, an unknown member or key, a number not finite, an array of
        the wrong shape, a probe outside the fit's folder.
    """
    path = Path(path)
    data, raw = read_config_bytes(path)
    source = f"config file {path}"
    policy = None
    if isinstance(data, dict) and POLICY_KEY in data:
        policy = FitPolicy.from_dict(data.pop(POLICY_KEY), source)
    if not isinstance(data, dict) or _KEY not in data:
        config = SemsoftConfig.from_dict(data, source)
        return FitFile(path, config, None, None, file_sha256(raw), policy)
    fitted = data.pop(_KEY)
    config = SemsoftConfig.from_dict(data, source)
    procedure = checked_block_keys(fitted, source, path)
    identity = checked_identity(fitted, source)
    labels = identity.labels
    probe = offset = None
    unit = raw
    if procedure == "probe":
        from semsoft_plugin.fit.probe import LinearProbe

        where = probe_path(path, fitted["probe"])
        probe_bytes = read_file_bytes(where, "probe weights")
        found = file_sha256(probe_bytes)
        if found != fitted["probe_sha256"]:
            raise ValueError(
                f"{where}: the probe file has sha256 {found[:16]}..., the fit {path.name} "
                f"recorded {str(fitted['probe_sha256'])[:16]}...: it was replaced or edited "
                "after the fit was saved (a fit and its probe are one unit); fit again"
            )
        probe, probe_labels = LinearProbe.from_bytes(probe_bytes, str(where))
        if tuple(probe_labels) != labels:
            raise ValueError(f"{where}: the probe's labels {probe_labels} are not {list(labels)}")
        unit = raw + probe_bytes
    else:
        offset = checked_offset(fitted["offset"], len(labels), source)
    correction = FittedCorrection(procedure, labels, offset, probe)
    return FitFile(path, config, correction, identity, file_sha256(unit), policy)


def upgrade_fit(path: str | Path) -> str:
    """Rewrite a fit file of an older format (`UPGRADABLE_FORMATS`) in this one: a probe
    fit records its probe file's sha256 as the file is now. The rewritten file is then
    read with `read_fit`, so a file this version would refuse for another reason is
    refused here too, and the original is left as it was.

    Parameters
    ----------
    path : str or Path
        The fit file.

    Returns
    -------
    str
        What was done, in one line.
    """
    path = Path(path)
    data, raw = read_config_bytes(path)
    fitted = data.get(_KEY) if isinstance(data, dict) else None
    if not isinstance(fitted, dict):
        raise ValueError(f"{path} holds no fitted correction: nothing to upgrade")
    if fitted.get("format") == FIT_FORMAT:
        read_fit(path)
        return f"{path} is already format {FIT_FORMAT}"
    if fitted.get("format") not in UPGRADABLE_FORMATS or isinstance(fitted.get("format"), bool):
        raise ValueError(
            f"{path}: fit file format {fitted.get('format')!r:.40} cannot be upgraded (only "
            f"{', '.join(map(str, UPGRADABLE_FORMATS))}): fit again"
        )
    old = fitted["format"]
    fitted["format"] = FIT_FORMAT
    pinned = ""
    if fitted.get("procedure") == "probe":
        where = probe_path(path, fitted.get("probe"))
        fitted["probe_sha256"] = file_sha256(read_file_bytes(where, "probe weights"))
        pinned = f"; its probe {where.name} pinned at sha256 {fitted['probe_sha256'][:16]}..."
    path.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")
    try:
        read_fit(path)
    except ValueError:
        path.write_bytes(raw)
        raise
    return f"{path}: format {old} rewritten as format {FIT_FORMAT}{pinned}"
