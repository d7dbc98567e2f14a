"""The settings record of a scored file, `OUTPUT.semsoft.json` beside it.

It holds everything besides the texts that changes a written value (model, labels,
prompt, configuration, batch size, the fit file's sha256 when `--config` holds a
fitted correction...), so that `--resume` can refuse to continue rows scored with
other settings, by name; a fingerprint of the input (`text_fingerprint` of every text
scored) and of the rows done so far (updated after each batch), so that `--resume`
refuses an input that changed under the done rows, or anywhere when `--calibrate
file`'s correction was estimated from the whole file; and, to reproduce a result, the
package version and the published sha256 of a known model's weights (not compared on
`--resume`: a checkpoint directory is not hashed, it can be gigabytes).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from semsoft_plugin.app.classify_args import file_strength
from semsoft_plugin.core.calibration import FileCalibration
from semsoft_plugin.core.config import renamed_message

__all__ = [
    "TextFingerprint",
    "check_fingerprints",
    "check_settings",
    "provenance",
    "recorded_calibration",
    "run_settings",
    "settings_path",
    "text_fingerprint",
    "write_settings",
]


def settings_path(output: str | Path) -> Path:
    """The sidecar of an output file: `OUTPUT.semsoft.json` beside it."""
    output = Path(output)
    return output.with_name(output.name + ".semsoft.json")


def run_settings(
    args: argparse.Namespace, labels: list[str], template: Any, config: Any
) -> dict[str, Any]:
    """What a file's rows were scored with, flattened to dotted names (`config.k`):
    everything besides the texts that changes a written value."""
    from semsoft_plugin.engines.models import default_dtype

    settings: dict[str, Any] = {
        "model": args.model,
        "backend": args.backend,
        "dtype": default_dtype() if args.dtype == "auto" else args.dtype,
        "engine_args": args.engine_args,
        "labels": labels,
        "batch_size": args.batch_size,
        "max_text_tokens": args.max_text_tokens,
        "review_below": args.review_below,
        "text_column": args.text_column,
        "column_prefix": args.column_prefix,
        "calibrate": getattr(args, "calibrate", None),
        "file_strength": file_strength(args),
    }
    if args.backend == "vllm":  # transformers' dtype does not apply; engine_args does
        settings["dtype"] = None
    settings.update({f"prompt.{k}": v for k, v in template.to_dict().items()})
    settings.update({f"config.{k}": v for k, v in config.to_dict().items()})
    # Through JSON and back: what is compared is what the sidecar holds.
    return dict(json.loads(json.dumps(settings)))


def check_settings(output: Path, settings: dict[str, Any]) -> None:
    """`--resume`: refuse to continue rows scored with other settings, by name."""
    sidecar = settings_path(output)
    try:
        recorded = json.loads(sidecar.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(
            f"--resume: {output} has no settings record {sidecar.name}, so its rows cannot be "
            "checked against this run's settings: pass --overwrite to score it again"
        ) from None
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"--resume: {sidecar} is not readable JSON ({error})") from None
    recorded = recorded.get("settings") if isinstance(recorded, dict) else None
    if not isinstance(recorded, dict):
        raise ValueError(f"--resume: {sidecar} holds no 'settings' object")
    for key in sorted(recorded):
        renamed = renamed_message(key.removeprefix("config.")) if key.startswith("config.") else None
        if renamed:
            raise ValueError(
                f"--resume: {sidecar} records config.{renamed} (an older version's "
                "option): the rows cannot be checked against this run's settings; pass "
                "--overwrite to score them again"
            )
    if recorded.get("fit") != settings.get("fit"):
        def short(digest: Any) -> str:
            return "none" if digest is None else f"sha256 {str(digest)[:16]}..."

        raise ValueError(
            f"--resume: the rows in {output} were scored with another fitted correction "
            f"(--config fit: {short(recorded.get('fit'))} then, {short(settings.get('fit'))} "
            "now); resume with the same fit file, or pass --overwrite"
        )
    differ = [
        k for k in sorted(set(recorded) | set(settings)) if recorded.get(k) != settings.get(k)
    ]
    if differ:
        shown = "; ".join(
            f"{k}: {json.dumps(recorded.get(k))} then, {json.dumps(settings.get(k))} now"
            for k in differ[:4]
        )
        raise ValueError(
            f"--resume: the rows in {output} were scored with other settings ({shown}); "
            "resume with the same settings, or pass --overwrite"
        )


def provenance(model: str) -> dict[str, Any]:
    """What identifies the code and weights beyond the settings: the package version
    and, for a known model name, its weights' published sha256 (None for a directory)."""
    from importlib.metadata import PackageNotFoundError, version

    from semsoft_plugin.engines.models import KNOWN_MODELS

    try:
        package = version("semsoft-plugin")
    except PackageNotFoundError:
        package = None
    source = KNOWN_MODELS.get(model)
    return {"semsoft_plugin": package, "model_sha256": source.sha256 if source else None}


class TextFingerprint:
    """A running sha256 of texts in order, each length-prefixed (so no two lists of
    texts share one): the fingerprint of the rows done grows with each batch written."""

    def __init__(self, texts: Sequence[str] = ()) -> None:
        self._digest = hashlib.sha256()
        self.rows = 0
        self.add(texts)

    def add(self, texts: Sequence[str]) -> None:
        """Take `texts` after those already in.

        Parameters
        ----------
        texts : sequence of str
            The next texts.
        """
        for text in texts:
            data = text.encode("utf-8", "surrogatepass")
            self._digest.update(len(data).to_bytes(8, "little") + data)
        self.rows += len(texts)

    def to_dict(self) -> dict[str, Any]:
        """The record's `{"rows", "sha256"}`.

        Returns
        -------
        dict
            How many texts, and their sha256.
        """
        return {"rows": self.rows, "sha256": self._digest.hexdigest()}


def text_fingerprint(texts: Sequence[str]) -> str:
    """sha256 of texts in order (`TextFingerprint`).

    Parameters
    ----------
    texts : sequence of str
        The texts.

    Returns
    -------
    str
        The hex digest.
    """
    return str(TextFingerprint(texts).to_dict()["sha256"])


def check_fingerprints(
    output: Path, texts: Sequence[str], *, whole: bool
) -> None:
    """`--resume`: refuse an input that changed since the recorded rows were scored.

    Parameters
    ----------
    output : Path
        The output being resumed.
    texts : sequence of str
        The texts the input gives now, in the order they are scored.
    whole : bool
        Compare the whole input (`--calibrate file`, whose correction is the mean of
        every text), not only the rows done.

    Raises
    ------
    ValueError
        Naming which changed: the rows already done, or the input the file correction
        was estimated from; or a record from before fingerprints (`--overwrite`).
    """
    sidecar = settings_path(output)
    record = json.loads(sidecar.read_text(encoding="utf-8"))
    done, scored = record.get("done"), record.get("input")
    if not isinstance(done, dict) or not isinstance(scored, dict):
        raise ValueError(
            f"--resume: {sidecar} holds no fingerprint of the input (an older version wrote "
            "it), so a changed input could not be told: pass --overwrite to score it again"
        )
    rows = done.get("rows")
    if not isinstance(rows, int) or rows > len(texts) or (
        text_fingerprint(texts[:rows]) != done.get("sha256")
    ):
        raise ValueError(
            f"--resume: the input changed under the {rows} row(s) already in {output} (their "
            "texts are not those scored): pass --overwrite to score the new input"
        )
    if whole and text_fingerprint(texts) != scored.get("sha256"):
        raise ValueError(
            f"--resume: the input changed since --calibrate file estimated its correction from "
            f"it ({scored.get('rows')} texts then, {len(texts)} now, or other texts): the "
            "recorded correction does not hold; pass --overwrite to score it again"
        )


def write_settings(
    output: Path,
    settings: dict[str, Any],
    made_with: dict[str, Any],
    file_calibration: FileCalibration | None = None,
    *,
    input_print: dict[str, Any] | None = None,
    done_print: dict[str, Any] | None = None,
) -> None:
    """Record the settings (and `provenance`) beside a new output, written whole
    to a staged file and then renamed over the old record. With `--calibrate file`
    the record is written again once the first pass has estimated the correction, which
    it then holds (`file_calibration`: bias in `--labels` order, the strength applied,
    rows, and whether the guard chose that strength from which mean top probability), so
    that `--resume` applies the same correction to the rows it adds, the guard's
    decision included. `input_print` and `done_print` (`{"rows", "sha256"}`,
    `text_fingerprint`) are the input's texts and the rows written so far."""
    sidecar = settings_path(output)
    staged = sidecar.with_name(sidecar.name + ".tmp")
    body: dict[str, Any] = {"semsoft_classify": 1, "settings": settings, "provenance": made_with}
    if file_calibration is not None:
        body["file_calibration"] = file_calibration.to_dict()
    if input_print is not None:
        body["input"] = input_print
    if done_print is not None:
        body["done"] = done_print
    staged.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(staged, sidecar)


def recorded_calibration(output: Path) -> FileCalibration | None:
    """The file correction recorded beside `output` (`None` if there is none: the
    first pass did not finish); read after `check_settings` passed."""
    sidecar = settings_path(output)
    record = json.loads(sidecar.read_text(encoding="utf-8")).get("file_calibration")
    if record is None:
        return None
    try:
        return FileCalibration.from_dict(record)
    except (TypeError, ValueError, KeyError) as error:
        raise ValueError(f"--resume: {sidecar} holds a bad file_calibration ({error})") from None
