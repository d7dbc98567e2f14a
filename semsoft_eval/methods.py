"""The methods `semsoft eval` compares, by name: a registry.

Each method is a function from a `MethodInputs` (the kept passes, the labels, the folds)
to a `MethodResult` (`[N, L]` probabilities and what it measured), registered with
`method`; `score_methods` runs the named ones. A new method is one decorated function:

```python
@method("semantic-half", "Semantic Softmax averaged with the constrained softmax")
def _semantic_half(m: MethodInputs) -> MethodResult:
    return m.derived(m.semantic(), (m.semantic().probs + m.constrained().probs) / 2)
```

Methods from the kept passes cost no forward pass; `self-consistency`, `verbal` and
`generative-scoring` go through the run's `Backend` and are not in `DEFAULT_METHODS`.
Methods that need labels are cross-fitted over `fold_ids`: every item is scored out of fold.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from semsoft_eval import calibrate
from semsoft_eval.backends import Backend
from semsoft_eval.forward import Forward
from semsoft_plugin.core.calibration import FileCalibration, batch_calibrate
from semsoft_plugin.core.config import SemsoftConfig
from semsoft_plugin.core.labels import LabelSet
from semsoft_plugin.core.softmax import SemanticSoftmax

__all__ = [
    "ALL_METHODS",
    "DEFAULT_METHODS",
    "METHODS",
    "Method",
    "MethodInputs",
    "MethodResult",
    "constrained_probs",
    "method",
    "score_methods",
    "semantic_probs",
]


@dataclass
class MethodResult:
    """One method's label probabilities `[N, L]` and what it measured on the way."""

    probs: np.ndarray
    seconds: float
    fallback_rate: float | None = None
    coverage: float | None = None
    extra: dict[str, Any] | None = None


def semantic_probs(
    forward: Forward, embeddings: Any, labels: LabelSet, config: SemsoftConfig, *, chunk: int = 128
) -> MethodResult:
    """Semantic Softmax of the kept logits with one configuration (the core, batched)."""
    if config.k > forward.store_k:
        raise ValueError(f"k={config.k} exceeds the {forward.store_k} logits kept per item")
    start = time.perf_counter()
    scorer = SemanticSoftmax(embeddings, labels, config)
    parts = [scorer(rows) for rows in forward.chunks(chunk)]
    probs = torch.cat([p.probs for p in parts]).double().numpy()
    fallback = torch.cat([p.fallback for p in parts]).float()
    coverage = torch.cat([p.coverage for p in parts]).float()
    return MethodResult(
        probs=probs / probs.sum(1, keepdims=True),
        seconds=time.perf_counter() - start,
        fallback_rate=float(fallback.mean()),
        coverage=float(coverage.mean()),
    )


def constrained_probs(
    forward: Forward, labels: LabelSet, *, content_free: bool = False
) -> np.ndarray:
    """The softmax over the label answer tokens (the first columns of `label_ids`)."""
    values = forward.cf_label_logits if content_free else forward.label_logits
    return torch.softmax(values[:, : len(labels)].double(), dim=-1).numpy()


@dataclass
class MethodInputs:
    """What a method may read. `constrained()` and `semantic()` are computed once per
    run and shared by the methods built on them; `backend` and `prompts` are there
    for the methods that generate."""

    forward: Forward
    embeddings: Any
    labels: LabelSet
    targets: np.ndarray
    config: SemsoftConfig
    paper: SemsoftConfig
    fold_ids: np.ndarray
    backend: Backend | None = None
    prompts: Sequence[Any] = ()
    seed: int = 0
    _memo: dict[str, MethodResult] = field(default_factory=dict, repr=False)

    def constrained(self) -> MethodResult:
        if "constrained" not in self._memo:
            start = time.perf_counter()
            probs = constrained_probs(self.forward, self.labels)
            self._memo["constrained"] = MethodResult(probs, time.perf_counter() - start)
        return self._memo["constrained"]

    def semantic(self) -> MethodResult:
        if "semantic" not in self._memo:
            self._memo["semantic"] = self.score(self.config)
        return self._memo["semantic"]

    def score(self, config: SemsoftConfig, *, content_free: bool = False) -> MethodResult:
        """Semantic Softmax with `config` on the items (or the content-free inputs)."""
        forward = self.forward.content_free() if content_free else self.forward
        return semantic_probs(forward, self.embeddings, self.labels, config)

    def derived(
        self, base: MethodResult, probs: np.ndarray, start: float | None = None, **extra: Any
    ) -> MethodResult:
        """`probs` computed from `base`: its cost (plus the time since `start`), its
        fallback rate and coverage, and `extra` (e.g. fitted temperatures)."""
        spent = 0.0 if start is None else time.perf_counter() - start
        return MethodResult(
            probs, base.seconds + spent, base.fallback_rate, base.coverage, extra or None
        )

    @property
    def engine(self) -> str:
        """The engine that kept the passes: the backend's (`"transformers"` where no
        backend is given, as for passes read from a transformers cache)."""
        return "transformers" if self.backend is None else self.backend.name

    def generation(self) -> tuple[Backend, list[str]]:
        if self.backend is None:
            raise ValueError("this method generates text: give the run's backend and prompts")
        return self.backend, list(self.labels.names)


Method = Callable[[MethodInputs], MethodResult]


@dataclass(frozen=True)
class _Entry:
    run: Method
    help: str
    default: bool


METHODS: dict[str, _Entry] = {}


def method(name: str, help: str, *, default: bool = True) -> Callable[[Method], Method]:
    """Register `name` (`default=False`: only when asked for by name)."""

    def register(run: Method) -> Method:
        if name in METHODS:
            raise ValueError(f"method {name!r} is registered twice")
        METHODS[name] = _Entry(run, help, default)
        return run

    return register


@method("constrained", "softmax over the label answer tokens (what constrained decoding implies)")
def _constrained(m: MethodInputs) -> MethodResult:
    return m.constrained()


@method("semantic", "Semantic Softmax with the run's SemsoftConfig (default or --config)")
def _semantic(m: MethodInputs) -> MethodResult:
    return m.semantic()


@method("semantic-paper", "the paper's exact formula, SemsoftConfig.preset('paper') at k, tau")
def _semantic_paper(m: MethodInputs) -> MethodResult:
    return m.score(m.paper)


@method("semantic-shared", "SemsoftConfig.preset('shared'): every kept token's whole mass shared out among the labels")
def _semantic_shared(m: MethodInputs) -> MethodResult:
    return m.score(SemsoftConfig.preset("shared").replace(k=m.config.k))


@method("semantic-temperature", "semantic, then a temperature fitted on held folds")
def _semantic_temperature(m: MethodInputs) -> MethodResult:
    start = time.perf_counter()
    probs, temps = calibrate.cross_fit_temperature(m.semantic().probs, m.targets, m.fold_ids)
    return m.derived(m.semantic(), probs, start, fold_temperatures=temps)


@method(
    "fit",
    "Classifier.fit on held folds: the classifier's default fit family for the backend "
    "(the pool weight and temperature, a temperature alone, the bias corrections, and the "
    "probe where the engine keeps hidden states) from the run's config, the out-of-fold rule "
    "and its macro-F1 guard included, fitted on the other folds and applied as predictions "
    "apply it; each fold's choice reported",
)
def _fit(m: MethodInputs) -> MethodResult:
    from semsoft_eval.held_fit import cross_fit_classifier

    start = time.perf_counter()
    probs, choices = cross_fit_classifier(
        m.forward, m.embeddings, m.labels, m.targets, m.fold_ids, m.config, m.engine, seed=m.seed
    )
    return MethodResult(probs, time.perf_counter() - start, extra={"fold_choices": choices})


@method("pooled", "the semantic pool, label-free: SemsoftConfig.preset('pooled') (a = 0.3)")
def _pooled(m: MethodInputs) -> MethodResult:
    return m.score(SemsoftConfig.preset("pooled").replace(k=m.config.k))


@method(
    "silent-vote",
    "the per-row pool, label-free: SemsoftConfig.preset('silent-vote') (each row's pool weight "
    "from its own silent vote)",
)
def _silent_vote(m: MethodInputs) -> MethodResult:
    return m.score(SemsoftConfig.preset("silent-vote").replace(k=m.config.k))


def _file_mode(m: MethodInputs, base: MethodResult) -> MethodResult:
    """The file mode as shipped: the bias of the evaluated items as one file, applied
    row by row at the strength its guard chooses (the default `strength="auto"`)."""
    start = time.perf_counter()
    # Any run size: an evaluation measures the mode on whatever file it is given (the
    # CLI's floor of 32 rows protects a user's file, not a measurement).
    correction = FileCalibration.estimate(base.probs, min_rows=2)
    return m.derived(
        base,
        correction.apply(base.probs),
        start,
        bias=list(correction.bias),
        strength=correction.strength,
        guard=correction.guard,
        confidence=correction.confidence,
    )


@method(
    "constrained-file",
    "the file mode with its guard on constrained (the items' mean as the label bias, divided "
    "out when their mean top probability is at most 0.5)",
)
def _constrained_file(m: MethodInputs) -> MethodResult:
    return _file_mode(m, m.constrained())


@method(
    "pooled-file",
    "the file mode with its guard on the semantic pool (SemsoftConfig.preset('pooled'))",
)
def _pooled_file(m: MethodInputs) -> MethodResult:
    return _file_mode(m, _pooled(m))


@method("semantic-batch", "semantic, then batch calibration (divided by the mean over items)")
def _semantic_batch(m: MethodInputs) -> MethodResult:
    start = time.perf_counter()
    return m.derived(m.semantic(), batch_calibrate(m.semantic().probs), start)


@method("semantic-contextual", "semantic, then contextual calibration (content-free inputs)")
def _semantic_contextual(m: MethodInputs) -> MethodResult:
    start = time.perf_counter()
    cf = m.score(m.config, content_free=True)
    return m.derived(m.semantic(), calibrate.contextual(m.semantic().probs, cf.probs), start)


@method("contextual", "contextual calibration (Zhao et al., 2021): 'N/A', '', '[MASK]'")
def _contextual(m: MethodInputs) -> MethodResult:
    start = time.perf_counter()
    cf = constrained_probs(m.forward, m.labels, content_free=True)
    probs = calibrate.contextual(m.constrained().probs, cf)
    return MethodResult(probs, m.constrained().seconds + time.perf_counter() - start)


@method("batch", "batch calibration (Zhou et al., 2024) of constrained, label-free")
def _batch(m: MethodInputs) -> MethodResult:
    start = time.perf_counter()
    probs = batch_calibrate(m.constrained().probs)
    return MethodResult(probs, m.constrained().seconds + time.perf_counter() - start)


@method("temperature", "temperature scaling of the constrained logits, fitted on held folds")
def _temperature(m: MethodInputs) -> MethodResult:
    start = time.perf_counter()
    probs, temps = calibrate.cross_fit_temperature(m.constrained().probs, m.targets, m.fold_ids)
    seconds = m.constrained().seconds + time.perf_counter() - start
    return MethodResult(probs, seconds, extra={"fold_temperatures": temps})


@method("prior", "the label frequencies of the held folds (the floor to beat)")
def _prior(m: MethodInputs) -> MethodResult:
    return MethodResult(calibrate.cross_fit_prior(m.targets, len(m.labels), m.fold_ids), 0.0)


@method("sequence", "each label's whole token sequence probability, normalised over labels")
def _sequence(m: MethodInputs) -> MethodResult:
    forward = m.forward
    if forward.sequence_logprob is None:
        note = "all labels are single tokens: equals constrained"
        return MethodResult(m.constrained().probs, 0.0, extra={"note": note})
    probs = torch.softmax(forward.sequence_logprob.double(), -1).numpy()
    return MethodResult(probs, forward.sequence_seconds / forward.n)


def _normalised(probs: Any) -> np.ndarray:
    p = np.nan_to_num(np.asarray(probs, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0).clip(
        0, None
    )
    total = p.sum(1, keepdims=True)
    # A row with no mass (nothing parsed) says nothing: uniform, not NaN.
    return np.where(total > 0, p / np.where(total > 0, total, 1.0), 1.0 / p.shape[1])


@method("self-consistency", "vote shares of 10 answers sampled at T=0.7", default=False)
def _self_consistency(m: MethodInputs) -> MethodResult:
    from semsoft_eval import selfconsistency

    backend, names = m.generation()
    start = time.perf_counter()
    probs = selfconsistency.self_consistency_probs(
        backend, None, list(m.prompts), names, n=10, temperature=0.7, seed=m.seed
    )
    return MethodResult(_normalised(probs), time.perf_counter() - start)


@method("verbal", "the confidence the model states with a greedy answer", default=False)
def _verbal(m: MethodInputs) -> MethodResult:
    from semsoft_eval import selfconsistency

    backend, names = m.generation()
    start = time.perf_counter()
    probs, unparsed = selfconsistency.verbal_probs(backend, None, list(m.prompts), names)
    return MethodResult(
        _normalised(probs), time.perf_counter() - start, extra={"n_unparsed": int(unparsed)}
    )


@method(
    "generative-scoring",
    "vLLM's own label scoring (/generative_scoring, apply_softmax=True): the label "
    "tokens' softmax from its one-token requests (--backend vllm)",
    default=False,
)
def _generative_scoring(m: MethodInputs) -> MethodResult:
    """Each item scored as `POST /generative_scoring` scores it, through the engine.

    The server softmaxes the label tokens' full-vocabulary log-probabilities over the
    `label_token_ids` it is given (in float64, as here) and returns only the first
    label's probability per item: a client that wants all `L` probabilities sends
    `L - 1` requests, each with another label first (`extra`). One read of the
    engine's log-probabilities here gives all `L`, so `seconds` is the one-request
    cost per item."""
    if m.backend is None:
        raise ValueError("generative-scoring scores through the engine: give the run's backend")
    start = time.perf_counter()
    logprobs = m.backend.label_token_logprobs(
        list(m.prompts), m.labels.answer_token_ids, progress=False
    )
    probs = torch.softmax(logprobs.double(), dim=-1).numpy()
    requests = max(1, len(m.labels) - 1)
    return MethodResult(
        probs, time.perf_counter() - start, extra={"server_requests_per_item": requests}
    )


@method(
    "probe",
    "logistic regression on the decision step's hidden state (hidden calibration), its L2 "
    "strength chosen by inner folds, fitted on held folds",
    default=False,
)
def _probe(m: MethodInputs) -> MethodResult:
    from semsoft_eval.probe import cross_fit_probe

    if m.forward.hidden is None:
        raise ValueError(
            "method 'probe' needs the decision step's hidden states, which these kept forward "
            "passes lack (the vLLM backend gives none; a transformers cache gains them when "
            "'probe' is asked for through semsoft eval)"
        )
    start = time.perf_counter()
    from semsoft_plugin.fit.probe import label_logit_rows

    rows = label_logit_rows(m.embeddings, m.labels)
    probs, choices = cross_fit_probe(
        m.forward.hidden.numpy(), m.targets, m.fold_ids, len(m.labels), label_rows=rows,
        seed=m.seed,
    )  # fmt: skip
    return MethodResult(probs, time.perf_counter() - start, extra={"fold_choices": choices})


def check_methods(methods: Sequence[str]) -> list[str]:
    """The names, deduplicated in order; an unknown or missing one is refused."""
    names = list(dict.fromkeys(methods))
    unknown = [m for m in names if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown method {unknown[0]!r}; methods are {', '.join(METHODS)}")
    if not names:
        raise ValueError("no method given")
    return names


def score_methods(methods: Sequence[str], inputs: MethodInputs) -> dict[str, MethodResult]:
    """Label probabilities of each named method on the same forward passes."""
    return {name: METHODS[name].run(inputs) for name in check_methods(methods)}


DEFAULT_METHODS = tuple(name for name, entry in METHODS.items() if entry.default)
ALL_METHODS = tuple(METHODS)
