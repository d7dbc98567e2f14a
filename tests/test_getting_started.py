"""docs/getting-started.md runs as shown: its code blocks, in order, in a folder holding a
copy of `examples/` (the commands' relative paths), `semsoft` being this checkout's
`python -m semsoft_plugin`. The install block is checked, not run (it needs the network);
the steps that start no engine run in the fast lane, the vLLM step in the slow one
(`vllm`-marked), after the steps it reads (the fit) have run again in its own session."""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "getting-started.md"


def blocks() -> list[tuple[str, str]]:
    """`(language, code)` of each fenced block of the page, in order."""
    text = PAGE.read_text(encoding="utf-8")
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w+)\n(.*?)^```", text, re.M | re.S)]


def run_block(language: str, code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
    if language == "python":
        command = [sys.executable, "-c", code]
    else:
        command = ["bash", "-c", re.sub(r"\bsemsoft (?=\w)", f"{sys.executable} -m semsoft_plugin ", code)]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"{code}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    assert "Traceback" not in done.stderr
    return done


def test_the_page_holds_the_five_steps() -> None:
    found = blocks()
    assert [language for language, _ in found] == ["bash", "bash", "bash", "python", "bash"]
    install = found[0][1].strip()
    assert install == 'pip install -e ".[transformers,eval]"'
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert {"transformers", "eval"} <= set(extras["project"]["optional-dependencies"])
    assert all("--model smollm2-135m" in code or 'from_pretrained("smollm2-135m"' in code
               for _, code in found[1:])  # fmt: skip
    assert "--backend vllm" in found[4][1]
    for name, size in (("fit", 100), ("test", 60)):
        with (ROOT / "examples" / f"labelled-reviews-{name}.csv").open(encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
        assert len(rows) == size and {r["label"] for r in rows} == {"positive", "negative"}


@pytest.fixture(scope="module")
def steps(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """Steps 2 to 4 run in a fresh folder; their outputs."""
    folder = tmp_path_factory.mktemp("getting-started")
    shutil.copytree(ROOT / "examples", folder / "examples")
    outputs = [run_block(language, code, folder).stdout for language, code in blocks()[1:4]]
    return folder, outputs


def test_steps_two_to_four_run_as_shown(steps: tuple[Path, list[str]]) -> None:
    folder, (one, _, fit) = steps
    assert re.search(r"^label: (positive|negative)", one, re.M)
    with (folder / "scored.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 8 and {"label", "p_positive", "p_negative", "truncated"} <= set(rows[0])
    # The fit helps on the held-out file, as the page says (NLL and ECE lower).
    found = dict(re.findall(r"^(default|fitted): accuracy [\d.]+  NLL ([\d.]+)  ECE [\d.]+$", fit, re.M))
    assert float(found["fitted"]) < float(found["default"]), fit
    assert (folder / "reliability.png").stat().st_size > 10_000
    assert (folder / "fit.json").is_file()


@pytest.mark.vllm
def test_step_five_runs_in_vllm(steps: tuple[Path, list[str]]) -> None:
    pytest.importorskip("vllm")
    folder, _ = steps
    language, code = blocks()[4]
    run_block(language, code, folder)
    with (folder / "scored-vllm.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 60
    right = sum(r["fit_label"] == r["label"] for r in rows)
    assert right >= 45, f"the fitted scores in vLLM got {right} of 60 right"
