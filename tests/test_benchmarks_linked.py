"""Every result under ``benchmarks/results/`` is linked from a page of the site (``docs/``):
its ``.md`` table, or the ``.json`` where no table was written, by its repository address
(``repo_url`` + ``/blob/main/``, as ``mkdocs.yaml`` links files outside ``docs/``). A result
no page links is one no reader finds: link it where it belongs, or remove it. Reads files;
no model loads."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _prefix() -> str:
    """The address of ``benchmarks/results/`` the pages link by: ``repo_url`` + ``/blob/main/``."""
    found = re.search(r"^repo_url:\s*(\S+)", (ROOT / "mkdocs.yaml").read_text("utf-8"), re.M)
    assert found, "mkdocs.yaml names no repo_url"
    return f"{found.group(1).rstrip('/')}/blob/main/benchmarks/results/"


def unlinked(results: Path, pages: list[Path], prefix: str) -> list[str]:
    """The files of ``results`` that no page links (by ``prefix`` + the file's name): a
    ``.json`` beside its ``.md`` is linked through the ``.md``; any other file by its own."""
    linked = {
        target.split("#", 1)[0].removeprefix(prefix)
        for page in pages
        for target in LINK.findall(page.read_text("utf-8"))
        if target.startswith(prefix)
    }
    missing = []
    for path in sorted(results.iterdir()):
        table = path.with_suffix(".md")
        shown = table if path.suffix == ".json" and table.is_file() else path
        if shown.name not in linked:
            missing.append(path.name)
    return missing


def test_every_result_is_linked_from_a_docs_page() -> None:
    pages = sorted((ROOT / "docs").rglob("*.md"))
    assert unlinked(RESULTS, pages, _prefix()) == [], (
        "results no docs page links (link the .md, or the .json where there is no .md, "
        "by its repository address, or remove the result)"
    )


def test_the_check_names_each_unlinked_result(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    for name in ("a.json", "a.md", "b.json", "c.md", "d.json", "d.md"):
        (results / name).write_text("{}\n", "utf-8")
    prefix = "https://example.org/o/r/blob/main/benchmarks/results/"
    page = tmp_path / "page.md"
    page.write_text(f"[table]({prefix}a.md#x), [JSON]({prefix}b.json), [d](d.md)\n", "utf-8")
    assert unlinked(results, [page], prefix) == ["c.md", "d.json", "d.md"]
