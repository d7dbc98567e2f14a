"""What the engine's processor keeps for the readers: why a row went unscored, and the
rows a fit scored inside the engine, with the channel that carries them out.

Unscored rows (NaN, every token masked, a failed scoring) are recorded with the reason
(`unscored_reason`). A fit's rows
([LogitsProbe][semsoft_plugin.fit.row_probe.LogitsProbe]) and `semsoft_hidden` rows
([LogitsInverse][semsoft_plugin.fit.logits_inverse.LogitsInverse], under the fit name
`HIDDEN`) are kept in a bounded table in the worker process, under `fitted_key`, since
vLLM's returned log-probs are taken before any processor runs. The worker extension
`semsoft_plugin.engines.vllm.fits.FittedRows` serves them through `collective_rpc`
(`RPC_METHOD`); the server's middleware writes them as `semsoft_fitted` (`RESPONSE_FITTED`).
Why this channel and whose row is whose: docs/vllm.md ("A fitted probe in the engine").
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from semsoft_plugin.core.request import KEY_FIT, KEY_ROW_KEY, SemsoftRequest
from semsoft_plugin.engines.reader_contract import FitNotApplied
from semsoft_plugin.engines.scoring import CACHE_SIZE, ModelScorer
from semsoft_plugin.fit.logits_inverse import DEFAULT_TOLERANCE, LogitsInverse
from semsoft_plugin.fit.row_probe import LogitsProbe

__all__ = [
    "EXTENSION",
    "FIT_PROCESSOR",
    "HIDDEN",
    "RPC_METHOD",
    "FitUse",
    "HiddenNotRead",
    "apply_fits",
    "keep",
    "keep_hidden",
    "keep_reason",
    "fitted_key",
    "row_table_key",
    "hidden_refusal",
    "read_hidden",
    "fitted_rows",
    "record_fits",
    "record_unscored",
    "unscored_reason",
]

# The worker extension and the processor subclass that serve fits (app layer), and the
# worker method the readers call through collective_rpc.
EXTENSION = "semsoft_plugin.engines.vllm.fits.FittedRows"
FIT_PROCESSOR = "semsoft_plugin.engines.vllm.fits:FittedSemanticSoftmax"
RPC_METHOD = "semsoft_fitted_rows"
# Fitted rows kept per worker process: a reader reads its row when the request ends, so
# only a reader slower than this many later decisions finds its row gone (and is told).
TABLE_SIZE = 65536
# The table name of a request's hidden state: a fit name holds no '/', so no fit's key
# is ever a hidden state's.
HIDDEN = "/hidden"


# Requests the processor could not score, for the readers in this process: (prompt
# token ids, output tokens before the decision step) -> the reason. Bounded like the
# label-set cache. Only in-process readers see it (the engine process of a server
# is another one); there a model-made NaN still shows in the raw log-probabilities.
_UNSCORED: OrderedDict[tuple[str | None, tuple[int, ...], tuple[int, ...]], str] = OrderedDict()
_UNSCORED_LOCK = threading.Lock()


def _unscored_key(
    request: SemsoftRequest, prompt: Sequence[int], before: Sequence[int]
) -> tuple[str | None, tuple[int, ...], tuple[int, ...]]:
    return (request.row_key, tuple(int(t) for t in prompt), tuple(int(t) for t in before))


def record_unscored(
    request: SemsoftRequest, prompt: Sequence[int], before: Sequence[int], reason: str
) -> None:
    key = _unscored_key(request, prompt, before)
    with _UNSCORED_LOCK:
        _UNSCORED[key] = reason
        _UNSCORED.move_to_end(key)
        while len(_UNSCORED) > CACHE_SIZE:
            _UNSCORED.popitem(last=False)


def unscored_reason(
    model: ModelScorer,
    request: SemsoftRequest,
    prompt: Sequence[int] | None,
    generated: Sequence[int],
    step: int,
) -> str | None:
    """Why the engine left this output unconstrained, if it recorded one: only when
    the decision-step token is not a label (a constrained row always emits one)."""
    if not _UNSCORED or request.mode != "constrain" or prompt is None:
        return None
    if len(generated) > step and int(generated[step]) in model.scoring(request).answer_to_label:
        return None
    key = _unscored_key(request, prompt, generated[:step])
    with _UNSCORED_LOCK:
        return _UNSCORED.get(key)


@dataclass(frozen=True)
class FitUse:
    """A fit as one request uses it in the engine.

    Attributes
    ----------
    name : str
        The fit's name (`semsoft_fit`).
    probe : LogitsProbe
        The probe on the logits row.
    order : tuple of int
        For each of the request's labels, its column among the fit's labels.
    tolerance : float
        The largest residual of a row still scored.
    """

    name: str
    probe: LogitsProbe
    order: tuple[int, ...]
    tolerance: float = DEFAULT_TOLERANCE


_TABLE: OrderedDict[str, dict[str, Any]] = OrderedDict()
_LOCK = threading.Lock()


def fitted_key(row_key: str, table: str, prompt: Sequence[int], before: Sequence[int]) -> str:
    """The table key of a request's decision step: the request's own `semsoft_row_key`
    (minted by semsoft for it alone), the table (its fit's name, or `HIDDEN`), its
    prompt's token ids and the tokens generated before the decision step (hex, 32
    characters). Requests that share a row key (one `SamplingParams` given for several
    prompts) still differ by prompt; where even that is the same, see `record_fits`."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(row_key.encode("ascii") + b"\0" + table.encode("utf-8") + b"\0")
    digest.update(
        torch.tensor([len(prompt), *prompt, *before], dtype=torch.int64).numpy().tobytes()
    )
    return digest.hexdigest()


def record_fits(uses: Sequence[tuple[FitUse, str | None]], picked: Tensor) -> list[Tensor | None]:
    """Score each row of `picked` (`[N, V]` decision-step logits) with its fit, keep the
    row in the table under its key, and return its probabilities in the request's
    label order (None where the row has no fit or could not be scored with it).

    Parameters
    ----------
    uses : Sequence[tuple[FitUse, str | None]]
        Sequence of (FitUse, str or None)
        Per row, its fit and its `fitted_key` (None: no prompt ids to key it by; it is
        scored, but no reader can find it).
    picked : Tensor
        The rows, as the processor got them.

    Returns
    -------
    list of Tensor or None
        Per row, `[L]` float64 probabilities to constrain the label with, or None.
    """
    # One read of the hidden states per inverse (an engine has one): the two products
    # with the [V, d] output layer are the cost, shared by every fit and row.
    reads: dict[tuple[int, float], Any] = {}
    for key_ in {(id(use.probe.inverse), use.tolerance) for use, _ in uses}:
        index = [i for i, (u, _) in enumerate(uses) if (id(u.probe.inverse), u.tolerance) == key_]
        inverse = uses[index[0]][0].probe.inverse
        reads[key_] = (index, inverse.read(picked[index], key_[1]))
    out: list[Tensor | None] = []
    entries: dict[str, dict[str, Any]] = {}
    for i, (use, key) in enumerate(uses):
        index, back = reads[(id(use.probe.inverse), use.tolerance)]
        j = index.index(i)
        residual = float(back.residual[j])
        probs = None
        if bool(back.readable[j]):
            probs = use.probe.hidden_probs(back.hidden[j : j + 1])[0, list(use.order)]
        if probs is not None and bool(torch.isfinite(probs).all()):
            entry: dict[str, Any] = {"probs": probs.tolist(), "residual": residual}
            out.append(probs)
        elif probs is not None:  # a bounded probe cannot get here; never NaN to a reader
            entry = {"reason": f"fit {use.name!r} not applied: its scores are not finite"}
            out.append(None)
        else:
            why = row_reason(residual, use.tolerance)
            entry = {"reason": f"fit {use.name!r} not applied: {why}"}
            out.append(None)
        if key is not None:
            entries[key] = _one_row(entries.get(key), entry, use.name)
    for key, entry in entries.items():
        keep(key, entry)
    return out


# Two rows of one key in one step closer than this are the same row (a duplicate prompt
# under one SamplingParams); farther apart, they came from requests that differ in what the
# processor cannot see (a LoRA adapter), and neither may be handed to the other's reader.
SAME_ROW_ATOL = 1e-6


def _one_row(kept: dict[str, Any] | None, entry: dict[str, Any], fit: str) -> dict[str, Any]:
    """The entry to keep under a key that two requests of one step share (`kept`, the
    first one's; None: the key is not shared): the row when both are the same, else a
    refusal that names the cause, never one request's row for the other."""
    if kept is None or kept == entry:
        return entry
    same = (
        "probs" in kept
        and "probs" in entry
        and all(
            abs(a - b) <= SAME_ROW_ATOL
            for a, b in zip(kept["probs"], entry["probs"], strict=True)
        )
    )
    if same:
        return kept
    return {
        "reason": f"fit {fit!r} not applied: two requests shared one {KEY_ROW_KEY} and one "
        "prompt and got different rows (they differ in what the engine's processor cannot "
        "see, such as a LoRA adapter): give each request its own sampling_params(...)"
    }


def row_reason(residual: float, tolerance: float) -> str:
    """Why a decision-step row with this reconstruction residual is not read as
    `W h + b` (the residual named, and what makes one)."""
    why = (
        "its logits hold NaN, inf or a masked token"
        if not residual < float("inf")
        else f"its reconstruction residual {residual:.3g} exceeds the tolerance {tolerance}"
    )
    return (
        f"the decision-step row is not the output layer's W h + b ({why}); logit_bias, "
        "min_tokens, allowed or bad tokens, structured outputs, soft-capped logits or an "
        "earlier processor change the row before this processor reads it"
    )


def keep_hidden(
    keys: Sequence[str | None],
    picked: Tensor,
    inverse: LogitsInverse,
    tolerance: float = DEFAULT_TOLERANCE,
) -> None:
    """Read each row's hidden state back from `picked` (`[N, V]` decision-step logits)
    and keep it under its key (`fitted_key(HIDDEN, ...)`; None: not kept), with its
    residual, or why it cannot be read (`row_reason`)."""
    back = inverse.read(picked, tolerance)
    for key, hidden, residual, readable in zip(
        keys, back.hidden.cpu(), back.residual.tolist(), back.readable.tolist(), strict=True
    ):
        if key is None:
            continue
        entry: dict[str, Any] = {"residual": residual}
        if readable:
            entry["hidden"] = hidden.contiguous().numpy().tobytes()
        else:
            entry["reason"] = (
                "the hidden state cannot be read back from its logits row: "
                + row_reason(residual, tolerance)
            )
        keep(key, entry)


class HiddenNotRead(ValueError):
    """A decision step's hidden state could not be read back from its logits row (the
    row is not `W h + b`, or the engine kept none); the message names why."""


def hidden_refusal(llm: Any) -> str | None:
    """Why an offline `vllm.LLM` cannot return hidden states (its worker extension is
    not `EXTENSION`), or None."""
    parallel = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    found = getattr(getattr(parallel, "parallel_config", None), "worker_extension_cls", "")
    if found == EXTENSION:
        return None
    return (
        "the decision step's hidden state is read back from its logits row inside the "
        "engine and returned through its worker, which this engine cannot do: create it "
        f"with LLM(..., worker_extension_cls={EXTENSION!r})"
    )


def read_hidden(llm: Any, keys: Sequence[str]) -> list[Tensor]:
    """The `[d]` float32 hidden states kept under `keys` in an offline `vllm.LLM`'s
    worker, taken from its table; `HiddenNotRead` naming the first row that has none
    (its index in `keys`, its residual and why)."""
    try:
        rows = rpc_rows(llm, keys, take=True)
    except FitNotApplied:
        raise HiddenNotRead(hidden_refusal(llm) or "the engine's worker has no table") from None
    out = []
    for i, row in enumerate(rows):
        if row is None:
            raise HiddenNotRead(
                f"prompt {i}: the engine kept no hidden state for it (an engine without "
                "the semsoft processor, or more than "
                f"{TABLE_SIZE} rows kept before this one was read)"
            )
        if row.get("hidden") is None:
            raise HiddenNotRead(f"prompt {i}: {row.get('reason')}")
        out.append(torch.frombuffer(bytearray(row["hidden"]), dtype=torch.float32))
    return out


def apply_fits(
    decisions: Sequence[
        tuple[Any, SemsoftRequest, Sequence[int] | None, Sequence[int] | None, int | None]
    ],
    picked: Tensor,
    probs: Tensor,
) -> Tensor:
    """`probs` (`[N, L]`, the rows' Semantic Softmax) with each row that names a fit and
    can be read replaced by the fit's probabilities; every fitted row, or why it was not
    fitted, is kept for the readers.

    Parameters
    ----------
    decisions : sequence of tuples
        Per row of `picked`: its `FitUse` (or why the engine cannot apply the fit it
        names, or None: no fit), the request, the prompt's token ids, the output token
        ids and the index of the decision step among them.
    picked : Tensor
        `[N, V]` the decision-step logits rows, as the processor got them.
    probs : Tensor
        `[N, L]` the rows' scores without the fit.

    Returns
    -------
    Tensor
        `probs`, with the fitted rows replaced (a copy when any is).
    """
    uses: list[tuple[int, FitUse, str | None]] = []
    for i, (fit, request, prompt, output, step) in enumerate(decisions):
        if fit is None:
            continue
        key = row_table_key(request, request.fit or "", prompt, list(output or [])[: step or 0])
        if isinstance(fit, str):
            if key is not None:
                keep(key, {"reason": fit})
            continue
        uses.append((i, fit, key))
    if not uses:
        return probs
    fitted = record_fits([(use, key) for _, use, key in uses], picked[[i for i, *_ in uses]])
    probs = probs.clone()
    for (i, *_), row in zip(uses, fitted, strict=True):
        if row is not None:
            probs[i] = row.to(probs.dtype)
    return probs


def row_table_key(
    request: SemsoftRequest, table: str, prompt: Sequence[int] | None, before: Sequence[int]
) -> str | None:
    """`fitted_key` of a request's row in `table`, or None where it cannot be kept for a
    reader: no row key (admission refuses such a request; the check is repeated here
    because a row must never be kept under a key another request can rebuild) or no
    prompt ids."""
    if request.row_key is None or prompt is None:
        return None
    return fitted_key(request.row_key, table, prompt, before)


def keep_reason(
    request: SemsoftRequest, prompt: Sequence[int], before: Sequence[int], reason: str
) -> None:
    """Keep why the processor left a fitted request's row unscored (`reason`)."""
    key = row_table_key(request, request.fit or "", prompt, before)
    if key is not None:
        keep(key, {"reason": f"fit {request.fit!r} not applied: {reason}"})


def keep(key: str, entry: dict[str, Any]) -> None:
    """Put one row (`{"probs", "residual"}` or `{"reason"}`) in the table."""
    with _LOCK:
        _TABLE[key] = entry
        _TABLE.move_to_end(key)
        while len(_TABLE) > TABLE_SIZE:
            _TABLE.popitem(last=False)


def fitted_rows(keys: Sequence[str], take: bool = False) -> list[dict[str, Any] | None]:
    """The rows kept under `keys` in this process (None: none kept), for the worker
    extension's `RPC_METHOD`; `take` removes them from the table."""
    with _LOCK:
        if take:
            return [_TABLE.pop(str(k), None) for k in keys]
        return [None if (row := _TABLE.get(str(k))) is None else dict(row) for k in keys]


def rpc_rows(llm: Any, keys: Sequence[str], take: bool = False) -> list[dict[str, Any] | None]:
    """The rows of `keys` from an offline `vllm.LLM`'s workers (the first worker's
    answer: every tensor-parallel rank computes the same rows); `take` removes them."""
    try:
        answers = llm.collective_rpc(RPC_METHOD, args=(list(keys), take))
    except NotImplementedError:
        raise FitNotApplied(
            f"this engine cannot return fitted rows: create it with "
            f"LLM(..., worker_extension_cls={EXTENSION!r}, logits_processors="
            f"[{FIT_PROCESSOR!r}])"
        ) from None
    return list(answers[0])


STATE_METHOD = "semsoft_weights_state"


def weights_state(llm: Any) -> str | None:
    """The digest of an offline `vllm.LLM`'s model as its worker holds it now
    (`model_state.module_state`, through the worker extension's `STATE_METHOD`), or None
    where the engine has no such extension (its passes are then never read back)."""
    try:
        return str(llm.collective_rpc(STATE_METHOD)[0])
    except (NotImplementedError, AttributeError):
        return None


def fit_refusal(model_config: Any, parallel_config: Any) -> str | None:
    """Why an engine with these configs cannot serve a `semsoft_fit` request (its
    processor and worker extension not loaded), or None."""
    processors = [
        p if isinstance(p, str) else f"{p.__module__}:{p.__qualname__}"
        for p in getattr(model_config, "logits_processors", None) or ()
    ]
    missing = []
    if FIT_PROCESSOR not in processors:
        missing.append(f"--logits-processors {FIT_PROCESSOR}")
    if getattr(parallel_config, "worker_extension_cls", "") != EXTENSION:
        missing.append(f"--worker-extension-cls {EXTENSION}")
    if not missing:
        return None
    return (
        f"{KEY_FIT}: this engine serves no fits; start it with {' and '.join(missing)} and "
        "SEMSOFT_FIT_DIR naming the fit folder"
    )
