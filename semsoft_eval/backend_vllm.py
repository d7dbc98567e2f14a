"""The vLLM `semsoft_eval.backends.Backend` (a `vllm.LLM` with the plugin).

The decision step goes through [`semsoft_plugin.engines.vllm.classify_vllm`][semsoft_plugin.engines.vllm.classify_vllm], which keeps
the raw top-`k` log-probabilities and the label tokens' raw log-probabilities, and the
decision step's hidden state (the `probe` method, a fit family with the probe): the
engine's processor reads it back from the logits row (`h = W⁺ (z - b)`, each row judged
by its residual) and its worker returns it through `collective_rpc`, so the engine needs
the worker extension `semsoft_plugin.engines.vllm.fits.FittedRows` (`load` builds it with
it; an engine given without it gives no hidden states). vLLM is imported only when a
method here runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from semsoft_eval.backends import DecisionStep, Generations, Prompt
from semsoft_plugin.core.kept_scores import kept_from_top_logprobs
from semsoft_plugin.core.labels import LabelSet
from semsoft_plugin.core.tokens import OutputEmbeddings

__all__ = ["VLLM_STORE_K", "VLLMBackend"]

# vLLM returns each kept log-probability as a Python object; 256 covers the tune grid
# (k <= 200) and the largest k a server request may ask (semsoft_plugin.engines.vllm.MAX_K).
VLLM_STORE_K = 256


class VLLMBackend:
    """A `vllm.LLM` (built with the plugin's logits processor) and its tokenizer."""

    name = "vllm"

    def __init__(self, llm: Any, tokenizer: Any = None) -> None:
        self.model = llm
        self.tokenizer = tokenizer if tokenizer is not None else llm.get_tokenizer()

    @classmethod
    def load(
        cls, model_dir: Path, *, seed: int = 0, engine_args: Mapping[str, Any] | None = None
    ) -> VLLMBackend:
        """A `vllm.LLM` with the plugin, keeping enough log-probabilities per step."""
        from vllm import LLM

        from semsoft_plugin.engines.vllm.params import ENTRY_POINT
        from semsoft_plugin.engines.vllm.reader_tables import EXTENSION

        # If the entry point is installed too, the second copy of the processor stands down.
        # The worker extension returns the hidden states (the probe).
        args = {"max_logprobs": VLLM_STORE_K, "seed": seed, "worker_extension_cls": EXTENSION,
                **dict(engine_args or {})}  # fmt: skip
        return cls(LLM(str(model_dir), logits_processors=[ENTRY_POINT], **args))

    def embeddings(self) -> OutputEmbeddings:
        from semsoft_plugin.engines.scoring import output_embeddings

        return output_embeddings(self.model)

    def max_store_k(self) -> int:
        from semsoft_plugin.core.config import SemsoftConfig

        max_logprobs = int(self.model.llm_engine.model_config.max_logprobs)
        store_k = VLLM_STORE_K if max_logprobs == -1 else min(VLLM_STORE_K, max_logprobs)
        if store_k < SemsoftConfig().k:
            raise ValueError(
                f"this engine keeps max_logprobs={max_logprobs} log-probabilities per step, "
                f"fewer than k={SemsoftConfig().k}: create it with "
                f"LLM(..., max_logprobs={VLLM_STORE_K})"
            )
        return store_k

    def decision_step(
        self,
        inputs: Sequence[Any],
        labels: LabelSet,
        token_ids: Sequence[int],
        *,
        store_k: int,
        batch_size: int = 8,
        progress: bool = True,
    ) -> DecisionStep:
        """`batch_size` is unused: the engine schedules its own batches. The hidden
        states come back where the engine has the worker extension (module docstring); a
        row that is not the output layer's `W h + b` is refused naming its residual."""
        from semsoft_plugin.engines.vllm import classify_vllm
        from semsoft_plugin.engines.vllm.reader_tables import hidden_refusal

        hidden = hidden_refusal(self.model) is None
        results = classify_vllm(
            self.model, list(inputs), labels.names, keep_logprobs=store_k,
            token_ids=list(token_ids), max_tokens=1, progress=progress, hidden=hidden,
        )  # fmt: skip
        kept = kept_from_top_logprobs(results, list(token_ids))
        # Never None here: classify_vllm fetches the label tokens the top-k lacks.
        probs = [r.probs or {} for r in results]
        return DecisionStep(
            top_ids=kept.top_ids,
            top_values=kept.top_logits,
            label_values=kept.label_logits,
            check=torch.tensor([[p[n] for n in labels.names] for p in probs]),
            vocab_size=self.embeddings().vocab_size,
            hidden=torch.stack([r.hidden for r in results if r.hidden is not None])
            if hidden and results
            else None,
        )

    def sequence_logprobs(
        self, inputs: Sequence[Any], labels: LabelSet, *, batch_size: int = 8, progress: bool = True
    ) -> Tensor:
        """Token `j` of a label is one request `prompt + label[:j]` with
        `max_tokens=1` asking for exactly that token's log-probability
        (`logprob_token_ids`): the shared prompt is served from vLLM's prefix cache,
        where `prompt_logprobs` would re-run every prompt in full."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        encoded = self._encode(inputs)
        sequences = labels.token_sequences
        out = torch.zeros((len(encoded), len(sequences)), dtype=torch.float32)
        places: list[tuple[int, list[tuple[int, int]]]] = []  # item, [(label, token)]
        requests, params = [], []
        for i, ids in enumerate(encoded):
            # The first tokens of every label share one request on the bare prompt.
            wanted: dict[tuple[int, ...], list[tuple[int, int]]] = {}
            for label, seq in enumerate(sequences):
                for j in range(len(seq)):
                    wanted.setdefault(tuple(seq[:j]), []).append((label, seq[j]))
            for prefix, asked in wanted.items():
                places.append((i, asked))
                requests.append(TokensPrompt(prompt_token_ids=ids + list(prefix)))
                tokens = list(dict.fromkeys(t for _, t in asked))
                params.append(
                    SamplingParams(
                        max_tokens=1, temperature=0.0, logprob_token_ids=tokens, detokenize=False
                    )
                )
        outputs = self.model.generate(requests, params, use_tqdm=progress)
        for (i, asked), output in zip(places, outputs, strict=True):
            logprobs = output.outputs[0].logprobs[0]
            for label, token in asked:
                out[i, label] += float(logprobs[token].logprob)
        return out

    def label_token_logprobs(
        self, inputs: Sequence[Any], token_ids: Sequence[int], *, progress: bool = True
    ) -> Tensor:
        """`[N, M]` full-vocabulary log-probabilities of `token_ids` as the next token,
        read the way vLLM's `POST /generative_scoring` reads them (vLLM 0.32,
        `vllm/entrypoints/generate/generative_scoring/serving.py`): one request per
        prompt with the server's own parameters, `SamplingParams(max_tokens=1,
        logprobs=M, logprob_token_ids=token_ids, n=1, watermarking=False)`, and each
        token's log-probability from the first step's `logprobs`.

        The server's own serving class needs an async engine client and its renderer, so
        the offline engine sends the same requests instead; the scores are the server's
        (`tests/test_vllm_generative.py` compares them with a real request). One
        difference: the server cuts a prompt longer than the context, the engine refuses it.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        ids = [int(t) for t in token_ids]
        params = SamplingParams(
            max_tokens=1, logprobs=len(ids), logprob_token_ids=ids, n=1, watermarking=False
        )
        requests = [TokensPrompt(prompt_token_ids=p) for p in self._encode(inputs)]
        outputs = self.model.generate(requests, params, use_tqdm=progress)
        return torch.tensor(
            [[float(o.outputs[0].logprobs[0][t].logprob) for t in ids] for o in outputs],
            dtype=torch.float64,
        )

    def _encode(self, inputs: Sequence[Any]) -> list[list[int]]:
        from semsoft_plugin.engines.prompting import encode_prompts, format_prompt

        return encode_prompts(self.tokenizer, [format_prompt(self.tokenizer, p) for p in inputs])

    def generate(
        self,
        prompts: Sequence[Prompt],
        *,
        n: int,
        temperature: float,
        seed: int,
        max_tokens: int,
        stop: Sequence[str] = (),
        batch_size: int = 4,
        keep_entropy: bool = False,
        progress: bool | None = None,
    ) -> Generations:
        """`SamplingParams(n=n)`; `batch_size` is unused (the engine schedules)."""
        if keep_entropy:
            raise ValueError("keep_entropy needs a transformers model, not vLLM")
        from vllm import SamplingParams
        from vllm.platforms import current_platform

        from semsoft_plugin.engines.prompting import encode_prompts

        encoded = encode_prompts(self.tokenizer, prompts)
        # vLLM 0.32's CPU runner fails ("CPU Generator does not use offset") when a request
        # with its own seed has a sample discarded under chunked prefill; on CPU the
        # engine's seed (LLM(seed=...)) makes the sampling repeatable instead.
        params = SamplingParams(
            n=n,
            temperature=temperature,
            top_k=0 if temperature > 0 else -1,
            top_p=1.0,
            seed=None if current_platform.is_cpu() else seed,
            max_tokens=max_tokens,
            stop=list(stop) or None,
        )
        outputs = self.model.generate(
            [{"prompt_token_ids": ids} for ids in encoded], params, use_tqdm=bool(progress)
        )
        return Generations([[o.text for o in out.outputs] for out in outputs], None)
