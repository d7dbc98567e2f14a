"""semsoft_eval's modules import one another one way: no module imports (directly or
through others) a module that imports it. Pinned here so that a circle, such as the one
the engine backends and their chooser once made, is caught at review time, not found
later as an import that works only in one order."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EVAL = ROOT / "semsoft_eval"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path, known: set[str]) -> set[str]:
    """The semsoft_eval modules the file imports, function-level imports included.

    ``from semsoft_eval import calibrate`` names the module ``semsoft_eval.calibrate``;
    relative imports are resolved against the file's package.
    """
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        found |= {t for t in targets if t in known and t != name}
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle (its modules in order, the first repeated last), or ``[]``."""
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> list[str]:
        if module in path:
            return path[path.index(module) :] + [module]
        if module in done:
            return []
        path.append(module)
        for target in sorted(graph[module]):
            if found := visit(target):
                return found
        path.pop()
        done.add(module)
        return []

    for module in sorted(graph):
        if found := visit(module):
            return found
    return []


def test_the_eval_package_imports_have_no_cycle() -> None:
    paths = sorted(p for p in EVAL.rglob("*.py") if "__pycache__" not in p.parts)
    known = {_module_name(p) for p in paths}
    graph = {_module_name(p): _imported(p, known) for p in paths}
    assert graph["semsoft_eval.backend_factory"] >= {
        "semsoft_eval.backend_transformers",
        "semsoft_eval.backend_vllm",
    }  # the graph is read (a broken reader would find no edge, and so no cycle)
    assert _cycle(graph) == []


def test_a_cycle_is_found() -> None:
    """The check itself: a circle through three modules is reported, in order."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycle(graph) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []
