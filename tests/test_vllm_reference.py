"""What the vLLM tests rely on, checked without vLLM (these run where it is not
installed): the label set the engine tests use as a clash really clashes, the top-k
log-probabilities the engine returns determine the transformers adapter's scores, and
the eval refuses backend arguments before it loads anything.
"""

from __future__ import annotations

import pytest
import torch
from _vllm import CLASH, EMOTIONS, PROMPTS, SENTIMENT

from semsoft_plugin.core import request as sreq
from semsoft_plugin.core.labels import LabelSet
from semsoft_plugin.engines import scoring

pytestmark = pytest.mark.slow


def test_label_clash_is_detected_by_the_tokenizer():
    # Guard for the "clash" request above: it must really be unresolvable.
    from transformers import AutoTokenizer

    from semsoft_plugin.engines import models

    tok = AutoTokenizer.from_pretrained(str(models.resolve("smollm2-135m")))
    with pytest.raises(ValueError, match="same token"):
        LabelSet(CLASH, tok)


def test_top_k_logprobs_determine_the_scores_exactly(model_and_tokenizer, checkpoint):
    """Fed the top-k raw log-probabilities of the transformers forward pass, the reader
    reproduces the transformers adapter's scores to float32 precision."""
    from semsoft_plugin.engines import hf

    model, tok = model_and_tokenizer
    for item, labels in ((PROMPTS["dog"], EMOTIONS), (PROMPTS["review"], SENTIMENT)):
        want = hf.classify(model, tok, [item], labels, keep_logits=True)[0]
        logp = torch.log_softmax(want.logits, -1)
        values, ids = torch.topk(logp, 50)
        top = dict(zip(ids.tolist(), values.tolist(), strict=True))
        answer = LabelSet(labels, tok).answer_token_ids
        extra = {t: float(logp[t]) for t in answer}
        request = sreq.build_request(labels)  # what sampling_params(labels) sends
        got = scoring.scores_from_top_k(
            scoring.client_model(checkpoint), request, top, extra, [], 0
        )
        for label in labels:
            assert got.probs[label] == pytest.approx(want.probs[label], abs=1e-5)
            assert got.constrained_probs[label] == pytest.approx(
                want.constrained_probs[label], abs=1e-5
            )
        assert got.coverage == pytest.approx(want.coverage, abs=1e-5)


def test_eval_backend_arguments_are_checked():
    from semsoft_eval.preparation import prepare

    with pytest.raises(ValueError, match="backend='tpu'"):
        prepare("smollm2-135m", "sst2", backend="tpu")
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        prepare("smollm2-135m", "sst2", engine_args={"tensor_parallel_size": 2})
