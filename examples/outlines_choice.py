"""An existing Outlines choice pipeline, before and after adding calibrated probabilities.

Run from the project root (first run converts the default model, later runs load it)::

    PYTHONPATH=. python examples/outlines_choice.py

The "after" label is the argmax of the calibrated probabilities (greedy decoding),
so it can differ from the "before" label, which Outlines picks by its own masked
argmax. On the 135M default model the calibrated scores at this position are not
informative (see docs/outlines.md); the example shows the API, use a larger model for
real work.
"""

from __future__ import annotations

from typing import Literal

import outlines

from semsoft_plugin.engines import models

Emotion = Literal["joy", "sadness", "anger", "fear"]

TEXTS = [
    "I just got the job, I can't stop smiling!",
    "My dog died this morning.",
    "They cancelled my flight again and nobody answers the phone.",
    "There is a strange noise downstairs and I am home alone.",
]


def prompt(text: str) -> str:
    return f"Which emotion does this text express: joy, sadness, anger or fear?\nText: {text}"


def before(model: outlines.models.Transformers) -> list[str]:
    """The pipeline as it is today: labels only, no probabilities."""
    generator = outlines.Generator(model, Emotion)
    return [generator(prompt(text), max_new_tokens=5) for text in TEXTS]


def after(model: outlines.models.Transformers) -> list[str]:
    """The same pipeline with one import changed."""
    from semsoft_plugin.engines.outlines import Generator

    generator = Generator(model, Emotion)
    return generator.batch([prompt(text) for text in TEXTS], max_new_tokens=5)


def main() -> None:
    hf_model, tokenizer = models.load("default")
    model = outlines.from_transformers(hf_model, tokenizer)

    print("before (outlines.Generator):")
    for text, label in zip(TEXTS, before(model), strict=True):
        print(f"  {label:8s} {text}")

    print("after (semsoft_plugin.engines.outlines.Generator):")
    for text, label in zip(TEXTS, after(model), strict=True):
        probs = "  ".join(f"{name} {p:.2f}" for name, p in label.probs.items())
        baseline = "  ".join(f"{name} {p:.2f}" for name, p in label.constrained_probs.items())
        fallback = "  (fallback: constrained softmax)" if label.fallback else ""
        print(f"  {label:8s} {text}")
        print(f"           calibrated:  {probs}{fallback}")
        print(f"           constrained: {baseline}")

    # A generator built elsewhere keeps its own Outlines mask (here the llguidance backend).
    from semsoft_plugin.engines.outlines import wrap

    existing = outlines.Generator(model, Emotion, "llguidance")
    label = wrap(existing, Emotion)(prompt(TEXTS[1]))
    print(f"wrapped llguidance generator: {label} {label.probs}")


if __name__ == "__main__":
    main()
