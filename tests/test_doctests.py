"""The examples (``>>>``) in the docstrings run, and say what they show. The modules are
found here, not listed by hand: every module of ``semsoft_plugin`` and ``semsoft_eval``
whose source holds a docstring example is collected, so a new example runs in CI's fast
lane the day it is written. None loads a model (small tensors and arrays only)."""

from __future__ import annotations

import ast
import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("semsoft_plugin", "semsoft_eval")


def _has_example(path: Path) -> bool:
    """Whether a module, class or function docstring in the file holds a ``>>>`` line."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = [tree] + [
        n for n in ast.walk(tree)
        if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    return any(">>> " in (ast.get_docstring(n, clean=False) or "") for n in nodes)


def modules_with_examples() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if _has_example(path):
                parts = path.relative_to(ROOT).with_suffix("").parts
                found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


MODULES = modules_with_examples()


def test_the_modules_are_found() -> None:
    """The discovery finds the modules whose examples once went unrun, and every source
    file that holds a ``>>>`` prompt holds it in a docstring that is collected."""
    for name in (
        "semsoft_plugin.core.silent_vote",
        "semsoft_plugin.fit.logits_inverse",
        "semsoft_plugin.core.text_rules",
        "semsoft_plugin.core.softmax",
        "semsoft_eval.metrics",
    ):
        assert name in MODULES
    with_prompt = {
        p for package in PACKAGES for p in (ROOT / package).rglob("*.py")
        if ">>> " in p.read_text(encoding="utf-8")
    }
    assert len(MODULES) == len(with_prompt), sorted(str(p) for p in with_prompt)


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
