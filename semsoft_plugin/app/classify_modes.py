"""Which `semsoft classify` flags apply to which mode, checked before any model loads.

`semsoft classify` runs in one of three modes: one text (`TEXT`), a file
(`--input FILE --output FILE`, in this process) or a Ray job (`--input ... --ray`).
A flag that has no effect in the mode given is refused, naming the flag and the mode,
rather than ignored: a user who passes `--output-format jsonl` without `--ray` gets
a one-line refusal instead of a CSV.

Whether a flag was given is read from its value: every flag of the table below has the
default `None` in the parser (a `store_true` flag too), and its real default is
filled in by `fill_defaults` once the check passed. So a flag given with its
default value (`--batch-size 8` with one text) is refused like any other.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = [
    "FILE",
    "FLAG_DEFAULTS",
    "FLAG_MODES",
    "ONE_TEXT",
    "RAY",
    "check_mode_flags",
    "classify_mode",
    "fill_defaults",
]

ONE_TEXT = "one text"
FILE = "a file (--input without --ray)"
RAY = "--ray"

# Parser destination -> the modes in which the flag has an effect.
FLAG_MODES: dict[str, tuple[str, ...]] = {
    "json": (ONE_TEXT,),
    "output": (FILE, RAY),
    "text_column": (FILE, RAY),
    "column_prefix": (FILE, RAY),
    "review_below": (FILE, RAY),
    "batch_size": (FILE, RAY),
    "overwrite": (FILE, RAY),
    "encoding": (FILE,),
    "resume": (FILE,),
    "max_text_tokens": (ONE_TEXT, FILE),
    "ray_address": (RAY,),
    "concurrency": (RAY,),
    "num_cpus": (RAY,),
    "num_gpus": (RAY,),
    "output_format": (RAY,),
    "id_column": (RAY,),
}

# The value a flag of FLAG_MODES takes when it is not given.
FLAG_DEFAULTS: dict[str, Any] = {
    "json": False,
    "text_column": "text",
    "column_prefix": "",
    "review_below": 0.6,
    "batch_size": 8,
    "overwrite": False,
    "encoding": "utf-8",
    "resume": False,
    "concurrency": 1,
    "output_format": "parquet",
}

# The formats ``--output-format`` names, and the suffixes each writes.
_FORMAT_SUFFIXES = {
    "parquet": (".parquet",),
    "csv": (".csv",),
    "jsonl": (".jsonl", ".ndjson"),
}
_TABLE_SUFFIXES = (".parquet", ".csv", ".tsv", ".tab", ".jsonl", ".ndjson")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def classify_mode(args: argparse.Namespace) -> str:
    """The mode the arguments ask for: `ONE_TEXT`, `FILE` or `RAY`.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed `semsoft classify` arguments.

    Returns
    -------
    str
        The mode's name, as the refusals print it.
    """
    if getattr(args, "input", None) is None:
        return ONE_TEXT
    return RAY if getattr(args, "ray", False) else FILE


def check_mode_flags(args: argparse.Namespace) -> str:
    """Refuse each flag given that has no effect in the arguments' mode, and an
    `--output-format` that contradicts `--output`'s suffix.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed arguments, before `fill_defaults` (a flag not given is `None`).

    Returns
    -------
    str
        The mode (`classify_mode`).

    Raises
    ------
    ValueError
        Naming the first flag that does not apply and the mode, or the contradicting
        format and suffix.
    """
    mode = classify_mode(args)
    if getattr(args, "ray", None) and getattr(args, "input", None) is None:
        raise ValueError("--ray goes with --input DIR_OR_FILE")
    for dest, modes in FLAG_MODES.items():
        value = getattr(args, dest, None)
        if value is None or mode in modes:
            continue
        shown = "" if value is True else f" {value}"
        where = " or ".join(modes)
        raise ValueError(
            f"{_flag(dest)}{shown} does not apply to {mode}: it has an effect only with {where}"
        )
    kind, output = getattr(args, "output_format", None), getattr(args, "output", None)
    if kind is not None and output:
        suffix = Path(output).suffix.lower()
        if suffix in _TABLE_SUFFIXES and suffix not in _FORMAT_SUFFIXES[kind]:
            raise ValueError(
                f"--output-format {kind} contradicts --output {output} (a {suffix} name): "
                f"name the output folder without a table suffix, or give --output-format "
                f"{suffix.lstrip('.')}"
            )
    return mode


def fill_defaults(args: argparse.Namespace) -> None:
    """Give each flag of `FLAG_DEFAULTS` not given its default value, in place (after
    `check_mode_flags`).

    Parameters
    ----------
    args : argparse.Namespace
        The parsed arguments.
    """
    for dest, value in FLAG_DEFAULTS.items():
        if getattr(args, dest, None) is None:
            setattr(args, dest, value)
