"""mkdocs hook: the CLI reference page (``reference/cli.md``) generated from the argparse
parsers of ``semsoft`` and its subcommands, so that the page cannot drift from the code.

The parsers come from :func:`semsoft_plugin.app.cli.command_parsers` (each subcommand's
module imported, no model loaded). A subcommand whose module cannot be imported fails the
build with the line naming the extra to install; none is left out. Named in
``mkdocs.yaml`` under ``hooks:``.
"""

from __future__ import annotations

import argparse
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

PAGE = "reference/cli.md"


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _flags(action: argparse.Action) -> str:
    names = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.dest}`"
    if action.nargs == 0:
        return names
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        return names + " " + "\\|".join(f"`{c}`" for c in action.choices)
    metavar = action.metavar or (action.dest.upper() if action.option_strings else None)
    return names + (f" `{metavar}`" if metavar else "")


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS, False):
        return ""
    if action.default == "":
        return '`""`'  # an empty string: a bare pair of backticks would print as ``
    return f"`{action.default}`"


def _help(action: argparse.Action) -> str:
    text = action.help or ""
    if "%(" in text:  # argparse's own %(default)s and the like
        text = text % {**vars(action), "default": action.default, "prog": ""}
    return _cell(text)


def _command(name: str, parser: argparse.ArgumentParser) -> list[str]:
    lines = [f"## `semsoft {name}`" if name else "## `semsoft`", ""]
    if parser.description:
        lines += [parser.description, ""]
    lines += ["```text", parser.format_usage().strip(), "```", ""]
    for group in parser._action_groups:
        actions = [
            a
            for a in group._group_actions
            if a.help != argparse.SUPPRESS
            and not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
        ]
        if not actions:
            continue
        lines += [f"**{group.title}**", "", "| argument | default | meaning |", "|---|---|---|"]
        lines += [f"| {_flags(a)} | {_default(a)} | {_help(a)} |" for a in actions]
        lines.append("")
    if parser.epilog:
        lines += [parser.epilog, ""]
    return lines


def cli_reference() -> str:
    """The page's Markdown: one section per command, its usage and every argument."""
    from semsoft_plugin.app.cli import MissingExtra, command_parsers

    try:
        parsers = command_parsers()
    except MissingExtra as error:
        raise PluginError(f"the CLI reference cannot document every subcommand: {error}") from None
    lines = [
        "# CLI reference",
        "",
        "Generated from the argparse parsers when the docs are built "
        "(`scripts/mkdocs_cli_reference.py`); `semsoft CMD --help` prints the same.",
        "",
    ]
    for name in sorted(parsers):
        lines += _command(name, parsers[name])
    return "\n".join(lines)


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, PAGE, content=cli_reference()))
    return files
