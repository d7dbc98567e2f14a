"""What the vLLM test files share: the CPU engine's settings, the prompts and label sets,
and small helpers. Importing this module does not import vLLM, so the files that need no
vLLM (``test_vllm_reference.py``) use it too; the engines themselves are session fixtures
in ``conftest.py``, built once for all the ``test_vllm_*`` files.
"""

from __future__ import annotations

import os

# Read by vLLM when an engine starts: in-process engine core, a small KV cache.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from importlib.metadata import EntryPoint, entry_points  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402

from semsoft_plugin.engines.vllm.params import ENTRY_POINT  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SENTIMENT = ["positive", "negative"]
EMOTIONS = ["joy", "sadness", "anger", "fear", "disapproval"]
# Both split into two tokens on SmolLM2's tokenizer: the remainder must be forced.
MULTI = ["disapproval", "annoyance"]
CLASH = ["annoy", "annoyance", "calm"]
ENGINE_ARGS: dict[str, Any] = dict(
    enforce_eager=True,
    max_logprobs=50,
    max_model_len=512,
    # Small token budget: every chat prompt below is prefilled in several chunks.
    max_num_batched_tokens=32,
    enable_prefix_caching=False,
    seed=0,
    # float32 on both sides (the bf16 checkpoint upcasts exactly): vLLM's and
    # transformers' decision-step log-probabilities then agree to ~2e-5, so scores can
    # be compared tightly. In bf16 the logits themselves are rounded (step 0.125 for
    # |logit| in [16, 32)) and the two engines' top-50 log-probs differed by up to 0.18,
    # which moves label probabilities by a few hundredths: a property of the dtype,
    # not of the adapter.
    dtype="float32",
)
# Same dtype on both sides (float32, see ENGINE_ARGS): only kernel order differs.
ATOL = 1e-4
# Chat requests continue the pre-filled answer ("Sentiment:"), as hf.classify does.
CONTINUE = {"continue_final_message": True, "add_generation_prompt": False}


def chat(user: str, prefix: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": user}, {"role": "assistant", "content": prefix}]


PROMPTS = {
    "review": chat(
        "Classify the sentiment of this review: 'I loved this movie, the acting was "
        "wonderful and I would watch it again.' Answer positive or negative.",
        "Sentiment:",
    ),
    "short": chat("Sentiment of 'awful food'? positive or negative.", "Sentiment:"),
    "dog": chat(
        "Which emotion does this express: 'My dog died yesterday and I cannot stop "
        "crying.' Options: joy, sadness, anger, fear, disapproval.",
        "Emotion:",
    ),
}

# Issue 34 items 4 and 6: body fields (beside a good semsoft request) that vLLM's own
# SamplingParams refuses with VLLMValidationError, not a ValueError (it escaped the
# admission middleware: "Exception in ASGI application", the kept-alive connection
# dropped), and beam search (it was admitted: 200 and the text " Positive", no label);
# each with what the 400 must say.
VLLM_REFUSED = {
    "n=2 greedy": ({"n": 2, "temperature": 0}, "n must be 1 when using greedy sampling, got 2"),
    "top_p=0": ({"top_p": 0}, r"top_p must be in \(0, 1\], got 0\.0"),
    "temperature=-1": ({"temperature": -1}, "temperature must be non-negative, got -1"),
    "max_tokens=-1": ({"max_tokens": -1}, "max_tokens must be at least 1, got -1"),
    "min_p=2": ({"min_p": 2}, r"min_p must be in \[0, 1\], got 2"),
    "beam search": ({"use_beam_search": True}, "use_beam_search=True: .*cannot use beam search"),
}


class FreshConfig:
    """Stands for a second engine's config (the processor registers one per config)."""

    def __init__(self, model_config: Any) -> None:
        from types import SimpleNamespace

        self.model_config = model_config
        # What the processor reads as a request joins: synchronous scheduling (CPU).
        self.scheduler_config = SimpleNamespace(async_scheduling=False)
        self.parallel_config = SimpleNamespace(worker_extension_cls=None)


def installed_entry_points() -> list[EntryPoint]:
    """semsoft's ``vllm.logits_processors`` entry points in this environment (none when
    the package is not installed)."""
    return [
        ep for ep in entry_points(group="vllm.logits_processors") if ep.value == ENTRY_POINT
    ]


def without_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference engine must not have the plugin even when the package is
    installed (its entry point is loaded by every engine in the environment)."""
    import vllm.v1.sample.logits_processor as v1_loader

    monkeypatch.setattr(v1_loader, "_load_logitsprocs_plugins", lambda: [])


def token_prompt(tokenizer: Any, item: Any) -> Any:
    """``item`` (a text or chat) as the ``TokensPrompt`` the adapter would send."""
    from vllm.inputs import TokensPrompt

    from semsoft_plugin.engines.prompting import format_prompt

    text, special = format_prompt(tokenizer, item)
    return TokensPrompt(prompt_token_ids=tokenizer.encode(text, add_special_tokens=not special))
