"""The docstrings of ``semsoft_plugin`` and ``semsoft_eval`` stay short, say each thing
once and state the code's defaults (ast only: nothing is imported, no model is loaded).

What is checked, on every module, class and function docstring (after
``inspect.cleandoc``):

- a module docstring runs to at most 15 lines (a longer text goes to a docs/ page);
- a numpydoc entry (the description under a ``name : type`` line of a Parameters,
  Other Parameters, Attributes, Returns or Yields section) runs to at most 4 lines;
- no paragraph (a block between blank lines, section headers or entry lines, of at
  least 2 lines or 100 characters, doctest blocks excepted) appears twice;
- an entry whose description says ``default`` followed by a Python literal (``default:
  0.5``, ``(default ``False``)``, ``defaults to None``) names the default of the
  function's signature, or of the dataclass field, where that default is a literal.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("semsoft_plugin", "semsoft_eval")


MAX_MODULE_LINES = 15
MAX_ENTRY_LINES = 4
ENTRY_SECTIONS = {"Parameters", "Other Parameters", "Attributes", "Returns", "Yields"}
_DEFAULT = re.compile(r"\bdefault(?:s to|:| is)?\s+`{0,2}([^`\s,;)]+)`{0,2}", re.IGNORECASE)
Node = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef


def _files() -> list[Path]:
    return [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]


def _documented(tree: ast.Module) -> Iterator[tuple[Node, str]]:
    nodes: list[Node] = [tree]
    nodes += [
        n for n in ast.walk(tree)
        if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    for node in nodes:
        doc = ast.get_docstring(node, clean=True)
        if doc:
            yield node, doc


def _is_header(lines: list[str], i: int) -> bool:
    """Whether line ``i`` is a numpydoc section title (underlined by dashes)."""
    return (
        i + 1 < len(lines) and bool(lines[i].strip())
        and set(lines[i + 1].strip()) == {"-"} and not lines[i].startswith(" ")
    )


def _entries(doc: str) -> Iterator[tuple[str, list[str]]]:
    """``(entry line, description lines)`` of the entry sections, trailing blanks cut."""
    lines = doc.splitlines()
    section, entry, body = "", "", []
    for i, line in enumerate(lines):
        if _is_header(lines, i) or (i > 0 and _is_header(lines, i - 1)):
            if entry:
                yield entry, body
            entry, body = "", []
            if _is_header(lines, i):
                section = line.strip()
        elif section in ENTRY_SECTIONS and line and not line.startswith(" "):
            if entry:
                yield entry, body
            entry, body = line, []
        elif entry:
            body.append(line)
    if entry:
        yield entry, body


def _trimmed(body: list[str]) -> list[str]:
    while body and not body[-1].strip():
        body = body[:-1]
    return body


def _paragraphs(doc: str) -> Iterator[str]:
    """The blocks of a docstring, split at blank lines, section titles and entry lines."""
    lines = doc.splitlines()
    block: list[str] = []
    section = ""
    for i, line in enumerate(lines):
        title = _is_header(lines, i)
        if title:
            section = line.strip()
        cut = (
            not line.strip() or title or (i > 0 and _is_header(lines, i - 1))
            or (section in ENTRY_SECTIONS and not line.startswith(" "))
        )
        if cut:
            if block:
                yield "\n".join(block)
            block = []
        else:
            block.append(line.strip())
    if block:
        yield "\n".join(block)


def _literal(text: str) -> tuple[bool, object]:
    try:
        return True, ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False, None


def _signature_defaults(node: Node) -> dict[str, ast.expr]:
    """A function's parameter defaults, or a class's (its ``__init__``'s, else its
    annotated fields')."""
    if isinstance(node, ast.ClassDef):
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                return _signature_defaults(item)
        return {
            item.target.id: item.value
            for item in node.body
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            and item.value is not None
        }
    if isinstance(node, ast.Module):
        return {}
    args = node.args
    positional = args.posonlyargs + args.args
    found = dict(zip([a.arg for a in positional[len(positional) - len(args.defaults):]],
                     args.defaults, strict=True))
    found |= {a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d}
    return found


def _where(path: Path, node: Node) -> str:
    name = "module" if isinstance(node, ast.Module) else node.name
    return f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 1)} {name}"


def _all_docstrings() -> Iterator[tuple[Path, Node, str]]:
    for path in _files():
        for node, doc in _documented(ast.parse(path.read_text(encoding="utf-8"))):
            yield path, node, doc


def test_the_files_are_found() -> None:
    """The walk reads both packages, every module of each."""
    files = {p.relative_to(ROOT).as_posix() for p in _files()}
    assert "semsoft_plugin/core/softmax.py" in files
    assert "semsoft_plugin/engines/vllm/processor.py" in files
    assert "semsoft_eval/metrics.py" in files


def test_module_docstrings_are_short() -> None:
    long = [
        f"{_where(path, node)}: {len(doc.splitlines())} lines"
        for path, node, doc in _all_docstrings()
        if isinstance(node, ast.Module) and len(doc.splitlines()) > MAX_MODULE_LINES
    ]
    assert not long, "\n".join(long)


def test_entries_are_short() -> None:
    long = [
        f"{_where(path, node)}: {entry.strip()!r} {len(_trimmed(body))} lines"
        for path, node, doc in _all_docstrings()
        for entry, body in _entries(doc)
        if len(_trimmed(body)) > MAX_ENTRY_LINES
    ]
    assert not long, "\n".join(long)


def test_no_paragraph_repeats() -> None:
    seen: dict[str, list[str]] = defaultdict(list)
    for path, node, doc in _all_docstrings():
        for block in _paragraphs(doc):
            if (block.count("\n") >= 1 or len(block) >= 100) and not block.startswith(">>>"):
                seen[" ".join(block.split())].append(_where(path, node))
    repeated = [f"{places}: {text[:80]!r}" for text, places in seen.items() if len(places) > 1]
    assert not repeated, "\n".join(repeated)


def test_documented_defaults_are_the_code_s() -> None:
    wrong = []
    for path, node, doc in _all_docstrings():
        defaults = _signature_defaults(node)
        for entry, body in _entries(doc):
            name = entry.split(":")[0].strip().lstrip("*")
            code = defaults.get(name)
            if code is None:
                continue
            is_literal, value = _literal(ast.unparse(code))
            for said in _DEFAULT.findall(" ".join(body)):
                ok, stated = _literal(said.rstrip("."))
                if ok and is_literal and (stated != value or type(stated) is not type(value)):
                    wrong.append(f"{_where(path, node)}: {name} says {said}, code {value!r}")
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_what_it_checks() -> None:
    """Each check finds the fault it is written for, on a made-up docstring."""
    doc = inspect.cleandoc('''Head.

        Parameters
        ----------
        k : int
            One
            two
            three
            four
            five (default: 3).
        j : int
            As `k`.

        Returns
        -------
        int
            The sum.
        ''')
    entries = dict(_entries(doc))
    assert len(_trimmed(entries["k : int"])) == 5
    assert _trimmed(entries["j : int"]) == ["    As `k`."]
    assert "One\ntwo\nthree\nfour\nfive (default: 3)." in list(_paragraphs(doc))
    assert _DEFAULT.findall("x (default ``False``).") == ["False"]
    assert _DEFAULT.findall("x, defaults to None.") == ["None."]
    func = ast.parse("def f(k=4, *, j=None): pass").body[0]
    assert isinstance(func, ast.FunctionDef)
    assert {n: ast.unparse(v) for n, v in _signature_defaults(func).items()} == {
        "k": "4", "j": "None",
    }
