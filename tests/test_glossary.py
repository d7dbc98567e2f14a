"""One name per concept (docs/glossary.md): the names a user meets in Python, on the
command line and in outputs are pinned here, so that an old spelling cannot come back
in one corner (issue 35).

The names part (this file's ``test_names_*`` functions): the result attributes, the
one-text ``--json`` keys, the keywords of every public signature, the eval/tune flags
and the one default generation length.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import pkgutil
from collections.abc import Iterator
from typing import Any

import pytest

# Spellings that a public signature of ours may no longer take, with the name that
# replaced each (docs/glossary.md).
RETIRED = {
    "use_tqdm": "progress",
    "max_new_tokens": "max_tokens",
    "greedy_pick": "greedy",
    "method_temperature": "score_temperature",
    "fit_temperature": "fit_score_temperature",
}
PACKAGES = ("semsoft_plugin", "semsoft_eval")


def _public_modules() -> Iterator[Any]:
    for root in PACKAGES:
        package = importlib.import_module(root)
        yield package
        for info in pkgutil.walk_packages(package.__path__, root + "."):
            if not any(part.startswith("_") for part in info.name.split(".")):
                yield importlib.import_module(info.name)


def _public_callables() -> Iterator[tuple[str, Any]]:
    """Every public function, class constructor and public method defined in our
    packages, by qualified name."""
    seen: set[int] = set()
    for module in _public_modules():
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            where = f"{module.__name__}.{name}"
            if inspect.isfunction(obj):
                yield where, obj
            elif inspect.isclass(obj):
                yield where, obj
                for attr, member in vars(obj).items():
                    if attr.startswith("_"):
                        continue
                    member = getattr(member, "__func__", member)  # class/static methods
                    if inspect.isfunction(member):
                        yield f"{where}.{attr}", member


def _parameters(obj: Any) -> list[str]:
    try:
        return list(inspect.signature(obj).parameters)
    except (TypeError, ValueError):  # a builtin without a signature
        return []


def test_names_no_public_signature_takes_a_retired_spelling() -> None:
    found = []
    inspected = 0
    for where, obj in _public_callables():
        inspected += 1
        found += [
            f"{where}({name}=...): say {RETIRED[name]}="
            for name in _parameters(obj)
            if name in RETIRED
        ]
    assert inspected > 300, f"only {inspected} public callables found: the walk is broken"
    assert not found, "\n".join(found)


def test_names_the_new_spellings_are_where_the_old_ones_were() -> None:
    from semsoft_plugin.engines import hf
    from semsoft_plugin.engines.openai import openai_label_scores
    from semsoft_plugin.engines.reader_contract import read_scores
    from semsoft_plugin.engines.vllm.batch import classify_vllm
    from semsoft_plugin.engines.vllm.reader import fetch_logprobs

    assert {"progress", "max_tokens"} <= set(_parameters(classify_vllm))
    assert {"progress", "max_tokens"} <= set(_parameters(hf.classify))
    assert "progress" in _parameters(fetch_logprobs)
    assert "greedy" in _parameters(openai_label_scores)
    assert {"greedy", "plugin"} <= set(_parameters(read_scores))
    assert "constrained" not in _parameters(read_scores)


def test_names_of_the_result_attributes() -> None:
    """The calibrated probabilities are ``probs`` and the label-tokens-only softmax is
    ``constrained_probs`` on every result type."""
    from semsoft_plugin.app.predictions import Predictions
    from semsoft_plugin.core.result import LabelResult, ScoredLabel
    from semsoft_plugin.core.softmax import SemanticSoftmaxResult

    for kind in (SemanticSoftmaxResult, LabelResult, Predictions):
        names = {f.name for f in dataclasses.fields(kind)}
        assert {"probs", "constrained_probs"} <= names, kind
        assert not {"semantic", "constrained"} & names, kind
    scored = ScoredLabel("joy", {"joy": 0.7, "anger": 0.3}, {"joy": 0.6, "anger": 0.4}, False, 1.0)
    assert scored.probs == {"joy": 0.7, "anger": 0.3}
    assert scored.constrained_probs == {"joy": 0.6, "anger": 0.4}
    assert not hasattr(scored, "semantic") and not hasattr(scored, "constrained")


def test_names_of_the_core_result_follow_the_scores() -> None:
    """The fields are what they say: ``constrained_probs`` is the softmax over the label
    tokens, ``probs`` the calibrated one (here a vote moves it away)."""
    import torch

    from semsoft_plugin.core.softmax import SemanticSoftmax, constrained_softmax

    torch.manual_seed(0)
    emb = torch.randn(8, 4)
    emb[2] = emb[0] + 0.01 * torch.randn(4)  # token 2 sits next to label 0's token
    logits = torch.tensor([1.0, 1.0, 3.0, -9.0, -9.0, -9.0, -9.0, -9.0])
    result = SemanticSoftmax(emb, [0, 1], k=3, tau=0.5, semantic_weight=1.0)(logits)
    torch.testing.assert_close(result.constrained_probs, constrained_softmax(logits, [0, 1]))
    assert result.probs[0] > result.constrained_probs[0] + 0.1


def _subcommand(name: str) -> Any:
    from semsoft_plugin.app.cli import build_parser

    parser = build_parser(load=name)
    (action,) = (a for a in parser._actions if a.dest == "command")
    return action.choices[name]


@pytest.mark.parametrize("command", ["eval", "tune"])
def test_names_of_the_eval_and_tune_file_and_fold_flags(command: str) -> None:
    options = _subcommand(command)._option_string_actions
    assert {"--input", "--output", "--n-folds"} <= set(options)
    assert not {"--data-file", "--out", "--folds"} & set(options)
    assert options["--n-folds"].default == 5


@pytest.mark.parametrize("command", ["classify", "eval", "tune", "distill"])
def test_names_have_one_spelling_no_abbreviation(command: str, capsys: Any) -> None:
    """argparse would read ``--out`` as ``--output`` (a unique prefix): a second
    spelling of one option. Every command refuses it."""
    parser = _subcommand(command)
    assert parser.allow_abbrev is False
    with pytest.raises(SystemExit):
        parser.parse_args(["--labels", "a,b", "--out", "x.json"])
    err = capsys.readouterr().err
    assert "--out" in err.split("unrecognized arguments:")[1]


def test_names_of_the_classify_file_flags() -> None:
    options = _subcommand("classify")._option_string_actions
    assert {"--input", "--output"} <= set(options)


def test_names_the_fold_defaults_are_one() -> None:
    """Every place that sets folds defaults to 5: ``n_folds``, and the estimator's ``cv``
    (scikit-learn's name, which also takes a splitter)."""
    from semsoft_eval.evaluate import evaluate
    from semsoft_eval.tune import tune_dataset
    from semsoft_plugin.app.classifier import Classifier
    from semsoft_plugin.fit import fitting

    places = [evaluate, tune_dataset, fitting.fit_probs]
    for place in places:
        assert inspect.signature(place).parameters["n_folds"].default == 5, place
    assert inspect.signature(Classifier).parameters["cv"].default == 5


def test_names_the_default_generation_length_holds_any_label(model_and_tokenizer) -> None:
    """``max_tokens`` is in tokens and has one default on every engine: the longest
    answer's UTF-8 bytes + 2, which holds the spaced answer and EOS under a real
    tokenizer even where one character is several tokens."""
    from semsoft_plugin.core.request import default_max_tokens

    _, tokenizer = model_and_tokenizer
    for label in ("joy", "ненависть", "喜び", "🙂", "a-very-long-label"):
        budget = default_max_tokens([label, "x"], None)
        assert budget == len(label.encode("utf-8")) + 2
        assert len(tokenizer.encode(" " + label, add_special_tokens=False)) + 1 <= budget
    assert default_max_tokens(["joy"], "</think>") == 256


@pytest.mark.slow
def test_names_of_the_one_text_classify_output(capsys) -> None:
    """The ``--json`` keys and the table columns of a one-text classify say ``probs``
    and ``constrained_probs``: the default scores are the constrained softmax, so
    "semantic" would misname them."""
    from semsoft_plugin.app.cli import main

    argv = ["classify", "I am furious.", "--labels", "joy,anger", "--model", "smollm2-135m"]
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"label", "probs", "constrained_probs", "fallback", "coverage"} <= set(report)
    assert not {"semantic", "constrained"} & set(report)
    assert set(report["probs"]) == set(report["constrained_probs"]) == {"joy", "anger"}
    assert main(argv) == 0
    printed = capsys.readouterr().out
    header = printed.splitlines()[1].split()
    assert header == ["probs", "constrained_probs"]
    # "coverage" is shown only where votes are used (a pool, semantic_weight > 0).
    assert report["coverage"] is None and "coverage" not in printed
    assert main([*argv, "--preset", "pooled", "--json"]) == 0
    assert 0 <= json.loads(capsys.readouterr().out)["coverage"] <= 1
    assert main([*argv, "--preset", "pooled"]) == 0
    assert "coverage of the top-50 mass" in capsys.readouterr().out
