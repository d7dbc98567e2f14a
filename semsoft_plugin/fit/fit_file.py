"""The fit file: a fitted correction is input too, checked whole when it is read.

`Classifier.save_fit` and `semsoft tune --output` write, and `Classifier.load_fit`,
`semsoft classify --config` and the Outlines `load_fit` read, one JSON file: the
[`SemsoftConfig`][semsoft_plugin.core.config.SemsoftConfig] fields, and under `"fitted"`
(`FITTED_KEYS`) what the fit was made on and what it adds. It is untrusted input: a file
edited by hand, copied beside another model, or written by an older version is refused,
by name, before any engine starts. A run is checked against it field by field
(`FitIdentity`; the model by its output layer's bytes, `output_layer_sha256`), and a
probe's weights are read only from the fit's own folder (`probe_file_name`), checked
against `probe_sha256`. The block key by key, and what each check refuses:
docs/few-labels.md ("The fit file").
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from semsoft_plugin.core.labels import label_names
from semsoft_plugin.core.text_rules import code_points

__all__ = [
    "FITTED_KEYS",
    "FIT_FORMAT",
    "UPGRADABLE_FORMATS",
    "UPGRADE_COMMAND",
    "MEMBERS",
    "FitIdentity",
    "file_sha256",
    "output_layer_sha256",
    "probe_file_name",
]

FIT_FORMAT = 4
# What each older format lacks; `semsoft upgrade-fit` rewrites such a file (a format-3 file
# then records no policy: the policy it ran under was never saved).
UPGRADABLE_FORMATS = (2, 3)
_LACKS = {
    2: "which does not pin its probe file's bytes",
    3: "which does not record the fit's policy",
}
UPGRADE_COMMAND = "semsoft upgrade-fit"
OFFSET_MEMBERS = ("offset", "batch", "contextual")
MEMBERS = (*OFFSET_MEMBERS, "probe")
_ALL = MEMBERS

# key -> (the members whose file holds it, what it is)
FITTED_KEYS: dict[str, tuple[tuple[str, ...], str]] = {
    "format": (_ALL, f"the fit file's format, {FIT_FORMAT}"),
    "procedure": (_ALL, "the member that won"),
    "labels": (_ALL, "the labels, in the prompt's order"),
    "prompt": (_ALL, "the prompt template: user, answer_prefix, system"),
    "output_layer": (_ALL, "sha256 of the checkpoint's output layer, as stored"),
    "offset": (OFFSET_MEMBERS, "one finite log-offset per label"),
    "probe": (("probe",), "the probe's weights file, beside the fit"),
    "probe_sha256": (("probe",), "sha256 of the probe file's bytes"),
}
PROMPT_KEYS = ("user", "answer_prefix", "system")


def probe_file_name(fit_path: str | Path) -> str:
    """The name of a fit's probe weights, made from the fit file's whole name.

    Parameters
    ----------
    fit_path : str or Path
        The fit file.

    Returns
    -------
    str
        `NAME.probe.safetensors` for the fit file `NAME` (`fit.json` gives
        `fit.json.probe.safetensors`), in the fit's folder.
    """
    return f"{Path(fit_path).name}.probe.safetensors"


def file_sha256(data: bytes) -> str:
    """The sha256 of a fit file's bytes (what a settings record names the fit by).

    Parameters
    ----------
    data : bytes
        The file's content.

    Returns
    -------
    str
        The hex digest.
    """
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class FitIdentity:
    """What a fit was made on, and what a run that applies it must match.

    Attributes
    ----------
    labels : tuple of str
        The labels, in the prompt's order.
    prompt : dict
        The prompt template's `user`, `answer_prefix` and `system`.
    output_layer : str
        sha256 of the checkpoint's output layer as stored (`output_layer_sha256`).
    hidden_size : int or None
        A run's: the width of its model's output layer, which a probe must read (a
        fit's probe carries its own; not written in the file).
    """

    labels: tuple[str, ...]
    prompt: dict[str, Any]
    output_layer: str
    hidden_size: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The identity's keys of the `"fitted"` block.

        Returns
        -------
        dict
            `labels`, `prompt` and `output_layer`.
        """
        return {
            "labels": list(self.labels),
            "prompt": {key: self.prompt.get(key) for key in PROMPT_KEYS},
            "output_layer": self.output_layer,
        }

    def check_run(self, run: FitIdentity, source: str) -> None:
        """Refuse a run that does not match the fit, naming both sides.

        Parameters
        ----------
        run : FitIdentity
            The run's labels, prompt and output layer.
        source : str
            The fit file, for the message.

        Raises
        ------
        ValueError
            When the labels (compared after NFC, in order), the prompt or the output
            layer differ.
        """
        import unicodedata

        def nfc(names: tuple[str, ...]) -> list[str]:
            return [unicodedata.normalize("NFC", name) for name in names]

        if nfc(self.labels) != nfc(run.labels):
            if sorted(nfc(self.labels)) == sorted(nfc(run.labels)):
                raise ValueError(
                    f"{source} was fitted with the labels in the order {list(self.labels)}, "
                    f"this run gives {list(run.labels)}: the offsets and the prompt follow "
                    "the order; give the labels in the fit's order, or fit again"
                )
            theirs = ", ".join(code_points(name) for name in self.labels)
            ours = ", ".join(code_points(name) for name in run.labels)
            raise ValueError(
                f"{source} was fitted for the labels {theirs}; this run gives {ours}: fit "
                "again for these labels"
            )
        for key in PROMPT_KEYS:
            fitted, now = self.prompt.get(key), run.prompt.get(key)
            if fitted != now:
                flag = {"user": "--prompt", "answer_prefix": "--answer-prefix"}.get(key, key)
                raise ValueError(
                    f"{source} was fitted with the prompt's {key} {fitted!r:.120}; this run "
                    f"has {now!r:.120} ({flag}): a correction holds only for the prompt it "
                    "was fitted on; give that prompt, or fit again"
                )
        if self.output_layer != run.output_layer:
            raise ValueError(
                f"{source} was fitted on a model whose output layer has sha256 "
                f"{self.output_layer[:16]}..., this run's model has {run.output_layer[:16]}...: "
                "another model's correction does not hold; fit again on this model"
            )


def checked_identity(fitted: dict[str, Any], source: str) -> FitIdentity:
    """The identity a `"fitted"` block records, every field checked.

    Parameters
    ----------
    fitted : dict
        The block (its keys already checked against `FITTED_KEYS`).
    source : str
        The fit file, for the messages.

    Returns
    -------
    FitIdentity
        The labels, prompt and output layer the fit was made on.
    """
    labels = fitted["labels"]
    if not isinstance(labels, list) or not all(isinstance(name, str) for name in labels):
        raise ValueError(f"{source}: 'fitted.labels' must be a list of label names")
    label_names(labels)  # the labels' own rules: not empty, no twins, two at least
    prompt = fitted["prompt"]
    if not isinstance(prompt, dict):
        raise ValueError(f"{source}: 'fitted.prompt' must be an object ({', '.join(PROMPT_KEYS)})")
    unknown = sorted(set(prompt) - set(PROMPT_KEYS))
    missing = [key for key in PROMPT_KEYS if key not in prompt]
    if unknown or missing:
        raise ValueError(
            f"{source}: 'fitted.prompt' must hold exactly {', '.join(PROMPT_KEYS)}"
            + (f"; unknown: {', '.join(unknown)}" if unknown else "")
            + (f"; missing: {', '.join(missing)}" if missing else "")
        )
    for key in PROMPT_KEYS:
        value = prompt[key]
        if not (isinstance(value, str) or (key == "system" and value is None)):
            raise ValueError(f"{source}: 'fitted.prompt.{key}' = {value!r:.60} is not a string")
    layer = fitted["output_layer"]
    if not (isinstance(layer, str) and len(layer) == 64 and all(c in "0123456789abcdef" for c in layer)):
        raise ValueError(f"{source}: 'fitted.output_layer' = {layer!r:.80} is not a sha256 hex digest")
    return FitIdentity(tuple(labels), dict(prompt), layer)


def checked_block_keys(fitted: Any, source: str, path: str | Path = "FIT.json") -> str:
    """The member a `"fitted"` block names, its keys checked against `FITTED_KEYS`.

    Parameters
    ----------
    fitted : Any
        The `"fitted"` value of the file.
    source : str
        The fit file, for the messages.
    path : str or Path
        The fit file's path, for the command that rewrites an older format.

    Returns
    -------
    str
        The member (`procedure`).

    Raises
    ------
    ValueError
        For a file written before this format (refit), an unknown member, an unknown or
        missing key.
    """
    if not isinstance(fitted, dict):
        raise ValueError(f"{source}: 'fitted' must be an object")
    if "format" not in fitted:
        raise ValueError(
            f"{source} was written by an older version, which did not record the labels, "
            "prompt and model the fit was made on: fit again (Classifier.fit and save_fit, "
            "or semsoft tune)"
        )
    if fitted["format"] in UPGRADABLE_FORMATS and not isinstance(fitted["format"], bool):
        raise ValueError(
            f"{source}: fit file format {fitted['format']}, {_LACKS[fitted['format']]}; this "
            f"version reads format {FIT_FORMAT}: rewrite it with `{UPGRADE_COMMAND} {path}` "
            "(it records a probe file as it is now), or fit again"
        )
    if fitted["format"] != FIT_FORMAT or isinstance(fitted["format"], bool):
        raise ValueError(
            f"{source}: fit file format {fitted['format']!r:.40}; this version reads format "
            f"{FIT_FORMAT}: fit again"
        )
    procedure = fitted.get("procedure")
    if procedure not in MEMBERS:
        raise ValueError(
            f"{source}: 'fitted.procedure' {procedure!r:.60} is not a member of the fit "
            f"family that carries a correction ({', '.join(MEMBERS)})"
        )
    wanted = [key for key, (members, _) in FITTED_KEYS.items() if procedure in members]
    unknown = sorted(set(fitted) - set(wanted))
    if unknown:
        raise ValueError(
            f"{source}: unknown key(s) {', '.join(map(repr, unknown))} in 'fitted' (a "
            f"{procedure!r} fit holds {', '.join(wanted)})"
        )
    missing = [key for key in wanted if key not in fitted]
    if missing:
        raise ValueError(f"{source}: a {procedure!r} fit lacks {', '.join(missing)} in 'fitted'")
    return str(procedure)


def checked_offset(value: Any, n_labels: int, source: str) -> tuple[float, ...]:
    """A bias member's offsets: a list of one finite number per label.

    Parameters
    ----------
    value : Any
        `fitted.offset` as read.
    n_labels : int
        The labels the fit records.
    source : str
        The fit file, for the messages.

    Returns
    -------
    tuple of float
        The offsets.
    """
    if not isinstance(value, list) or len(value) != n_labels:
        raise ValueError(
            f"{source}: 'fitted.offset' must be a list of {n_labels} numbers, one per label"
        )
    for index, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, int | float):
            raise ValueError(f"{source}: 'fitted.offset'[{index}] = {item!r:.40} is not a number")
        if not math.isfinite(item):
            raise ValueError(f"{source}: 'fitted.offset'[{index}] = {item} is not finite")
    return tuple(float(item) for item in value)


def probe_path(fit_path: Path, value: Any) -> Path:
    """The probe file a fit names, inside the fit's folder only.

    Parameters
    ----------
    fit_path : Path
        The fit file.
    value : Any
        `fitted.probe` as read.

    Returns
    -------
    Path
        The probe's weights file.

    Raises
    ------
    ValueError
        For a name that is not a plain file name (absolute, with a folder, `..`) or
        one that leads out of the fit's folder through a link.
    """
    if not isinstance(value, str) or not value:
        raise ValueError(f"{fit_path}: 'fitted.probe' must be a file name")
    name = Path(value)
    if name.is_absolute() or len(name.parts) != 1 or value in (".", "..") or "\\" in value:
        raise ValueError(
            f"{fit_path}: 'fitted.probe' {value!r:.80} must name a file in the fit's own "
            "folder (no folder, no absolute path)"
        )
    folder = fit_path.parent.resolve()
    path = fit_path.parent / value
    if path.resolve().parent != folder:
        raise ValueError(f"{fit_path}: 'fitted.probe' {value!r:.80} leads out of the fit's folder")
    return path


_OUTPUT_NAMES = ("lm_head.weight", "embed_out.weight", "output.weight")
_TIED_SUFFIXES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight")
_LAYER_CACHE: dict[tuple[str, int, int], str] = {}


def _output_layer(folder: Path) -> tuple[Path, str]:
    """The safetensors file and tensor name of a checkpoint's output layer: `lm_head`
    where it has one, else the tied input embedding."""
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{folder}: no safetensors weights, so its output layer cannot be hashed")
    for wanted in (_OUTPUT_NAMES, _TIED_SUFFIXES):
        for file in files:
            with safe_open(str(file), framework="pt") as handle:
                name = next((k for k in handle.keys() if k in wanted or k.endswith(wanted)), None)
            if name is not None:
                return file, name
    raise ValueError(f"{folder}: no output layer ({', '.join(_OUTPUT_NAMES)}) in its weights")


def output_layer_sha256(checkpoint: str | Path) -> str:
    """sha256 of a checkpoint's output layer as its safetensors files store it.

    The tensor is `lm_head.weight` where the checkpoint has one, else the tied input
    embedding (`*.embed_tokens.weight`); the digest covers its name, stored dtype,
    shape and bytes, read in slices (no copy of the whole layer). It does not depend on
    the dtype a model is loaded in, nor on the name the checkpoint was found by.

    Parameters
    ----------
    checkpoint : str or Path
        A checkpoint directory holding `*.safetensors` files.

    Returns
    -------
    str
        The hex digest.

    Raises
    ------
    ValueError
        When the directory holds no safetensors file or none holds an output layer.
    """
    import torch
    from safetensors import safe_open

    file, name = _output_layer(Path(checkpoint))
    stat = file.stat()
    key = (str(file.resolve()), stat.st_size, int(stat.st_mtime_ns))
    if key in _LAYER_CACHE:
        return _LAYER_CACHE[key]
    digest = hashlib.sha256()
    with safe_open(str(file), framework="pt") as handle:
        tensor = handle.get_slice(name)
        shape = tensor.get_shape()
        digest.update(json.dumps([name, str(tensor.get_dtype()), shape]).encode())
        rows = max(1, (64 << 20) // max(1, int(math.prod(shape[1:])) * 4))
        for start in range(0, shape[0], rows):
            part = tensor[start : start + rows].contiguous()
            digest.update(part.view(torch.uint8).numpy().tobytes())
    _LAYER_CACHE[key] = digest.hexdigest()
    return _LAYER_CACHE[key]


def output_layer_width(checkpoint: str | Path) -> int:
    """The width of a checkpoint's output layer (the hidden size a probe reads), read
    from its safetensors header (the layer `output_layer_sha256` hashes).

    Parameters
    ----------
    checkpoint : str or Path
        A checkpoint directory holding `*.safetensors` files.

    Returns
    -------
    int
        The layer's second dimension.
    """
    from safetensors import safe_open

    file, name = _output_layer(Path(checkpoint))
    with safe_open(str(file), framework="pt") as handle:
        return int(handle.get_slice(name).get_shape()[1])
