"""End-to-end distillation benchmark on CPU: three arms and five confidence signals.

Runs :func:`semsoft_eval.distill.run_distill` (sampling cached in ``--out/samples.json``,
so a rerun skips it), then writes ``--out/report.json`` and ``--out/report.md`` with the
held-out tables, the wall time and the machine (CPU, cores, load).

Its defaults are the measured run of docs/results.md (SST-2, 200 training and 100 held-out items,
an answer warm-up on 100 others, 3 epochs); every flag of ``semsoft distill`` applies.

    OMP_NUM_THREADS=2 python3 benchmarks/research/distill_run.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

from semsoft_eval.distill.cli import add_arguments, config_from_args  # noqa: E402
from semsoft_eval.distill.run import run_distill  # noqa: E402
from semsoft_eval.distill.tables import format_markdown  # noqa: E402


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(parser)
    # the measured run of docs/results.md (about 42 min on 2 CPU cores from nothing)
    parser.set_defaults(
        out="runs/distill-warmup", train_items=200, eval_items=100, epochs=3, warmup_items=100
    )
    args = parser.parse_args()
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1)))
    start, load_start = time.time(), os.getloadavg()
    report = run_distill(config_from_args(args))
    wall = time.time() - start
    report["machine"] = {
        "cpu": _cpu(),
        "arch": platform.machine(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_start": [round(x, 2) for x in load_start],
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "dtype": "float32",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(start)),
        "wall_s": round(wall, 1),
    }
    out = Path(args.out)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    m = report["machine"]
    header = (
        f"`python3 benchmarks/research/distill_run.py {' '.join(sys.argv[1:])}` on {m['date']}: {m['cpu']} "
        f"({m['arch']}, {m['cores']} shared cores, {m['torch_threads']} torch threads, "
        f"load {m['load_average_start'][0]} -> {m['load_average_end'][0]}), {m['dtype']}, "
        f"wall {wall / 60:.1f} min\n\n"
    )
    (out / "report.md").write_text(header + format_markdown(report) + "\n")
    print(header + format_markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
