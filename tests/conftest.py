"""Shared fixtures: one real model (the small embedded model, SmolLM2-135M) per session; and
the ``engine`` marker, set here so that no test has to remember it.

CI runs two lanes (``scripts/test.sh``): ``-m "not engine"`` first, then ``-m engine``. A
test is ``engine`` when it starts vLLM, Outlines or a model server, which is known from
what it asks for rather than from a decorator someone may forget:

* it requests (directly or through other fixtures) one of :data:`ENGINE_FIXTURES`;
* or it carries its own ``@pytest.mark.vllm`` / ``@pytest.mark.outlines`` (tests that
  build an ``LLM`` inline). A module-wide ``pytestmark`` does not count: the
  ``test_vllm_*.py`` files that import vLLM mark every test ``vllm``, including their
  engine-free checks (option parsing, refusals), which belong to the fast lane.

The vLLM engines (``llm``, ``plain_llm``, ``server``) are session fixtures here, so that
the ``test_vllm_*.py`` files share one of each instead of starting one per file; vLLM is
imported inside them, never when this file loads.

The evaluation's built-in data sets (``--dataset sst2``, ``load_builtin("goemotions")``,
NQ-open) are read, in every test, from :data:`TEST_DATA` (``tests/data``: a few dozen rows
of each, sources and licences in its README), never from a data folder beside the clone.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

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


TEST_DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session", autouse=True)
def data_root() -> Iterator[Path]:
    """``$SEMSOFT_DATA`` is ``tests/data`` for the whole session (module-scoped fixtures
    included, and subprocesses, which inherit it), whatever the caller's environment says:
    the tests read the rows the repository carries, so a bare clone passes them."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SEMSOFT_DATA", str(TEST_DATA))
        yield TEST_DATA


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if is_engine_test(item):
            item.add_marker(pytest.mark.engine)


@pytest.fixture(scope="session")
def default_checkpoint():
    from semsoft_plugin.engines import models

    return models.resolve("smollm2-135m")


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


# ---------------------------------------------------------------------------
# vLLM engines and their references, shared by the test_vllm_*.py files
# ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def checkpoint(default_checkpoint):
    """The default model's local checkpoint (the vLLM tests' name for it)."""
    return default_checkpoint


@pytest.fixture(scope="session")
def llm(checkpoint) -> Iterator[Any]:
    """A vLLM engine with the plugin loaded by class, and the worker extension that
    returns the hidden states its processor reads back from the logits rows (the probe),
    as the engines semsoft builds by name have it."""
    from _vllm import ENGINE_ARGS
    from vllm import LLM

    from semsoft_plugin.engines import vllm as sv
    from semsoft_plugin.engines.vllm.reader_tables import EXTENSION

    engine = LLM(
        str(checkpoint), logits_processors=[sv.SemanticSoftmaxLogitsProcessor],
        worker_extension_cls=EXTENSION, **ENGINE_ARGS,
    )  # fmt: skip
    yield engine
    del engine


@pytest.fixture(scope="session")
def plain_llm(checkpoint) -> Iterator[Any]:
    """The same engine without the plugin: the reference for opted-out requests."""
    from _vllm import ENGINE_ARGS, without_entry_points
    from vllm import LLM

    with pytest.MonkeyPatch.context() as patch:
        without_entry_points(patch)
        engine = LLM(str(checkpoint), **ENGINE_ARGS)
    yield engine
    del engine


@pytest.fixture(scope="session")
def tokenizer(llm):
    return llm.get_tokenizer()


@pytest.fixture(scope="session")
def hf_model(model_and_tokenizer):
    """The transformers model in float32, like the engines here (a copy: the session
    fixture is shared with other test modules)."""
    import copy

    model, tok = model_and_tokenizer
    return copy.deepcopy(model).float(), tok


@pytest.fixture(scope="session")
def hf_results(hf_model):
    from _vllm import EMOTIONS, PROMPTS, SENTIMENT

    from semsoft_plugin.engines import hf

    model, tok = hf_model
    return {
        "review": hf.classify(model, tok, [PROMPTS["review"]], SENTIMENT)[0],
        "short": hf.classify(model, tok, [PROMPTS["short"]], SENTIMENT)[0],
        "dog": hf.classify(model, tok, [PROMPTS["dog"]], EMOTIONS)[0],
    }


@pytest.fixture(scope="session")
def server(checkpoint, tmp_path_factory) -> Iterator[str]:
    """A vLLM OpenAI server subprocess with the plugin and its admission middleware;
    yields its ``/v1`` base URL."""
    from _server import plugin_server

    from semsoft_plugin.engines.vllm.params import ENTRY_POINT

    log = tmp_path_factory.mktemp("server") / "server.log"
    with plugin_server(checkpoint, log, ENTRY_POINT) as url:
        yield url
