"""Rows per second on a local Ray cluster (1 and 2 actors) against the single-process CLI.

``--rows`` reviews of SST-2 dev (it has 872: rows 873 on are dev rows 1, 2, ... again,
each with its own ``id``), the default model in float32, batch
``--batch-size``, labels positive/negative. Three runs of ``semsoft classify`` on the
same JSONL file, each in this process and timed end to end (model loading included,
Ray's start excluded): without Ray, then ``--ray`` with ``--concurrency`` 1 and 2 on
``ray.init(num_cpus=2)``. Every actor and the single process use ``--threads`` torch
threads. Each Ray run's rows are compared with the single process's, row by row (by the
``id`` column): the largest absolute difference of any probability or coverage, and
whether labels, fallback and review flags agree. Writes JSON and Markdown::

    python benchmarks/perf/bench_ray.py --rows 1000 --out benchmarks/results/ray-sst2-1000

The machine's load average before and after each run goes into the results: on a
shared machine the timings move with the other jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

LABELS = "positive,negative"
FLOATS = ("p_", "constrained_", "coverage")


def _rows(path: Path) -> dict[Any, dict[str, Any]]:
    """Rows of a JSONL file or a directory of JSONL files, by ``id``."""
    files = sorted(path.iterdir()) if path.is_dir() else [path]
    rows = [json.loads(line) for f in files for line in f.read_text().splitlines() if line]
    return {r["id"]: r for r in rows}


def _compare(single: dict[Any, dict], other: dict[Any, dict]) -> dict[str, Any]:
    worst, same_flags = 0.0, True
    for key, row in single.items():
        got = other.get(key)
        if got is None:
            return {"rows_missing": len(set(single) - set(other)), "equal_within_1e-6": False}
        for column, value in row.items():
            if column.startswith(FLOATS):
                worst = max(worst, abs(float(got[column]) - float(value)))
            elif column in ("label", "fallback", "review") and got[column] != value:
                same_flags = False
    return {
        "rows": len(other),
        "rows_missing": len(set(single) - set(other)),
        "rows_extra": len(set(other) - set(single)),
        "max_abs_diff": worst,
        "labels_and_flags_equal": same_flags,
        "equal_within_1e-6": worst <= 1e-6 and same_flags and len(other) == len(single),
    }


def _timed(argv: list[str]) -> dict[str, Any]:
    from semsoft_plugin.app.cli import main as semsoft

    before = os.getloadavg()[0]
    began = time.perf_counter()
    code = semsoft(argv)
    seconds = time.perf_counter() - began
    if code != 0:
        raise SystemExit(f"semsoft {' '.join(argv)} exited {code}")
    return {"seconds": seconds, "load_before": before, "load_after": os.getloadavg()[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--actors", default="1,2", help="comma-separated actor counts")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--model", default="default")
    parser.add_argument("--out", default="benchmarks/results/ray-sst2-{rows}")
    args = parser.parse_args()

    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import ray
    import torch

    from semsoft_eval.data import load_builtin

    torch.set_num_threads(args.threads)
    dev = load_builtin("sst2").texts  # 872 reviews: past them the rows start again
    texts = [dev[i % len(dev)] for i in range(args.rows)]
    work = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    source = work / "sst2.jsonl"
    source.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    common = ["--labels", LABELS, "--model", args.model, "--dtype", "float32"]
    common += ["--batch-size", str(args.batch_size)]

    runs: dict[str, Any] = {}
    single_out = work / "single.jsonl"
    runs["single process"] = _timed(
        ["classify", "--input", str(source), "--output", str(single_out), *common]
    )
    single = _rows(single_out)
    ray.init(num_cpus=2, include_dashboard=False)
    for actors in [int(a) for a in args.actors.split(",")]:
        out = work / f"ray-{actors}"
        argv = ["classify", "--input", str(source), "--output", str(out), "--ray", *common]
        argv += ["--concurrency", str(actors), "--num-cpus", str(args.threads)]
        argv += ["--id-column", "id", "--output-format", "jsonl"]
        runs[f"ray, {actors} actor(s)"] = {**_timed(argv), **_compare(single, _rows(out))}
    ray.shutdown()
    for run in runs.values():
        run["rows_per_s"] = len(texts) / run["seconds"]
    base = runs["single process"]["rows_per_s"]
    for run in runs.values():
        run["speedup_vs_single"] = run["rows_per_s"] / base

    result = {
        "command": "python benchmarks/perf/bench_ray.py " + " ".join(sys.argv[1:]),
        "rows": len(texts),
        "data": "SST-2 dev in order (872 reviews, then again from the first)",
        "model": args.model,
        "dtype": "float32",
        "batch_size": args.batch_size,
        "threads_per_process": args.threads,
        "cluster": "ray.init(num_cpus=2) on this machine",
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, shared with other jobs",
        "ray": ray.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "runs": runs,
    }
    out = Path(args.out.format(rows=len(texts)))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")
    lines = [
        f"# semsoft classify on Ray: {len(texts)} SST-2 rows, {args.model}, float32, "
        f"batch {args.batch_size}",
        "",
        f"`{result['command']}` ({result['date']}; {result['machine']}; {args.threads} torch "
        "thread(s) per process; end to end, model loading included, Ray start excluded).",
        "",
        "| run | seconds | rows/s | vs single | load avg before/after | equal to single (1e-6) "
        "| max abs diff |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, run in runs.items():
        equal = run.get("equal_within_1e-6", "(reference)")
        diff = f"{run['max_abs_diff']:.1e}" if "max_abs_diff" in run else ""
        lines.append(
            f"| {name} | {run['seconds']:.1f} | {run['rows_per_s']:.2f} | "
            f"{run['speedup_vs_single']:.2f}x | {run['load_before']:.1f} / "
            f"{run['load_after']:.1f} | {equal} | {diff} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
