"""Read the trained adapters of a finished distillation run again, two ways.

For each arm of ``--out/report.json`` with a saved adapter, reload it and read the
held-out items' verbal confidence as the greedy statement (as the run did) and as the
expected stated value (:func:`semsoft_eval.distill.stated_value_signal`), and count the
confidences stated. The teacher and the one-pass baselines are read again too, each
checked against the run's AUROC2, to add the bootstrap interval of every AUROC2
(:func:`semsoft_eval.confidence.auroc2_interval`). The figures are added to
``report.json`` and ``report.md`` is
written again, so runs made before that reading existed can be compared with new ones.

``--train-fit N`` also reads the expected stated value on the arm's first ``N`` training
items and reports its Spearman correlation with the targets that arm was trained on. It
tells the two failures apart: a student that fits its own targets but not held-out
items has memorised (more items would help); one that does not even fit them has
underfit (more steps, or a larger model, would).

    OMP_NUM_THREADS=2 python3 benchmarks/research/distill_readout.py --out runs/distill-warmup --train-fit 100
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from pathlib import Path
from typing import Any

from semsoft_eval.distill import (  # noqa: E402
    DistillConfig,
    format_markdown,
    label_signals,
    load_adapter,
    load_task,
    score,
    self_consistency_signal,
    split_items,
    stated_value_signal,
)
from semsoft_eval.distill.data import QAItem  # noqa: E402
from semsoft_eval.distill.run import load_student, read_arm, read_verbal  # noqa: E402
from semsoft_eval.distill.targets import (  # noqa: E402
    SampledItem,
    build_examples,
    modal_filter,
)


def _interval_into(row: dict[str, Any], again: dict[str, Any], name: str = "teacher") -> None:
    """Copy the AUROC2 interval of a signal read again, once it is shown to be the same."""
    if again["auroc2"] != row["auroc2"]:
        raise RuntimeError(
            f"{name}: read again, AUROC2 {again['auroc2']}; the run reported {row['auroc2']}"
        )
    row["auroc2_ci95"] = again["auroc2_ci95"]


def _train_fit(
    tuned: Any,
    tokenizer: Any,
    config: DistillConfig,
    name: str,
    train: list[QAItem],
    sampled_train: list[SampledItem],
    n: int,
) -> float:
    """Spearman of the expected stated value with the arm's own targets, first ``n`` items."""
    from scipy.stats import spearmanr

    pool = modal_filter(sampled_train) if name == "modal filter" else sampled_train
    examples = build_examples(
        tokenizer, pool, shuffle_targets=name == "shuffled", seed=config.seed
    )  # build_examples keeps the items with a readable answer, in order
    by_question = {item.question: item for item in train}
    kept = [by_question[s.question] for s in pool if s.modal][:n]
    targets = [e.target for e in examples][:n]
    verbal, _ = read_verbal(config, tuned, tokenizer, kept, f"verbal on training items ({name})")
    expected = stated_value_signal(tuned, tokenizer, kept, verbal)
    return round(float(spearmanr(expected.confidence, targets).statistic), 4)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="a run's output dir (report.json)")
    parser.add_argument(
        "--train-fit",
        type=int,
        default=0,
        metavar="N",
        help="also correlate the stated confidence with each arm's targets on N training items",
    )
    args = parser.parse_args()
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1)))
    out = Path(args.out)
    report = json.loads((out / "report.json").read_text())
    config = DistillConfig(**report["config"])
    train, held = split_items(  # a warm-up leaves train and held-out as they were
        load_task(config.task, config.data), config.train_items, config.eval_items, config.seed
    )
    stored = json.loads((out / "samples.json").read_text())["items"]
    sampled_train = [SampledItem.from_json(s) for s in stored[: config.train_items]]
    sampled = [SampledItem.from_json(s) for s in stored[config.train_items :]]
    if [s.question for s in sampled] != [i.question for i in held]:
        raise ValueError(f"{out}/samples.json does not hold this run's held-out items")
    teacher = self_consistency_signal(sampled, None)
    _interval_into(report["heldout"]["self_consistency"], score(teacher))
    warm = report.get("answer_warmup")  # the arms were trained on the warmed-up model
    warmup = Path(warm["adapter"]) if warm else None

    base, tokenizer = load_student(config, warmup)
    before, entropy = read_verbal(config, base, tokenizer, held, "verbal before")
    baselines = {"verbal before": before, "logit entropy": entropy}
    if config.task != "nq":
        baselines |= {
            s.name: s
            for s in label_signals(base, tokenizer, held, batch_size=config.eval_batch_size)
        }
    for name, signal in baselines.items():
        held_out = report["heldout"]
        row = held_out["verbal_before"] if name == "verbal before" else held_out["one_pass"][name]
        _interval_into(row, score(signal), name)
    del base
    held_targets = [s.target for s in sampled]
    for name, run in report["runs"].items():
        if "adapter" not in run:
            continue
        base, tokenizer = load_student(config, warmup)
        tuned = load_adapter(base, run["adapter"])
        again = read_arm(config, name, tuned, tokenizer, held, teacher, held_targets)
        _interval_into(run["verbal"], again["verbal"], f"{name}, greedy")
        for key in ("stated_values", "target_ceiling_auroc2", "verbal_expected"):
            run[key] = again[key]
        if args.train_fit:
            run["train_fit_spearman"] = _train_fit(
                tuned, tokenizer, config, name, train, sampled_train, args.train_fit
            )
            run["train_fit_items"] = min(args.train_fit, run["examples"])
        del tuned, base
        gc.collect()
    report["readout"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    md = out / "report.md"
    header = md.read_text().split("\n\n", 1)[0] if md.is_file() else ""
    note = (
        f"(expected stated values added by `benchmarks/research/distill_readout.py` on {report['readout']})"
    )
    md.write_text(f"{header}\n{note}\n\n{format_markdown(report)}\n")
    print(md.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
