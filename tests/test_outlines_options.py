"""One options object across the Outlines adapters (issue 45 item 4): the keywords of
``Generator`` / ``wrap`` become one :class:`ChoiceOptions`, made once and passed down
whole to the engine's class, as vLLM passes ``SamplingParams``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from semsoft_plugin.core.config import SemsoftConfig
from semsoft_plugin.engines.outlines.base import ChoiceOptions

OUTLINES = Path(__file__).resolve().parents[1] / "semsoft_plugin" / "engines" / "outlines"


def test_the_keywords_make_one_options_object() -> None:
    options = ChoiceOptions.of(k=20, score_temperature=2.0, temperature=0.5)
    assert options.config == SemsoftConfig(k=20, score_temperature=2.0)
    assert options.temperature == 0.5 and options.variants is None
    assert options.fitted_correction is None
    assert ChoiceOptions.of(options) is options  # passed down as it is
    assert ChoiceOptions.of() == ChoiceOptions()
    with pytest.raises(ValueError, match="give options= or the option keywords, not both"):
        ChoiceOptions.of(options, k=5)
    with pytest.raises(ValueError, match="method_temperature"):
        ChoiceOptions.of(method_temperature=2.0)  # an old name, refused by name


def test_the_keyword_block_is_written_once() -> None:
    """No function in the Outlines adapters takes ``variants`` and ``fitted_correction``
    as keywords except ``ChoiceOptions.of``; the engine classes take the object."""
    spelled = []
    for path in sorted(OUTLINES.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                args = {a.arg for a in (*node.args.args, *node.args.kwonlyargs)}
                if {"variants", "fitted_correction"} <= args:
                    spelled.append(f"{path.name}:{node.name}")
    assert spelled == ["base.py:of"]
