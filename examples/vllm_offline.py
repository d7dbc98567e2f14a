"""Offline batch classification with vLLM and calibrated label probabilities.

Run: python examples/vllm_offline.py   (CPU: see docs/vllm.md, Install)
"""

from __future__ import annotations

import os

# In-process engine: quick to start for a small run (drop for multi-GPU serving).
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from vllm import LLM  # noqa: E402

from semsoft_plugin.engines import models  # noqa: E402
from semsoft_plugin.engines import vllm as semsoft  # noqa: E402
from semsoft_plugin.engines.vllm.params import ENTRY_POINT  # noqa: E402

LABELS = ["joy", "sadness", "anger", "fear"]
TEXTS = [
    "My dog died yesterday and I cannot stop crying.",
    "We won the final in the last minute!",
    "Someone keyed my car again and the police do nothing.",
]


def main() -> None:
    checkpoint = str(models.resolve("default"))  # SmolLM2-135M-Instruct, safetensors
    llm = LLM(
        checkpoint,
        logits_processors=[ENTRY_POINT],  # omit if the package is installed
        max_logprobs=50,  # the scores are read from the top-50 raw log-probabilities
        enforce_eager=True,
        max_model_len=512,
    )
    prompts = [
        [
            {"role": "user", "content": f"Which emotion: '{text}' Options: {', '.join(LABELS)}."},
            {"role": "assistant", "content": "Emotion:"},
        ]
        for text in TEXTS
    ]
    # The common case in one call ...
    for text, result in zip(TEXTS, semsoft.classify_vllm(llm, prompts, LABELS), strict=True):
        probs = ", ".join(f"{k} {v:.2f}" for k, v in result.probs.items())
        print(f"{result.label:>8}  [{probs}]  {text}")

    # ... or ordinary generate calls, opted in per request.
    params = semsoft.sampling_params(LABELS)
    tokenizer = llm.get_tokenizer()
    text = tokenizer.apply_chat_template(prompts[0], tokenize=False, continue_final_message=True)
    output = llm.generate(
        [{"prompt_token_ids": tokenizer.encode(text, add_special_tokens=False)}], params
    )[0]
    print(repr(output.outputs[0].text), semsoft.label_probs(output, params, llm))


if __name__ == "__main__":
    main()
