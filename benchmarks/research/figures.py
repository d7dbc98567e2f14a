"""The documentation's figures, drawn from the committed benchmark results: one command
rebuilds them all.

Usage::

    python benchmarks/research/figures.py            # writes docs/figures/*.svg
    python benchmarks/research/figures.py --check    # exit 1 if a figure's source changed since

Each figure is an SVG whose metadata (`<dc:description>`) names its source result and that
file's sha256 when the figure was drawn; `tests/test_figures.py` checks every committed
figure against its committed source, so a result rerun without its figures fails the
tests rather than leaving the site showing old numbers. Nothing here is drawn by hand:
every number on a figure is read from its source JSON. The reliability diagrams are drawn
by `semsoft_eval.report.reliability_figure`, as `semsoft eval --plot` draws a user's.

Importing this module needs only the standard library (the test reads `FIGURES` and
`embedded_source`); drawing needs matplotlib and `semsoft_eval` (the `eval` extra).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "figures"
SALT = "semsoft-figures"  # matplotlib's svg.hashsalt: the same source, the same bytes

# Each kind's name on a panel (`semsoft_eval.benchmarking.KINDS` order).
KIND_NAMES = {
    "goemotions": "GoEmotions (28 labels)",
    "ekman": "GoEmotions, Ekman (7)",
    "sst2": "SST-2 sentiment (2)",
    "agnews": "AG News topics (4)",
    "trec": "TREC questions (6)",
    "convabuse": "ConvAbuse (2)",
    "davidson": "Davidson toxicity (2)",
}
# What each method is called on a figure.
METHOD_NAMES = {
    "default": "default (no labels)",
    "temperature": "temperature scaling",
    "fit": "the fit",
    "probe": "the probe alone",
}


@dataclass(frozen=True)
class Figure:
    """One figure: its file under `docs/figures/`, the result it is drawn from (a path
    from the repository root) and the function that draws it from the loaded JSON."""

    name: str
    source: str
    draw: Callable[[dict[str, Any]], Any]
    args: tuple[Any, ...] = ()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def description(source: str, digest: str) -> str:
    """The text a figure carries in its metadata."""
    return f"Drawn by benchmarks/research/figures.py from {source} (sha256 {digest})"


_DESCRIPTION = re.compile(
    r"<dc:description>Drawn by benchmarks/research/figures\.py from (\S+) \(sha256 ([0-9a-f]{64})\)"
)


def embedded_source(svg: Path) -> tuple[str, str]:
    """The source path and sha256 a figure was drawn from, read from its metadata."""
    found = _DESCRIPTION.search(svg.read_text(encoding="utf-8"))
    if found is None:
        raise ValueError(f"{svg} names no source (no <dc:description> by benchmarks/research/figures.py)")
    return found.group(1), found.group(2)


# -- the figures ---------------------------------------------------------------------------


def throughput(result: dict[str, Any]) -> Any:
    """Rows per second of each path of `bench_vllm.py --generative`: the median pass as a
    bar, every pass as a dot."""
    import matplotlib.pyplot as plt

    gen = result["generative"]
    paths = list(gen["throughput"])
    fig, ax = plt.subplots(figsize=(7.5, 0.55 * len(paths) + 1.3))
    for i, path in enumerate(paths):
        row = gen["throughput"][path]
        color = "C1" if path.startswith("generative_scoring") else "C0"
        ax.barh(i, row["rows_per_s"], color=color, alpha=0.8, edgecolor="k", linewidth=0.5)
        passes = [gen["rows"] / s for s in row["seconds"]]
        ax.plot(passes, [i] * len(passes), "o", ms=4, color="k", alpha=0.7,
                label="one pass" if i == 0 else None)  # fmt: skip
        ax.text(row["rows_per_s"] * 0.02, i, f"{row['rows_per_s']:.2f}", va="center",
                fontsize=8, color="white", fontweight="bold")  # fmt: skip
    ax.set_yticks(range(len(paths)), paths, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("rows per second (bar: the median of the passes)", fontsize=8)
    ax.tick_params(axis="x", labelsize=8)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(
        f"{result['model']}, {result['dtype']}, {gen['rows']} SST-2 rows, "
        f"{gen['repeats']} passes per path (vLLM on CPU)",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


def learning_curve(result: dict[str, Any], model: str) -> Any:
    """Test NLL against the labels fitted on, one panel per kind of `model`'s pairs."""
    import matplotlib.pyplot as plt

    pairs = {k.split("/", 1)[1]: v for k, v in result["pairs"].items() if k.startswith(model + "/")}
    if not pairs:
        raise SystemExit(f"{model} has no pairs in the probe curve")
    kinds = [k for k in KIND_NAMES if k in pairs] + [k for k in pairs if k not in KIND_NAMES]
    cols = 4
    rows = (len(kinds) + 1 + cols - 1) // cols  # one cell for the legend
    fig, axes = plt.subplots(rows, cols, figsize=(3.0 * cols, 2.6 * rows), squeeze=False)
    styles = {"default": ("k", ":", "s"), "temperature": ("C1", "--", "^"),
              "fit": ("C0", "-", "o"), "probe": ("C2", "-.", "d")}  # fmt: skip
    for ax, kind in zip(axes.ravel(), kinds, strict=False):
        sizes = sorted(pairs[kind]["sizes"], key=int)
        x = [int(s) for s in sizes]
        for method, (color, line, marker) in styles.items():
            y = [pairs[kind]["sizes"][s][method]["nll"] for s in sizes]
            ax.plot(x, y, line, marker=marker, ms=4, color=color, label=METHOD_NAMES[method])
        ax.set_xscale("log", base=2)
        ax.set_xticks(x, [str(v) for v in x])
        ax.minorticks_off()
        ax.set_title(f"{KIND_NAMES.get(kind, kind)}, n={pairs[kind]['n']}", fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel("test NLL", fontsize=8)
    for ax in axes[-1, :]:
        ax.set_xlabel("labelled items fitted on", fontsize=8)
    spare = axes.ravel()[len(kinds) :]
    handles, labels = axes.ravel()[0].get_legend_handles_labels()
    for ax in spare:
        ax.axis("off")
    spare[0].legend(handles, labels, loc="center", fontsize=8,
                    title=f"mean of {result['draws']} draws", title_fontsize=8)  # fmt: skip
    fig.suptitle(f"{model}: test NLL against the labels fitted on (lower is better)", fontsize=10)
    fig.tight_layout()
    return fig


def reliability(result: dict[str, Any], pair: str) -> Any:
    """Reliability diagrams of the default, temperature scaling and the fit on one pair
    (the first size the result holds), the test items of every draw pooled."""
    from semsoft_eval.report import reliability_figure

    sizes = result["pairs"][pair]["sizes"]
    size = sorted(sizes, key=int)[0]
    bins = sizes[size]["reliability"]
    panels = {METHOD_NAMES[m] + ("" if m == "default" else f", {size} labels"): bins[m]
              for m in ("default", "temperature", "fit")}  # fmt: skip
    model, kind = pair.split("/", 1)
    total = sum(bins["default"]["count"])
    title = (f"{KIND_NAMES.get(kind, kind)}, {model}: {total} test predictions "
             f"({result['draws']} draws of {size} labels, the rest of {result['pairs'][pair]['n']} "
             "items tested)")  # fmt: skip
    return reliability_figure(panels, title=title, cols=3)


FIGURES = (
    Figure("throughput.svg", "benchmarks/results/generative-vs-plugin.json", throughput),
    Figure("learning-curve-smollm2-135m.svg", "benchmarks/results/probe-curve.json",
           learning_curve, ("smollm2-135m",)),
    Figure("learning-curve-qwen2.5-coder-1.5b.svg", "benchmarks/results/probe-curve.json",
           learning_curve, ("qwen2.5-coder-1.5b",)),
    Figure("reliability-sst2.svg", "benchmarks/results/probe-curve-reliability.json",
           reliability, ("smollm2-135m/sst2",)),
    Figure("reliability-davidson.svg", "benchmarks/results/probe-curve-reliability.json",
           reliability, ("smollm2-135m/davidson",)),
)  # fmt: skip


def draw(figure: Figure, out: Path = OUT) -> Path:
    """Draw one figure from its source into `out`, its source's sha256 in its metadata."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    source = ROOT / figure.source
    plt.rcParams["svg.hashsalt"] = SALT
    fig = figure.draw(json.loads(source.read_text()), *figure.args)
    out.mkdir(parents=True, exist_ok=True)
    path = out / figure.name
    metadata = {"Title": figure.name.removesuffix(".svg"), "Date": None,
                "Creator": "matplotlib, benchmarks/research/figures.py",
                "Description": description(figure.source, sha256(source))}  # fmt: skip
    fig.savefig(path, format="svg", metadata=metadata)
    plt.close(fig)
    return path


def stale(out: Path = OUT) -> list[str]:
    """Each figure that is missing or whose source changed since it was drawn."""
    problems = []
    for figure in FIGURES:
        path = out / figure.name
        if not path.is_file():
            problems.append(f"{figure.name}: missing")
            continue
        source, digest = embedded_source(path)
        if source != figure.source:
            problems.append(f"{figure.name}: drawn from {source}, not {figure.source}")
        elif digest != sha256(ROOT / source):
            problems.append(f"{figure.name}: {source} changed since it was drawn")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="draw nothing; exit 1 naming each figure whose source changed")  # fmt: skip
    parser.add_argument("--out", type=Path, default=OUT, help="the folder (docs/figures)")
    args = parser.parse_args()
    if args.check:
        problems = stale(args.out)
        print("\n".join(problems) or f"{len(FIGURES)} figures match their sources")
        return 1 if problems else 0
    for figure in FIGURES:
        print(draw(figure, args.out).relative_to(ROOT) if args.out == OUT else draw(figure, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
