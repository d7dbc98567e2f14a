"""The Semantic Softmax flags of `semsoft classify`, `eval` and `tune`, generated
from [`SemsoftConfig`][semsoft_plugin.core.config.SemsoftConfig]'s field table.

One flag per config field (`score_temperature` is `--score-temperature`, with the
field's help and rule), `--preset` and `--config` for the base the flags override,
and each old option name (`--temperature`, `--residual`, ...) refused with the new
one. `semsoft tune` reads the same flags as grid axes (comma-separated values over
the start), so a flag and the field it sets cannot drift apart.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from semsoft_plugin.core.config import (
    PRESETS,
    RENAMED,
    SemsoftConfig,
    config_field_specs,
    renamed_message,
)

__all__ = [
    "add_config_arguments",
    "config_from_args",
    "flag",
    "grid_from_args",
    "start_from_args",
]

_BOOLS = {"true": True, "false": False, "1": True, "0": False}


def flag(field: str) -> str:
    """The command-line spelling of a config field: `own_vote` -> `--own-vote`."""
    return "--" + field.replace("_", "-")


def _bool(text: str) -> bool:
    try:
        return _BOOLS[text.strip().lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"{text!r} is not true or false") from None


def _reader(spec: Mapping[str, Any]) -> Callable[[str], Any]:
    """How one value of a field is read from the command line (`none` resets a
    field that may be None, such as `tau_quantile`)."""
    kind = spec["kind"]
    if kind is bool:
        return _bool
    choices = spec.get("choices")

    def read(text: str) -> Any:
        if spec.get("nullable") and text.strip().lower() == "none":
            return None
        if choices is not None:
            if text not in choices:
                raise argparse.ArgumentTypeError(
                    f"{text!r} is not one of {', '.join(choices)}"
                )
            return text
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {spec['rule']}") from None

    return read


def _listed(read: Callable[[str], Any]) -> Callable[[str], tuple[Any, ...]]:
    def read_list(text: str) -> tuple[Any, ...]:
        return tuple(read(part.strip()) for part in text.split(","))

    return read_list


class _Renamed(argparse.Action):
    """An old flag: refused with the new one (hidden from `--help`)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        parser.error(str(renamed_message(self.dest, "--")))


def add_config_arguments(
    parser: argparse.ArgumentParser,
    *,
    grid: Mapping[str, Sequence[Any]] | None = None,
    skip: Sequence[str] = (),
) -> None:
    """Add `--preset`, `--config` and one flag per [`SemsoftConfig`][semsoft_plugin.core.config.SemsoftConfig] field.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The subcommand's parser
    grid : Mapping[str, Sequence[Any]] | None
        `None`: each flag overrides its field of the base (`classify`, `eval`).
        A mapping: each flag is a grid axis of comma-separated values over the start
        (`tune`), defaulting to the mapping's values for that field
    skip : Sequence[str]
        Fields with no flag (`tune`: `score_temperature`, fitted, not searched)
    """
    what = "the start of the fit" if grid is not None else "the settings"
    group = parser.add_argument_group(
        "Semantic Softmax settings (SemsoftConfig; a flag overrides its field of --preset "
        "or --config)"
        if grid is None
        else "Semantic Softmax grid axes (comma-separated values over the start; a field "
        "not given keeps the start's value)"
    )
    group.add_argument(
        "--preset",
        choices=tuple(PRESETS),
        help=f"a named SemsoftConfig as {what} (default: constrained)",
    )
    group.add_argument(
        "--config", help=f"a SemsoftConfig JSON file as {what} (e.g. from 'semsoft tune')"
    )
    for name, spec in config_field_specs().items():
        if name in skip:
            continue
        read = _reader(spec)
        choices = spec.get("choices")
        metavar = (
            "|".join(choices) if choices else "true|false" if spec["kind"] is bool
            else spec["kind"].__name__.upper()
        )  # fmt: skip
        if grid is None:
            # Not set unless given, so that "--tau-quantile none" (None) is a value.
            group.add_argument(
                flag(name), dest=name, type=read, metavar=metavar, default=argparse.SUPPRESS,
                help=f"{spec['help']} ({spec['rule']})",
            )  # fmt: skip
            continue
        values = grid.get(name)
        group.add_argument(
            flag(name), dest=name, type=_listed(read), metavar=f"{metavar},...",
            default=None if values is None else tuple(values),
            help=f"{spec['help']}"
            + (f"; default {','.join(str(v).lower() for v in values)}" if values else ""),
        )  # fmt: skip
    for old in RENAMED:
        group.add_argument(flag(old), dest=old, nargs="?", action=_Renamed, help=argparse.SUPPRESS)


def check_one_base(args: argparse.Namespace) -> None:
    """`--preset` and `--config` both give the base settings: refuse the pair."""
    preset, path = getattr(args, "preset", None), getattr(args, "config", None)
    if preset is not None and path is not None:
        raise ValueError(
            f"--preset {preset} and --config {path} both give the base settings: give one "
            "(and override its fields with their flags)"
        )


def start_from_args(args: argparse.Namespace) -> SemsoftConfig:
    """The `--preset` or `--config` base (default: the constrained preset), no
    field flag applied (`tune`'s start). A config file that holds a fitted correction
    is refused by name ([`SemsoftConfig.load`][semsoft_plugin.core.config.SemsoftConfig.load]): only `classify` applies one."""
    check_one_base(args)
    preset, path = getattr(args, "preset", None), getattr(args, "config", None)
    if path is not None:
        return SemsoftConfig.load(path)
    return SemsoftConfig.preset(preset or "constrained")


def config_from_args(
    args: argparse.Namespace, *, base: SemsoftConfig | None = None
) -> SemsoftConfig:
    """The base with every field flag given applied; `ValueError` naming a refused
    combination. The base is `base` when the caller has already read `--config`
    (`classify`, whose file may hold a fitted correction:
    [`semsoft_plugin.fit.fitted.read_fit`][semsoft_plugin.fit.fitted.read_fit]), else `start_from_args`'s."""
    try:
        given = {name: getattr(args, name) for name in config_field_specs() if hasattr(args, name)}
        return (base if base is not None else start_from_args(args)).replace(**given)
    except ValueError as error:
        raise ValueError(f"Semantic Softmax settings: {error}") from None


def grid_from_args(args: argparse.Namespace, skip: Sequence[str] = ()) -> dict[str, Any]:
    """`tune`'s grid: field -> values, for each field flag given or defaulted."""
    return {
        name: getattr(args, name)
        for name in config_field_specs()
        if name not in skip and getattr(args, name, None) is not None
    }

