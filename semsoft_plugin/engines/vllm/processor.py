"""The vLLM logits processor: Semantic Softmax inside the engine, for both model runners.

How the scores come back, the decision step and async scheduling (placeholder output
tokens) are explained in the package docstring ([`semsoft_plugin.engines.vllm`][semsoft_plugin.engines.vllm]).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from vllm import SamplingParams
from vllm.sampling_params import SamplingType
from vllm.v1.sample.logits_processor import BatchUpdate, process_dict_updates
from vllm.v1.sample.logits_processor import LogitsProcessor as V1LogitsProcessor
from vllm.v1.worker.gpu.sample.logits_processor.interface import (
    LogitsContext,
    LogitsProcRequestState,
)
from vllm.v1.worker.gpu.sample.logits_processor.interface import (
    LogitsProcessor as V2LogitsProcessor,
)

from semsoft_plugin.core.config import SemsoftConfig
from semsoft_plugin.core.request import SemsoftRequest
from semsoft_plugin.engines.scoring import CACHE_SIZE, LabelScorer, ModelScorer, trigger_position
from semsoft_plugin.engines.vllm.params import (
    ENTRY_POINT,
    check_on_engine,
    load_tokenizer,
    unrepaired_output_tokens,
    validate_params,
)
from semsoft_plugin.engines.vllm.parsed import forget, parsed_request
from semsoft_plugin.engines.vllm.reader_tables import (
    HIDDEN,
    FitUse,
    apply_fits,
    fit_refusal,
    keep_hidden,
    keep_reason,
    record_unscored,
    row_table_key,
)
from semsoft_plugin.fit.logits_inverse import LogitsInverse

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = logging.getLogger(__name__)


def _known_length(tokens: Sequence[int], start: int) -> int:
    """Length of the prefix of `tokens` free of async-scheduling placeholders
    (`-1`), scanning from a little before `start` (earlier tokens were known)."""
    for i in range(max(0, start - 1), len(tokens)):
        if tokens[i] < 0:
            return i
    return len(tokens)


def _record_greedy_picks(logits: Tensor, rows: Tensor, group: list[tuple[int, Any]]) -> None:
    """Remember, for greedy rows, the label the engine will sample from `logits`.

    vLLM's greedy sampler takes `argmax` of the processed logits, and only this
    processor's label scores are finite in these rows, so the same `argmax` here is
    the engine's pick (ties included). Used when async scheduling has not yet written
    the sampled token back (package docstring). Overwritten on every decision, so a
    discarded partial-prefill row never leaves a stale pick."""
    greedy = [i for i, (_, state) in enumerate(group) if state.greedy]
    for _, state in group:
        state.predicted = None
    if not greedy:
        return
    index = torch.tensor(greedy, device=logits.device)
    picks = logits.index_select(0, rows.index_select(0, index)).argmax(-1).tolist()
    for i, token in zip(greedy, picks, strict=True):
        state = group[i][1]
        state.predicted = state.scoring.answer_to_label.get(int(token))


# ---------------------------------------------------------------------------
# The processor
# ---------------------------------------------------------------------------


# id(vllm_config), runner -> (the config, the processor that serves it), both weak.
_ENGINES: dict[tuple[int, str], tuple[weakref.ref[Any], weakref.ref[Any]]] = {}
_ENGINES_LOCK = threading.Lock()


def _claim_engine(vllm_config: Any, runner: str, processor: Any) -> bool:
    """Register `processor` as the one serving this engine; True if another already is
    (a subclass of the one registered takes over, whichever vLLM built first)."""
    key = (id(vllm_config), runner)
    with _ENGINES_LOCK:
        held = _ENGINES.get(key)
        holder = held[1]() if held is not None and held[0]() is vllm_config else None
        if holder is not None and not (
            isinstance(processor, type(holder)) and type(processor) is not type(holder)
        ):
            return True
        if holder is not None:  # a subclass (the one serving fits) takes the engine over
            holder.inert = True
        _ENGINES[key] = (weakref.ref(vllm_config), weakref.ref(processor))
        return False


@dataclass
class _Active:
    """Engine-side state of one opted-in request (constrain mode)."""

    request: SemsoftRequest
    scoring: LabelScorer | None  # None: the label set was refused; the request is ended
    eos_token_id: int | None
    output_ids: list[int] | None = None  # V1: the runner's live list
    decided_at: int | None = None  # output index of the decision step
    checked_upto: int = 0  # trigger search resumes here
    label: int | None = None  # chosen label, once sampled
    greedy: bool = True  # the engine samples the argmax of the written logits
    predicted: int | None = None  # greedy: the label this processor's logits make it pick
    prompt_ids: Sequence[int] | None = None  # the prompt's ids (for _UNSCORED, fitted rows)
    fit: FitUse | str | None = None  # semsoft_fit: the fit, or why the engine cannot use it
    owned: bool = False  # the request was parsed here: its parse is freed when it leaves
    refusal: str | None = None  # why the request was refused as it joined (then ended)


class SemanticSoftmaxLogitsProcessor(V1LogitsProcessor, V2LogitsProcessor):
    """Semantic Softmax label constraint for opted-in requests, for both vLLM runners.

    Constructed by vLLM, never by hand: `(vllm_config, device, is_pin_memory)` by the
    V1 model runner, `(vllm_config, req_states)` by Model Runner V2; the branch is
    taken on those arguments. Requests without `semsoft_labels` in their
    `extra_args` are never touched (their logits rows are not written).

    What it does for an opted-in request in constrain mode: at the decision step,
    only the labels' answer tokens keep a finite logit, set to `log P_sem`; the
    remaining tokens of the sampled label are then forced, then EOS. In observe mode
    it does nothing in the engine (the scores are read from the output).

    The embeddings and the tokenizer are loaded on the first opted-in request, so an
    engine that merely has the plugin installed (entry point) pays nothing.

    Examples
    --------
    vLLM builds it; name it by its class or its import string (or install the package:
    the entry point loads it) and opt a request in with
    [`sampling_params`][semsoft_plugin.engines.vllm.sampling_params]:

    ```python
    from vllm import LLM
    from semsoft_plugin.engines import models
    from semsoft_plugin.engines.vllm import sampling_params

    processor = "semsoft_plugin.engines.vllm:SemanticSoftmaxLogitsProcessor"
    llm = LLM(str(models.resolve("default")), max_logprobs=50, logits_processors=[processor])
    params = sampling_params(["positive", "negative"])
    out = llm.generate(["Review: I loved it. Sentiment:"], params)[0]
    out.outputs[0].text                     # ' positive': a label, drawn from the scores
    ```
    """

    def __init__(self, vllm_config: VllmConfig, *args: Any) -> None:
        if len(args) == 2:  # V1: (device, is_pin_memory)
            self._runner = "v1"
            self._device = torch.device(args[0])
            self._req_states: LogitsProcRequestState | None = None
        elif len(args) == 1:  # Model Runner V2: (req_states)
            self._runner = "v2"
            self._req_states = args[0]
            self._device = torch.device(self._req_states.device)
        else:
            raise TypeError(
                "SemanticSoftmaxLogitsProcessor(vllm_config, device, is_pin_memory) or "
                "(vllm_config, req_states)"
            )
        self._config = vllm_config
        # vLLM does not deduplicate: a class both installed (entry point) and passed
        # explicitly is built twice for one engine. The second copy stands down so the
        # constraint is applied once.
        self.inert = _claim_engine(vllm_config, self._runner, self)
        self._model: ModelScorer | None = None
        self._model_lock = threading.Lock()
        self._inverse: LogitsInverse | None = None  # built on the first fit or hidden read
        self._active: dict[int, _Active] = {}  # V1: batch index; V2: request slot
        # Bounded like the label-set cache: one entry per distinct refusal, so a stream
        # of distinct refused label sets cannot grow it without end.
        self._warned: OrderedDict[str, None] = OrderedDict()
        max_logprobs = getattr(vllm_config.model_config, "max_logprobs", None)
        default_k = SemsoftConfig().k
        if max_logprobs is not None and max_logprobs != -1 and max_logprobs < default_k:
            logger.info(
                "semsoft: this engine has max_logprobs=%s < k=%s; opted-in requests with the "
                "default k will be refused: set max_logprobs=%s (--max-logprobs %s)",
                max_logprobs,
                default_k,
                default_k,
                default_k,
            )
        self.placeholders = not self.inert and unrepaired_output_tokens(vllm_config, self._runner)
        if self.placeholders:
            logger.warning(
                "semsoft: this engine schedules asynchronously and no logits processor was "
                "passed explicitly, so vLLM does not repair the placeholder (-1) output "
                "tokens processors see; greedy label requests are still completed, sampled "
                "multi-token labels and triggers are not: start it with --logits-processors "
                "%s (LLM(logits_processors=[...])) or --no-async-scheduling",
                ENTRY_POINT,
            )

    # -- both interfaces -----------------------------------------------------
    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """Refuse malformed or oversized semsoft options (HTTP 400 on the server)."""
        validate_params(sampling_params)

    def is_argmax_invariant(self) -> bool:
        """The label constraint changes greedy picks."""
        return False

    def _engine_model(self) -> ModelScorer:
        with self._model_lock:
            if self._model is None:
                model_config = self._config.model_config
                self._model = ModelScorer(
                    model_config.model,
                    load_tokenizer(model_config),
                    vocab_size=model_config.get_vocab_size(),
                    device=self._device,
                )
            return self._model

    def _logits_inverse(self) -> LogitsInverse:
        """The output layer's pseudo-inverse (`h = W⁺ (z - b)`), built once per engine
        from the checkpoint's output embeddings."""
        if self._inverse is None:
            embeddings = self._engine_model().embeddings
            self._inverse = LogitsInverse(embeddings.weight, vocab_size=embeddings.vocab_size)
        return self._inverse

    def _activate(self, params: SamplingParams) -> _Active | None:
        if self.inert:
            return None
        try:
            request, owned = parsed_request(params.extra_args)
        except ValueError:
            return None  # refused at admission by validate_params; never reaches here
        if request is None or (
            request.mode != "constrain" and request.fit is None and not request.hidden
        ):
            if owned:
                forget(request.row_key if request is not None else None)
            return None
        model = self._engine_model()
        eos = params.eos_token_id
        if eos is None:
            eos = getattr(model.tokenizer, "eos_token_id", None)
        greedy = params.sampling_type == SamplingType.GREEDY
        try:
            # vLLM's admission call hands over no engine config: the checks that need it
            # run here, as the request joins (the server's middleware ran them already).
            check_on_engine(request, params, self._config, fits=False)
            scoring = model.scoring(request)
        except ValueError as error:
            # The request is ended at its first step (EOS), never run unconstrained; the
            # reader raises the same error on its output.
            self._warn(str(error), f"semsoft: request refused and ended: {error}")
            return _Active(request, None, eos, greedy=greedy, owned=owned, refusal=str(error))
        fit = None if request.fit is None else self._fit_use(request)
        return _Active(request, scoring, eos, greedy=greedy, fit=fit, owned=owned)

    def _leave(self, state: _Active | None) -> None:
        """A request left the engine: free its parse if this processor made it."""
        if state is not None and state.owned:
            forget(state.request.row_key)

    def _fit_use(self, request: SemsoftRequest) -> FitUse | str:
        """The fit a request names, or why not (`engines.vllm.fits` serves a fit folder)."""
        refusal = fit_refusal(self._config.model_config, self._config.parallel_config)
        return f"fit {request.fit!r} not applied: {refusal or 'this processor serves no fits'}"

    def _warn(self, key: str, message: str) -> None:
        """Log `message` once per `key` among the last `CACHE_SIZE` distinct keys."""
        if key in self._warned:
            self._warned.move_to_end(key)
            return
        self._warned[key] = None
        while len(self._warned) > CACHE_SIZE:
            self._warned.popitem(last=False)
        logger.warning(message)

    # -- V1 --------------------------------------------------------------------
    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """V1: follow requests through adds, removals and moves of the batch."""

        def new_state(
            params: SamplingParams, _prompt: list[int] | None, output_ids: list[int]
        ) -> _Active | None:
            state = self._activate(params)
            if state is not None:
                state.output_ids = output_ids  # live reference, grows each step
                state.prompt_ids = _prompt
                if state.refusal is not None and _prompt is not None:
                    record_unscored(state.request, _prompt, [], state.refusal)
            return state

        if batch_update is not None:
            for index in batch_update.removed:
                self._leave(self._active.get(index))
        process_dict_updates(self._active, batch_update, new_state)

    # -- V2 --------------------------------------------------------------------
    def add_request(self, req_idx: int, sampling_params: SamplingParams) -> bool:
        """V2: (re)initialise a slot; True when this request is constrained."""
        self._leave(self._active.get(req_idx))  # the slot's previous request is gone
        state = self._activate(sampling_params)
        if state is None:
            self._active.pop(req_idx, None)
            return False
        self._active[req_idx] = state
        return True

    def apply_staged_writes(self) -> None:
        """V2: nothing is staged (state is host-side)."""

    # -- the step ----------------------------------------------------------------
    def apply(self, logits: Tensor, ctx: LogitsContext | None = None) -> Tensor:
        """Constrain the opted-in rows; every other row is left as it is."""
        if not self._active:
            return logits
        if self._runner == "v1":
            rows = [
                (index, state, state.output_ids or [], len(state.output_ids or []))
                for index, state in self._active.items()
                if index < logits.shape[0]
            ]
        else:
            if ctx is None:
                raise ValueError("Model Runner V2 passes a LogitsContext to apply()")
            rows = self._v2_rows(logits, ctx)
        decide: dict[int, list[tuple[int, _Active]]] = {}
        force_rows: list[int] = []
        force_tokens: list[int] = []
        for row, state, generated, j in rows:
            action = self._plan(state, generated, j)
            if action == "decide":
                decide.setdefault(id(state.scoring), []).append((row, state))
            elif isinstance(action, int):
                force_rows.append(row)
                force_tokens.append(action)
        for group in decide.values():
            self._decide(logits, group)
        if force_rows:
            index = torch.tensor(force_rows, device=logits.device)
            logits[index] = float("-inf")
            logits[index, torch.tensor(force_tokens, device=logits.device)] = 0.0
        return logits

    def _plan(self, state: _Active, generated: Any, j: int) -> str | int | None:
        """What to do to the row that samples output token `j`: decide, force a
        token (int) or nothing. Derived from the output tokens only, so rows whose
        sample is discarded (partial prefills) leave no trace.

        A `-1` in the output tokens is an async-scheduling placeholder for a token
        sampled but not yet copied to the host (package docstring): it is never read
        as a token. The trigger search stops before it and resumes there on a later
        step; a decision-step token that is still a placeholder is taken from the
        processor's own greedy pick, and otherwise the row waits (nothing is forced
        from a guess, and no label is cached from it)."""
        if state.scoring is None:  # refused label set: end the request now
            return None if state.eos_token_id is None else int(state.eos_token_id)
        if state.decided_at is None:
            trigger = state.request.trigger
            if trigger is None:
                state.decided_at = 0
            else:
                if j < 1:
                    return None
                tokens = list(generated(j) if callable(generated) else generated[:j])
                known = _known_length(tokens, state.checked_upto)
                if known < j:
                    self._warn_placeholder()
                tokenizer = self._engine_model().tokenizer
                found = trigger_position(tokenizer, tokens[:known], trigger, state.checked_upto)
                state.checked_upto = known + 1
                if found < 0:
                    return None
                state.decided_at = found
        m = j - state.decided_at
        if m == 0:
            state.label = None
            return "decide"
        if m < 0 or state.request.mode != "constrain":  # observe: a fit's row only
            return None
        if state.label is None:
            tokens = generated(state.decided_at + 1) if callable(generated) else generated
            answer = int(tokens[state.decided_at])
            if answer >= 0:
                state.label = state.scoring.answer_to_label.get(answer, -1)
            elif state.predicted is not None:
                state.label = state.predicted
            else:
                self._warn_placeholder()
                sequences = state.scoring.labels.token_sequences
                if (
                    m == 1
                    and state.eos_token_id is not None
                    and all(len(q) == 1 for q in sequences)
                ):
                    return int(state.eos_token_id)  # one-token labels all end here
                return None
        if state.label < 0:
            return None
        sequence = state.scoring.labels.token_sequences[state.label]
        if m < len(sequence):
            return int(sequence[m])
        if m == len(sequence) and state.eos_token_id is not None:
            return int(state.eos_token_id)
        return None

    def _decide(self, logits: Tensor, group: list[tuple[int, _Active]]) -> None:
        """Write `log P_sem` into the label tokens of rows at their decision step.

        A row it cannot score (NaN or +inf logits, every token masked), or every row of
        a label set whose scoring fails, is left exactly as the engine had it, and so is
        the rest of that request (no label is forced): one bad row must never fail the
        batch, its neighbours go on. The request is recorded in `_UNSCORED` so that
        the reader reports why instead of returning scores for text it did not choose.
        """
        scoring = group[0][1].scoring
        assert scoring is not None  # _plan never groups a refused label set for a decision
        rows = torch.tensor([row for row, _ in group], device=logits.device)
        picked = logits.index_select(0, rows)
        self._keep_hidden(group, picked)
        nan = torch.isnan(picked).any(-1)
        pos_inf = (picked == float("inf")).any(-1)
        masked = (picked == float("-inf")).all(-1)
        bad = nan | pos_inf | masked
        if bool(bad.any()):
            for (_, state), is_nan, is_inf, is_bad in zip(
                group, nan.tolist(), pos_inf.tolist(), bad.tolist(), strict=True
            ):
                if is_bad:
                    what = (
                        "NaN" if is_nan else "+inf" if is_inf else "only -inf (every token masked)"
                    )
                    self._leave_unscored(state, f"its decision-step logits hold {what}")
            keep = [i for i, is_bad in enumerate(bad.tolist()) if not is_bad]
            if not keep:
                return
            group = [group[i] for i in keep]
            rows = rows[keep]
            picked = picked[keep]
        try:
            result = scoring.scorer(picked)
        except Exception as error:  # never let one label set fail the engine's batch
            logger.exception("semsoft: scoring failed; the rows are left as they are")
            for _, state in group:
                self._leave_unscored(state, f"scoring failed: {error}")
            return
        decisions = [(st.fit, st.request, st.prompt_ids, st.output_ids, st.decided_at)
                     for _, st in group]  # fmt: skip
        probs = apply_fits(decisions, picked, result.probs)
        log_p = probs.clamp_min(1e-30).log().to(logits.device, logits.dtype)
        write = [i for i, (_, state) in enumerate(group) if state.request.mode == "constrain"]
        if len(write) < len(group):  # observe: the row was read, never written
            group, rows, log_p = [group[i] for i in write], rows[write], log_p[write]
        answer = scoring.answer_ids.to(logits.device)
        logits[rows] = float("-inf")
        logits[rows.unsqueeze(1), answer.unsqueeze(0)] = log_p
        _record_greedy_picks(logits, rows, group)

    def _keep_hidden(self, group: list[tuple[int, _Active]], picked: Tensor) -> None:
        """Keep the hidden state of each row whose request asked for it
        (`semsoft_hidden`), read back from the row as the processor got it, before
        anything is written to it (`reader_tables.keep_hidden`)."""
        wanted = [i for i, (_, state) in enumerate(group) if state.request.hidden]
        if not wanted:
            return
        keys: list[str | None] = []
        for i in wanted:
            state = group[i][1]
            if state.output_ids is None:
                keys.append(None)  # no key a reader could rebuild
                continue
            before = list(state.output_ids)[: state.decided_at or 0]
            keys.append(row_table_key(state.request, HIDDEN, state.prompt_ids, before))
        keep_hidden(keys, picked[wanted], self._logits_inverse())

    def _warn_placeholder(self) -> None:
        self._warn(
            "placeholder",
            "semsoft: output tokens are still async-scheduling placeholders (-1) when the "
            "processor runs, so a sampled label or a trigger cannot be followed; start the "
            f"engine with --logits-processors {ENTRY_POINT} (LLM(logits_processors=[...])) "
            "or --no-async-scheduling",
        )

    def _leave_unscored(self, state: _Active, reason: str) -> None:
        state.label = -1  # nothing forced later: the request runs as the engine has it
        self._warn(
            f"unscored: {reason[:80]}",
            f"semsoft: a request's row is left as the engine had it, {reason}; its reader "
            "raises with this reason",
        )
        if state.prompt_ids is not None and state.output_ids is not None:
            before = state.output_ids[: state.decided_at or 0]
            record_unscored(state.request, state.prompt_ids, before, reason)
            if state.fit is not None:
                keep_reason(state.request, state.prompt_ids, before, reason)

    def _v2_rows(self, logits: Tensor, ctx: LogitsContext) -> list[tuple[int, _Active, Any, int]]:
        slots = ctx.idx_mapping_np
        if logits.shape[0] != len(slots):
            # One row per draft token (speculative decoding): the decision step is not
            # one row. Leave the rows alone rather than constrain the wrong one.
            self._warn("spec", "semsoft: speculative decoding rows are not constrained")
            return []
        assert self._req_states is not None
        prompt_len = self._req_states.prompt_len.np
        all_tokens = self._req_states.all_token_ids.gpu
        rows = []
        for row, slot in enumerate(slots.tolist()):
            state = self._active.get(slot)
            if state is None:
                continue
            start = int(prompt_len[slot])
            # Tokens visible to the token sampled now (exact without spec decoding);
            # below the prompt length the row is a partial prefill, its sample discarded.
            j = int(ctx.seq_lens_upper_bound_np[row]) - start
            if j < 0:
                continue

            def generated(n: int, slot: int = slot, start: int = start) -> list[int]:
                return all_tokens[slot, start : start + n].tolist()

            if (state.fit is not None or state.request.hidden) and state.label is None:
                # a fitted row's key, or a kept hidden state's
                state.prompt_ids = all_tokens[slot, :start].tolist()
                state.output_ids = all_tokens[slot, start : start + j].tolist()

            rows.append((row, state, generated, j))
        return rows
