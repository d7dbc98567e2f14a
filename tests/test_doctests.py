"""The examples (``>>>``) in the public docstrings run, and say what they show: each
module listed here holds at least one, and none loads a model (small tensors and arrays
only), so they run in CI's fast lane."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "semsoft_plugin.core.config",
    "semsoft_plugin.core.softmax",
    "semsoft_plugin.core.labels",
    "semsoft_plugin.core.folds",
    "semsoft_plugin.core.fitting",
    "semsoft_plugin.core.temperature_scaling",
    "semsoft_plugin.core.calibration",
    "semsoft_plugin.core.row_probe",
    "semsoft_eval.metrics",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    tests = [t for t in finder.find(module, name) if t.examples]
    assert tests, f"{name} has no docstring example"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed"
