"""``semsoft``'s subcommands besides ``classify`` come from the entry-point group
``semsoft.commands`` alone: a package registering one there adds it, and a command whose
module cannot be imported says in one line what to install (the entry point's
distribution and extras), with status 2 and no traceback. No model loads here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RUN = """
import contextlib, io, json, sys
from semsoft_plugin.app.cli import main
out, err = io.StringIO(), io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
        rc = main(json.loads(sys.argv[1]))
    except SystemExit as stop:
        rc = stop.code
print(json.dumps({"rc": rc, "out": out.getvalue(), "err": err.getvalue()}))
"""


def _semsoft(argv: list[str], *paths: Path) -> dict:
    path = os.pathsep.join([str(ROOT), *map(str, paths)])
    done = subprocess.run(
        [sys.executable, "-c", RUN, json.dumps(argv)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
        check=True,
        timeout=120,
    )
    return json.loads(done.stdout)


def _fake_distribution(root: Path) -> Path:
    """A distribution ``fake-dist`` registering ``hello`` (whose module imports a package
    that is not installed) and ``hi`` (which works), as an installed package would."""
    info = root / "fake_dist-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-dist\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[semsoft.commands]\nhello = fake_hello:add [speech]\nhi = fake_hi:add\n"
    )
    (root / "fake_hello.py").write_text("import not_installed_anywhere_xyz\n")
    (root / "fake_hi.py").write_text(
        "def add(subparsers):\n"
        "    p = subparsers.add_parser('hi', help='say hi')\n"
        "    p.set_defaults(func=lambda args: print('hi from fake') or 0)\n"
    )
    return root


def test_this_checkout_registers_eval_tune_and_distill():
    """The editable install's metadata (read by ``importlib.metadata``) lists the three."""
    names = {ep.name for ep in entry_points(group="semsoft.commands")}
    assert {"eval", "tune", "distill"} <= names


def test_eval_help_is_the_real_parser():
    report = _semsoft(["eval", "--help"])
    assert report["rc"] == 0, report["err"]
    assert report["out"].startswith("usage: semsoft eval") and "--dataset" in report["out"]


def test_a_registered_command_is_listed_loaded_and_run(tmp_path):
    fake = _fake_distribution(tmp_path)
    listing = _semsoft(["--help"], fake)
    assert "hello" in listing["out"] and "hi" in listing["out"]
    assert _semsoft(["hi"], fake) == {"rc": 0, "out": "hi from fake\n", "err": ""}


def test_a_command_whose_module_is_missing_says_what_to_install(tmp_path):
    report = _semsoft(["hello"], _fake_distribution(tmp_path))
    assert report["rc"] == 2
    assert report["err"].strip().splitlines() == [
        "semsoft hello needs not_installed_anywhere_xyz, which is not installed: "
        "pip install 'fake-dist[speech]'"
    ]


def test_an_unknown_command_names_the_entry_point_group():
    report = _semsoft(["nosuchcommand"])
    assert report["rc"] == 2 and "invalid choice: 'nosuchcommand'" in report["err"]
    assert "semsoft.commands" in _semsoft(["--help"])["out"]


def test_classify_help_fits_one_screen_and_help_all_lists_every_option():
    """`--help` shows the everyday options in at most 60 lines at 100 columns; every
    other option (the SemsoftConfig fields, the engine's, Ray's) is in `--help-all`, and
    still parses."""
    import argparse

    from semsoft_plugin.app.cli import command_parsers

    env = {**os.environ, "COLUMNS": "100", "PYTHONPATH": str(ROOT)}
    short = subprocess.run([sys.executable, "-m", "semsoft_plugin", "classify", "--help"],
                           capture_output=True, text=True, env=env, check=True).stdout  # fmt: skip
    full = subprocess.run([sys.executable, "-m", "semsoft_plugin", "classify", "--help-all"],
                          capture_output=True, text=True, env=env, check=True).stdout  # fmt: skip
    assert len(short.splitlines()) <= 60, short
    everyday = ("--labels", "--model", "--prompt", "--preset", "--config", "--backend", "--input",
                "--output", "--resume", "--review-below", "--max-text-tokens", "--help-all")  # fmt: skip
    for option in everyday:
        assert option in short, option
    import re

    listed = re.findall(r"^\s+(--[\w-]+)", short, flags=re.MULTILINE)  # the options section
    assert not {"--tau", "--ray", "--dtype", "--k"} & set(listed), listed
    parser = command_parsers()["classify"]
    shown = [o for a in parser._actions if a.help != argparse.SUPPRESS for o in a.option_strings]
    assert shown and all(o in full for o in shown)
    args = parser.parse_args(["--labels", "a,b", "--tau", "0.2", "--dtype", "float32", "x"])
    assert args.tau == 0.2 and args.dtype == "float32"
