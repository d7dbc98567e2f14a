"""Steps 4-5 of the recipe: LoRA SFT with TRL and the adapter on disk.

[`train_lora`][semsoft_eval.distill.training.train_lora] runs TRL's `SFTTrainer` with a peft `LoraConfig` (paper: rank 16,
alpha 32) on the examples of [`build_examples`][semsoft_eval.distill.targets.build_examples]. The
examples are tokenised here (the chat template with its pre-filled `"Answer:"` turn,
then the completion and EOS) and handed over as `input_ids` + `completion_mask`, so
TRL's completion-only loss covers exactly the answer and confidence tokens: TRL's own
conversational tokenisation would re-render the assistant prefix as a generation
prompt and split it from the completion. Training is float32 on CPU (bf16 is about 7x
slower on this machine's CPU and loses small AdamW updates) and seeded.

[`save_adapter`][semsoft_eval.distill.training.save_adapter] writes the standard peft layout (`adapter_config.json` +
`adapter_model.safetensors`, never pickle), loadable with `PeftModel.from_pretrained`
([`load_adapter`][semsoft_eval.distill.training.load_adapter]) and by vLLM's LoRA support (`LoRARequest`).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from semsoft_eval.distill.targets import Example
from semsoft_plugin.engines.prompting import format_prompt

__all__ = [
    "DEFAULT_TARGET_MODULES",
    "tokenize_example",
    "train_lora",
    "save_adapter",
    "load_adapter",
]

DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")


def tokenize_example(tokenizer: Any, example: Example) -> dict[str, list[int]]:
    """`input_ids` (prompt, completion, EOS) and `completion_mask` (1 on what is taught)."""
    text, special = format_prompt(tokenizer, example.prompt)
    prompt_ids = tokenizer.encode(text, add_special_tokens=not special)
    answer_ids = tokenizer.encode(example.completion, add_special_tokens=False)
    if tokenizer.eos_token_id is not None:
        answer_ids.append(tokenizer.eos_token_id)  # teach the model to stop after the number
    return {
        "input_ids": prompt_ids + answer_ids,
        "completion_mask": [0] * len(prompt_ids) + [1] * len(answer_ids),
    }


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive int")


def train_lora(
    model: Any,
    tokenizer: Any,
    examples: Sequence[Example],
    *,
    rank: int = 16,
    alpha: int = 32,
    dropout: float = 0.05,
    target_modules: Sequence[str] = DEFAULT_TARGET_MODULES,
    lr: float = 5e-4,
    epochs: int = 2,
    batch_size: int = 8,
    max_steps: int | None = None,
    seed: int = 0,
    progress: bool | None = None,
) -> tuple[Any, list[float]]:
    """LoRA SFT of `model` on `examples` with TRL (loss on the completion tokens only).

    Returns the trained peft model (in eval mode) and the logged loss of each step.
    Give a float32 model. `max_steps` caps the steps (the tests take one).
    """
    from datasets import Dataset
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    if not examples:
        raise ValueError("no training examples")
    for name, value in (
        ("rank", rank),
        ("alpha", alpha),
        ("epochs", epochs),
        ("batch_size", batch_size),
    ):
        _positive_int(name, value)
    if max_steps is not None:
        _positive_int("max_steps", max_steps)
    if not lr > 0:
        raise ValueError(f"lr={lr!r} must be positive")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    dataset = Dataset.from_list([tokenize_example(tokenizer, e) for e in examples])
    lora = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=list(target_modules),
        task_type="CAUSAL_LM",
    )
    with tempfile.TemporaryDirectory(prefix="semsoft-sft-") as scratch:
        args = SFTConfig(
            output_dir=scratch,
            per_device_train_batch_size=batch_size,
            num_train_epochs=epochs,
            max_steps=max_steps if max_steps is not None else -1,
            learning_rate=lr,
            lr_scheduler_type="linear",
            warmup_steps=0,
            weight_decay=0.0,
            max_grad_norm=1.0,
            seed=seed,
            data_seed=seed,
            completion_only_loss=True,
            max_length=None,
            bf16=False,
            fp16=False,
            use_cpu=not torch.cuda.is_available(),
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            disable_tqdm=progress is False,
            dataloader_num_workers=0,
        )
        trainer = SFTTrainer(
            model=model,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=lora,
        )
        trainer.train()
    losses = [float(e["loss"]) for e in trainer.state.log_history if "loss" in e]
    peft_model: Any = trainer.model
    peft_model.eval()
    return peft_model, losses


def save_adapter(peft_model: Any, out_dir: str | Path, info: dict[str, Any] | None = None) -> Path:
    """Save the adapter (peft layout, safetensors) and, beside it, `distill.json`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(str(out), safe_serialization=True)
    if info is not None:
        (out / "distill.json").write_text(json.dumps(info, indent=2) + "\n")
    return out


def load_adapter(base: Any, adapter_dir: str | Path, *, merge: bool = True) -> Any:
    """`base` with a saved adapter applied (merged: as fast as the base model)."""
    from peft import PeftModel

    model = PeftModel.from_pretrained(base, str(adapter_dir))
    model = model.merge_and_unload() if merge else model
    model.eval()
    return model
