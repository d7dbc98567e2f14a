"""`Classifier.fit` runs one way through the package: a `sys.setprofile` trace of a fit on
SmolLM2-135M finds no module that calls back into one that called it (a call graph of
semsoft's modules with no cycle). A callback across layers (the fit handing a member to the
caller's probe, which called back into the fit for its metric) is how the fit came to run
back and forth; this pins that it does not.
"""

from __future__ import annotations

import graphlib
import sys
from collections import defaultdict
from types import FrameType
from typing import Any

import pytest

pytest.importorskip("sklearn")

from _reviews import LABELS, NAMES, TEXTS  # noqa: E402

from semsoft_plugin import Classifier  # noqa: E402
from semsoft_plugin.app.engine_settings import EngineSettings  # noqa: E402

pytestmark = pytest.mark.slow
PACKAGE = "semsoft_plugin"


def _module(frame: FrameType | None) -> str | None:
    """The semsoft module of `frame` or of the nearest semsoft frame below it."""
    while frame is not None:
        name = str(frame.f_globals.get("__name__", ""))
        if name.startswith(PACKAGE):
            return name
        frame = frame.f_back
    return None


def traced_calls(run: Any) -> dict[str, set[str]]:
    """caller module -> the semsoft modules it called, while `run()` runs."""
    calls: dict[str, set[str]] = defaultdict(set)

    def profile(frame: FrameType, event: str, _: Any) -> None:
        if event != "call":
            return
        callee = str(frame.f_globals.get("__name__", ""))
        if not callee.startswith(PACKAGE):
            return
        caller = _module(frame.f_back)
        calls[callee]  # every module entered is a node
        if caller is not None and caller != callee:
            calls[caller].add(callee)

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls


def test_a_fit_calls_through_the_modules_one_way() -> None:
    clf = Classifier(
        "smollm2-135m", labels=LABELS, engine=EngineSettings(dtype="float32"), cv=3
    )
    clf.predict_proba(TEXTS[:1])  # the model loaded before the trace
    calls = traced_calls(lambda: clf.fit(TEXTS, list(NAMES)))
    assert len(calls) > 10, sorted(calls)  # the trace saw the fit
    try:
        order = list(graphlib.TopologicalSorter(calls).static_order())
    except graphlib.CycleError as error:
        pytest.fail(f"modules call back into their caller: {' -> '.join(error.args[1])}")
    assert set(order) == set(calls) | {m for called in calls.values() for m in called}


def test_the_trace_sees_a_callback_across_layers() -> None:
    """The fit calling the probe member it was handed is an edge fit -> probe, and the probe
    choosing its strength an edge probe -> guard: a call back into the fit would close a
    cycle, which the test above would name."""
    import numpy as np
    from _probe import zero_label_rows

    from semsoft_plugin.fit import fitting
    from semsoft_plugin.fit.probe import probe_member

    rng = np.random.default_rng(0)
    y = np.arange(24) % 2
    hidden = rng.normal(size=(24, 6)) + y[:, None]
    member = probe_member(hidden, y, 2, label_rows=zero_label_rows(hidden, 2))
    grid = np.full((1, 24, 2), 0.5)
    calls = traced_calls(
        lambda: fitting.fit_probs(grid, grid[0], y, n_folds=3, external={"probe": member})
    )
    assert "semsoft_plugin.fit.probe" in calls["semsoft_plugin.fit.fitting"]
    assert "semsoft_plugin.fit.f1_guard" in calls["semsoft_plugin.fit.probe"]
    assert "semsoft_plugin.fit.fitting" not in calls["semsoft_plugin.fit.probe"]
