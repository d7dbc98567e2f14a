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
