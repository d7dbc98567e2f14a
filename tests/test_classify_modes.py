"""Every ``semsoft classify`` flag is checked against the mode (one text, a file,
``--ray``) before any model loads: a flag with no effect in the mode is refused, naming
the flag and the mode (issues 42 and 43).

No test here loads a model: a refusal that came after the load would fail them by the
``Classifier`` stub below.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from semsoft_plugin.app import classify_modes
from semsoft_plugin.app.cli import main

LABELS = "positive,negative"


@pytest.fixture(autouse=True)
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a model fails the test: every refusal comes before it."""
    from semsoft_plugin.app.classifier import Classifier

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("a model was loaded before the refusal")

    monkeypatch.setattr(Classifier, "from_pretrained", classmethod(refuse))


def refusal(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


ONE_TEXT_REFUSED = [
    ("--concurrency", "2"),
    ("--num-gpus", "1"),
    ("--review-below", "0.6"),  # the default value given by hand is still given
    ("--column-prefix", "x_"),
    ("--overwrite",),
    ("--output-format", "csv"),
    ("--id-column", "id"),
    ("--text-column", "text"),
    ("--encoding", "latin-1"),
    ("--batch-size", "8"),
    ("--num-cpus", "1"),
    ("--ray-address", "auto"),
    ("--resume",),
    ("--output", "out.csv"),
]


@pytest.mark.parametrize("flag", ONE_TEXT_REFUSED, ids=lambda f: f[0])
def test_one_text_refuses_a_file_or_ray_flag(capsys, flag):
    err = refusal(capsys, ["classify", "Great fun.", "--labels", LABELS, *flag])
    assert f"{flag[0]}" in err and "does not apply to one text" in err


RAY_ONLY = [
    ("--id-column", "id"),
    ("--output-format", "jsonl"),
    ("--concurrency", "2"),
    ("--num-gpus", "1"),
    ("--num-cpus", "2"),
    ("--ray-address", "auto"),
]


@pytest.mark.parametrize("flag", RAY_ONLY, ids=lambda f: f[0])
def test_a_file_refuses_ray_only_flags_without_ray(capsys, tmp_path: Path, flag):
    inp = tmp_path / "in.csv"
    inp.write_text("text\nGreat fun.\n")
    argv = ["classify", "--input", str(inp), "--output", str(tmp_path / "out.csv")]
    err = refusal(capsys, [*argv, "--labels", LABELS, *flag])
    assert flag[0] in err and classify_modes.FILE in err and "only with --ray" in err
    assert not (tmp_path / "out.csv").exists()


@pytest.mark.parametrize(
    "flag", [("--json",), ("--resume",), ("--encoding", "latin-1")], ids=lambda f: f[0]
)
def test_ray_refuses_what_it_ignores(capsys, tmp_path: Path, flag):
    inp = tmp_path / "in.csv"
    inp.write_text("text\nGreat fun.\n")
    argv = ["classify", "--input", str(inp), "--output", str(tmp_path / "out"), "--ray"]
    err = refusal(capsys, [*argv, "--labels", LABELS, *flag])
    assert flag[0] in err and "does not apply to --ray" in err


def test_output_format_contradicting_the_suffix_is_refused(capsys, tmp_path: Path):
    inp = tmp_path / "in.csv"
    inp.write_text("text\nGreat fun.\n")
    argv = ["classify", "--input", str(inp), "--ray", "--labels", LABELS]
    err = refusal(capsys, [*argv, "--output", str(tmp_path / "out.csv"), "--output-format", "jsonl"])
    assert "--output-format jsonl contradicts --output" in err and ".csv" in err


def test_every_mode_flag_has_no_default_in_the_parser():
    """'Given' is read from None, never by comparing to the default value."""
    from semsoft_plugin.app.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["classify"]
    defaults = {a.dest: a.default for a in sub._actions}
    for dest in classify_modes.FLAG_MODES:
        assert defaults[dest] is None, dest
