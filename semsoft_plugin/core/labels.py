"""Label sets: which tokens stand for each label at the decision step.

A label is scored as the model would write it after a prompt that ends just before the
answer (`"Emotion:"`): with a leading space (`" joy"`), usually one whole-word token;
`verbalizers` make the model answer with another word. Its answer token is the first token
of that spelling and its embedding `E_l` that token's output embedding (with
`leading_space=False`, the first token of the spaced spelling); spelling variants whose
first token belongs to no other label are its own tokens. A label list
([`label_names`][semsoft_plugin.core.labels.label_names]) is an ordered sequence of at least
two distinct, non-empty strings, each checked by `semsoft_plugin.core.text_rules`. A
[`LabelSet`][semsoft_plugin.core.labels.LabelSet] is bound to its tokenizer
([`LabelSet.check_tokenizer`][semsoft_plugin.core.labels.LabelSet.check_tokenizer]), and
every fault (an empty set, duplicates, labels sharing an answer token) is a `ValueError`
naming the label. Each rule and why: docs/method.md ("Label sets").
"""

from __future__ import annotations

import csv
import hashlib
from collections import Counter
from collections.abc import Iterable, Iterator, KeysView, Mapping, Sequence, ValuesView
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Protocol

from semsoft_plugin.core.text_rules import check_label, code_points, label_identity
from semsoft_plugin.core.tokens import LabelTokens

__all__ = [
    "LABELS_SYNTAX",
    "Label",
    "LabelSet",
    "TokenizerLike",
    "label_names",
    "split_labels",
]

# Labels a server or a user may pass are bounded so a request cannot blow up the
# weight tensor; adapters may set stricter limits.
MAX_LABELS = 1000


class TokenizerLike(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


@dataclass(frozen=True)
class Label:
    """One label and its tokens."""

    name: str
    answer_text: str
    token_ids: tuple[int, ...]
    own_token_ids: tuple[int, ...] = field(default=())
    anchor_token_id: int | None = None

    @property
    def answer_token_id(self) -> int:
        return self.token_ids[0]


def _encode(tokenizer: TokenizerLike, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _auto_variants(name: str) -> list[str]:
    return list(dict.fromkeys([name.lower(), name.capitalize(), name.upper(), name.title()]))


class LabelSet:
    """Labels bound to a tokenizer: answer tokens, variants and the core's `LabelTokens`.

    Parameters
    ----------
    labels : sequence of str
        The label names, in the order results are reported.
    tokenizer : TokenizerLike
        A transformers tokenizer (anything with `encode(text, add_special_tokens=False)`)
    leading_space : bool, default True
        Score labels as whole words after a space (prompt ends with e.g. `"Answer:"`).
    verbalizers : Mapping[str, str] | None
        Mapping label -> str, optional
        The word the model should answer with for a label, when it is not the name.
    variants : Mapping[str, Iterable[str]] | None
        Mapping label -> iterable of str, optional
        Extra spellings or synonyms that count as the label itself.
    auto_variants : bool, default False
        Add lower/Capitalised/UPPER/Title-case spellings as own tokens. Off by default:
        the capitalised forms (" Yes", " Positive") start sentences as well as answer
        the question and carried the model's label bias on SST-2 and Davidson
        (docs/defaults.md); without this they still vote, by their cosine.

    Examples
    --------
    Labels bound to a tokenizer, each scored as a leading-space whole word after the
    answer prefix:

    ```python
    from semsoft_plugin import LabelSet
    from semsoft_plugin.engines import models

    _, tokenizer = models.load("smollm2-135m")
    labels = LabelSet(["positive", "negative"], tokenizer)
    labels.names              # ('positive', 'negative'): the order given
    ```
    """

    def __init__(
        self,
        labels: Sequence[str],
        tokenizer: TokenizerLike,
        *,
        leading_space: bool = True,
        verbalizers: Mapping[str, str] | None = None,
        variants: Mapping[str, Iterable[str]] | None = None,
        auto_variants: bool = False,
    ) -> None:
        names = self._check_names(labels)
        verbalizers = dict(verbalizers or {})
        variants = {k: list(v) for k, v in (variants or {}).items()}
        for mapping, what in ((verbalizers, "verbalizers"), (variants, "variants")):
            unknown = [k for k in mapping if k not in names]
            if unknown:
                raise ValueError(f"{what} name unknown label(s): {', '.join(map(repr, unknown))}")
        prefix = " " if leading_space else ""
        self.leading_space = leading_space
        self.names: tuple[str, ...] = tuple(names)

        spelled: list[tuple[str, str, tuple[int, ...]]] = []
        for name in names:
            word = verbalizers.get(name, name)
            if not isinstance(word, str) or not word.strip():
                raise ValueError(f"label {name!r}: verbalizer {word!r} is empty")
            answer_text = prefix + word.strip()
            ids = tuple(_encode(tokenizer, answer_text))
            if not ids:
                raise ValueError(f"label {name!r} tokenises to nothing ({answer_text!r})")
            control = _special_in(tokenizer, ids)
            if control:
                raise ValueError(
                    f"label {name!r} holds the tokenizer's special token(s) {control}: an "
                    "engine cannot emit a control token as text (its text would be empty "
                    "or cut), so it cannot be a label; spell the label another way"
                )
            spelled.append((name, answer_text, ids))

        by_sequence: dict[tuple[int, ...], str] = {}
        by_first: dict[int, str] = {}
        for name, _, ids in spelled:
            if ids in by_sequence:
                raise ValueError(
                    f"labels {by_sequence[ids]!r} and {name!r} tokenise identically: "
                    "they cannot be told apart"
                )
            by_sequence[ids] = name
            if ids[0] in by_first:
                raise ValueError(
                    f"labels {by_first[ids[0]]!r} and {name!r} start with the same token "
                    f"{ids[0]}, so the decision step cannot tell them apart; give one of "
                    "them a verbalizer (another answer word) or change leading_space"
                )
            by_first[ids[0]] = name

        # Variant first tokens become own tokens unless another label claims them too.
        candidates: dict[str, list[int]] = {name: [ids[0]] for name, _, ids in spelled}
        claimed: dict[int, set[str]] = {ids[0]: {name} for name, _, ids in spelled}
        for name, answer_text, label_ids in spelled:
            word = answer_text[len(prefix) :]
            given = list(variants.get(name, []))
            automatic = _auto_variants(word) if auto_variants else []
            for variant in automatic + given:
                if not isinstance(variant, str) or not variant.strip():
                    raise ValueError(f"label {name!r}: empty variant {variant!r}")
                variant_ids = _encode(tokenizer, prefix + variant.strip())
                if not variant_ids or not _decodes_to_text(tokenizer, variant_ids[0]):
                    continue
                # An automatic spelling that needs more tokens than the label starts with a
                # fragment (" NEGATIVE" -> " N" "EG" "ATIVE"): " N" is not the label, and
                # on SST-2 such fragments carried the model's label bias, not a vote.
                if (
                    variant in automatic
                    and variant not in given
                    and len(variant_ids) > len(label_ids)
                ):
                    continue
                candidates[name].append(variant_ids[0])
                claimed.setdefault(variant_ids[0], set()).add(name)
        anchors = (
            [ids[0] for _, _, ids in spelled]
            if leading_space
            else _spaced_anchors(tokenizer, [(text, ids[0]) for _, text, ids in spelled])
        )
        self.labels: tuple[Label, ...] = tuple(
            Label(
                name,
                answer_text,
                ids,
                tuple(dict.fromkeys(t for t in candidates[name] if claimed[t] == {name})),
                anchor,
            )
            for (name, answer_text, ids), anchor in zip(spelled, anchors, strict=True)
        )
        self.label_tokens = LabelTokens(
            tuple(label.answer_token_id for label in self.labels),
            tuple(label.own_token_ids for label in self.labels),
            None if leading_space else tuple(anchors),
        )
        self.tokenizer_name: str = _tokenizer_name(tokenizer)
        self.vocab_size: int | None = _tokenizer_size(tokenizer)
        self.fingerprint: str = self._fingerprint_with(tokenizer)

    def _fingerprint_with(self, tokenizer: Any) -> str:
        """Hash of what this set's token ids mean under `tokenizer`."""
        ids = sorted(
            {t for label in self.labels for t in label.token_ids}
            | {t for own in self.label_tokens.own_token_ids for t in own}
            | set(self.label_tokens.anchors)
        )
        try:
            encodings: list[Any] = [_encode(tokenizer, label.answer_text) for label in self.labels]
        except Exception as error:  # a foreign tokenizer may fail on them
            encodings = [repr(error)]
        state = (_tokenizer_size(tokenizer), ids, _token_strings(tokenizer, ids), encodings)
        return hashlib.sha256(repr(state).encode("utf-8")).hexdigest()

    def check_tokenizer(self, tokenizer: Any, *, where: str = "") -> None:
        """Refuse a tokenizer other than the one this set was built with.

        Parameters
        ----------
        tokenizer : Any
            The tokenizer of the model the set is about to score
        where : str
            What is checking, for the message (e.g. `"classify"`)

        Raises
        ------
        ValueError
            Naming both tokenizers, when the vocabulary size, the token strings of
            this set's ids or the labels' encodings differ: the ids would stand for
            other tokens there.
        """
        if self._fingerprint_with(tokenizer) == self.fingerprint:
            return
        here = f" in {where}" if where else ""
        raise ValueError(
            f"LabelSet {list(self.names)!r} was built with tokenizer {self.tokenizer_name} "
            f"({self.vocab_size} tokens) but is used{here} with tokenizer "
            f"{_tokenizer_name(tokenizer)} ({_tokenizer_size(tokenizer)} tokens), whose "
            "token ids stand for other tokens: build the LabelSet with this model's tokenizer"
        )

    def check_vocabulary(self, rows: int, *, where: str = "") -> None:
        """Refuse output embeddings with fewer rows than this set's tokenizer has
        tokens (the model is not the tokenizer's), when no tokenizer is at hand."""
        if self.vocab_size is not None and self.vocab_size > rows:
            here = f" in {where}" if where else ""
            raise ValueError(
                f"LabelSet {list(self.names)!r} was built with tokenizer "
                f"{self.tokenizer_name} ({self.vocab_size} tokens) but is used{here} with "
                f"output embeddings of {rows} rows: not that tokenizer's model"
            )

    @staticmethod
    def _check_names(labels: Any) -> list[str]:
        if isinstance(labels, LabelSet):
            raise ValueError("labels is already a LabelSet: use it as is")
        return label_names(labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __repr__(self) -> str:
        return f"LabelSet({list(self.names)!r}, leading_space={self.leading_space})"

    @property
    def answer_token_ids(self) -> tuple[int, ...]:
        return self.label_tokens.answer_token_ids

    @property
    def token_sequences(self) -> tuple[tuple[int, ...], ...]:
        """Full answer token sequence of each label (what constrain mode emits)."""
        return tuple(label.token_ids for label in self.labels)

    @property
    def multi_token_labels(self) -> tuple[str, ...]:
        """Labels whose answer spelling is more than one token (E_l is a prefix's)."""
        return tuple(label.name for label in self.labels if len(label.token_ids) > 1)

    def index(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise ValueError(f"unknown label {name!r}; labels are {list(self.names)}") from None

    def report(self) -> dict[str, Any]:
        """How the labels tokenised: for logs and the eval report."""
        return {
            "leading_space": self.leading_space,
            "multi_token_labels": list(self.multi_token_labels),
            "tokens_per_label": {label.name: len(label.token_ids) for label in self.labels},
            "own_tokens_per_label": {label.name: len(label.own_token_ids) for label in self.labels},
            "anchor_differs_from_answer": [
                label.name
                for label in self.labels
                if label.anchor_token_id != label.answer_token_id
            ],
        }


def label_names(labels: Any) -> list[str]:
    """The label names of a label list (or of a [`LabelSet`][semsoft_plugin.core.labels.LabelSet]), checked.

    The one rule of every adapter (`hf.classify`, the Outlines adapter, the vLLM
    helpers): an ordered sequence (list, tuple, 1-D numpy array or pandas Series,
    `dict_keys`) of at least two distinct, non-empty strings, at most `MAX_LABELS`;
    a set is refused (it has no order). A `str` is refused, never split: iterating it would give its
    characters, and a label may hold a comma.

    Raises
    ------
    ValueError
        Naming the bad value: a string, fewer than two labels, a label refused by
        `semsoft_plugin.core.text_rules.check_label`, or one repeated (after NFC
        normalisation).

    Examples
    --------
    >>> from semsoft_plugin.core.labels import label_names
    >>> label_names(("positive", "negative"))
    ['positive', 'negative']
    >>> label_names("positive,negative")
    Traceback (most recent call last):
        ...
    ValueError: labels must be a list of strings, got the string 'positive,negative'; a string is not split (a label may hold a comma): pass ['positive', 'negative'] if that is what you mean
    """
    if isinstance(labels, LabelSet):
        return list(labels.names)
    if isinstance(labels, str):
        raise ValueError(
            f"labels must be a list of strings, got the string {labels!r}; a string is "
            f"not split (a label may hold a comma): pass {labels.split(',')!r} if that "
            "is what you mean"
        )
    if isinstance(labels, AbstractSet) and not isinstance(labels, KeysView):
        raise ValueError(
            f"labels {labels!r} is a {type(labels).__name__}, which has no order: give a "
            f"list (e.g. sorted(labels)); the prompt lists the labels in their order"
        )
    if getattr(labels, "ndim", 1) != 1:
        raise ValueError(
            f"labels must be one-dimensional, got shape {getattr(labels, 'shape', None)}"
        )
    if hasattr(labels, "tolist"):  # a numpy array or pandas Series: its Python values
        labels = labels.tolist()
    elif isinstance(labels, KeysView | ValuesView):  # a dict's order is its insertion order
        labels = list(labels)
    if not isinstance(labels, Sequence):
        raise ValueError(f"labels must be a list of strings, got {labels!r}")
    if len(labels) == 0:
        raise ValueError("label set is empty: give at least two labels")
    if len(labels) == 1:
        raise ValueError(
            f"label set {list(labels)!r} has one label (one class): give at least two (a "
            "single label always gets probability 1, whatever the input)"
        )
    if len(labels) > MAX_LABELS:
        raise ValueError(f"{len(labels)} labels exceed the limit of {MAX_LABELS}")
    seen: dict[str, str] = {}
    for label in labels:
        check_label(label)
        key = label_identity(label)
        if key in seen and seen[key] == label:
            raise ValueError(f"label {label!r} appears twice")
        if key in seen:
            raise ValueError(
                f"labels {code_points(seen[key])} and {code_points(label)} print alike (equal "
                "after NFC normalisation, without invisible code points, or as Unicode "
                "confusables): they would be two columns that look the same; give one"
            )
        seen[key] = label
    return list(labels)


# How a label list is written on a command line (both commands' --help say it).
LABELS_SYNTAX = (
    "comma-separated, read as one CSV row: a label holding a comma goes in double "
    """quotes, e.g. --labels 'yes,"no, maybe"' (two labels)"""
)


def split_labels(text: str, option: str = "--labels") -> list[str]:
    """The labels of a command-line label list: one CSV row (the `csv` module's
    quoting), so a label holding a comma is written in double quotes
    (`yes,"no, maybe"`) and a double quote inside one is doubled; spaces around each
    label are dropped. The one parser of `semsoft classify` and `semsoft eval`.

    Examples
    --------
    >>> from semsoft_plugin.core.labels import split_labels
    >>> split_labels("joy, sadness,anger")
    ['joy', 'sadness', 'anger']
    >>> split_labels('yes,"no, maybe"')
    ['yes', 'no, maybe']
    >>> split_labels("yes,,no")
    Traceback (most recent call last):
        ...
    ValueError: --labels 'yes,,no' has an empty label

    Raises
    ------
    ValueError
        Naming `option` and the text: not one CSV row (an unclosed quote, a new line),
        or an empty label.
    """
    try:
        rows = list(csv.reader([text], skipinitialspace=True, strict=True))
    except csv.Error as error:
        raise ValueError(
            f"{option} {text!r} is not one comma-separated (CSV) row: {error}; quote a "
            """label holding a comma: 'yes,"no, maybe"'"""
        ) from None
    labels = [label.strip() for label in (rows[0] if rows else [])]
    if not labels or any(not label for label in labels):
        raise ValueError(f"{option} {text!r} has an empty label")
    return labels


def _spaced_anchors(tokenizer: TokenizerLike, answers: list[tuple[str, int]]) -> list[int]:
    """Per label, the first token of its leading-space spelling, or its answer token when
    that spelling starts with whitespace only or with the same token as another label's."""
    spaced = []
    for text, answer in answers:
        ids = _encode(tokenizer, " " + text)
        spaced.append(ids[0] if ids and _decodes_to_text(tokenizer, ids[0]) else answer)
    shared = {t for t, count in Counter(spaced).items() if count > 1}
    return [
        answer if token in shared else token
        for token, (_, answer) in zip(spaced, answers, strict=True)
    ]


def _tokenizer_name(tokenizer: Any) -> str:
    name = getattr(tokenizer, "name_or_path", None)
    return f"{type(tokenizer).__name__}({name!r})" if name else type(tokenizer).__name__


def _tokenizer_size(tokenizer: Any) -> int | None:
    """`len(tokenizer)` (added tokens included), else its `vocab_size`, else None."""
    try:
        return int(len(tokenizer))
    except TypeError:
        size = getattr(tokenizer, "vocab_size", None)
        return int(size) if isinstance(size, int) else None


def _token_strings(tokenizer: Any, ids: list[int]) -> list[Any] | None:
    """Each id's token string (None where the tokenizer cannot say)."""
    convert = getattr(tokenizer, "convert_ids_to_tokens", None)
    try:
        if convert is not None:
            return list(convert(ids))
        decode = getattr(tokenizer, "decode", None)
        return None if decode is None else [decode([t]) for t in ids]
    except Exception as error:  # an id outside a foreign tokenizer's vocabulary
        return [repr(error)]


def _special_in(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """The special (control) tokens among `ids`, by their text: a label spelling one
    (`"<|im_end|>"`) encodes to a control id that decodes to nothing as text."""
    special = set(getattr(tokenizer, "all_special_ids", None) or ())
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    special |= {int(i) for i, t in decoder.items() if getattr(t, "special", False)}
    found = [t for t in ids if t in special]
    convert = getattr(tokenizer, "convert_ids_to_tokens", None)
    return [str(convert(t)) if convert else str(t) for t in dict.fromkeys(found)]


def _decodes_to_text(tokenizer: Any, token_id: int) -> bool:
    """False for a token that is only whitespace: it says nothing about any label."""
    decode = getattr(tokenizer, "decode", None)
    if decode is None:
        return True
    return bool(decode([token_id]).strip())
