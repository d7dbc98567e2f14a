"""`semsoft distill`: distil self-consistency into a stated confidence (Cacioli, 2026).

The recipe (docs/distillation.md), one module per stage:

* [`data`][semsoft_eval.distill.data]: the questions and their grading;
* [`targets`][semsoft_eval.distill.targets]: sampled answers turned into guarded targets;
* [`training`][semsoft_eval.distill.training]: LoRA SFT with TRL, the adapter as safetensors;
* [`evaluation`][semsoft_eval.distill.evaluation]: the confidence signals on held-out items;
* [`run`][semsoft_eval.distill.run]: the three arms end to end;
* [`tables`][semsoft_eval.distill.tables]: the report's held-out figures as Markdown tables;
* [`cli`][semsoft_eval.distill.cli]: the command line (`semsoft distill`).

Nothing here imports an engine at package import: torch, transformers, peft and TRL are
imported by the functions that need them.
"""

from semsoft_eval.distill.cli import add_parser, run
from semsoft_eval.distill.data import (
    QAItem,
    grade,
    load_label_task,
    load_nq,
    load_task,
    qa_prompt,
    split_items,
    split_items_with_warmup,
)
from semsoft_eval.distill.evaluation import (
    Signal,
    closeness,
    label_signals,
    score,
    self_consistency_signal,
    stated_value_signal,
    stated_values,
    verbal_signal,
)
from semsoft_eval.distill.run import DistillConfig, run_distill
from semsoft_eval.distill.tables import format_markdown
from semsoft_eval.distill.targets import (
    Example,
    SampledItem,
    build_answer_examples,
    build_examples,
    guarded,
    modal_filter,
    sample_cached,
    sample_items,
    summarise,
)
from semsoft_eval.distill.training import load_adapter, save_adapter, train_lora

__all__ = [
    "QAItem",
    "SampledItem",
    "Example",
    "Signal",
    "DistillConfig",
    "load_nq",
    "load_label_task",
    "load_task",
    "split_items",
    "split_items_with_warmup",
    "qa_prompt",
    "grade",
    "sample_items",
    "sample_cached",
    "summarise",
    "modal_filter",
    "guarded",
    "build_examples",
    "build_answer_examples",
    "train_lora",
    "save_adapter",
    "load_adapter",
    "verbal_signal",
    "self_consistency_signal",
    "label_signals",
    "stated_value_signal",
    "stated_values",
    "score",
    "closeness",
    "run_distill",
    "format_markdown",
    "add_parser",
    "run",
]
