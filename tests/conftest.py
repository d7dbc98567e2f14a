"""Shared fixtures: one real model (the embedded default, SmolLM2-135M) per session; and
the ``engine`` marker, set here so that no test has to remember it.

CI runs two lanes (``scripts/test.sh``): ``-m "not engine"`` first, then ``-m engine``. A
test is ``engine`` when it starts vLLM, Outlines or a model server, which is known from
what it asks for rather than from a decorator someone may forget:

* it requests (directly or through other fixtures) one of :data:`ENGINE_FIXTURES`;
* or it carries its own ``@pytest.mark.vllm`` / ``@pytest.mark.outlines`` (tests that
  build an ``LLM`` inline). A module-wide ``pytestmark`` does not count: ``test_vllm.py``
  marks every test ``vllm`` because it imports vLLM, including its engine-free checks
  (option parsing, refusals), which belong to the fast lane.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# Fixtures that build an engine: vLLM ``LLM`` objects (``llm``, ``plain_llm``,
# ``poison_llm``), a vLLM API server subprocess (``server``), Outlines models.
# Fixtures built on them (``mixed_batch``, ``tokenizer``, ``async_setup``, ``generator``)
# are caught through ``item.fixturenames``, which holds the whole closure.
ENGINE_FIXTURES = frozenset({"llm", "plain_llm", "poison_llm", "server", "outlines_model"})
ENGINE_MARKERS = ("vllm", "outlines")


def is_engine_test(item: pytest.Item) -> bool:
    """Whether a collected test starts vLLM, Outlines or a model server (see above)."""
    if ENGINE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    own = getattr(item, "own_markers", [])
    return any(mark.name in ENGINE_MARKERS for mark in own)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if is_engine_test(item):
            item.add_marker(pytest.mark.engine)


@pytest.fixture(scope="session")
def default_checkpoint():
    from semsoft_plugin.engines import models

    return models.resolve("default")


@pytest.fixture(scope="session")
def model_and_tokenizer(default_checkpoint):
    from semsoft_plugin.engines import models

    return models.load(str(default_checkpoint))


@pytest.fixture(scope="session")
def foreign_tokenizer():
    """A real tokenizer that is not the default model's: a word-level vocabulary in which
    the usual test labels have other ids (built locally, no hub)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "positive", "negative", "joy", "sadness", "anger", "fear", "the"]
    words += [w.capitalize() for w in words[1:]] + [w.upper() for w in words[1:]]
    raw = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=raw, unk_token="[UNK]", name_or_path="tiny-wordlevel"
    )
