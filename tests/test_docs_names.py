"""Every flag and key the docs name exists: a ``--flag`` after ``semsoft CMD`` (in a
code block or one inline code span) is one of CMD's argparse options; any other
``--flag`` in inline code or a code block is an option of some ``semsoft`` command, of a
benchmark script, or one of the few vLLM server and pytest flags listed here; every ``semsoft_*`` key is one a request may carry
(``core.request``) or the response field the server adds. Data-driven: the parsers and
keys are read from the code, so a renamed option turns every stale mention into a
failure naming the file, the line and the old name. No model loads."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from semsoft_plugin.app.cli import command_parsers
from semsoft_plugin.core import request

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

FENCE = re.compile(r"^```")
SPAN = re.compile(r"`([^`\n]+)`")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
KEY = re.compile(r"\bsemsoft_[a-z0-9_]+")
PACKAGES = {"semsoft_plugin", "semsoft_eval"}  # the packages' names, not keys
# Other programs' flags the docs name, which no parser here can check: vLLM's server
# (`vllm serve --help`), pytest's and mkdocs'.
ELSEWHERE = {
    "--strict",
    "--logits-processors",
    "--max-logprobs",
    "--middleware",
    "--hf-overrides",
    "--no-async-scheduling",
    "--served-model-name",
    "--worker-extension-cls",
    "--durations",
}
# The benchmark scripts' own flags, read from their argparse calls.
BENCHMARKS = {
    flag
    for script in (ROOT / "benchmarks").rglob("*.py")
    for flag in re.findall(r'add_argument\(\s*"(--[a-z0-9-]+)"', script.read_text("utf-8"))
}
# Where a shell line's command ends.
END = re.compile(r"\s(\||;|&&|#|>)\s")


def _option_strings(parser) -> set[str]:
    """The options a user may give; hidden ones (old names kept only to refuse them with
    the new name) do not count, so a page that still documents one is stale."""
    return {
        o
        for action in parser._actions
        if action.help != argparse.SUPPRESS
        for o in action.option_strings
    }


PARSERS = command_parsers()
OPTIONS = {name: _option_strings(parser) for name, parser in PARSERS.items()}
ANY_OPTION = set().union(*OPTIONS.values())
COMMAND = re.compile(r"\bsemsoft(?:\.sh)?\s+(" + "|".join(sorted(n for n in OPTIONS if n)) + r")\b")


def _pieces(text: str):
    """``(line, piece)`` for each command-shaped piece of a page: each line of a code
    block (continuation lines joined) and each inline code span."""
    in_block = False
    pending = ""
    start = 0
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.strip()):
            in_block = not in_block
            continue
        if in_block:
            if not pending:
                start = number
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            yield start, pending + line
            pending = ""
        else:
            for span in SPAN.findall(line):
                yield number, span


def _stale_flags(path: Path) -> list[str]:
    found = []
    for line, piece in _pieces(path.read_text(encoding="utf-8")):
        where = f"{path.relative_to(ROOT)}:{line}"
        command = COMMAND.search(piece)
        if command is not None:
            rest = END.split(piece[command.end() :])[0]
            known = OPTIONS[command.group(1)]
            found += [
                f"{where}: semsoft {command.group(1)} has no {flag}"
                for flag in FLAG.findall(rest)
                if flag not in known
            ]
        else:
            found += [
                f"{where}: no semsoft command has {flag}"
                for flag in FLAG.findall(piece)
                if flag not in ANY_OPTION | BENCHMARKS | ELSEWHERE
            ]
    return found


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_documented_flags_exist(path: Path) -> None:
    assert _stale_flags(path) == []


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_documented_request_keys_exist(path: Path) -> None:
    known = set(request.KNOWN_KEYS) | {request.RESPONSE_LABEL_LOGPROBS, request.RESPONSE_FITTED}
    stale = [
        f"{path.relative_to(ROOT)}:{number}: {key}"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for key in KEY.findall(line)
        if key not in known and key not in PACKAGES
    ]
    assert stale == []


def test_a_stale_flag_and_a_wrong_command_are_found(tmp_path: Path) -> None:
    """The checks themselves: a flag no parser has, and one given to the wrong command."""
    page = ROOT / "docs" / "_probe.md"
    try:
        page.write_text(
            "Run `semsoft classify --input a.csv --no-such-flag`.\n\n"
            "```bash\nsemsoft eval --dataset sst2 \\\n  --resume\n"
            "python -m vllm.entrypoints.openai.api_server --max-logprobs 50\n```\n"
            "Alone: `--another-missing`.\n",
            encoding="utf-8",
        )
        assert _stale_flags(page) == [
            "docs/_probe.md:1: semsoft classify has no --no-such-flag",
            "docs/_probe.md:4: semsoft eval has no --resume",
            "docs/_probe.md:8: no semsoft command has --another-missing",
        ]
    finally:
        page.unlink()


def test_the_cli_reference_names_every_option() -> None:
    """The generated CLI page (the mkdocs hook) has a section per command and a row for
    every option of it, so a new flag is documented by being added."""
    pytest.importorskip("mkdocs")
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "mkdocs_cli_reference", ROOT / "scripts" / "mkdocs_cli_reference.py"
    )
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = hook.cli_reference()
    sections = page.split("\n## ")[1:]
    by_command = {s.splitlines()[0].strip("`").removeprefix("semsoft").strip(): s for s in sections}
    assert set(by_command) == set(OPTIONS)
    missing = [
        f"{name}: {option}"
        for name, options in OPTIONS.items()
        for option in options
        if option not in ("-h", "--help") and f"`{option}`" not in by_command[name]
    ]
    assert missing == []


def test_the_documented_eval_methods_exist() -> None:
    """Every method name evaluation.md lists in backticks under **Methods.** is one of
    the registry's (semsoft_eval.methods), and every default method is listed."""
    methods = pytest.importorskip("semsoft_eval.methods")
    text = (ROOT / "docs" / "evaluation.md").read_text(encoding="utf-8")
    paragraph = text[text.index("**Methods.**") :].split("\n\n")[0]
    named = set(re.findall(r"`([a-z][a-z-]*)`", paragraph))
    known = set(methods.METHODS)
    defaults = set(PARSERS["eval"].get_default("methods").split(","))
    assert named & known >= defaults
    assert {n for n in named if "-" in n or n in known} <= known
