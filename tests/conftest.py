"""Shared fixtures: one real model (the embedded default, SmolLM2-135M) per session."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(scope="session")
def default_checkpoint():
    from semsoft_plugin import models

    return models.resolve("default")


@pytest.fixture(scope="session")
def model_and_tokenizer(default_checkpoint):
    from semsoft_plugin import models

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
