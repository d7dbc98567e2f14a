"""The package's layout keeps its layers: core (torch-only math) <- fit (the few-label fit) <- engines (one adapter
per engine) <- app (classifier, CLI, tables, Ray), and semsoft_eval's modules import one
another one way, with no import circle in either package (imports inside functions and
under ``TYPE_CHECKING`` count: a circle dodged by a late import is still one). Pinned here
so that a new import or a circle is caught at review time, not found later by a reader
(or as an import that works only in one order). Modules are split by responsibility, not
to meet a line count, so no size is pinned."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "semsoft_plugin"
LAYERS = ("core", "fit", "engines", "app")  # each may import only from those before it


def _modules(package: Path) -> list[Path]:
    return sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, list[str], int]]:
    """Every ``import``/``from ... import`` in the file as ``(module, names, line)``,
    function-level ones included; relative imports resolved against the file's package."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(parent + ([module] if module else []))
            found.append((module, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            found.extend((a.name, [], node.lineno) for a in node.names)
    return found


def _layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "semsoft_plugin" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in LAYERS else None


@pytest.mark.parametrize("layer", LAYERS)
def test_a_layer_imports_only_from_the_layers_below(layer: str) -> None:
    allowed = set(LAYERS[: LAYERS.index(layer) + 1])
    upward = []
    for path in _modules(PLUGIN / layer):
        for module, names, line in _imports(path):
            targets = [module] + [f"{module}.{n}" for n in names]
            bad = {_layer(t) for t in targets} - allowed - {None}
            if bad:
                upward.append(f"{path.relative_to(ROOT)}:{line} imports {module} ({bad})")
    assert upward == []


def _named_modules(path: Path) -> list[tuple[str, int]]:
    """Every module path a string in the code names (``"semsoft_plugin.app.x:Y"``, as a
    worker extension or an entry point is named), docstrings left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (match, node.lineno)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and id(node) not in docstrings
        for match in re.findall(r"semsoft_plugin(?:\.[a-z_]+)+", node.value)
    ]  # fmt: skip


@pytest.mark.parametrize("layer", LAYERS)
def test_a_layer_names_no_module_above_it_in_a_string(layer: str) -> None:
    """A class named in a string (``worker_extension_cls=``, a processor's import path) is
    an import the test above cannot see: it too points only down."""
    allowed = set(LAYERS[: LAYERS.index(layer) + 1])
    upward = [
        f"{path.relative_to(ROOT)}:{line} names {module}"
        for path in _modules(PLUGIN / layer)
        for module, line in _named_modules(path)
        if _layer(module) not in allowed | {None}
    ]
    assert upward == []


def test_a_string_naming_a_module_is_found(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('"""Names semsoft_plugin.app.x in a docstring."""\nX = "semsoft_plugin.app.x:Y"\n')
    assert _named_modules(module) == [("semsoft_plugin.app.x", 2)]


def test_every_plugin_module_is_in_a_layer() -> None:
    loose = [p.name for p in PLUGIN.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    assert loose == []


@pytest.mark.parametrize("package", ["semsoft_plugin", "semsoft_eval"])
def test_no_private_name_is_imported_across_modules(package: str) -> None:
    private = [
        f"{p.relative_to(ROOT)}:{line} {module}.{name}"
        for p in _modules(ROOT / package)
        for module, names, line in _imports(p)
        if module.split(".")[0] in ("semsoft_plugin", "semsoft_eval")
        for name in names
        if name.startswith("_") and not name.startswith("__")
    ]
    assert private == []


def _defined(path: Path) -> set[str]:
    """Names a module defines at its top level (functions, classes, assignments)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def test_names_are_imported_from_the_module_that_defines_them() -> None:
    """No re-exports: ``from semsoft_plugin.x.y import name`` (or ``semsoft_eval``) needs ``name`` defined in
    ``x/y.py`` (or ``y`` a module of package ``x``). A package ``__init__`` may gather its
    own modules' public names; nothing else passes a name on."""
    passed_on = []
    files = [*_modules(ROOT / "semsoft_plugin"), *_modules(ROOT / "semsoft_eval")]
    files += sorted((ROOT / "tests").glob("*.py")) + sorted((ROOT / "examples").glob("*.py"))
    for path in files:
        for module, names, line in _imports(path):
            if not module.startswith(("semsoft_plugin.", "semsoft_eval.")):
                continue
            target = ROOT.joinpath(*module.split("."))
            if target.is_dir():  # a package: its __init__ or its submodules
                continue
            defined = _defined(target.with_suffix(".py"))
            passed_on += [
                f"{path.relative_to(ROOT)}:{line} {module}.{n}" for n in names if n not in defined
            ]
    assert passed_on == []


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


def _graph(package: str) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (any ``import`` anywhere in the file:
    at the top, inside a function, under ``TYPE_CHECKING``); a package ``__init__`` that
    gathers its own modules' names is an edge to each module it names."""
    paths = _modules(ROOT / package)
    known = {_module_name(p) for p in paths}
    return {
        _module_name(p): {
            target
            for module, names, _ in _imports(p)
            for target in (module, *(f"{module}.{n}" for n in names))
            if target in known and target != _module_name(p)
        }
        for p in paths
    }


def test_the_eval_package_imports_have_no_cycle() -> None:
    graph = _graph("semsoft_eval")
    assert graph["semsoft_eval.backend_factory"] >= {
        "semsoft_eval.backend_transformers",
        "semsoft_eval.backend_vllm",
    }  # the graph is read (a broken reader would find no edge, and so no cycle)
    assert _cycle(graph) == []


def test_the_plugin_imports_have_no_cycle() -> None:
    """Counting imports inside functions and under ``TYPE_CHECKING``: the two circles
    this test was written against (``app.classifier`` and its fit/settings helpers,
    ``core.fitting`` and ``core.label_offsets``) were each dodged by a late import."""
    graph = _graph("semsoft_plugin")
    assert "semsoft_plugin.core.tokens" in graph["semsoft_plugin.core.softmax"]
    assert "semsoft_plugin.fit.fitting" in graph["semsoft_plugin.fit.fit_family"]  # in a function
    assert _cycle(graph) == []


def test_a_cycle_is_found() -> None:
    """The check itself: a circle through three modules is reported, in order."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycle(graph) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []


def test_the_plugin_names_no_other_package() -> None:
    """``semsoft eval``/``tune``/``distill`` come from the entry-point group
    ``semsoft.commands``: no plugin module names the evaluation package, not even in a
    string or a docstring (a string is how the CLI once loaded it sideways)."""
    naming = [
        str(p.relative_to(ROOT)) for p in _modules(PLUGIN) if "semsoft_eval" in p.read_text("utf-8")
    ]
    assert naming == []
