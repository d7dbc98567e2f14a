"""One name per concept, for the rows of issue 42's table (docs/glossary.md): the
transformers engine, the score temperature, the per-text result types and the labels'
order. A second name anywhere (a flag, a choice, an extra, a page, a result field) fails
here, naming it; an old spelling is refused naming the new one. No model loads.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from semsoft_plugin.app.cli import command_parsers

ROOT = Path(__file__).resolve().parents[1]
GLOSSARY = ROOT / "docs" / "glossary.md"
# What a user reads; the changelog is history and keeps the names of its time.
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# Old spellings no page, script or config may use, with the one name.
OLD_SPELLINGS = {
    r"backend\s*=\s*[\"']hf[\"']": 'backend="transformers"',
    r"--backend[ =]hf\b": "--backend transformers",
    r"semsoft-plugin\[[^\]]*\bhf\b": "semsoft-plugin[transformers]",
    r"`hf` extra|extras?: `hf`": "the `transformers` extra",
    r"\bfit_temperature\s*=": "fit_policy=FitPolicy(fit_score_temperature=...)",
    r"--no-temperature\b": "--no-score-temperature",
}
PARSERS = command_parsers()


def _visible(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {
        option: action
        for action in parser._actions
        if action.help != argparse.SUPPRESS
        for option in action.option_strings
    }


def old_spellings(path: Path) -> list[str]:
    """``file:line: old -> new`` for each old spelling in a file."""
    found = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if re.search(r"\b(refused|renamed)\b", line):
            continue  # a page saying which old spelling is refused
        for pattern, new in OLD_SPELLINGS.items():
            found += [
                f"{path.relative_to(ROOT)}:{number}: {m.group(0)} -> {new}"
                for m in re.finditer(pattern, line)
            ]
    return found


@pytest.mark.parametrize(
    "path",
    [*PAGES, ROOT / "pyproject.toml", *sorted((ROOT / "scripts").glob("*.sh"))],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_no_page_script_or_config_uses_an_old_spelling(path: Path) -> None:
    assert old_spellings(path) == []


def test_the_old_spellings_are_found() -> None:
    page = ROOT / "docs" / "_probe_names.md"
    try:
        page.write_text(
            "`semsoft eval --backend hf`, `Classifier(backend='hf', fit_temperature=False)`,\n"
            "`pip install 'semsoft-plugin[hf,eval]'`, `semsoft tune --no-temperature`\n",
            encoding="utf-8",
        )
        assert sorted(f.split(": ", 1)[1] for f in old_spellings(page)) == [
            "--backend hf -> --backend transformers",
            "--no-temperature -> --no-score-temperature",
            "backend='hf' -> backend=\"transformers\"",
            "fit_temperature= -> fit_policy=FitPolicy(fit_score_temperature=...)",
            "semsoft-plugin[hf -> semsoft-plugin[transformers]",
        ]
    finally:
        page.unlink()


# -- the transformers engine ---------------------------------------------------------------
@pytest.mark.parametrize("command", ["classify", "eval", "tune"])
def test_every_backend_flag_names_the_engine_transformers(command: str) -> None:
    action = _visible(PARSERS[command])["--backend"]
    assert set(action.choices or ()) == {"transformers", "vllm"}
    assert action.default == "transformers"


@pytest.mark.parametrize("command", ["classify", "eval", "tune"])
def test_backend_hf_is_refused_naming_transformers(command: str, capsys: Any) -> None:
    with pytest.raises(SystemExit):
        PARSERS[command].parse_args(["--labels", "a,b", "--backend", "hf"])
    assert "backend='hf' is now spelled 'transformers'" in capsys.readouterr().err


def test_the_classifier_refuses_the_old_spellings_naming_the_new() -> None:
    from semsoft_plugin import Classifier

    with pytest.raises(ValueError, match="'transformers'"):
        Classifier("default", labels=["a", "b"], backend="hf").check_params()
    with pytest.raises(TypeError, match=r"fit_policy=FitPolicy\(fit_score_temperature"):
        Classifier("default", labels=["a", "b"], fit_temperature=False)


def test_the_eval_engine_name_refuses_hf_naming_transformers() -> None:
    from semsoft_eval.backends import ENGINES, engine_name

    assert engine_name("transformers") == "transformers"
    with pytest.raises(ValueError, match="backend='hf' is now spelled 'transformers'"):
        engine_name("hf")
    with pytest.raises(ValueError, match=re.escape(str(ENGINES))):
        engine_name("tpu")


def test_the_install_extra_is_named_transformers() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    extras = project["project"]["optional-dependencies"]
    assert "transformers" in extras and "hf" not in extras


# -- the score temperature -------------------------------------------------------------------
def test_every_temperature_flag_names_which_temperature() -> None:
    """The score temperature's flags say so; a bare ``--temperature`` is only ever the
    engine's sampling temperature (``distill``'s teacher samples)."""
    found = {
        f"semsoft {name} {option}": action
        for name, parser in PARSERS.items()
        for option, action in _visible(parser).items()
        if "temperature" in option
    }
    for where, action in found.items():
        flag = where.split()[-1]
        assert flag in {"--score-temperature", "--no-score-temperature", "--temperature"}, where
        if flag == "--temperature":
            assert "sampling temperature" in (action.help or ""), where
    assert "semsoft tune --no-score-temperature" in found


def test_no_temperature_is_refused_naming_no_score_temperature(capsys: Any) -> None:
    with pytest.raises(SystemExit):
        PARSERS["tune"].parse_args(["--dataset", "sst2", "--no-temperature"])
    assert "--no-temperature: renamed: use --no-score-temperature" in capsys.readouterr().err
    args = PARSERS["tune"].parse_args(["--dataset", "sst2", "--no-score-temperature"])
    assert args.no_score_temperature is True


def test_tune_names_the_switch_as_the_classifier_does() -> None:
    import inspect

    from semsoft_eval.tune import tune, tune_dataset

    for function in (tune, tune_dataset):
        parameters = inspect.signature(function).parameters
        assert "fit_score_temperature" in parameters and "temperature" not in parameters


# -- the per-text result ---------------------------------------------------------------------
def _fields(kind: type) -> set[str]:
    if dataclasses.is_dataclass(kind):
        return {f.name for f in dataclasses.fields(kind)}
    return set(kind.__annotations__)


def test_the_result_types_are_one_hierarchy_of_names() -> None:
    """Each level holds the fields of the level above under the same names
    (docs/glossary.md, "The result types"): a field renamed on one type fails here."""
    from semsoft_plugin.app.predictions import Predictions
    from semsoft_plugin.core.result import LabelResult, ScoredLabel
    from semsoft_plugin.core.softmax import SemanticSoftmaxResult

    core, one, scored, batch = (
        _fields(k) for k in (SemanticSoftmaxResult, LabelResult, ScoredLabel, Predictions)
    )
    assert core <= one, core - one
    assert scored | {"label"} <= one, scored - one
    assert isinstance(ScoredLabel.label, property)
    assert batch - {"labels", "truncated"} <= one, batch - one
    assert {"label", "probs", "constrained_probs", "fallback", "coverage"} <= batch
    table = GLOSSARY.read_text(encoding="utf-8").split("## The result types")[1].split("\n## ")[0]
    for kind in ("SemanticSoftmaxResult", "LabelResult", "ScoredLabel", "Predictions", "FitResult"):
        assert f"| `{kind}` |" in table, kind


# -- the labels' order -----------------------------------------------------------------------
def test_the_glossary_gives_each_output_its_label_order() -> None:
    section = GLOSSARY.read_text(encoding="utf-8").split("## The labels' order")[1].split("\n## ")[0]
    sorted_row, given_row = (
        next(row for row in section.splitlines() if row.endswith(f"| {end}"))
        for end in (
            "sorted (`np.unique`'s order, which scikit-learn's metrics assume) |",
            "the order the labels were given (prompt order) |",
        )
    )
    for name in ("classes_", "predict_proba", "Predictions.labels"):
        assert name in sorted_row, name
    for name in ("labels_", "LabelResult", "--json", "p_<label>", "FitResult.offset"):
        assert name in given_row, name


# -- the methods and members -----------------------------------------------------------------
def test_the_glossary_says_what_each_method_and_member_computes() -> None:
    methods = pytest.importorskip("semsoft_eval.methods")
    from semsoft_plugin.fit.fitting import FAMILY

    text = GLOSSARY.read_text(encoding="utf-8").split("## Methods and fit-family members")[1]
    rows = [r for r in text.splitlines() if r.startswith("| `")]
    named = {n for r in rows for n in re.findall(r"`([a-z][a-z-]*)`", r.split(" | ")[0])}
    assert set(methods.METHODS) <= named, set(methods.METHODS) - named
    assert set(FAMILY) <= named, set(FAMILY) - named
    batch = next(r for r in rows if r.startswith("| `batch` |") and "labelled rows" in r)
    assert "file mode" in batch
