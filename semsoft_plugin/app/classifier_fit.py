"""``Classifier.fit`` on labels: one forward pass per text, then the core's search over
the whole family (:func:`semsoft_plugin.core.fit_family.fit_config`, the one ``semsoft
tune`` runs), with the probe fitted here where the engine exposes the hidden state.

Which members an engine supports: transformers gives the decision step's hidden state
(:class:`~semsoft_plugin.engines.hf_hidden.HiddenAtDecision`, read during the same pass),
so every member; vLLM's generate runner returns token log-probabilities only, so every
member but the probe, and a probe asked for on vLLM is refused by name, never dropped
(what vLLM could do: a second engine of the same checkpoint with ``runner="pooling"`` and
last-token pooling returns the final hidden state from ``llm.embed``, one more model load
and prompt pass per item; not built).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from semsoft_plugin.app.fit_file import FitIdentity
from semsoft_plugin.app.fitted import FittedCorrection
from semsoft_plugin.app.probe import probe_refused
from semsoft_plugin.app.texts import target_list
from semsoft_plugin.core.calibration import CONTENT_FREE
from semsoft_plugin.core.labels import label_names
from semsoft_plugin.engines.prompting import build_inputs

if TYPE_CHECKING:
    from semsoft_plugin.app.classifier import Classifier
    from semsoft_plugin.core.fit_family import FitResult

__all__ = [
    "checked_family",
    "corrected_rows",
    "fit_labelled",
    "fit_targets",
    "kept_passes",
    "loaded_fit",
]

_ADVICE = "use backend='hf', or leave 'probe' out of fit_family"


def fit_targets(clf: Classifier, values: list[str], y: Any) -> tuple[list[str], list[int] | None]:
    """The label names ``fit`` fits and ``y`` as their indices (None: ``y is None`` with
    ``calibrate="file"``, the unlabelled fit), each bad value refused by name."""
    unlabelled = y is None and clf.calibrate == "file"
    if unlabelled and clf.labels is None:
        raise ValueError("fit(texts) without y needs labels=[...]: texts do not name them")
    if y is None and not unlabelled:  # scikit-learn's words (check_requires_y_none)
        raise ValueError(
            "Classifier requires y to be passed, but the target y is None (only "
            "calibrate='file' fits on texts alone)"
        )
    given = [] if y is None else target_list(y, len(values))
    names = clf._names() if clf.labels is not None else label_names(sorted(set(given)))
    index = {name: i for i, name in enumerate(names)}
    unknown = [label for label in given if label not in index]
    if unknown:
        raise ValueError(f"y holds {unknown[0]!r}, which is not a label; labels: {names}")
    return names, None if unlabelled else [index[label] for label in given]


def checked_family(family: Sequence[str] | None, backend: str) -> tuple[str, ...]:
    """The members ``Classifier.fit`` checks on ``backend`` (``"hf"``/``"vllm"``):
    ``family`` checked (an unknown member refused by name, the probe on vLLM refused),
    or with ``None`` every member the engine supports."""
    from semsoft_plugin.core.fitting import FAMILY, check_family

    if family is None:
        return tuple(m for m in FAMILY if m != "probe" or backend != "vllm")
    names = check_family(family)
    if "probe" in names and backend == "vllm":
        raise probe_refused(_ADVICE)
    return names


def kept_passes(
    clf: Classifier, setup: Any, inputs: list[Any], store_k: int, *, hidden: bool = False
) -> tuple[Any, Any]:
    """The decision step's top ``store_k`` raw scores and every label token's
    (:class:`~semsoft_plugin.core.kept_scores.KeptScores`) from ``clf``'s engine, and with
    ``hidden`` the ``[N, H]`` hidden states there (transformers; else None)."""
    import torch

    from semsoft_plugin.core.kept_scores import KeptScores, compress, kept_from_top_logprobs
    from semsoft_plugin.core.kept_scores import label_token_ids as token_ids_of
    from semsoft_plugin.engines.hf_hidden import HiddenAtDecision

    token_ids = token_ids_of(setup.labels)
    if setup.loaded.backend == "vllm":
        if hidden:
            raise probe_refused(_ADVICE)
        results = clf._classify(setup, inputs, keep_logprobs=store_k, token_ids=token_ids)
        return kept_from_top_logprobs(results, token_ids), None
    # The fit keeps logits from hf.classify's default float32 head, as it always has.
    with HiddenAtDecision(setup.loaded.model if hidden else None) as hook:
        classified = clf._classify(setup, inputs, keep_logits=True, exact_head=True)
    rows = torch.stack([c.logits for c in classified if c.logits is not None])
    ids = torch.tensor(token_ids)
    top_ids, top_logits, label_logits = compress(rows, store_k, ids)
    states = hook.rows(setup.loaded.tokenizer, inputs, clf.batch_size) if hidden else None
    return KeptScores(top_ids, top_logits, ids, label_logits), states


def _split(kept: Any, n: int) -> tuple[Any, Any]:
    from semsoft_plugin.core.kept_scores import KeptScores

    def part(rows: slice) -> KeptScores:
        return KeptScores(kept.top_ids[rows], kept.top_logits[rows], kept.label_ids,
                          kept.label_logits[rows])  # fmt: skip

    return part(slice(0, n)), part(slice(n, None))


def fit_labelled(
    clf: Classifier, setup: Any, values: list[str], targets: list[int], axes: dict[str, Any]
) -> tuple[FitResult, FittedCorrection | None]:
    """The labelled fit of ``clf`` on ``values`` (label indices ``targets`` in
    ``setup.labels`` order), from ``setup.config`` over ``axes``: what it chose and the
    correction it adopted (None: the config alone)."""
    import numpy as np

    from semsoft_plugin.app.probe import fit_probe, probe_member
    from semsoft_plugin.core import fit_family

    family = checked_family(clf.fit_family, setup.loaded.backend)
    start = setup.config
    store_k = max(c.k for c in fit_family.configs_with_start(axes, start)[0])
    inputs = setup.fitter.prompts(values)[0]
    names = list(setup.labels.names)
    if "contextual" in family:  # the content-free inputs ride in the same pass
        tokenizer = setup.loaded.tokenizer
        inputs += build_inputs(setup.prompt, list(CONTENT_FREE), names, tokenizer)
    kept, hidden = kept_passes(clf, setup, inputs, store_k, hidden="probe" in family)
    kept, content_free = _split(kept, len(values))
    y = np.asarray(targets, dtype=np.int64)
    external = {}
    if hidden is not None:
        x = hidden[: len(values)].numpy()
        external["probe"] = probe_member(x, y, len(names), seed=clf.random_state)
    result = fit_family.fit_config(
        kept, setup.loaded.embeddings(), setup.labels, y, start=start, grid=axes,
        temperature=bool(clf.fit_temperature), n_folds=clf.n_folds, margin=clf.margin,
        seed=clf.random_state, family=family,
        content_free=content_free if "contextual" in family else None, external=external,
    )  # fmt: skip
    if result.kept_default or result.procedure in ("grid", "temperature"):
        return result, None
    if result.procedure == "probe":
        fitted = fit_probe(x, y, len(names), seed=clf.random_state)
        return result, FittedCorrection("probe", tuple(names), probe=fitted)
    offset = tuple(float(v) for v in result.offset or ())
    return result, FittedCorrection(result.procedure, tuple(names), offset=offset)


def fit_identity(clf: Classifier, labels: Any) -> FitIdentity:
    """What ``clf`` applies a fit with: ``labels`` (prompt order), its prompt and the
    output layer of its model, found without loading it."""
    from semsoft_plugin.app.classifier_settings import checked_settings
    from semsoft_plugin.app.fit_file import run_identity

    prompt, _ = checked_settings(clf)
    return run_identity(labels, prompt, clf.model, allow_download=True)


def loaded_fit(clf: Classifier, path: Any) -> tuple[Any, FittedCorrection | None]:
    """The config and correction a file holds, checked against ``clf``: its labels, no
    ``calibrate`` on top, and no probe on vLLM."""
    from semsoft_plugin.app import handles
    from semsoft_plugin.app.fitted import read_fit

    fit = read_fit(path)
    config, correction = fit.config, fit.correction
    if correction is not None:
        fit.check_run(fit_identity(clf, clf._names()))
        if clf.calibrate is not None:
            raise ValueError(
                f"calibrate={clf.calibrate!r} with a fitted correction ({correction.procedure}) "
                "from a config file: the correction was fitted on uncorrected scores; use one "
                "or the other"
            )
        if correction.needs_hidden and handles.engine_of(clf) == "vllm":
            raise probe_refused(_ADVICE)
    return config, correction


def corrected_rows(
    clf: Classifier, setup: Any, inputs: list[Any], classes: tuple[str, ...]
) -> tuple[list[Any], Any]:
    """Each input's result and ``[N, L]`` probabilities (``classes`` order) with the fit's
    correction applied row by row (the probe reads the hidden state of the same pass)."""
    from semsoft_plugin.app.predictions import probability_rows
    from semsoft_plugin.engines.hf_hidden import HiddenAtDecision

    correction: FittedCorrection | None = clf.__dict__.get("fitted_correction_")
    probe = correction is not None and correction.needs_hidden
    with HiddenAtDecision(setup.loaded.model if probe else None) as hook:
        results = clf._classify(setup, inputs)
    rows: list[Any] = [r.probs for r in results]
    probs = probability_rows(rows, classes)
    if correction is None:
        return results, probs
    hidden = hook.rows(setup.loaded.tokenizer, inputs, clf.batch_size) if probe else None
    return results, correction.apply(probs, classes, hidden)
