"""semsoft eval / tune: metrics on hand-computed cases, data errors, the report, end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from semsoft_eval import calibrate, metrics
from semsoft_eval.data import SOURCES, load_builtin, load_goemotions, load_table, sample
from semsoft_plugin.engines.prompting import PromptTemplate, load_template

# Four binary items; predictions 0, 1, 0, 1 against targets 0, 1, 1, 1.
P = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]])
Y = np.array([0, 1, 1, 1])


def test_metrics_match_hand_computed_values() -> None:
    m = metrics.classification_metrics(P, Y)
    assert m["accuracy"] == pytest.approx(0.75)
    # class 0: tp 1, fp 1, fn 0 -> 2/3; class 1: tp 2, fp 0, fn 1 -> 4/5
    assert m["macro_f1"] == pytest.approx((2 / 3 + 4 / 5) / 2)
    # squared errors summed over both classes: .02, .08, .72, .18
    assert m["brier"] == pytest.approx(0.25)
    assert m["nll"] == pytest.approx(
        -(math.log(0.9) + math.log(0.8) + math.log(0.4) + math.log(0.7)) / 4
    )
    # each confidence in its own bin: |.9-1| + |.8-1| + |.6-0| + |.7-1|, over 4
    assert m["ece"] == pytest.approx(0.3, abs=1e-6)
    assert m["auroc"] == pytest.approx(1.0)  # every positive scores above the one negative
    assert m["auroc2"] == pytest.approx(1.0)  # the wrong answer has the lowest confidence


def test_multiclass_auroc_skips_absent_labels_and_ece_numpy_matches_torchmetrics() -> None:
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(4), size=200)
    targets = rng.integers(0, 3, size=200)  # label 3 never occurs
    value = metrics.auroc(probs, targets)
    from sklearn.metrics import roc_auc_score

    expected = np.mean([roc_auc_score(targets == k, probs[:, k]) for k in range(3)])
    assert value == pytest.approx(expected)
    hits = probs.argmax(1) == targets
    assert float(metrics.ece_numpy(probs.max(1), hits)) == pytest.approx(
        metrics.ece(probs, targets), abs=1e-6
    )


def test_undefined_metrics_are_none_not_nan() -> None:
    assert metrics.auroc(P, np.ones(4, dtype=int)) is None
    assert metrics.auroc2(np.ones(4, dtype=bool), P.max(1)) is None
    soft = metrics.soft_label_metrics(np.full((3, 2), 0.5), np.array([0.0, 1.0, 1.0]))
    assert soft["spearman_vs_raters"] is None
    assert soft["share_over_0_9_on_ambiguous"] is None
    report = metrics.classification_metrics(P, np.ones(4, dtype=int))
    json.dumps(report, allow_nan=False)


def test_single_precision_rows_score_like_exact_ones_and_non_distributions_fail() -> None:
    import warnings

    targets = np.array([0, 1, 1, 0])
    rounded = P.astype(np.float32) * np.float32(1 + 3e-7)  # rows off by float32 rounding
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # scikit-learn's "do not sum to one" must not fire
        got = metrics.classification_metrics(rounded, targets)
    want = metrics.classification_metrics(P, targets)
    for name, value in want.items():
        assert got[name] == pytest.approx(value, abs=1e-6), name
    with pytest.raises(ValueError, match="row 2 sums to 1.2"):
        metrics.nll(P + np.array([[0, 0], [0, 0], [0.2, 0], [0, 0]]), targets)
    with pytest.raises(ValueError, match="negative"):
        metrics.brier(np.array([[1.5, -0.5]]), np.array([0]))


def test_soft_label_metrics_hand_computed() -> None:
    probs = np.array([[0.8, 0.2], [0.3, 0.7], [0.05, 0.95]])
    raters = np.array([0.0, 0.5, 2 / 3])
    m = metrics.soft_label_metrics(probs, raters)
    assert m["mae_vs_raters"] == pytest.approx((0.2 + 0.2 + (0.95 - 2 / 3)) / 3)
    assert m["n_ambiguous"] == 2
    assert m["share_over_0_9_on_ambiguous"] == pytest.approx(0.5)  # .95 is over, .7 is not
    # agreement with the predicted label: 1.0, 0.5, 2/3; confidences .8, .7, .95 in separate bins
    assert m["ece_vs_raters"] == pytest.approx((0.2 + 0.2 + (0.95 - 2 / 3)) / 3)
    assert m["spearman_vs_raters"] == pytest.approx(1.0)


def test_bootstrap_difference_is_zero_for_identical_methods_and_signed() -> None:
    same = metrics.bootstrap_difference(P, P, Y, n_resamples=50)
    assert all(v == {"diff": 0.0, "low": 0.0, "high": 0.0} for v in same.values())
    flatter = np.full_like(P, 0.5)
    diff = metrics.bootstrap_difference(flatter, P, Y, n_resamples=200)
    assert diff["nll"]["diff"] == pytest.approx(math.log(2) - metrics.nll(P, Y))
    assert diff["nll"]["low"] <= diff["nll"]["diff"] <= diff["nll"]["high"]


def test_temperature_fit_recovers_the_generating_temperature() -> None:
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 3, size=(4000, 5))
    true_probs = calibrate.apply_temperature(logits, 1.0)
    targets = np.array([rng.choice(5, p=p) for p in true_probs])
    # the model reports logits * 2.5: over-confident by a temperature of 2.5
    fitted = calibrate.fit_temperature(logits * 2.5, targets)
    assert fitted == pytest.approx(2.5, rel=0.1)


def test_contextual_and_prior_hand_computed() -> None:
    out = calibrate.contextual(np.array([[0.5, 0.5]]), np.array([[0.8, 0.2], [0.6, 0.4]]))
    assert out[0] == pytest.approx([0.3 / 1.0, 0.7 / 1.0], abs=1e-9)  # 0.5/0.7 vs 0.5/0.3
    folds = np.array([0, 0, 1, 1])
    prior = calibrate.cross_fit_prior(np.array([0, 0, 1, 0]), 2, folds)
    assert prior[0] == pytest.approx([2 / 4, 2 / 4])  # fold 1 holds labels 1, 0 -> (1+1, 1+1)
    assert prior[2] == pytest.approx([3 / 4, 1 / 4])  # fold 0 holds 0, 0 -> (2+1, 0+1)


# -- data ---------------------------------------------------------------------------


def test_builtin_shortcuts_read_the_data_root(data_root) -> None:
    # $SEMSOFT_DATA is tests/data (conftest): the shortcuts resolve their files there
    davidson = load_builtin("davidson")
    assert davidson.source["data_file"] == str(data_root / "davidson" / "labeled_data.csv")
    assert davidson.labels == ["no", "yes"] and davidson.soft is not None
    assert ((davidson.soft >= 0) & (davidson.soft <= 1)).all()
    assert davidson.soft[0] == pytest.approx(1 / 3) and davidson.targets.tolist().count(1) == 8
    goemotions = load_builtin("goemotions")
    assert len(goemotions.labels) == 28 and len(goemotions) == 31  # the single-label 31 of 40
    assert len(load_builtin("goemotions", any_gold=True)) == 40
    assert load_builtin("ekman").labels[:2] == ["anger", "disgust"]
    small = sample(load_builtin("sst2"), 10, seed=3)
    assert small.texts == sample(load_builtin("sst2"), 10, seed=3).texts and len(small) == 10


@pytest.mark.parametrize(
    "name, origin, licence",
    [
        ("sst2", "tonyzhaozh/few-shot-learning data/sst2/stsa.binary.dev", "Apache-2.0"),
        ("goemotions", "monologg/GoEmotions-pytorch data/original/dev.tsv", "CC BY 4.0"),
        ("davidson", "t-davidson/hate-speech-and-offensive-language data/labeled_data.csv", "MIT"),
        ("convabuse", "amandacurry/convabuse 2_splits/ConvAbuseEMNLPvalid.csv", "CC BY 4.0"),
    ],
)
def test_a_missing_builtin_data_set_says_where_it_comes_from(
    name, origin, licence, tmp_path, monkeypatch
) -> None:
    nowhere = tmp_path / "nowhere"
    monkeypatch.setenv("SEMSOFT_DATA", str(nowhere))
    with pytest.raises(ValueError) as refused:
        load_builtin(name)
    message = str(refused.value)
    assert "\n" not in message
    assert f"built-in data set {name!r} is not here ({nowhere / SOURCES[name].files[0]}" in message
    assert f"from github.com/{origin}" in message
    assert f"licence {licence};" in message
    assert "set $SEMSOFT_DATA to that folder (or give your own file with --input)" in message


def test_a_missing_data_set_is_one_line_from_the_cli_before_any_model(
    tmp_path, monkeypatch, capsys
):
    from semsoft_eval.distill import load_nq
    from semsoft_plugin.app.cli import main

    monkeypatch.setenv("SEMSOFT_DATA", str(tmp_path / "nowhere"))
    argv = ["eval", "--dataset", "sst2", "--model", "smollm2-135m", "--no-cache"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'sst2' is not here" in err and "Apache-2.0" in err
    with pytest.raises(ValueError, match=r"natural-questions nq_open/NQ-open.dev.jsonl, licence "
                       r"CC BY-SA 3.0;.*\$SEMSOFT_DATA.*with --input\)"):  # fmt: skip
        load_nq()


def test_bad_inputs_raise_one_line_errors(tmp_path) -> None:
    good = tmp_path / "d.csv"
    good.write_text("text,label\nhello,pos\nbye,neg\n")
    with pytest.raises(ValueError, match="no column 'sentence'"):
        load_table(good, text_column="sentence", label_column="label")
    with pytest.raises(ValueError, match="label 'pos' .* is not one of the labels"):
        load_table(good, label_column="label", labels=["negative", "neg"])
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="is empty"):
        load_table(empty, label_column="label")
    header_only = tmp_path / "h.tsv"
    header_only.write_text("text\tlabel\n")
    with pytest.raises(ValueError, match="is empty"):
        load_table(header_only, label_column="label")
    tsv = tmp_path / "g.tsv"
    tsv.write_text("some text\t0,5\tid1\n")
    labels = tmp_path / "labels.txt"
    labels.write_text("a\nb\nc\n")
    with pytest.raises(ValueError, match="label id 5 is outside the 3 labels.*does not match"):
        load_goemotions(tsv, labels, any_gold=True)
    soft = tmp_path / "s.jsonl"
    soft.write_text('{"text": "x", "p": 1.5}\n')
    with pytest.raises(ValueError, match=r"not in \[0, 1\]"):
        load_table(soft, prob_column="p", labels=["no", "yes"])
    with pytest.raises(ValueError, match="negative and the positive"):
        load_table(soft, prob_column="p")
    for error in (ValueError,):
        with pytest.raises(error, match="unknown dataset"):
            load_builtin("imdb")


def test_generic_jsonl_soft_labels(tmp_path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text('{"text": "a", "p": 0.25}\n{"text": "b", "p": 0.75}\n')
    data = load_table(path, prob_column="p", labels=["no", "yes"])
    assert data.targets.tolist() == [0, 1] and data.soft.tolist() == [0.25, 0.75]


def test_prompt_templates(tmp_path) -> None:
    with pytest.raises(ValueError, match="unknown placeholder"):
        PromptTemplate(user="{text} {label}")
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"user": "Mood of: {text}? ({labels})", "answer_prefix": "Mood:"}))
    template = load_template(path)
    messages = template.messages("hi", ["joy", "anger"])
    assert messages[-1] == {"role": "assistant", "content": "Mood:"}
    assert messages[0]["content"] == "Mood of: hi? (joy, anger)"


# -- end to end on the real default model -------------------------------------------


@pytest.mark.slow
def test_eval_end_to_end_report_schema_and_cache(tmp_path, capsys) -> None:
    from semsoft_plugin.app.cli import main

    out, plot = tmp_path / "r.json", tmp_path / "r.png"
    argv = ["eval", "--dataset", "ekman", "--limit", "16", "--seed", "1", "--cache-dir", str(tmp_path / "c"),
            "--bootstrap", "100", "--output", str(out), "--plot", str(plot), "--model", "smollm2-135m"]  # fmt: skip
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "| semantic |" in table and "| constrained |" in table
    report = json.loads(out.read_text())
    run = report["run"]
    for key in ("model", "dataset", "n", "seed", "k", "tau", "center", "seconds_per_item"):
        assert key in run
    assert run["n"] == 16 and run["dataset"] == "ekman"
    assert run["cache_check_max_abs_diff"] < 0.02  # rescoring the kept logits reproduces classify
    from semsoft_eval.methods import DEFAULT_METHODS

    assert list(report["methods"]) == list(DEFAULT_METHODS)
    for row in report["methods"].values():
        for key in (
            "accuracy",
            "macro_f1",
            "ece",
            "brier",
            "nll",
            "auroc",
            "auroc2",
            "fallback_rate",
            "coverage",
        ):
            assert key in row
        assert 0 <= row["accuracy"] <= 1 and row["nll"] > 0
    # The file mode as shipped, its guard's decision recorded beside the bias.
    for name in ("constrained-file", "pooled-file"):
        row = report["methods"][name]
        assert row["guard"] is True and 0 < row["confidence"] <= 1, (name, row)
        assert row["strength"] == (1.0 if row["confidence"] <= 0.5 else 0.0), (name, row)
    assert (
        report["methods"]["semantic"]["vs_constrained"]["ece"]["low"]
        <= report["methods"]["semantic"]["vs_constrained"]["ece"]["high"]
    )
    assert plot.stat().st_size > 10_000
    # a second run reads the kept forward passes and gives the same figures
    assert main(argv) == 0

    def figures(methods: dict) -> dict:
        return {
            name: {k: v for k, v in row.items() if k != "seconds_per_item"}
            for name, row in methods.items()
        }

    assert figures(json.loads(out.read_text())["methods"]) == figures(report["methods"])


@pytest.mark.slow
def test_eval_soft_labels_and_sequence(tmp_path, model_and_tokenizer) -> None:
    from semsoft_eval.evaluate import evaluate

    report = evaluate("smollm2-135m", "davidson", methods=["constrained", "semantic", "sequence"], limit=12,
                      cache_dir="", n_bootstrap=0, progress=False, loaded=model_and_tokenizer)  # fmt: skip
    row = report["methods"]["semantic"]
    assert set(metrics.soft_label_metrics(np.full((2, 2), 0.5), np.array([0.2, 0.8]))) <= set(row)
    # " no" / " yes" are single tokens: the sequence probability is the constrained one
    assert report["methods"]["sequence"]["nll"] == pytest.approx(
        report["methods"]["constrained"]["nll"]
    )


@pytest.mark.slow
def test_sequence_probabilities_of_multi_token_labels() -> None:
    from semsoft_eval.backend_transformers import TransformersBackend
    from semsoft_plugin.core.labels import LabelSet
    from semsoft_plugin.engines import models

    # float32: in bf16 a KV-cached continuation and a full recomputation differ by ~0.2 nats
    model, tokenizer = models.load("smollm2-135m", dtype="float32")
    labels = LabelSet(["joy", "disapproval"], tokenizer)
    assert labels.multi_token_labels == ("disapproval",)
    prompts = ["I love it. Emotion:", "This is wrong and I object. Emotion:"]
    batched = TransformersBackend(model, tokenizer).sequence_logprobs(
        prompts, labels, batch_size=2, progress=False
    )
    # the same, one item at a time and without the cache: the full sequence scored directly
    for row, prompt in enumerate(prompts):
        for col, label in enumerate(labels.labels):
            ids = tokenizer.encode(prompt + label.answer_text)
            prompt_len = len(tokenizer.encode(prompt))
            with torch.inference_mode():
                log_p = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
            direct = sum(log_p[i - 1, ids[i]] for i in range(prompt_len, len(ids)))
            assert float(batched[row, col]) == pytest.approx(float(direct), abs=1e-3)


@pytest.mark.slow
def test_tune_on_a_tiny_set_writes_a_config_eval_accepts(tmp_path, capsys) -> None:
    from semsoft_plugin.app.cli import main
    from semsoft_plugin.core.config import SemsoftConfig

    config = tmp_path / "cfg.json"
    cache = str(tmp_path / "c")
    argv = ["tune", "--dataset", "sst2", "--limit", "20", "--semantic-weight", "0.3,0.5,1",
            "--tau", "0.0,0.2", "--n-folds", "2", "--cache-dir", cache, "--margin", "0",
            "--fit-family", "grid,temperature",  # settings only: a plain config (test_fit_family)
            "--output", str(config), "--report", str(tmp_path / "t.json"), "--model", "smollm2-135m"]  # fmt: skip
    assert main(argv) == 0
    chosen = SemsoftConfig.load(config)
    tuned = json.loads((tmp_path / "t.json").read_text())
    fitted = SemsoftConfig().replace(**tuned["fit"]["fitted"])
    if tuned["fit"]["procedure"] == "grid":  # an entry of the grid searched
        assert fitted.semantic_weight in (0.3, 0.5, 1.0) and fitted.tau in (0.0, 0.2)
    else:  # the rule's floor: the start with a temperature
        assert tuned["fit"]["procedure"] == "temperature"
        assert fitted == SemsoftConfig(score_temperature=fitted.score_temperature)
    assert chosen == (SemsoftConfig() if tuned["fit"]["kept_default"] else fitted)
    assert set(tuned["cross_validated"]) == {
        "tuned",
        "constrained",
        "temperature",
        "semantic-default",
    }
    assert "cross-validated" in capsys.readouterr().out
    assert main(["eval", "--dataset", "sst2", "--limit", "20", "--config", str(config), "--methods",
                 "constrained,semantic", "--cache-dir", cache, "--bootstrap", "0",
                 "--model", "smollm2-135m"]) == 0  # fmt: skip


@pytest.mark.slow
def test_cli_user_errors_are_one_line(tmp_path, capsys) -> None:
    from semsoft_plugin.app.cli import main

    missing = tmp_path / "d.csv"
    missing.write_text("text,label\nhello,pos\nbye,neg\n")
    assert main(["eval", "--input", str(missing), "--label-column", "gold", "--no-cache",
                 "--model", "smollm2-135m"]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no column 'gold'" in err
    assert main(["eval", "--dataset", "sst2", "--methods", "constrained,magic", "--no-cache",
                 "--model", "smollm2-135m"]) == 2  # fmt: skip
    assert "unknown method 'magic'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "engine_args, message",
    [("[1]", "is not a JSON object"), ("{tensor", "is not JSON")],
)
def test_engine_args_must_be_a_json_object(engine_args, message, capsys) -> None:
    from semsoft_plugin.app.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--dataset", "sst2", "--backend", "vllm", "--engine-args", engine_args,
              "--model", "smollm2-135m"])  # fmt: skip
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_engine_args_without_the_vllm_backend_are_refused(capsys) -> None:
    from semsoft_plugin.app.cli import main

    argv = ["eval", "--dataset", "sst2", "--engine-args", '{"tensor_parallel_size": 2}',
            "--model", "smollm2-135m"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "tensor_parallel_size" in err and "backend='vllm'" in err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("leading_space", [True, False])
def test_tune_grid_equals_the_core_on_full_logits(leading_space, model_and_tokenizer) -> None:
    # The grid scores on a compact vocabulary; it must keep every anchor row too, or
    # labels scored without a leading space (anchored on their spaced word) would differ.
    from semsoft_eval.forward import assemble
    from semsoft_plugin import LabelSet, SemanticSoftmax, SemsoftConfig
    from semsoft_plugin.core.embeddings import from_model
    from semsoft_plugin.core.kept_scores import compress, grid_probs, label_token_ids

    model, tokenizer = model_and_tokenizer
    labels = LabelSet(["joy", "sadness", "anger"], tokenizer, leading_space=leading_space)
    embeddings = from_model(model)
    logits = torch.randn(5, embeddings.vocab_size, generator=torch.Generator().manual_seed(0)) * 4
    label_ids = torch.tensor(label_token_ids(labels))
    kept = compress(logits, 64, label_ids)
    forward = assemble(
        kept, kept, label_ids, torch.zeros(5, 3), vocab_size=logits.shape[1], seconds=0.0
    )
    configs = [
        SemsoftConfig(k=20),
        SemsoftConfig(k=50, tau=0.1, vote="per_label", semantic_weight=1.0),
    ]
    got, _ = grid_probs(forward, embeddings, labels, configs)
    for c, config in enumerate(configs):
        want = SemanticSoftmax(embeddings, labels, config)(forward.logits()).probs.double()
        np.testing.assert_allclose(got[c], want.numpy(), atol=1e-5)


# -- the seams of the evaluation: folds, registry, CLI flags, plots ------------------


def test_stratified_folds_keep_every_label_in_every_fold() -> None:
    targets = np.array([0] * 40 + [1] * 8 + [2] * 4)
    ids = calibrate.stratified_folds(targets, 4, seed=0)
    assert sorted(np.bincount(ids).tolist()) == [13, 13, 13, 13]
    for fold in range(4):
        assert np.bincount(targets[ids == fold], minlength=3).tolist() == [10, 2, 1]
    assert (calibrate.stratified_folds(targets, 4, seed=0) == ids).all()
    rare = np.array([0] * 10 + [1])
    with pytest.warns(UserWarning, match="a label has 1 items, fewer than the 3 folds"):
        fallback = calibrate.stratified_folds(rare, 3, seed=0)
    assert sorted(np.bincount(fallback).tolist()) == [3, 4, 4]
    with pytest.raises(ValueError, match="4 items cannot fill 5 folds"):
        calibrate.stratified_folds(np.array([0, 1, 0, 1]), 5)


def test_reliability_bins_are_the_ece_bins() -> None:
    from sklearn.calibration import calibration_curve

    from semsoft_eval.report import bins_ece, confidence_bins, reliability_bins

    rng = np.random.default_rng(0)
    conf = np.concatenate([rng.uniform(0.2, 1.0, 200), np.arange(3, 16) / 15])  # edges too
    hit = rng.uniform(size=conf.shape) < conf
    accuracy, mean_conf = calibration_curve(hit, conf, n_bins=metrics.N_BINS, pos_label=True)
    bins = confidence_bins(conf, hit)
    assert len(bins["count"]) == metrics.N_BINS and sum(bins["count"]) == len(conf)
    filled = [i for i, n in enumerate(bins["count"]) if n]
    assert all(bins["confidence"][i] is None for i in range(metrics.N_BINS) if i not in filled)
    np.testing.assert_allclose([bins["confidence"][i] for i in filled], mean_conf)
    np.testing.assert_allclose([bins["accuracy"][i] for i in filled], accuracy)
    assert bins_ece(bins) == pytest.approx(float(metrics.ece_numpy(conf, hit)))
    # a confidence on an edge falls in the bin below it, as in torchmetrics: 2/15 in bin 1
    assert confidence_bins(np.array([2 / 15]), np.array([1.0]))["count"][1] == 1
    probs = rng.dirichlet(np.ones(3), size=300)
    targets = rng.integers(0, 3, 300)
    assert bins_ece(reliability_bins(probs, targets)) == pytest.approx(
        metrics.ece(probs, targets), abs=1e-6
    )


def test_plot_reliability_draws_the_docs_panels(tmp_path: Path) -> None:
    """`semsoft eval --plot`'s diagrams are `reliability_figure`'s, as the docs' figures:
    one panel per method titled with its ECE, and a share-of-items panel beneath it."""
    import matplotlib.pyplot as plt

    from semsoft_eval.report import plot_reliability, reliability_bins, reliability_figure

    rng = np.random.default_rng(1)
    probs = {"a": rng.dirichlet(np.ones(2), 80), "b": rng.dirichlet(np.ones(2) * 5, 80)}
    targets = rng.integers(0, 2, 80)
    fig = reliability_figure({k: reliability_bins(p, targets) for k, p in probs.items()})
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == [f"{k} (ECE {metrics.ece(p, targets):.3f})" for k, p in probs.items()]
    assert [ax.get_xlabel() for ax in fig.axes] == ["", "", "confidence", "confidence"]
    plt.close(fig)
    plot_reliability(probs, targets, tmp_path / "r.svg", title="t")
    assert "<svg" in (tmp_path / "r.svg").read_text()[:2000]


def _synthetic_inputs(n: int = 12, folds: int = 2):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    from semsoft_eval.forward import assemble
    from semsoft_eval.methods import MethodInputs
    from semsoft_plugin import LabelSet, SemsoftConfig
    from semsoft_plugin.core.kept_scores import compress, label_token_ids
    from semsoft_plugin.engines import models

    tokenizer = AutoTokenizer.from_pretrained(models.resolve("smollm2-135m"))
    labels = LabelSet(["joy", "sadness", "anger"], tokenizer)
    generator = torch.Generator().manual_seed(0)
    vocab = len(tokenizer)
    logits = torch.randn(n, vocab, generator=generator) * 3
    embeddings = torch.randn(vocab, 16, generator=generator)
    label_ids = torch.tensor(label_token_ids(labels))
    kept = compress(logits, 64, label_ids)
    targets = np.arange(n) % 3
    # hidden states that carry the label, so the probe has something to find
    # (of the embeddings' width: the probe reads the label rows of the output layer)
    hidden = torch.randn(n, 16, generator=generator) + 2.0 * torch.eye(16)[targets]
    forward = assemble(kept, kept, label_ids, torch.zeros(n, 3), vocab_size=vocab, seconds=0.0,
                       hidden=hidden)  # fmt: skip
    return MethodInputs(
        forward,
        embeddings,
        labels,
        targets,
        config=SemsoftConfig(),
        paper=SemsoftConfig.preset("paper"),
        fold_ids=calibrate.folds(n, folds, 0),
    )


def test_methods_registry_runs_each_default_method_and_takes_new_ones() -> None:
    from semsoft_eval import methods
    from semsoft_eval.methods import ALL_METHODS, DEFAULT_METHODS

    assert DEFAULT_METHODS[:2] == ("constrained", "semantic") and "verbal" not in DEFAULT_METHODS
    assert set(ALL_METHODS) == set(methods.METHODS) >= {"self-consistency", "verbal"}
    inputs = _synthetic_inputs()
    out = methods.score_methods(DEFAULT_METHODS, inputs)
    assert list(out) == list(DEFAULT_METHODS)
    for result in out.values():
        assert np.isfinite(result.probs).all()
        np.testing.assert_allclose(result.probs.sum(1), 1.0)
    want = torch.softmax(inputs.forward.label_logits[:, :3].double(), -1).numpy()
    np.testing.assert_allclose(out["constrained"].probs, want)
    np.testing.assert_allclose(out["sequence"].probs, want)  # single-token labels
    with pytest.raises(ValueError, match="unknown method 'magic'"):
        methods.score_methods(["constrained", "magic"], inputs)
    with pytest.raises(ValueError, match="this method generates text"):
        methods.score_methods(["verbal"], inputs)

    @methods.method("test-half", "mean of constrained and semantic", default=False)
    def _half(m: methods.MethodInputs) -> methods.MethodResult:
        return m.derived(m.semantic(), (m.semantic().probs + m.constrained().probs) / 2)

    try:
        got = methods.score_methods(["test-half"], inputs)["test-half"]
        np.testing.assert_allclose(got.probs, (out["semantic"].probs + want) / 2)
        assert got.fallback_rate == out["semantic"].fallback_rate
        with pytest.raises(ValueError, match="registered twice"):
            methods.method("test-half", "again")(_half)
    finally:
        methods.METHODS.pop("test-half")


def test_the_fit_method_is_classifier_fit_on_each_held_fold() -> None:
    """`fit` is `Classifier.fit`'s fit from the kept passes (`fit_kept`, the default
    family for the engine with its rule and guard) on the other folds' items, applied to
    the held fold as predictions apply it; each fold's choice is in the report."""
    from semsoft_eval import methods
    from semsoft_eval.data import EvalData
    from semsoft_eval.held_fit import classifier_plan
    from semsoft_eval.report import build_report, format_markdown
    from semsoft_plugin.app.classifier_fit import fit_kept
    from semsoft_plugin.app.classifier_settings import checked_family
    from semsoft_plugin.core.fit_policy import FitPolicy
    from semsoft_plugin.core.kept_scores import kept_rows

    inputs = _synthetic_inputs(n=60, folds=3)
    policy, params = classifier_plan(inputs.config, "transformers", inputs.seed)
    family = checked_family(None, "transformers")
    assert policy.family == family and "probe" in family and params["cv"] == 5
    # the classifier's default rule, only its family and grid resolved
    assert policy.set_params(family=None, grid=None) == FitPolicy(random_state=inputs.seed)
    got = methods.score_methods(["fit"], inputs)["fit"]
    forward, hidden = inputs.forward, inputs.forward.hidden.numpy()
    names = tuple(inputs.labels.names)
    choices = got.extra["fold_choices"]
    assert [c["fold"] for c in choices] == [0, 1, 2]
    procedures = set()
    for fold, choice in enumerate(choices):
        train = np.flatnonzero(inputs.fold_ids != fold)
        held = np.flatnonzero(inputs.fold_ids == fold)
        state = fit_kept(
            kept_rows(forward, train), hidden[train], forward.content_free(), inputs.embeddings,
            inputs.labels, inputs.targets[train], policy, inputs.config, n_folds=5,
        )  # fmt: skip
        want, _ = state.kept_probs(kept_rows(forward, held), inputs.embeddings, inputs.labels,
                                   names, hidden[held])  # fmt: skip
        np.testing.assert_allclose(got.probs[held], want, rtol=0, atol=1e-9)
        assert choice["procedure"] == state.result.procedure
        assert choice["kept_default"] == state.result.kept_default
        assert choice["score_temperature"] == state.config.score_temperature
        assert ("C" in choice) == (state.correction is not None and state.correction.probe is not None)
        procedures.add("kept" if choice["kept_default"] else choice["procedure"])
    assert "probe" in procedures  # the hidden states carry the label: the probe wins somewhere
    np.testing.assert_allclose(got.probs.sum(1), 1.0)
    # the report carries each fold's choice, the JSON row and the Markdown table
    data = EvalData("synthetic", ["t"] * 60, list(names), inputs.targets)
    report = build_report({"fit": got}, data, inputs.fold_ids, n_bootstrap=0)
    assert report["methods"]["fit"]["fold_choices"] == choices
    json.dumps(report, allow_nan=False)
    run = {"dataset": "synthetic", "n": 60, "model": "m", "seconds_per_item": 0.0,
           "machine": "x", "date": "d", "label_report": {"multi_token_labels": []}}  # fmt: skip
    table = format_markdown({"run": run, **report})
    assert "`fit` per fold: 1 " in table and "probe (C=" in table


def test_the_fit_method_follows_the_engine_and_refuses_what_it_cannot_fit() -> None:
    from semsoft_eval import methods
    from semsoft_eval.held_fit import classifier_plan
    from semsoft_plugin.app.classifier_fit import fit_kept
    from semsoft_plugin.app.classifier_settings import checked_family
    from semsoft_plugin.core.kept_scores import kept_rows

    inputs = _synthetic_inputs(n=30)
    with pytest.raises(ValueError, match="unknown method 'semantic-fit'; methods are .*\\bfit\\b"):
        methods.score_methods(["semantic-fit"], inputs)
    assert "semantic-fit" not in methods.ALL_METHODS and "fit" in methods.DEFAULT_METHODS
    inputs.forward.hidden = None
    with pytest.raises(ValueError, match="method 'fit' is Classifier.fit's default family on "
                       "transformers.*probe needs the decision step's hidden states"):  # fmt: skip
        methods.score_methods(["fit"], inputs)
    # on vLLM: the family Classifier(backend="vllm").fit checks, whatever it is
    inputs.backend = SimpleNamespace(name="vllm")  # type: ignore[assignment]
    policy, _ = classifier_plan(inputs.config, "vllm", 0)
    assert policy.family == checked_family(None, "vllm")
    if "probe" in policy.family:
        with pytest.raises(ValueError, match="default family on vllm.*hidden states"):
            methods.score_methods(["fit"], inputs)
        return
    got = methods.score_methods(["fit"], inputs)["fit"]
    held = np.flatnonzero(inputs.fold_ids == 0)
    train = np.flatnonzero(inputs.fold_ids != 0)
    forward = inputs.forward
    state = fit_kept(kept_rows(forward, train), None, forward.content_free(), inputs.embeddings,
                     inputs.labels, inputs.targets[train], policy, inputs.config,
                     n_folds=5)  # fmt: skip
    want, _ = state.kept_probs(kept_rows(forward, held), inputs.embeddings, inputs.labels,
                               tuple(inputs.labels.names))  # fmt: skip
    np.testing.assert_allclose(got.probs[held], want, rtol=0, atol=1e-9)


def test_tune_is_the_classifier_fit_and_its_figures_are_the_held_fold_fit() -> None:
    """`semsoft tune` runs `fit_kept` on all items and, for its figures,
    `cross_fit_plan` (what the method `fit` runs) with its own policy."""
    from semsoft_eval.held_fit import cross_fit_plan
    from semsoft_eval.tune import tune
    from semsoft_plugin import SemsoftConfig
    from semsoft_plugin.app.classifier_fit import fit_kept
    from semsoft_plugin.core.fit_policy import FitPolicy
    from semsoft_plugin.fit.fitting import DEFAULT_WEIGHTS, FAMILY

    inputs = _synthetic_inputs(n=45)
    forward, y = inputs.forward, inputs.targets
    result = tune(forward, inputs.embeddings, inputs.labels, y, n_folds=3)
    policy = FitPolicy(family=FAMILY, grid={"semantic_weight": DEFAULT_WEIGHTS})
    state = fit_kept(forward, forward.hidden.numpy(), forward.content_free(), inputs.embeddings,
                     inputs.labels, y, policy, SemsoftConfig(), n_folds=3)  # fmt: skip
    assert result.fit.to_dict() == state.result.to_dict() and result.config == state.config
    if state.correction is None or state.correction.probe is None:
        assert result.correction == state.correction
    else:  # the same probe, fitted on the same rows
        np.testing.assert_array_equal(result.correction.probe.weight, state.correction.probe.weight)
    folds = calibrate.stratified_folds(y, 3, 0)
    probs, choices = cross_fit_plan(forward, inputs.embeddings, inputs.labels, y, folds,
                                    SemsoftConfig(), policy, n_folds=3)  # fmt: skip
    assert result.fold_choices == choices
    assert result.cross_validated["tuned"] == metrics.classification_metrics(probs, y, None)


def test_cli_flags_are_the_config_fields_and_hf_is_an_alias() -> None:
    import argparse
    import dataclasses

    from semsoft_eval import cli_eval
    from semsoft_eval.tune import DEFAULT_GRID, grid_configs
    from semsoft_plugin import SemsoftConfig
    from semsoft_plugin.app.config_args import config_from_args, grid_from_args

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    cli_eval.add_eval_parser(sub)
    cli_eval.add_tune_parser(sub)
    fields = [f.name for f in dataclasses.fields(SemsoftConfig)]
    argv = ["eval", "--backend", "transformers", "--preset", "pooled", "--own-vote", "false", "--k", "30",
            "--tau-quantile", "0.9"]  # fmt: skip
    args = parser.parse_args(argv)
    assert args.backend == "transformers"
    config = config_from_args(args)
    assert (config.own_vote, config.k, config.tau_quantile) == (False, 30, 0.9)
    assert config.semantic_weight == 0.3  # the preset's
    assert config.center == SemsoftConfig().center  # not given: the preset's own
    tune = parser.parse_args(["tune", "--vote", "shared,per_label", "--k", "20,50"])
    axes = grid_from_args(tune, skip=("score_temperature",))
    assert axes == {**DEFAULT_GRID, "vote": ("shared", "per_label"), "k": (20, 50)}
    assert not hasattr(tune, "score_temperature")  # fitted, never a grid axis
    assert set(DEFAULT_GRID) <= set(fields)
    # At weight 0 the votes have no effect: those entries keep the vote defaults.
    configs = grid_configs(axes)
    assert {c.vote for c in configs if c.semantic_weight == 0} == {"residual"}
    assert {c.vote for c in configs if c.semantic_weight > 0} == {"shared", "per_label"}
    with pytest.raises(SystemExit):
        parser.parse_args(["eval", "--backend", "tpu"])
