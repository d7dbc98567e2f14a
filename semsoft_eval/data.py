"""Evaluation data: GoEmotions TSV, generic CSV/TSV/JSONL, and built-in shortcuts.

Every loader returns an `EvalData`: texts, label names, hard targets, and for
binary soft-label data the raters' fraction for the positive label. Bad input raises a
one-line `ValueError` naming the file and the bad value.

Built-in shortcuts read public data sets from `$SEMSOFT_DATA`, else `../shared/data`
beside the project root (a clone has none). Each one's files, origin and licence are in
`SOURCES`, and a missing file is refused in one line that says where to get it. What
each set holds: docs/evaluation.md ("Built-in data sets").
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from semsoft_plugin.app.tables import read_lines as _read_lines
from semsoft_plugin.app.tables import read_records as _read_records

__all__ = [
    "EvalData",
    "BUILTIN",
    "DATA_ENV",
    "SOURCES",
    "Source",
    "builtin_root",
    "data_dir",
    "load_builtin",
    "load_goemotions",
    "load_table",
    "sample",
]

DATA_ENV = "SEMSOFT_DATA"
BUILTIN = ("goemotions", "ekman", "davidson", "sst2", "agnews", "trec", "convabuse")

# Single-word label names, so that each is one answer token on the embedded models.
AGNEWS_LABELS = ("world", "sports", "business", "technology")  # classes.txt order
TREC_LABELS = {
    "ABBR": "abbreviation",
    "DESC": "description",
    "ENTY": "entity",
    "HUM": "human",
    "LOC": "location",
    "NUM": "number",
}


@dataclass(frozen=True)
class Source:
    """Where a built-in data set comes from, so that a missing one can be fetched.

    Attributes
    ----------
    files : tuple[str, ...]
        The files the loader reads, relative to `data_dir`
    what : str
        The data set, as a reader would cite it
    origin : str
        The public repository and path the files are copied from
    licence : str
        The data's licence
    how : str
        What to do with the published file(s), when more than saving them as `files`
    """

    files: tuple[str, ...]
    what: str
    origin: str
    licence: str
    how: str = ""


_FEW_SHOT = "github.com/tonyzhaozh/few-shot-learning"
_GOEMOTIONS = "github.com/monologg/GoEmotions-pytorch"
SOURCES: dict[str, Source] = {
    "goemotions": Source(
        ("goemotions/dev.tsv", "goemotions/labels.txt"),
        "GoEmotions dev split (Demszky et al., 2020)",
        f"{_GOEMOTIONS} data/original/dev.tsv and labels.txt",
        "CC BY 4.0",
    ),
    "ekman": Source(
        ("goemotions/ekman_dev.tsv", "goemotions/ekman_labels.txt"),
        "GoEmotions dev split mapped to Ekman's emotions (Demszky et al., 2020)",
        f"{_GOEMOTIONS} data/ekman/dev.tsv and labels.txt",
        "CC BY 4.0",
    ),
    "davidson": Source(
        ("davidson/labeled_data.csv",),
        "Hate Speech and Offensive Language tweets (Davidson et al., 2017)",
        "github.com/t-davidson/hate-speech-and-offensive-language data/labeled_data.csv",
        "MIT",
    ),
    "sst2": Source(
        ("sst2/dev.txt",),
        "SST-2 dev split",
        f"{_FEW_SHOT} data/sst2/stsa.binary.dev",
        "Apache-2.0",
    ),
    "agnews": Source(
        ("agnews/dev.csv",),
        "AG News (Zhang et al., 2015)",
        f"{_FEW_SHOT} data/agnews/test.csv",
        "Apache-2.0",
        "keep its rows 0, 2, 4, ... under a 'Class Index,Title,Description' header",
    ),
    "trec": Source(
        ("trec/train.txt",),
        "TREC question classification, training split (Li and Roth, 2002)",
        f"{_FEW_SHOT} data/trec/train.txt",
        "Apache-2.0",
    ),
    "convabuse": Source(
        ("convabuse/valid_soft.csv",),
        "ConvAbuse validation split (Cercas Curry et al., 2021)",
        "github.com/amandacurry/convabuse 2_splits/ConvAbuseEMNLPvalid.csv",
        "CC BY 4.0",
        "write it as columns text ('User: ' + the message), p_abusive (the share of its "
        "annotators who marked it abusive), raters",
    ),
    "nq": Source(
        ("nq_open/dev.jsonl",),
        "Natural Questions open, dev split (Lee et al., 2019)",
        "github.com/google-research-datasets/natural-questions nq_open/NQ-open.dev.jsonl",
        "CC BY-SA 3.0",
    ),
}


@dataclass
class EvalData:
    """Items to classify.

    Attributes
    ----------
    name : str
        Data set name, for the report
    texts : list[str]
        The items
    labels : list[str]
        Label names in report order
    targets : np.ndarray
        Int array [N], the gold label index (for multi-label items the first one)
    gold_sets : list[tuple[int, ...]] | None
        Per item, all gold label indices (only for `any_gold`), else None
    soft : np.ndarray | None
        Float array [N], the raters' fraction for `labels[1]` (binary soft data), else None
    task : str
        Which default prompt template fits ("emotion", "sentiment", "toxicity", "generic")
    """

    name: str
    texts: list[str]
    labels: list[str]
    targets: np.ndarray
    gold_sets: list[tuple[int, ...]] | None = None
    soft: np.ndarray | None = None
    task: str = "generic"
    source: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.texts)

    def subset(self, index: np.ndarray) -> EvalData:
        index = np.asarray(index, dtype=np.int64)
        return EvalData(
            name=self.name,
            texts=[self.texts[i] for i in index],
            labels=list(self.labels),
            targets=self.targets[index],
            gold_sets=None if self.gold_sets is None else [self.gold_sets[i] for i in index],
            soft=None if self.soft is None else self.soft[index],
            task=self.task,
            source=dict(self.source),
        )


def data_dir() -> Path:
    """`$SEMSOFT_DATA`, else `../shared/data` beside the project root."""
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent.parent / "shared" / "data"


def builtin_root(name: str, *, own_file: str = "--input") -> Path:
    """The data folder holding every file of built-in data set `name` (see `SOURCES`).

    A missing file is refused here, in one line naming the data set, its origin, its licence
    and `$SEMSOFT_DATA`, rather than by whichever loader first opens it; `own_file` is
    the option that takes the user's own file instead.
    """
    if name not in SOURCES:
        raise ValueError(f"no built-in data set {name!r}; those known are {', '.join(SOURCES)}")
    source = SOURCES[name]
    root = data_dir()
    missing = [f for f in source.files if not (root / f).is_file()]
    if missing:
        them = "them" if len(source.files) > 1 else "it"
        how = f"{source.how}, saved" if source.how else f"save {them}"
        raise ValueError(
            f"built-in data set {name!r} is not here ({root / missing[0]} is missing): it is "
            f"{source.what}, from {source.origin}, licence {source.licence}; {how} as "
            f"{' and '.join(source.files)} in a folder and set ${DATA_ENV} to that folder "
            f"(or give your own file with {own_file})"
        )
    return root


def load_goemotions(
    data_file: str | Path,
    labels_file: str | Path,
    *,
    any_gold: bool = False,
    name: str = "goemotions",
) -> EvalData:
    """GoEmotions TSV: `text <TAB> comma-separated label ids <TAB> comment id`.

    Single-label items only by default; with `any_gold` all items are kept and
    `gold_sets` holds every gold label.
    """
    labels = [line.strip() for line in _read_lines(Path(labels_file))]
    if len(set(labels)) != len(labels):
        raise ValueError(f"labels file {labels_file} lists a label twice")
    texts: list[str] = []
    golds: list[tuple[int, ...]] = []
    for number, line in enumerate(_read_lines(Path(data_file)), start=1):
        parts = line.split("\t")
        if len(parts) < 2:
            raise ValueError(
                f"{data_file}:{number}: expected 'text<TAB>label ids', got {line[:60]!r}"
            )
        try:
            ids = tuple(int(x) for x in parts[1].split(","))
        except ValueError:
            raise ValueError(
                f"{data_file}:{number}: label ids {parts[1]!r} are not integers"
            ) from None
        bad = [i for i in ids if not 0 <= i < len(labels)]
        if bad:
            raise ValueError(
                f"{data_file}:{number}: label id {bad[0]} is outside the {len(labels)} labels of "
                f"{labels_file}: the label list does not match the data"
            )
        if len(ids) > 1 and not any_gold:
            continue
        texts.append(parts[0])
        golds.append(ids)
    if not texts:
        raise ValueError(f"{data_file} has no usable items")
    return EvalData(
        name=name,
        texts=texts,
        labels=labels,
        targets=np.array([g[0] for g in golds], dtype=np.int64),
        gold_sets=golds if any_gold else None,
        task="emotion",
        source={"data_file": str(data_file), "labels_file": str(labels_file)},
    )


def _column(records: list[dict[str, object]], column: str, path: Path) -> list[object]:
    if column not in records[0]:
        raise ValueError(f"{path}: no column {column!r}; columns are {sorted(records[0])}")
    values = [r.get(column) for r in records]
    for number, value in enumerate(values, start=1):
        if value is None or (isinstance(value, str) and not value.strip()):
            raise ValueError(f"{path}: row {number} has no value in column {column!r}")
    return values


def load_table(
    path: str | Path,
    *,
    text_column: str = "text",
    label_column: str | None = None,
    prob_column: str | None = None,
    labels: list[str] | None = None,
    name: str | None = None,
    task: str = "generic",
) -> EvalData:
    """A CSV, TSV or JSONL file with a text column and a hard or a soft label.

    Parameters
    ----------
    label_column : str | None
        Hard labels; the label set is the sorted distinct values unless
        `labels` is given, in which case every value must be one of them
    prob_column : str | None
        A binary soft label in [0, 1] (the raters' fraction for the positive
        label); `labels` must then name the negative and the positive label
    """
    path = Path(path)
    if (label_column is None) == (prob_column is None):
        raise ValueError("give exactly one of --label-column and --prob-column")
    records = _read_records(path)
    texts = [str(t) for t in _column(records, text_column, path)]
    if label_column is not None:
        values = [str(v).strip() for v in _column(records, label_column, path)]
        if labels is None:
            labels = sorted(set(values))
            if len(labels) < 2:
                raise ValueError(
                    f"{path}: column {label_column!r} holds one distinct label, need at least 2"
                )
        index = {label: i for i, label in enumerate(labels)}
        unknown = sorted(set(values) - set(index))
        if unknown:
            raise ValueError(
                f"{path}: label {unknown[0]!r} in column {label_column!r} is not one of the labels {labels}"
            )
        targets = np.array([index[v] for v in values], dtype=np.int64)
        soft = None
    else:
        if labels is None or len(labels) != 2:
            raise ValueError(
                "--prob-column needs --labels naming the negative and the positive label"
            )
        try:
            column = _column(records, str(prob_column), path)
            soft = np.array([float(v) for v in column], dtype=np.float64)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ValueError(
                f"{path}: column {prob_column!r} holds a value that is not a number"
            ) from None
        bad = np.flatnonzero(~((soft >= 0) & (soft <= 1)))
        if bad.size:
            raise ValueError(
                f"{path}: row {bad[0] + 1} has {prob_column}={soft[bad[0]]!r}, not in [0, 1]"
            )
        targets = (soft > 0.5).astype(np.int64)
    if len(set(labels)) != len(labels):
        raise ValueError(f"labels {labels} list a label twice")
    return EvalData(
        name=name or path.stem,
        texts=texts,
        labels=list(labels),
        targets=targets,
        soft=soft,
        task=task,
        source={"data_file": str(path)},
    )


def _davidson(path: Path) -> EvalData:
    with path.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    if not rows:
        raise ValueError(f"data file {path} is empty")
    texts, soft, targets = [], [], []
    for row in rows:
        count = int(row["count"])
        toxic = int(row["hate_speech"]) + int(row["offensive_language"])
        texts.append(row["tweet"])
        soft.append(toxic / count)
        targets.append(int(row["class"] in ("0", "1")))  # the majority: hate or offensive
    return EvalData(
        name="davidson",
        texts=texts,
        labels=["no", "yes"],
        targets=np.array(targets, dtype=np.int64),
        soft=np.array(soft, dtype=np.float64),
        task="toxicity",
        source={"data_file": str(path)},
    )


def _sst2(path: Path) -> EvalData:
    texts, targets = [], []
    for number, line in enumerate(_read_lines(path), start=1):
        label, _, text = line.partition(" ")
        if label not in ("0", "1") or not text:
            raise ValueError(f"{path}:{number}: expected '0|1 text', got {line[:40]!r}")
        texts.append(text)
        targets.append(int(label))
    return EvalData(
        name="sst2",
        texts=texts,
        labels=["negative", "positive"],
        targets=np.array(targets, dtype=np.int64),
        task="sentiment",
        source={"data_file": str(path)},
    )


def _agnews(path: Path) -> EvalData:
    texts, targets = [], []
    for number, row in enumerate(_read_records(path), start=2):
        try:
            target = int(str(row["Class Index"])) - 1
        except (KeyError, ValueError):
            raise ValueError(f"{path}:{number}: expected a 'Class Index' of 1-4") from None
        if not 0 <= target < len(AGNEWS_LABELS):
            raise ValueError(f"{path}:{number}: Class Index {target + 1} is not 1-4")
        texts.append(f"{row['Title']}. {row['Description']}")
        targets.append(target)
    return EvalData(
        name="agnews",
        texts=texts,
        labels=list(AGNEWS_LABELS),
        targets=np.array(targets, dtype=np.int64),
        task="topic",
        source={"data_file": str(path)},
    )


def _trec(path: Path) -> EvalData:
    names = list(TREC_LABELS.values())
    texts, targets = [], []
    if not path.is_file():
        raise ValueError(f"data file not found: {path}")
    lines = path.read_text(encoding="latin-1").splitlines()  # the published file is latin-1
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        head, _, text = line.partition(" ")
        coarse = head.partition(":")[0]
        if coarse not in TREC_LABELS or not text.strip():
            raise ValueError(f"{path}:{number}: expected 'COARSE:fine question', got {line[:40]!r}")
        texts.append(text.strip())
        targets.append(names.index(TREC_LABELS[coarse]))
    return EvalData(
        name="trec",
        texts=texts,
        labels=names,
        targets=np.array(targets, dtype=np.int64),
        task="question",
        source={"data_file": str(path)},
    )


def load_builtin(name: str, *, any_gold: bool = False) -> EvalData:
    """One of `BUILTIN`, read from `data_dir` (`builtin_root` checks it)."""
    if name not in BUILTIN:
        raise ValueError(
            f"unknown dataset {name!r}; built-in ones are {', '.join(BUILTIN)}, or give --input"
        )
    root = builtin_root(name)
    if name == "goemotions":
        return load_goemotions(
            root / "goemotions/dev.tsv", root / "goemotions/labels.txt", any_gold=any_gold
        )
    if name == "ekman":
        return load_goemotions(
            root / "goemotions/ekman_dev.tsv",
            root / "goemotions/ekman_labels.txt",
            any_gold=any_gold,
            name="ekman",
        )
    if name == "davidson":
        return _davidson(root / "davidson/labeled_data.csv")
    if name == "sst2":
        return _sst2(root / "sst2/dev.txt")
    if name == "agnews":
        return _agnews(root / "agnews/dev.csv")
    if name == "trec":
        return _trec(root / "trec/train.txt")
    if name == "convabuse":
        data = load_table(
            root / "convabuse/valid_soft.csv",
            prob_column="p_abusive",
            labels=["no", "yes"],
            name="convabuse",
            task="abuse",
        )
        data.source["raters"] = "p_abusive"
        return data
    raise AssertionError(f"BUILTIN lists {name!r} but load_builtin does not read it")


def sample(data: EvalData, limit: int | None, seed: int = 0) -> EvalData:
    """A fixed random sample of `limit` items (all items, in file order, if None)."""
    if limit is None or limit >= len(data):
        return data
    if limit < 1:
        raise ValueError(f"--limit {limit} must be at least 1")
    index = np.sort(np.random.default_rng(seed).choice(len(data), size=limit, replace=False))
    return data.subset(index)
