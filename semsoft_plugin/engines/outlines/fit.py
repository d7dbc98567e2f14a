"""An Outlines choice generator that applies a fit from its config file: the file
`Classifier.save_fit` and `semsoft tune --output` write, read by the one reader
`Classifier.load_fit` and `semsoft classify --config` use
([`semsoft_plugin.fit.fitted.load_fitted`][semsoft_plugin.fit.fitted.load_fitted]).

Why here: engines may not import the app (tests/test_layout.py), so the Outlines adapter
takes the *loaded* correction (`fitted_correction=`) and this function reads the file and
passes the config and the correction on. It is applied at the decision step on a
transformers model, and to the decision step's logits row on a vLLM model (greedy only;
the engine needs the worker extension `semsoft_plugin.engines.vllm.fits.FittedRows`). The
correction means the same only when the Classifier was fitted at Outlines' position
(labels as Outlines writes them, no answer prefix): docs/outlines.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from semsoft_plugin.engines.fit_identity import run_identity
from semsoft_plugin.engines.prompting import PromptTemplate
from semsoft_plugin.fit.fitted import read_fit

__all__ = ["OUTLINES_PROMPT", "load_fit"]

# The prompt as Outlines gives it to the model: the text alone as the user message, the
# chat's generation prompt after it, no answer prefix (a fit must be made with it).
OUTLINES_PROMPT = PromptTemplate("{text}", answer_prefix="")


def load_fit(
    model: Any,
    output_type: Any,
    path: str | Path,
    backend: str | None = None,
    *,
    variants: Any = None,
    temperature: float | None = None,
) -> Any:
    """`semsoft_plugin.engines.outlines.Generator(model, output_type, backend)` with the
    fit a config file holds: its settings, then its correction (a bias member's offset or
    the probe) at the decision step, to each row alone.

    Parameters
    ----------
    model : Any
        The Outlines model, as in [`Generator`][semsoft_plugin.engines.outlines.Generator].
    output_type : Any
        The choice of labels, as in `Generator`.
    backend : str | None
        Outlines' structured-generation backend, as in `Generator`.
    variants : Any
        The spellings that count as each label, as in `Generator`.
    path : str | Path
        The config file (`Classifier.save_fit`, `semsoft tune --output`; a plain
        config file works too). No setting can be overridden: a correction was fitted
        on the file's settings (as `semsoft classify --config` refuses such options)
    temperature : float | None
        The sampling temperature (the calls' default; greedy when unset)

    Raises
    ------
    ValueError
        For a file whose labels are not the choices, fitted with another prompt than
        `OUTLINES_PROMPT` or on another model's output layer; on a vLLM model, for a
        correction with a sampling temperature, or the probe on an engine without the
        worker extension that returns the hidden state.
    """
    from semsoft_plugin.engines.outlines import Generator
    from semsoft_plugin.engines.outlines.base import ChoiceOptions, model_engine
    from semsoft_plugin.engines.outlines.choices import choice_labels

    fit = read_fit(path)
    config, correction = fit.config, fit.correction
    model_engine(model)  # ValueError for a model no generator drives
    if fit.identity is not None:
        choices = choice_labels(output_type)
        # Outlines' prompt names no labels, so their order is the fit's when the set is.
        same = sorted(choices) == sorted(fit.identity.labels)
        fit.check_run(
            run_identity(fit.identity.labels if same else choices, OUTLINES_PROMPT,
                         getattr(model, "model", model))
        )  # fmt: skip
    options = ChoiceOptions(config, variants, correction, temperature)
    return Generator(model, output_type, backend, options=options)
