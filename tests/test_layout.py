"""The package's layout keeps its layers: core (torch-only math) <- engines (one adapter
per engine) <- app (classifier, CLI, tables, Ray). Pinned here so that a new import or a
grown module is caught at review time, not found later by a reader."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "semsoft_plugin"
LAYERS = ("core", "engines", "app")  # each may import only from those before it
MAX_LINES = 500


def _modules(package: Path) -> list[Path]:
    return sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)


def _imports(path: Path) -> list[tuple[str, list[str], int]]:
    """Every ``import``/``from ... import`` in the file, function-level ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [a.name for a in node.names], node.lineno))
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


def test_every_plugin_module_is_in_a_layer() -> None:
    loose = [p.name for p in PLUGIN.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    assert loose == []


@pytest.mark.parametrize("package", ["semsoft_plugin", "semsoft_eval"])
def test_no_module_over_500_lines(package: str) -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in _modules(ROOT / package)
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}


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
