"""Fits served by a vLLM engine: the operator's fit folder, the processor that applies a
fit inside the engine, and the worker extension that returns its rows.

Every fit file in `SEMSOFT_FIT_DIR` (`FIT_DIR_ENV`) is checked at engine start and served
under its name; a request names one (`semsoft_fit`), never a path. Start a server with fits:

```python
SEMSOFT_FIT_DIR=/srv/fits python -m vllm.entrypoints.openai.api_server --model M \\
    --logits-processors semsoft_plugin.engines.vllm.fits:FittedSemanticSoftmax \\
    --worker-extension-cls semsoft_plugin.engines.vllm.fits.FittedRows \\
    --middleware semsoft_plugin.engines.vllm.admission --max-logprobs 50
```

Only the probe is applied in the engine (a label-offset fit is refused by name). What is
refused, and whose row is whose: docs/vllm.md ("A fitted probe in the engine").
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm import SamplingParams

from semsoft_plugin.core.request import KEY_FIT, SemsoftRequest, fit_name
from semsoft_plugin.engines.vllm.params import validate_params
from semsoft_plugin.engines.vllm.parsed import kept_config
from semsoft_plugin.engines.vllm.processor import SemanticSoftmaxLogitsProcessor
from semsoft_plugin.engines.vllm.reader_tables import FitUse, fitted_rows
from semsoft_plugin.fit.row_probe import LogitsProbe

if TYPE_CHECKING:
    from semsoft_plugin.fit.probe import LinearProbe

__all__ = ["FIT_DIR_ENV", "FittedRows", "FittedSemanticSoftmax", "ServedFit", "served_fit"]

logger = logging.getLogger(__name__)

FIT_DIR_ENV = "SEMSOFT_FIT_DIR"


@dataclass(frozen=True)
class ServedFit:
    """One fit file of the folder, as loaded at start.

    Attributes
    ----------
    name : str
        Its name (the file name without `.json`).
    labels : tuple of str
        The labels it was fitted for, in its columns' order.
    probe : LinearProbe or None
        Its probe; None when the file was refused.
    refusal : str or None
        Why the file was refused at load (then every request naming it is refused).
    """

    name: str
    labels: tuple[str, ...]
    probe: LinearProbe | None
    refusal: str | None = None


_FOLDERS: dict[tuple[str, str], dict[str, ServedFit]] = {}
_FOLDERS_LOCK = threading.Lock()


def _load_one(path: Path, layer: str, hidden_size: int) -> ServedFit:
    """One fit file, read with the fit-file checker and checked against the engine's
    model (`layer`: its output layer's sha256 as stored; `hidden_size`)."""
    from semsoft_plugin.fit.fit_file import FitIdentity
    from semsoft_plugin.fit.fitted import read_fit

    name = path.name[: -len(".json")]
    try:
        fit_name(name)
        fit = read_fit(path)
        correction = fit.correction
        if correction is None or correction.probe is None or fit.identity is None:
            what = "a plain config" if correction is None else f"a {correction.procedure!r} fit"
            raise ValueError(f"it is {what}: only a probe fit is applied inside the engine")
        # The labels and the prompt are the request's to match; the model is the engine's.
        fit.check_run(FitIdentity(fit.identity.labels, fit.identity.prompt, layer, hidden_size))
        return ServedFit(name, correction.labels, correction.probe)
    except Exception as error:  # any file the checker cannot read is refused, by name
        what = str(error) if isinstance(error, ValueError) else f"{type(error).__name__}: {error}"
        return ServedFit(name, (), None, f"fit {name!r} ({path.name}) was refused at load: {what}")


def _load_folder(root: Path, model_config: Any) -> dict[str, ServedFit]:
    """Every `*.json` fit of `root`, each loaded or refused with the reason."""
    from semsoft_plugin.engines import models
    from semsoft_plugin.fit.fit_file import output_layer_sha256

    paths = sorted(root.glob("*.json"))
    try:  # vLLM has the checkpoint locally (a hub name is in the hub cache)
        layer = output_layer_sha256(models.resolve(str(model_config.model), allow_download=False))
    except ValueError as error:
        why = f"the engine's output layer cannot be hashed to check the fit against ({error})"
        return {p.name[:-5]: ServedFit(p.name[:-5], (), None, why) for p in paths}
    size = int(model_config.get_hidden_size())
    return {fit.name: fit for fit in (_load_one(p, layer, size) for p in paths)}


def served_fits(model_config: Any) -> dict[str, ServedFit]:
    """The fits of the folder `SEMSOFT_FIT_DIR` names, for the engine's model
    (`model_config`, vLLM's), read once per process (an empty dict when the variable is
    unset)."""
    folder = os.environ.get(FIT_DIR_ENV)
    if not folder:
        return {}
    key = (str(Path(folder).resolve()), str(model_config.model))
    with _FOLDERS_LOCK:
        found = _FOLDERS.get(key)
        if found is None:
            root = Path(folder)
            if not root.is_dir():
                raise ValueError(f"{FIT_DIR_ENV}={folder!r} is not a folder")
            found = _load_folder(root, model_config)
            for fit in found.values():
                if fit.refusal is not None:
                    logger.warning("semsoft: %s", fit.refusal)
            _FOLDERS[key] = found
    return found


def served_fit(request: SemsoftRequest, model_config: Any) -> ServedFit:
    """The fit `request` names, checked against its labels; `ValueError` naming the
    fit when it is unknown, was refused at load, or was fitted for other labels."""
    fits = served_fits(model_config)
    fit = fits.get(request.fit or "")
    if fit is None:
        where = (
            f"the fits loaded from {FIT_DIR_ENV} are {sorted(fits)}"
            if os.environ.get(FIT_DIR_ENV)
            else f"this engine loaded no fits ({FIT_DIR_ENV} is not set)"
        )
        raise ValueError(f"{KEY_FIT}={request.fit!r} is not a fit this engine serves: {where}")
    if fit.refusal is not None:
        raise ValueError(f"{KEY_FIT}={request.fit!r}: {fit.refusal}")
    if sorted(fit.labels) != sorted(request.labels):
        raise ValueError(
            f"{KEY_FIT}={request.fit!r} was fitted for the labels {list(fit.labels)}, not "
            f"{list(request.labels)}"
        )
    return fit


class FittedSemanticSoftmax(SemanticSoftmaxLogitsProcessor):
    """The semsoft processor that also serves the fits of `SEMSOFT_FIT_DIR`.

    Loaded with `--logits-processors semsoft_plugin.engines.vllm.fits:FittedSemanticSoftmax`
    (`LLM(logits_processors=[...])`); where the plain processor is also loaded (the
    installed entry point), this one takes the engine over and the plain one stands
    down. The folder is read, and the output layer's inverse built, when the engine
    starts.
    """

    def __init__(self, vllm_config: Any, *args: Any) -> None:
        super().__init__(vllm_config, *args)
        self._model_config = vllm_config.model_config
        self._uses: dict[str, LogitsProbe] = {}
        if not self.inert and any(
            f.refusal is None for f in served_fits(self._model_config).values()
        ):
            self._logits_inverse()

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """The plain processor's checks, then, on a server, the fit a request names
        (HTTP 400): the middleware kept the engine's config with the request's parse.
        Offline the processor names a fit it cannot serve when the request joins."""
        request = validate_params(sampling_params)
        config = kept_config(sampling_params.extra_args)
        if request is not None and request.fit is not None and config is not None:
            served_fit(request, config.model_config)

    def _fit_use(self, request: SemsoftRequest) -> FitUse | str:
        try:
            fit = served_fit(request, self._model_config)
        except ValueError as error:
            return str(error)
        assert fit.probe is not None  # served_fit refuses a fit without one
        probe = self._uses.get(fit.name)
        if probe is None:
            probe = self._uses[fit.name] = fit.probe.on_logits(self._logits_inverse())
        order = tuple(fit.labels.index(label) for label in request.labels)
        return FitUse(fit.name, probe, order)


class FittedRows:
    """vLLM worker extension (`--worker-extension-cls
    semsoft_plugin.engines.vllm.fits.FittedRows`): the fitted rows the processor kept in
    this worker (and the hidden states it read back for `semsoft_hidden` requests), read
    by `collective_rpc("semsoft_fitted_rows", args=(keys, take))`."""

    model_runner: Any  # the vLLM worker's, into which this extension is mixed

    def semsoft_fitted_rows(
        self, keys: list[str], take: bool = False
    ) -> list[dict[str, Any] | None]:
        """The rows kept under `keys` (None where none is kept); `take` removes them."""
        return fitted_rows(keys, take)

    def semsoft_weights_state(self) -> str:
        """The digest of this worker's model now (`model_state.module_state`): kept passes
        are read back only while it is unchanged, so weights updated in place are seen."""
        from semsoft_plugin.engines.model_state import module_state

        return module_state(self.model_runner.get_model())
