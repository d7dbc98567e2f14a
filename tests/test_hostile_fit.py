"""A fitted correction is input too (issue 43): a fit file is checked whole when it is
read, before any engine starts, and applied only where it was fitted.

No test here scores a text: every refusal comes before a model loads (the ``no_model``
fixture makes a load fail the test). The checkpoint of the small embedded model is
read for its output layer's hash only.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from _probe import fit_plain

from semsoft_plugin.app.cli import main
from semsoft_plugin.core.config import SemsoftConfig
from semsoft_plugin.engines.fit_identity import run_identity
from semsoft_plugin.engines.prompting import DEFAULT_TEMPLATE, PromptTemplate
from semsoft_plugin.fit.fit_file import FitIdentity, output_layer_sha256
from semsoft_plugin.fit.fitted import FittedCorrection, read_fit, save_fitted

MODEL = "smollm2-135m"
LABELS = ("positive", "negative")


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a model fails the test: every refusal comes before it."""
    from semsoft_plugin.app import handles

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("a model was loaded before the refusal")

    monkeypatch.setattr(handles, "_load", refuse)


@pytest.fixture(scope="module")
def made_on() -> FitIdentity:
    return run_identity(LABELS, DEFAULT_TEMPLATE, MODEL)


def offset_fit(path: Path, made_on: FitIdentity, offset=(1.0, -1.0)) -> Path:
    save_fitted(path, SemsoftConfig(), FittedCorrection("offset", LABELS, offset=offset), made_on)
    return path


def probe_fit(path: Path, made_on: FitIdentity, width: int = 3) -> Path:
    x = np.random.default_rng(0).normal(size=(20, width))
    probe = fit_plain(x, np.arange(20) % 2, 2)
    save_fitted(path, SemsoftConfig(), FittedCorrection("probe", LABELS, probe=probe), made_on)
    return path


def edited(path: Path, change) -> Path:
    data = json.loads(path.read_text())
    change(data["fitted"])
    path.write_text(json.dumps(data))
    return path


def refusal(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


def classify(fit: Path, *extra: str) -> list[str]:
    return ["classify", "Great fun.", "--config", str(fit), "--model", MODEL, *extra]


# -- 1. a fit applied where it does not belong --------------------------------------


def test_a_fit_records_what_it_was_made_on(tmp_path, made_on):
    block = json.loads(offset_fit(tmp_path / "fit.json", made_on).read_text())["fitted"]
    assert block["labels"] == list(LABELS) and block["procedure"] == "offset"
    assert block["prompt"] == DEFAULT_TEMPLATE.to_dict()
    assert block["output_layer"] == made_on.output_layer and len(block["output_layer"]) == 64


def test_labels_in_another_order_are_refused(tmp_path, made_on, capsys, no_model):
    fit = offset_fit(tmp_path / "fit.json", made_on)
    err = refusal(capsys, classify(fit, "--labels", "negative,positive"))
    assert "in the order ['positive', 'negative']" in err
    assert "['negative', 'positive']" in err


def test_the_classifier_refuses_labels_in_another_order(tmp_path, made_on, no_model):
    from semsoft_plugin import Classifier

    fit = offset_fit(tmp_path / "fit.json", made_on)
    with pytest.raises(ValueError, match="in the order"):
        Classifier(MODEL, labels=["negative", "positive"]).load_fit(fit)


@pytest.mark.parametrize(
    "flags, key",
    [(["--prompt", "Is {text} good? {labels}"], "user"), (["--answer-prefix", "Label:"], "answer_prefix")],
)
def test_another_prompt_is_refused_naming_both(tmp_path, made_on, capsys, no_model, flags, key):
    fit = offset_fit(tmp_path / "fit.json", made_on)
    err = refusal(capsys, classify(fit, "--labels", ",".join(LABELS), *flags))
    assert f"prompt's {key}" in err and repr(DEFAULT_TEMPLATE.to_dict()[key])[:30] in err
    assert flags[1][:10] in err


def test_another_model_is_refused_naming_both_layers(tmp_path, made_on, capsys, no_model):
    other = FitIdentity(LABELS, DEFAULT_TEMPLATE.to_dict(), "ab" * 32)
    fit = offset_fit(tmp_path / "fit.json", other)
    err = refusal(capsys, classify(fit, "--labels", ",".join(LABELS)))
    assert "abababab" in err and made_on.output_layer[:16] in err


def test_the_model_is_compared_by_its_weights_not_its_name(made_on):
    from semsoft_plugin.engines import models

    folder = models.resolve(MODEL)
    assert run_identity(LABELS, DEFAULT_TEMPLATE, str(folder)) == made_on
    assert output_layer_sha256(folder) == made_on.output_layer


# -- 3. non-finite or malformed corrections -----------------------------------------


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda f: f.update(offset=[float("nan"), 0.0]), "holds NaN"),
        (lambda f: f.update(offset=[float("inf"), 0.0]), "holds Infinity"),
        (lambda f: f.update(offset=[float("-inf"), 0.0]), "holds -Infinity"),
        (lambda f: f.update(offset=[True, 0.0]), r"'fitted.offset'\[0\] = True is not a number"),
        (lambda f: f.update(offset=[1.0]), "must be a list of 2 numbers"),
        (lambda f: f.update(extra=1), "unknown key.*'extra' in 'fitted'"),
        (lambda f: f["prompt"].update(tone="polite"), "unknown: tone"),
        (lambda f: f.update(procedure="magic"), "'magic' is not a member"),
        (lambda f: f.pop("format"), "older version.*fit again"),
        (lambda f: f.update(format=1), "format 1.*fit again"),
        (lambda f: f.update(output_layer="x"), "not a sha256"),
        (lambda f: f.update(labels=["yes", "yes"]), "yes"),
    ],
)
def test_a_malformed_fit_is_refused_by_name(tmp_path, made_on, change, message):
    fit = edited(offset_fit(tmp_path / "fit.json", made_on), change)
    with pytest.raises(ValueError, match=message):
        read_fit(fit)


def test_an_unknown_top_level_key_is_refused(tmp_path, made_on):
    fit = offset_fit(tmp_path / "fit.json", made_on)
    data = json.loads(fit.read_text())
    fit.write_text(json.dumps({**data, "surprise": 1}))
    with pytest.raises(ValueError, match="surprise"):
        read_fit(fit)


@pytest.mark.parametrize("name", ["/etc/passwd", "../fit.json.probe.safetensors", "sub/p.safetensors"])
def test_the_probe_is_read_from_the_fits_folder_only(tmp_path, made_on, name):
    fit = edited(probe_fit(tmp_path / "fit.json", made_on), lambda f: f.update(probe=name))
    with pytest.raises(ValueError, match="fit's own folder|out of the fit's folder"):
        read_fit(fit)


def test_a_link_out_of_the_folder_is_refused(tmp_path, made_on):
    outside = probe_fit(tmp_path / "fit.json", made_on)
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "fit.json").write_text(outside.read_text())
    (inner / "fit.json.probe.safetensors").symlink_to(tmp_path / "fit.json.probe.safetensors")
    with pytest.raises(ValueError, match="out of the fit's folder"):
        read_fit(inner / "fit.json")


def test_two_fits_in_one_folder_keep_their_own_probe(tmp_path, made_on):
    a = probe_fit(tmp_path / "fit.json", made_on)
    x = np.random.default_rng(1).normal(size=(20, 3))
    other = FittedCorrection("probe", LABELS, probe=fit_plain(x, np.arange(20) // 10, 2))
    save_fitted(tmp_path / "fit.cfg", SemsoftConfig(), other, made_on)
    loaded = read_fit(a).correction
    assert loaded is not None and loaded.probe is not None
    first = json.loads(a.read_text())["fitted"]["probe"]
    second = json.loads((tmp_path / "fit.cfg").read_text())["fitted"]["probe"]
    assert first != second
    np.testing.assert_array_equal(read_fit(tmp_path / "fit.cfg").correction.probe.weight,
                                  other.probe.weight)  # fmt: skip


def _rewrite_probe(path: Path, **arrays: np.ndarray) -> None:
    """Rewrite a probe's arrays and pin the new bytes in its fit, as a tamperer who edits
    both files would: the probe's own checks must still refuse it."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    from semsoft_plugin.fit.fit_file import file_sha256

    with safe_open(str(path), framework="numpy") as f:
        meta, old = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    save_file({**old, **arrays}, str(path), metadata=meta)
    fit = path.with_name(path.name.removesuffix(".probe.safetensors"))
    edited(fit, lambda block: block.update(probe_sha256=file_sha256(path.read_bytes())))


@pytest.mark.parametrize(
    "arrays, message",
    [
        ({"scale": np.zeros(3)}, "scale holds a value that is not positive"),
        ({"weight": np.full((2, 3), np.nan)}, "weight holds a number that is not finite"),
        ({"seen": np.array([0, 5])}, r"seen \[0, 5\] must be distinct label indices"),
        ({"bias": np.zeros(3)}, r"bias has shape \[3\], not \[2\]"),
        # finite values that would overflow the scores to NaN
        ({"weight": np.full((2, 3), 1e308)}, r"weight holds 1e\+308, outside \[0, 1e\+08\]"),
        ({"scale": np.full(3, 1e-320)}, r"scale holds 9.99989e-321, outside \[1e-12, 1e\+12\]"),
    ],
)
def test_a_bad_probe_is_refused_at_load(tmp_path, made_on, arrays, message):
    fit = probe_fit(tmp_path / "fit.json", made_on)
    _rewrite_probe(tmp_path / "fit.json.probe.safetensors", **arrays)
    with pytest.raises(ValueError, match=message):
        read_fit(fit)


def test_a_truncated_probe_is_one_line(tmp_path, made_on, capsys, no_model):
    fit = probe_fit(tmp_path / "fit.json", made_on)
    probe = tmp_path / "fit.json.probe.safetensors"
    probe.write_bytes(probe.read_bytes()[:100])
    err = refusal(capsys, classify(fit, "--labels", ",".join(LABELS)))
    assert "it was replaced or edited after the fit was saved" in err
    _rewrite_pin(fit, probe)
    err = refusal(capsys, classify(fit, "--labels", ",".join(LABELS)))
    assert "is not a probe written by semsoft" in err


def _rewrite_pin(fit: Path, probe: Path) -> None:
    from semsoft_plugin.fit.fit_file import file_sha256

    edited(fit, lambda block: block.update(probe_sha256=file_sha256(probe.read_bytes())))


# -- 5. tracebacks instead of one line ---------------------------------------------


def test_config_a_folder_is_one_line(tmp_path, capsys):
    err = refusal(capsys, classify(tmp_path, "--labels", ",".join(LABELS)))
    assert f"config file {tmp_path} is a folder" in err


def test_config_a_link_loop_is_one_line(tmp_path, capsys):
    loop = tmp_path / "loop.json"
    os.symlink(loop, loop)
    err = refusal(capsys, classify(loop, "--labels", ",".join(LABELS)))
    assert f"config file {loop} cannot be read" in err


def test_config_nested_too_deep_is_one_line(tmp_path, capsys):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    err = refusal(capsys, classify(deep, "--labels", ",".join(LABELS)))
    assert f"config file {deep} is nested too deep" in err


def test_a_binary_config_names_the_file(tmp_path, capsys):
    binary = tmp_path / "weights.json"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    err = refusal(capsys, classify(binary, "--labels", ",".join(LABELS)))
    assert f"config file {binary} is not UTF-8" in err


def test_backend_vllm_without_vllm_is_one_line(capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )
    err = refusal(capsys, ["classify", "Great fun.", "--labels", "a,b", "--backend", "vllm"])
    assert "--backend vllm needs vLLM, which is not installed" in err


# -- 6. late or lost work -----------------------------------------------------------


def test_classify_takes_a_probe_on_vllm_up_to_the_engine(tmp_path, made_on, monkeypatch):
    """Issue 41: the probe is read back from the logits row on vLLM, so a fit holding it
    is no longer refused there: the command goes on to build the engine (stubbed)."""
    from semsoft_plugin.app import handles

    def engine(*_: object, **__: object) -> None:
        raise RuntimeError("the vLLM engine is built")

    monkeypatch.setattr(handles, "_load", engine)
    fit = probe_fit(tmp_path / "fit.json", made_on, width=576)  # SmolLM2's hidden size
    with pytest.raises(RuntimeError, match="the vLLM engine is built"):
        main(classify(fit, "--labels", ",".join(LABELS), "--backend", "vllm"))


@pytest.fixture
def no_tune(monkeypatch: pytest.MonkeyPatch) -> None:
    import semsoft_eval.tune as tune

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("the tune ran before --output was checked")

    monkeypatch.setattr(tune, "tune_dataset", refuse)


@pytest.mark.parametrize(
    "name, message",
    [
        ("missing/fit.json", "folder .*missing does not exist"),
        ("fit.csv", "name the file with a .json suffix"),
        ("exists.json", "exists: pass --overwrite"),
    ],
)
def test_tune_checks_its_output_at_start(tmp_path, capsys, no_tune, name, message):
    import re

    (tmp_path / "exists.json").write_text("{}")
    argv = ["tune", "--dataset", "sst2", "--model", MODEL, "--output", str(tmp_path / name)]
    err = refusal(capsys, argv)
    assert re.search(message, err), err
    assert (tmp_path / "exists.json").read_text() == "{}"


def test_the_outlines_reader_checks_the_prompt(tmp_path, made_on):
    """A fit made with the CLI's prompt is not the one Outlines gives the model."""
    pytest.importorskip("outlines")
    from typing import Literal

    from outlines.models.transformers import Transformers

    from semsoft_plugin.engines.outlines.fit import load_fit

    bare = Transformers.__new__(Transformers)  # no engine is touched before the refusal
    bare.model = MODEL
    fit = offset_fit(tmp_path / "fit.json", made_on)
    with pytest.raises(ValueError, match="prompt's user"):
        load_fit(bare, Literal["positive", "negative"], fit)


def test_a_prompt_template_is_compared_whole():
    a = FitIdentity(LABELS, DEFAULT_TEMPLATE.to_dict(), "0" * 64)
    system = PromptTemplate(DEFAULT_TEMPLATE.user, system="Be terse.").to_dict()
    with pytest.raises(ValueError, match="prompt's system"):
        a.check_run(FitIdentity(LABELS, system, "0" * 64), "fit")


# -- the file side: the settings record, blank rows, one row never ends a run -------------


class _Details:
    """What `Classifier.predict_details` gives, for a few fixed texts: enough for a file
    run's columns (the file job is tested here, not the model)."""

    def __init__(self, texts: list[str]) -> None:
        self.labels = sorted(LABELS)
        p = [0.25 + 0.5 * (sum(map(ord, text)) % 2) for text in texts]
        self.probs = np.array([[1 - q, q] for q in p])
        self.constrained_probs = self.probs
        self.label = [self.labels[int(q > 0.5)] for q in p]
        self.coverage = [0.0] * len(texts)
        self.fallback = [False] * len(texts)
        self.truncated = [0] * len(texts)

    def __len__(self) -> int:
        return len(self.label)


class _Fake:
    scored: list[str] = []

    def predict_details(self, texts: list[str]) -> _Details:
        from semsoft_plugin.app.texts import text_list

        _Fake.scored += text_list(texts)  # the API's rule: a blank text would be refused
        return _Details(texts)


@pytest.fixture
def fake_model(monkeypatch: pytest.MonkeyPatch) -> type[_Fake]:
    import semsoft_plugin.app.cli as cli

    _Fake.scored = []
    monkeypatch.setattr(cli, "classifier_from_args", lambda *a, **k: _Fake())
    return _Fake


def _texts(n: int) -> list[str]:
    return [f"review number {i}: {'good' if i % 3 else 'bad'} film" for i in range(n)]


def _write(path: Path, texts: list[str]) -> Path:
    import csv

    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text"])
        writer.writerows([t] for t in texts)
    return path


def run_file(inp: Path, out: Path, *extra: str) -> int:
    argv = ["classify", "--input", str(inp), "--output", str(out), "--labels", ",".join(LABELS)]
    return main([*argv, "--model", MODEL, *extra])


@pytest.mark.parametrize("blank", ["\u200b\u200b", "\u00a0", "\u3164", "\u2060\ufe0f", " \u200d "])
def test_a_blank_row_is_skipped_like_any_other_blank(tmp_path, capsys, fake_model, blank):
    texts = _texts(40)
    texts[29] = blank
    inp, out = _write(tmp_path / "in.csv", texts), tmp_path / "out.csv"
    assert run_file(inp, out, "--batch-size", "8") == 0
    assert "skipped 1 row(s) with an empty 'text': row 30" in capsys.readouterr().err
    assert len(out.read_text(encoding="utf-8").splitlines()) == 40  # header + 39 rows
    assert blank not in fake_model.scored


@pytest.mark.parametrize("blank", ["\u200b", "\u3164", "\u00a0\ufe0f"])
def test_the_api_refuses_a_blank_text_by_index(blank):
    from semsoft_plugin.app.texts import text_list

    with pytest.raises(ValueError, match=r"texts\[1\] .* is empty"):
        text_list(["fine", blank])


def _half_done(tmp_path: Path, texts: list[str], *extra: str) -> tuple[Path, Path]:
    """A run's output with its first 8 rows, as an interrupted run leaves it."""
    inp, out = _write(tmp_path / "in.csv", texts), tmp_path / "out.csv"
    assert run_file(inp, out, "--batch-size", "8", *extra) == 0
    lines = out.read_text(encoding="utf-8").splitlines(keepends=True)
    out.write_text("".join(lines[:9]), encoding="utf-8")
    return inp, out


def test_resume_refuses_another_fit_file(tmp_path, capsys, fake_model, made_on):
    a = offset_fit(tmp_path / "a.json", made_on, (1.0, -1.0))
    b = offset_fit(tmp_path / "b.json", made_on, (2.0, -2.0))
    inp, out = _half_done(tmp_path, _texts(20), "--config", str(a))
    capsys.readouterr()  # the first run\'s progress
    err = refusal(capsys, ["classify", "--input", str(inp), "--output", str(out), "--labels",
                           ",".join(LABELS), "--model", MODEL, "--batch-size", "8", "--config",
                           str(b), "--resume"])  # fmt: skip
    assert "another fitted correction" in err and "--config fit" in err


def test_resume_refuses_an_input_changed_under_the_done_rows(tmp_path, capsys, fake_model):
    texts = _texts(20)
    inp, out = _half_done(tmp_path, texts)
    capsys.readouterr()  # the first run\'s progress
    settings = json.loads((tmp_path / "out.csv.semsoft.json").read_text())
    assert settings["done"]["rows"] == 20 and settings["input"]["rows"] == 20
    record = tmp_path / "out.csv.semsoft.json"
    body = json.loads(record.read_text())
    from semsoft_plugin.app.file_settings import text_fingerprint

    body["done"] = {"rows": 8, "sha256": text_fingerprint(texts[:8])}
    record.write_text(json.dumps(body))
    changed = texts[:8] + ["an edited row"] + texts[9:]
    # The done rows' texts are unchanged in the output; a change in the input's first 8
    # rows is caught by the fingerprint even where the output's text column was edited too.
    _write(inp, ["x" + texts[0], *texts[1:]])
    capsys.readouterr()
    err = refusal(capsys, ["classify", "--input", str(inp), "--output", str(out), "--labels",
                           ",".join(LABELS), "--model", MODEL, "--batch-size", "8", "--resume"])  # fmt: skip
    assert "is not row 1" in err or "input changed under the 8 row(s)" in err
    _write(inp, changed)
    assert run_file(inp, out, "--batch-size", "8", "--resume") == 0  # below the done rows: fine


def test_resume_in_the_file_mode_refuses_an_input_changed_below(tmp_path, capsys, fake_model):
    texts = _texts(40)
    inp, out = _half_done(tmp_path, texts, "--calibrate", "file")
    capsys.readouterr()  # the first run\'s progress
    record = tmp_path / "out.csv.semsoft.json"
    body = json.loads(record.read_text())
    from semsoft_plugin.app.file_settings import text_fingerprint

    body["done"] = {"rows": 8, "sha256": text_fingerprint(texts[:8])}
    record.write_text(json.dumps(body))
    _write(inp, texts[:30] + ["a new text below the done rows"] + texts[31:])
    err = refusal(capsys, ["classify", "--input", str(inp), "--output", str(out), "--labels",
                           ",".join(LABELS), "--model", MODEL, "--batch-size", "8",
                           "--calibrate", "file", "--resume"])  # fmt: skip
    assert "the input changed since --calibrate file estimated its correction" in err


def test_resume_refuses_a_record_without_fingerprints(tmp_path, capsys, fake_model):
    inp, out = _half_done(tmp_path, _texts(20))
    capsys.readouterr()  # the first run\'s progress
    record = tmp_path / "out.csv.semsoft.json"
    body = json.loads(record.read_text())
    del body["done"], body["input"]
    record.write_text(json.dumps(body))
    err = refusal(capsys, ["classify", "--input", str(inp), "--output", str(out), "--labels",
                           ",".join(LABELS), "--model", MODEL, "--batch-size", "8", "--resume"])  # fmt: skip
    assert "holds no fingerprint of the input" in err


def test_the_file_mode_under_32_texts_is_refused_before_scoring(tmp_path, capsys, fake_model):
    inp = _write(tmp_path / "in.csv", _texts(20))
    err = refusal(capsys, ["classify", "--input", str(inp), "--output", str(tmp_path / "o.csv"),
                           "--labels", ",".join(LABELS), "--calibrate", "file"])  # fmt: skip
    assert "at least 32 distinct texts" in err and fake_model.scored == []


def test_parquet_non_finite_passthrough_survives_csv_and_parquet(tmp_path, fake_model):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    texts = _texts(3)
    scores = [float("inf"), float("nan"), -float("inf")]
    inp = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": texts, "score": scores}), inp)
    assert run_file(inp, tmp_path / "out.csv") == 0
    from semsoft_plugin.app.tables import read_records

    assert [r["score"] for r in read_records(tmp_path / "out.csv")] == ["inf", "nan", "-inf"]
    assert run_file(inp, tmp_path / "out.parquet") == 0
    back = pq.read_table(tmp_path / "out.parquet").column("score").to_pylist()
    assert back[0] == float("inf") and math.isnan(back[1]) and back[2] == -float("inf")


# -- labels that print alike ----------------------------------------------------------


@pytest.mark.parametrize(
    "pair",
    [("ab", "a\u200db"), ("yes", "ye\u200cs"), ("positive", "p\u043esitive"), ("no", "no\ufe0f")],
)
def test_labels_that_print_alike_are_twins_on_every_path(pair, capsys):
    from semsoft_plugin.core.labels import label_names

    with pytest.raises(ValueError, match="print alike") as refused:
        label_names(list(pair))
    assert "U+" in str(refused.value)
    err = refusal(capsys, ["classify", "x", "--labels", ",".join(pair)])
    assert "print alike" in err


def test_a_fit_saved_with_nfd_labels_loads_with_nfc_ones(tmp_path, made_on):
    import unicodedata

    nfd = tuple(unicodedata.normalize("NFD", name) for name in ("café", "thé"))
    nfc = tuple(unicodedata.normalize("NFC", name) for name in nfd)
    fit = FitIdentity(nfd, DEFAULT_TEMPLATE.to_dict(), made_on.output_layer)
    fit.check_run(FitIdentity(nfc, DEFAULT_TEMPLATE.to_dict(), made_on.output_layer), "fit")
    with pytest.raises(ValueError, match=r"U\+0301"):  # the code points, not the same print twice
        fit.check_run(FitIdentity(("cafe", "the"), DEFAULT_TEMPLATE.to_dict(),
                                  made_on.output_layer), "fit")  # fmt: skip


def test_the_classifier_refuses_another_prompt_and_an_old_file(tmp_path, made_on, no_model):
    from semsoft_plugin import Classifier

    fit = offset_fit(tmp_path / "fit.json", made_on)
    other = PromptTemplate("Is this good? {text}", answer_prefix="Label:")
    with pytest.raises(ValueError, match="prompt's user"):
        Classifier(MODEL, labels=list(LABELS), prompt=other).load_fit(fit)
    edited(fit, lambda f: f.pop("format"))
    with pytest.raises(ValueError, match="older version.*fit again"):
        Classifier(MODEL, labels=list(LABELS)).load_fit(fit)


def test_a_text_the_api_refuses_is_named_by_the_files_line(tmp_path, capsys, fake_model, monkeypatch):
    """Whatever the API's text rule refuses is refused before scoring, by file and line
    (here a rule the API might add: the check is the API's own, applied to each text)."""
    import semsoft_plugin.app.texts as texts_module

    real = texts_module.text_list

    def stricter(values):
        values = real(values)
        if any("number 7" in value for value in values):
            raise ValueError(f"texts[0] = {values[0]!r} is refused")
        return values

    monkeypatch.setattr(texts_module, "text_list", stricter)
    inp = _write(tmp_path / "in.csv", _texts(20))
    err = refusal(capsys, ["classify", "--input", str(inp), "--output", str(tmp_path / "o.csv"),
                           "--labels", ",".join(LABELS)])  # fmt: skip
    assert err.startswith(f"semsoft classify: error: {inp}:9: column 'text' = 'review number 7")
    assert fake_model.scored == []


def test_a_correction_saved_with_nfd_labels_applies_to_nfc_ones():
    """Issue 43: it was refused by a message that printed the same list twice."""
    import unicodedata

    nfd = tuple(unicodedata.normalize("NFD", name) for name in ("café", "thé"))
    nfc = [unicodedata.normalize("NFC", name) for name in nfd]
    correction = FittedCorrection("offset", nfd, offset=(1.0, -1.0))
    got = correction.apply(np.array([[0.5, 0.5]]), nfc[::-1])
    want = np.exp([-1.0, 1.0]) / np.exp([-1.0, 1.0]).sum()
    np.testing.assert_allclose(got[0], want)
    with pytest.raises(ValueError, match=r"'caf.*U\+0301.*not 'tea' \(U\+0074"):
        correction.check_labels(["tea", "coffee"])


# -- a fit is one unit; what a fit cannot use is refused before any scoring -----------------


def test_a_swapped_probe_is_refused_at_load(tmp_path, made_on, capsys, no_model):
    """Two fits of the same labels and shape: the probe of one put in place of the other's
    is refused by the fit's recorded sha256, naming the file."""
    a = probe_fit(tmp_path / "a.json", made_on)
    x = np.random.default_rng(1).normal(size=(20, 3))
    other = FittedCorrection("probe", LABELS, probe=fit_plain(x, np.arange(20) % 2, 2))
    save_fitted(tmp_path / "b.json", SemsoftConfig(), other, made_on)
    probe = tmp_path / "a.json.probe.safetensors"
    probe.write_bytes((tmp_path / "b.json.probe.safetensors").read_bytes())
    with pytest.raises(ValueError, match=r"a.json.probe.safetensors: the probe file has sha256 .* "
                       r"the fit a.json recorded .*replaced or edited"):  # fmt: skip
        read_fit(a)
    err = refusal(capsys, classify(a, "--labels", ",".join(LABELS)))
    assert "replaced or edited" in err


def test_resume_refuses_a_probe_swapped_under_its_fit(tmp_path, capsys, fake_model, made_on):
    """A run killed after 8 rows, whose probe is then replaced by another fit's (and the fit
    file re-pinned to it by hand): the settings record hashes both files, so --resume
    refuses to mix two probes in one output."""
    a = probe_fit(tmp_path / "a.json", made_on)
    monkey = pytest.MonkeyPatch()
    monkey.setattr(FitIdentity, "__init__", _identity_without_width(FitIdentity.__init__))
    try:
        inp, out = _half_done(tmp_path, _texts(20), "--config", str(a))
        capsys.readouterr()
        probe = tmp_path / "a.json.probe.safetensors"
        x = np.random.default_rng(2).normal(size=(20, 3))
        fit_plain(x, np.arange(20) % 2, 2).save(probe, LABELS)
        argv = ["classify", "--input", str(inp), "--output", str(out), "--labels", ",".join(LABELS),
                "--model", MODEL, "--batch-size", "8", "--config", str(a), "--resume"]  # fmt: skip
        assert "replaced or edited" in refusal(capsys, argv)
        _rewrite_pin(a, probe)
        assert "another fitted correction" in refusal(capsys, argv)
    finally:
        monkey.undo()


def _identity_without_width(init):  # type: ignore[no-untyped-def]
    """The run's identity without the model's hidden size: the fake model scores rows, so
    a 3-wide test probe stands for a real one (its width is checked in its own test)."""

    def patched(self, labels, prompt, output_layer, hidden_size=None):  # type: ignore[no-untyped-def]
        init(self, labels, prompt, output_layer, None)

    return patched


def test_an_older_fit_is_refused_with_the_command_that_rewrites_it(tmp_path, made_on, capsys):
    fit = probe_fit(tmp_path / "fit.json", made_on)

    def older(block: dict) -> None:
        block["format"] = 2
        del block["probe_sha256"]

    edited(fit, older)
    with pytest.raises(ValueError, match=rf"format 2, which does not pin its probe file's bytes.*"
                       rf"`semsoft upgrade-fit {fit}`"):  # fmt: skip
        read_fit(fit)
    assert main(["upgrade-fit", str(fit)]) == 0
    assert "format 2 rewritten as format 4; its probe fit.json.probe.safetensors pinned" in (
        capsys.readouterr().out
    )
    assert read_fit(fit).correction.probe is not None
    broken = offset_fit(tmp_path / "broken.json", made_on)
    edited(broken, lambda block: block.update(format=2, offset=[1.0]))
    before = broken.read_bytes()
    assert "must be a list of 2 numbers" in refusal(capsys, ["upgrade-fit", str(broken)])
    assert broken.read_bytes() == before  # a file this version refuses is left as it was


def test_a_probe_of_another_hidden_size_is_refused_at_load(tmp_path, made_on, no_model):
    """The 3-wide test probe on SmolLM2 (576): refused when the classifier takes the fit,
    before any model loads or any text is scored."""
    from semsoft_plugin.app.classifier import Classifier

    fit = probe_fit(tmp_path / "fit.json", made_on)
    with pytest.raises(ValueError, match="its probe reads hidden states of size 3, this model's are 576"):
        Classifier(MODEL, labels=list(LABELS)).load_fit(fit)


def test_a_fifo_is_refused_not_waited_on(tmp_path, made_on):
    fit = probe_fit(tmp_path / "fit.json", made_on)
    probe = tmp_path / "fit.json.probe.safetensors"
    probe.unlink()
    os.mkfifo(probe)
    with pytest.raises(ValueError, match="probe weights .* is not a regular file"):
        read_fit(fit)
    pipe = tmp_path / "pipe.json"
    os.mkfifo(pipe)
    with pytest.raises(ValueError, match="config file .*pipe.json is not a regular file"):
        read_fit(pipe)


def test_a_duplicate_key_is_refused(tmp_path, made_on):
    fit = offset_fit(tmp_path / "fit.json", made_on)
    text = fit.read_text()
    fit.write_text(text.replace('"fitted": {', '"fitted": {"procedure": "batch", ', 1))
    with pytest.raises(ValueError, match="holds the key 'procedure' twice: keep one"):
        read_fit(fit)


@pytest.mark.parametrize("name, value", [("truncate", "no"), ("engine__exact_head", "yes"),
                                         ("engine__progress", "no")])  # fmt: skip
def test_a_flag_set_later_is_checked_when_used(name, value, no_model):
    """A flag read by truth would take "no" for True: refused by name where it is used (a
    classifier parameter) or where its frozen settings value is built (a nested field)."""
    from semsoft_plugin.app.classifier import Classifier

    field = name.rpartition("__")[2]
    with pytest.raises(ValueError, match=f"{field}={value!r}\\)?:? must be True"):
        Classifier(MODEL, labels=list(LABELS)).set_params(**{name: value}).predict(["Great fun."])


# -- the policy a fit ran under ----------------------------------------------------------


def test_a_fit_file_records_its_policy_and_every_reader_checks_it(tmp_path, made_on, capsys):
    from semsoft_plugin.core.fit_policy import FitPolicy

    policy = FitPolicy(family=("offset", "temperature"), margin=0.5, f1_guard=False)
    correction = FittedCorrection("offset", LABELS, offset=(1.0, -1.0))
    fit = tmp_path / "fit.json"
    save_fitted(fit, SemsoftConfig(), correction, made_on, policy)
    assert read_fit(fit).policy == policy
    plain = tmp_path / "plain.json"
    save_fitted(plain, SemsoftConfig(semantic_weight=0.3), None, None, policy)
    assert read_fit(plain).policy == policy
    assert SemsoftConfig.load(plain) == SemsoftConfig(semantic_weight=0.3)  # a record, checked
    data = json.loads(plain.read_text())
    data["fit_policy"]["margin"] = -2
    plain.write_text(json.dumps(data))
    for read in (read_fit, SemsoftConfig.load):
        with pytest.raises(ValueError, match=r"plain\.json: FitPolicy\(margin=-2\): must be a finite"):
            read(plain)
    data["fit_policy"] = {"margin": 1.0, "gaurd": True}
    plain.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="fit_policy has no field 'gaurd'"):
        read_fit(plain)
    # A format-3 fit (no policy recorded) is refused with the command that rewrites it.
    edited(fit, lambda block: block.update(format=3))
    with pytest.raises(ValueError, match=r"format 3, which does not record the fit's policy.*upgrade-fit"):
        read_fit(fit)
    assert main(["upgrade-fit", str(fit)]) == 0
    assert "format 3 rewritten as format 4" in capsys.readouterr().out
    assert read_fit(fit).correction.offset == (1.0, -1.0)
