"""The built site reads: no Sphinx role or reStructuredText markup is left in its HTML, every
parameter table's Type column holds a type (not the first words of a description), every
name a package exports is documented, the pages a user starts from carry an example, and
a dead link fails the build.

The site is built once per session (``mkdocs build --strict``, about a minute), or read from
``$SEMSOFT_SITE_DIR`` where ``scripts/test.sh`` has just built it. No model loads.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import zlib
from html.parser import HTMLParser
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROLES = re.compile(r":(?:func|class|mod|meth):`?")
PACKAGES = [
    "semsoft_plugin/__init__.py",
    "semsoft_plugin/engines/vllm/__init__.py",
    "semsoft_plugin/engines/outlines/__init__.py",
    "semsoft_eval/distill/__init__.py",
]
# The objects a user starts from: their docstrings carry an Examples section.
STARTING_POINTS = [
    ("semsoft_plugin/app/classifier.py", "Classifier"),
    ("semsoft_plugin/app/predictions.py", "Predictions"),
    ("semsoft_plugin/fit/fit_family.py", "FitResult"),
    ("semsoft_plugin/core/config.py", "SemsoftConfig"),
    ("semsoft_plugin/core/labels.py", "LabelSet"),
    ("semsoft_plugin/engines/hf.py", "SemanticSoftmaxLogitsProcessor"),
    ("semsoft_plugin/engines/vllm/processor.py", "SemanticSoftmaxLogitsProcessor"),
    ("semsoft_plugin/engines/vllm/reader.py", "label_scores"),
    ("semsoft_plugin/engines/openai.py", "openai_label_scores"),
    ("semsoft_plugin/app/ray.py", "classify_dataset"),
]


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built site: ``$SEMSOFT_SITE_DIR`` if it holds one, else built here once."""
    given = os.environ.get("SEMSOFT_SITE_DIR")
    if given and (Path(given) / "index.html").is_file():
        return Path(given)
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    return out


class _Text(HTMLParser):
    """The text of a page outside code blocks, scripts and styles; and each table's rows
    (cell texts) with its header."""

    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.tables: list[tuple[list[str], list[list[str]]]] = []
        self._skip = 0
        self._cell: list[str] | None = None
        self._row: list[str] | None = None
        self._header: list[str] = []
        self._rows: list[list[str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("pre", "script", "style"):
            self._skip += 1
        elif tag == "table":
            self._header, self._rows = [], []
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("pre", "script", "style"):
            self._skip -= 1
        elif tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "tr" and self._row is not None:
            if self._row and not self._header:
                self._header = self._row
            elif self._row:
                self._rows.append(self._row)
            self._row = None
        elif tag == "table":
            self.tables.append((self._header, self._rows))

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)


def read_page(path: Path) -> _Text:
    parser = _Text()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


def markup_left(path: Path) -> list[str]:
    """Sphinx roles and RST double backticks in a page's text (code blocks aside)."""
    text = "".join(read_page(path).text)
    return [m.group(0) for m in ROLES.finditer(text)] + ["``"] * text.count("``")


def is_type(text: str) -> bool:
    """Whether a Type cell holds a type: a Python type expression (``int``,
    ``Mapping[str, Any] | None``, ``('a', 'b')`` choices) or numpydoc's words for one
    (``float or None``, ``tuple of float``, ``float in [0, 1]``, ``float > 0, finite``,
    ``Tensor (B, L)``, ``array of shape (N, L)``, ``array-like``, ``int, optional
    (research option)``); a sentence does not parse as one."""
    text = re.sub(r"\s*\([a-z][a-z ]*\)$", "", text.strip())  # a remark: "(research option)"
    text = re.sub(r",\s*(optional|finite)\b", "", text)
    text = re.sub(r"\s*[<>]=?\s*-?[\d.]+", "", text)  # a bound: "float > 0"
    text = re.sub(r"\s+in\s+[\[(][^\])]*[\])]", "", text)  # value ranges
    text = re.sub(r"\s+of shape\s*\([^()]*\)", "", text)  # shapes
    text = re.sub(r"(?<=[\w\]])\s*\([^()]*\)(\s+\w+)?", "", text)
    text = re.sub(r"\s+(or|of)\s+", " | ", text).replace("array-like", "array_like")
    if not text or re.search(r"\w\s+\[", text):  # "see [x]": words, not a subscript
        return False
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return False
    allowed = (
        ast.Expression, ast.Name, ast.Attribute, ast.Subscript, ast.BinOp, ast.BitOr,
        ast.Tuple, ast.List, ast.Set, ast.Constant, ast.Load, ast.Slice,
    )
    return all(isinstance(node, allowed) for node in ast.walk(tree))


def untyped_rows(path: Path) -> list[str]:
    """``name: type cell`` of each table row whose Type column holds no type."""
    bad = []
    for header, rows in read_page(path).tables:
        if "Type" not in header:
            continue
        column = header.index("Type")
        name = 0 if header[0] == "Name" else None
        for row in rows:
            cell = row[column] if column < len(row) else ""
            if not is_type(cell):
                bad.append(f"{row[name] if name is not None else '?'}: {cell!r}")
    return bad


def api_pages(site: Path) -> list[Path]:
    pages = sorted((site / "reference" / "api").rglob("index.html"))
    assert pages, "the site has no API pages"
    return pages


def test_no_sphinx_role_or_rst_markup_in_the_html(site: Path) -> None:
    pages = sorted(site.rglob("*.html"))
    found = {str(p.relative_to(site)): markup_left(p) for p in pages}
    assert {page: left for page, left in found.items() if left} == {}


def test_every_parameter_type_cell_holds_a_type(site: Path) -> None:
    found = {str(p.relative_to(site)): untyped_rows(p) for p in api_pages(site)}
    assert {page: rows for page, rows in found.items() if rows} == {}


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    """The two checks themselves, on a page written as the old docstrings rendered."""
    page = tmp_path / "index.html"
    page.write_text(
        "<p>See :func:`classify` and ``k``.</p><pre>``code`` :func: stays</pre>"
        "<table><thead><tr><th>Name</th><th>Type</th><th>Description</th></tr></thead>"
        "<tbody><tr><td>model</td><td>a model name or checkpoint directory</td><td>x</td></tr>"
        "<tr><td>labels</td><td>Sequence[str] | LabelSet | None</td><td>y</td></tr>"
        "<tr><td>mode</td><td>('constrain', 'observe')</td><td>z</td></tr>"
        "<tr><td>probs</td><td>Tensor (B, L)</td><td>z</td></tr>"
        "<tr><td>bias</td><td>float in [0, 1] or None</td><td>z</td></tr>"
        "<tr><td>rows</td><td>array of shape (N, L)</td><td>z</td></tr>"
        "<tr><td>t</td><td>float &gt; 0, finite</td><td>z</td></tr>"
        "<tr><td>q</td><td>float in (0, 1), optional (research option)</td><td>z</td></tr>"
        "<tr><td>text</td><td>the label names</td><td>z</td></tr></tbody></table>",
        encoding="utf-8",
    )
    assert markup_left(page) == [":func:`", "``", "``"]
    assert untyped_rows(page) == [
        "model: 'a model name or checkpoint directory'",
        "text: 'the label names'",
    ]


def _inventory(site: Path) -> set[str]:
    data = (site / "objects.inv").read_bytes().split(b"\n", 4)[4]
    return {line.split(" ", 1)[0] for line in zlib.decompress(data).decode("utf-8").splitlines()}


def _exports(init: Path) -> dict[str, str]:
    """``{name: where it is defined}`` for a package's ``__all__``."""
    tree = ast.parse(init.read_text(encoding="utf-8"))
    package = ".".join(init.relative_to(ROOT).parent.parts)
    origin: dict[str, str] = {}
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                origin[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            origin[node.name] = f"{package}.{node.name}"
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            names = list(ast.literal_eval(node.value))
    return {name: origin.get(name, f"{package}.{name}") for name in names}


@pytest.mark.parametrize("init", PACKAGES)
def test_every_exported_name_is_documented(site: Path, init: str) -> None:
    documented = _inventory(site)
    package = ".".join(Path(init).parent.parts)
    missing = [
        name
        for name, where in _exports(ROOT / init).items()
        if where not in documented and f"{package}.{name}" not in documented
    ]
    assert missing == []


def _docstring(path: str, name: str) -> str:
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == name:
            return ast.get_docstring(node) or ""
    raise AssertionError(f"{path} defines no {name}")


@pytest.mark.parametrize("path, name", STARTING_POINTS, ids=lambda v: str(v))
def test_a_starting_point_carries_an_example(path: str, name: str) -> None:
    assert re.search(r"^Examples\n-{8,}\n", _docstring(path, name), re.M), f"{name}: no Examples"


def test_a_dead_link_fails_the_build() -> None:
    """mkdocs validates every link and anchor at warning level, and the build is strict,
    so a link to a missing page or anchor is an error."""
    text = (ROOT / "mkdocs.yaml").read_text(encoding="utf-8")
    assert re.search(r"^strict: true$", text, re.M)
    validation = text[text.index("\nvalidation:") :].split("\n\n")[0]
    for key in ("omitted_files", "absolute_links", "unrecognized_links", "anchors", "not_found"):
        assert re.search(rf"^\s+{key}: warn$", validation, re.M), key


# What a page loads, as opposed to what it links to: a navigation link (`<a href>`) to
# the repository is no load.
LOADS = {
    "script": ("src",), "link": ("href",), "img": ("src", "srcset"), "iframe": ("src",),
    "source": ("src", "srcset"), "video": ("src", "poster"), "audio": ("src",),
    "embed": ("src",), "object": ("data",), "image": ("href", "xlink:href"),
}
EXTERNAL = re.compile(r"^\s*(?:https?:)?//", re.I)
CSS_URL = re.compile(r"(?:url\(\s*['\"]?|@import\s+['\"])\s*((?:https?:)?//[^'\")\s]+)", re.I)
RAW_TEX = re.compile(r"\\\(|\\\[|\$\$")


class _Page(HTMLParser):
    """The URLs a page loads from another host, and its text outside code."""

    def __init__(self) -> None:
        super().__init__()
        self.external: list[str] = []
        self.text: list[str] = []
        self._code = 0
        self._style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value and name in LOADS.get(tag, ()) and any(
                EXTERNAL.match(part) for part in value.split(",")
            ):
                self.external.append(f"<{tag} {name}={value}>")
            if name == "style" and value:
                self.external += CSS_URL.findall(value)
        if tag in ("pre", "code", "script", "style"):
            self._code += 1
        self._style = tag == "style"

    def handle_endtag(self, tag: str) -> None:
        if tag in ("pre", "code", "script", "style"):
            self._code -= 1
        self._style = False

    def handle_data(self, data: str) -> None:
        if self._style:
            self.external += CSS_URL.findall(data)
        if not self._code:
            self.text.append(data)


def read_loads(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def test_the_site_loads_nothing_from_another_host(site: Path) -> None:
    """No script, stylesheet, font, image or frame comes from another host, in a page or
    in a stylesheet the site ships: an air-gapped reader sees the same site."""
    found = {
        str(p.relative_to(site)): read_loads(p).external for p in sorted(site.rglob("*.html"))
    }
    found.update(
        {str(p.relative_to(site)): CSS_URL.findall(p.read_text(encoding="utf-8"))
         for p in sorted(site.rglob("*.css"))}
    )
    assert {page: urls for page, urls in found.items() if urls} == {}


def test_formulas_are_typeset_when_the_site_is_built(site: Path) -> None:
    """Every formula is MathML in the HTML (no script typesets it in the browser), and no
    TeX delimiter is left in a page's text outside code."""
    raw = {}
    for path in sorted(site.rglob("*.html")):
        left = RAW_TEX.findall("".join(read_loads(path).text))
        if left:
            raw[str(path.relative_to(site))] = left
    assert raw == {}
    for page, formulas in [
        ("few-labels", 1), ("reference/api/softmax", 5), ("reference/api/calibration", 3),
    ]:
        text = (site / page / "index.html").read_text(encoding="utf-8")
        assert text.count("<math ") >= formulas, page
        assert 'class="arithmatex"' not in text, page


def test_the_offline_checks_find_what_they_look_for(tmp_path: Path) -> None:
    page = tmp_path / "index.html"
    page.write_text(
        '<link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Roboto">'
        '<script src="//cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js"></script>'
        '<img srcset="a.png 1x, https://x.org/b.png 2x"><div style="background:url(http://x.org/c.png)">'
        '<style>@import "https://x.org/d.css";</style>'
        '<a href="https://github.com/semsoft/semsoft-plugin">repo</a><script src="assets/x.js"></script>'
        "<p>raw \\(x\\) and $$y$$</p><code>\\(kept\\)</code><pre>$$ kept $$</pre>",
        encoding="utf-8",
    )
    read = read_loads(page)
    assert [u.split("=", 1)[0] for u in read.external[:3]] == ["<link href", "<script src", "<img srcset"]
    assert read.external[3:] == ["http://x.org/c.png", "https://x.org/d.css"]
    assert RAW_TEX.findall("".join(read.text)) == ["\\(", "$$", "$$"]


def test_the_math_hook_typesets_what_arithmatex_marks() -> None:
    out = _hook("mkdocs_math").typeset(
        '<p>a <span class="arithmatex">\\(x &lt; y\\)</span></p>'
        '<div class="arithmatex">\\[\\frac{1}{2}\\]</div>'
    )
    assert '<math xmlns="http://www.w3.org/1998/Math/MathML" display="inline">' in out
    assert "<mo>&#x0003C;</mo>" in out  # the unescaped `<`, typeset as an operator
    assert '<div class="math"><math xmlns="http://www.w3.org/1998/Math/MathML" display="block">' in out
    assert "<mfrac>" in out and "arithmatex" not in out and "\\" not in out
    with pytest.raises(ValueError, match="leaves TeX"):  # a command it does not know
        _hook("mkdocs_math").typeset('<span class="arithmatex">\\(\\arg\\max_l p\\)</span>')


# The extras a docs-only venv lacks: the CLI parsers must load without any of them.
NOT_IN_DOCS = (
    "scipy", "sklearn", "torchmetrics", "matplotlib", "peft", "trl", "transformers",
    "accelerate", "safetensors", "gguf", "vllm", "outlines", "ray", "openai", "pandas", "pyarrow",
)
_BLOCKED = f"""
import sys
class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {set(NOT_IN_DOCS)!r}:
            raise ModuleNotFoundError(f"blocked: {{name}}", name=name)
sys.meta_path.insert(0, Blocked())
from semsoft_plugin.app.cli import command_parsers
print(" ".join(sorted(command_parsers())))
"""


def test_every_cli_parser_loads_from_the_docs_extra_alone() -> None:
    """The CLI reference is built from the parsers; with every other extra unimportable
    they all still load, so `pip install -e .[docs]` builds the whole reference."""
    run = subprocess.run(
        [sys.executable, "-c", _BLOCKED], cwd=ROOT, capture_output=True, text=True, check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["classify", "distill", "eval", "tune", "upgrade-fit"]


def _hook(name: str) -> ModuleType:
    """A hook module of `scripts/`, imported as mkdocs imports it."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(ROOT / "scripts"))


def test_a_subcommand_that_cannot_load_fails_the_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """Never left out of the reference without a word: the build stops, naming the extra."""
    from mkdocs.exceptions import PluginError

    reference = _hook("mkdocs_cli_reference")
    assert "## `semsoft eval`" in reference.cli_reference()
    monkeypatch.setitem(sys.modules, "semsoft_eval.cli_eval", None)  # an import that fails
    with pytest.raises(PluginError, match=r"semsoft eval needs .*pip install '[\w-]+\[eval\]'"):
        reference.cli_reference()


def _table_headers(text: str) -> list[str]:
    """The header row of each Markdown table (the line above a `|---|` rule)."""
    lines = text.splitlines()
    return [lines[i - 1] for i, line in enumerate(lines) if re.match(r"^\|(\s*:?-+:?\s*\|)+\s*$", line)]


@pytest.mark.parametrize("page, target", [("docs/results.md", "metrics.md"), ("README.md", "docs/metrics.md")])
def test_every_results_table_links_the_metrics(page: str, target: str) -> None:
    """A reader of a table of numbers is one click from what each column means."""
    headers = _table_headers((ROOT / page).read_text(encoding="utf-8"))
    assert headers, f"{page} has no table"
    assert [h for h in headers if f"]({target}" not in h] == []
    assert (ROOT / "docs" / "metrics.md").is_file()


def test_the_changelog_is_on_the_site_with_working_links(site: Path) -> None:
    """The site's changelog is CHANGELOG.md (included, not copied), its links the site's."""
    source = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert (ROOT / "docs" / "changelog.md").read_text(encoding="utf-8").count("\n") <= 4
    page = "".join(read_page(site / "changelog" / "index.html").text)
    last_heading = re.findall(r"^## (.+)$", source, re.M)[-1]
    assert " ".join(last_heading.replace("`", "").split()) in " ".join(page.split())
    links = _hook("mkdocs_changelog").site_links(
        "[a](docs/few-labels.md) [b](benchmarks/results/memory.md) [c](https://x.org/) [d](#e)",
        "https://github.com/o/r",
    )
    assert links == (
        "[a](few-labels.md) [b](https://github.com/o/r/blob/main/benchmarks/results/memory.md) "
        "[c](https://x.org/) [d](#e)"
    )


def test_the_api_reference_shows_defaults_as_values(site: Path) -> None:
    """`SemsoftConfig`'s defaults read as values (`50`), not as the constants that hold them
    (`DEFAULT_K`): scripts/griffe_defaults.py; a default computed by a call is left alone."""
    config = (site / "reference/api/config/index.html").read_text(encoding="utf-8")
    assert "DEFAULT_" not in config
    row = re.search(r"<td>\s*<code>k</code>\s*</td>.*?</tr>", config, re.S)
    assert row is not None and re.search(r"<td>\s*<code>50</code>\s*</td>", row.group(0))
    distill = (site / "reference/api/distill/index.html").read_text(encoding="utf-8")
    assert "DEFAULT_TARGET_MODULES" not in distill and "q_proj" in distill
