"""The documentation's figures (`benchmarks/research/figures.py`) against their committed
sources: each figure carries its source result's sha256, which must be the committed
file's, so a figure can never silently disagree with the numbers it draws. Engine-free: reads files."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _figures() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "_doc_figures", ROOT / "benchmarks" / "research" / "figures.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


figures = _figures()


@pytest.mark.parametrize("figure", figures.FIGURES, ids=lambda f: f.name)
def test_each_figure_carries_its_committed_sources_sha256(figure) -> None:  # type: ignore[no-untyped-def]
    path = figures.OUT / figure.name
    assert path.is_file(), f"{figure.name} missing: run python benchmarks/research/figures.py"
    source, digest = figures.embedded_source(path)
    assert source == figure.source
    assert digest == figures.sha256(ROOT / source), (
        f"{source} changed since {figure.name} was drawn: run python benchmarks/research/figures.py"
    )


def test_every_figure_is_made_by_the_script_and_shown_with_its_source() -> None:
    drawn = {f.name: f.source for f in figures.FIGURES}
    assert sorted(p.name for p in figures.OUT.iterdir()) == sorted(drawn)
    pages = {p.name: p.read_text(encoding="utf-8") for p in DOCS.glob("*.md")}
    for name, source in drawn.items():
        shown = [page for page, text in pages.items() if f"](figures/{name})" in text]
        assert shown, f"no page shows {name}"
        for page in shown:  # the caption, the paragraph after the image, names the source
            after = pages[page].split(f"](figures/{name})", 1)[1].lstrip("\n").split("\n\n", 1)[0]
            assert Path(source).name in after, f"{page}: {name}'s caption names no {source}"


def test_a_changed_source_is_named(tmp_path: Path) -> None:
    out = tmp_path / "figures"
    shutil.copytree(figures.OUT, out)
    assert figures.stale(out) == []
    svg = out / "throughput.svg"
    text = svg.read_text(encoding="utf-8")
    svg.write_text(re.sub(r"sha256 [0-9a-f]{64}", "sha256 " + "0" * 64, text), encoding="utf-8")
    (out / "reliability-sst2.svg").unlink()
    assert figures.stale(out) == [
        "throughput.svg: benchmarks/results/generative-vs-plugin.json changed since it was drawn",
        "reliability-sst2.svg: missing",
    ]
    svg.write_text(text.replace("<dc:description>", "<dc:title>"), encoding="utf-8")
    with pytest.raises(ValueError, match="names no source"):
        figures.embedded_source(svg)


def test_the_reliability_result_holds_each_methods_bins() -> None:
    """The bins the reliability diagrams draw: every method's 15 bins hold each draw's test
    items once, and the result records the command that made it."""
    result = json.loads((ROOT / "benchmarks/results/probe-curve-reliability.json").read_text())
    assert result["command"].startswith("python benchmarks/research/probe_curve.py ")
    assert set(result["pairs"]) == {"smollm2-135m/sst2", "smollm2-135m/davidson"}
    for pair in result["pairs"].values():
        for size, row in pair["sizes"].items():
            tested = result["draws"] * (pair["n"] - int(size))
            for method in ("default", "temperature", "fit", "probe", "constrained"):
                bins = row["reliability"][method]
                assert len(bins["count"]) == 15 and sum(bins["count"]) == tested
                for c, a, n in zip(bins["confidence"], bins["accuracy"], bins["count"], strict=True):
                    assert (c is None and a is None) if n == 0 else (0 <= a <= 1 and 0 < c <= 1)
