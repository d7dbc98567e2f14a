"""Label sets on the real default tokenizer."""

from __future__ import annotations

import string

import pytest

from semsoft_plugin import LabelSet

GOEMOTIONS = (
    "admiration amusement anger annoyance approval caring confusion curiosity desire "
    "disappointment disapproval disgust embarrassment excitement fear gratitude grief joy love "
    "nervousness optimism pride realization relief remorse sadness surprise neutral"
).split()


@pytest.fixture(scope="module")
def tokenizer(model_and_tokenizer):
    return model_and_tokenizer[1]


@pytest.mark.slow
def test_leading_space_labels_are_mostly_whole_words(tokenizer):
    labels = LabelSet(GOEMOTIONS, tokenizer)
    assert len(labels) == 28
    # On SmolLM2 only two GoEmotions labels need more than one token with a leading space.
    assert set(labels.multi_token_labels) == {"annoyance", "disapproval"}
    for label in labels.labels:
        assert tokenizer.decode(label.token_ids) == " " + label.name
        assert label.answer_token_id in label.own_token_ids


@pytest.mark.slow
def test_without_space_labels_fragment_and_collide(tokenizer):
    # "dis" starts disappointment, disapproval and disgust: the decision step cannot tell them apart.
    with pytest.raises(ValueError, match="start with the same token"):
        LabelSet(GOEMOTIONS, tokenizer, leading_space=False)


@pytest.mark.slow
def test_capitalised_variants_are_own_tokens(tokenizer):
    labels = LabelSet(["positive", "negative"], tokenizer, auto_variants=True)
    positive = labels.labels[0]
    assert tokenizer.encode(" Positive", add_special_tokens=False)[0] in positive.own_token_ids
    assert not set(positive.own_token_ids) & set(labels.labels[1].own_token_ids)
    # Off by default: a label's own token is its answer token (and variants you pass).
    plain = LabelSet(["positive", "negative"], tokenizer, variants={"negative": ["bad"]})
    assert plain.labels[0].own_token_ids == (plain.labels[0].answer_token_id,)
    bad = tokenizer.encode(" bad", add_special_tokens=False)[0]
    assert plain.labels[1].own_token_ids == (plain.labels[1].answer_token_id, bad)


@pytest.mark.slow
def test_without_space_the_embedding_is_read_from_the_spaced_word(tokenizer):
    first = {w: tokenizer.encode(w, add_special_tokens=False)[0] for w in ("s", " sadness", " joy")}
    labels = LabelSet(["joy", "sadness"], tokenizer, leading_space=False)
    sadness = labels.labels[1]
    assert sadness.answer_token_id == first["s"]  # the fragment Outlines writes
    assert sadness.anchor_token_id == first[" sadness"]  # the word the embeddings know
    assert labels.label_tokens.anchors == (first[" joy"], first[" sadness"])
    assert labels.report()["anchor_differs_from_answer"] == ["joy", "sadness"]
    spaced = LabelSet(["joy", "sadness"], tokenizer)
    assert spaced.label_tokens.anchor_token_ids is None
    assert spaced.label_tokens.anchors == spaced.answer_token_ids
    assert spaced.report()["anchor_differs_from_answer"] == []


class GreedyTokenizer:
    """Longest-match tokenizer over a fixed vocabulary: lets a test pick the collisions."""

    def __init__(self, vocab: list[str]) -> None:
        self.vocab = vocab

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = []
        while text:
            piece = max((v for v in self.vocab if text.startswith(v)), key=len)
            ids.append(self.vocab.index(piece))
            text = text[len(piece) :]
        return ids

    def decode(self, ids: list[int]) -> str:
        return "".join(self.vocab[i] for i in ids)


def test_labels_whose_spaced_words_start_alike_keep_their_answer_anchor():
    # Bare, "cat" / "cow" / "dog" start differently; spaced, " cat" and " cow" share " c".
    tok = GreedyTokenizer(
        [" c", "at", "ow", "cat", "cow", "dog", " dog", *" " + string.ascii_letters]
    )
    labels = LabelSet(["cat", "cow", "dog"], tok, leading_space=False)
    answers = [label.answer_token_id for label in labels.labels]
    assert answers == [tok.vocab.index(w) for w in ("cat", "cow", "dog")]
    assert labels.label_tokens.anchors == (answers[0], answers[1], tok.vocab.index(" dog"))


@pytest.mark.slow
def test_verbalizer_changes_the_answer_word(tokenizer):
    labels = LabelSet(["pos", "neg"], tokenizer, verbalizers={"pos": "good", "neg": "bad"})
    assert tokenizer.decode(labels.labels[0].token_ids) == " good"
    assert labels.names == ("pos", "neg")


@pytest.mark.slow
@pytest.mark.parametrize(
    "labels, kwargs, match",
    [
        ([], {}, "empty"),
        (["joy", "joy"], {}, "'joy' appears twice"),
        (["joy", ""], {}, "label '' is empty"),
        (["joy", "   "], {}, "is empty"),
        (["joy", 3], {}, "label 3 is not a string"),
        ("joy", {}, "list of strings"),
        (["joy", "sad"], {"verbalizers": {"angry": "mad"}}, "unknown label"),
        (["a", "b"], {"verbalizers": {"a": "same", "b": "same"}}, "tokenise identically"),
    ],
)
def test_bad_label_sets_raise_naming_the_label(tokenizer, labels, kwargs, match):
    with pytest.raises(ValueError, match=match):
        LabelSet(labels, tokenizer, **kwargs)


# --- one label-list rule, bound to the tokenizer (issue 17) ----------------------


def test_a_string_is_refused_not_split_into_characters(tokenizer):
    with pytest.raises(ValueError, match=r"string 'positive,negative'.*\['positive', 'negative'\]"):
        LabelSet("positive,negative", tokenizer)


def test_a_single_label_is_refused(tokenizer):
    with pytest.raises(ValueError, match="one label"):
        LabelSet(["positive"], tokenizer)


def test_label_names_rule():
    from semsoft_plugin.core.labels import label_names

    assert label_names(("a", "b")) == ["a", "b"]
    for bad in ("a,b", ["a"], [], ["a", "a"], ["a", 1], ["a", " "], 3):
        with pytest.raises(ValueError):
            label_names(bad)


def test_label_set_is_bound_to_its_tokenizer(tokenizer, foreign_tokenizer):
    from transformers import AutoTokenizer

    labels = LabelSet(["positive", "negative"], tokenizer)
    assert labels.vocab_size == len(tokenizer)
    labels.check_tokenizer(tokenizer)
    # the same tokenizer loaded again (another object) means the same ids
    labels.check_tokenizer(AutoTokenizer.from_pretrained(tokenizer.name_or_path))
    with pytest.raises(ValueError, match=r"built with tokenizer .*49152.*tiny-wordlevel"):
        labels.check_tokenizer(foreign_tokenizer)
    with pytest.raises(ValueError, match="tiny-wordlevel"):
        LabelSet(["positive", "negative"], foreign_tokenizer).check_tokenizer(tokenizer)


def test_a_tokenizer_of_the_same_size_with_other_tokens_is_refused(tokenizer):
    """Same vocabulary size, other token strings: the fingerprint, not the size, decides."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    labels = LabelSet(["positive", "negative"], tokenizer)
    words = {f"w{i}": i for i in range(len(tokenizer))}
    raw = Tokenizer(models.WordLevel(words, unk_token="w0"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    same_size = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="w0")
    assert len(same_size) == len(tokenizer)
    with pytest.raises(ValueError, match="stand for other tokens"):
        labels.check_tokenizer(same_size)


# --- labels that look alike, hide characters or are not Unicode (issue 34, items 5, 7, 9) -

NFC_CAFE, NFD_CAFE = "caf\u00e9", "cafe\u0301"  # one code point for é; e + combining accent


@pytest.mark.parametrize(
    "labels, match",
    [
        # Item 7: one text in two Unicode spellings was two columns 'p_café' (.44 and .56).
        ([NFC_CAFE, NFD_CAFE, "tea"], r"U\+0063 U\+0061 U\+0066 U\+00E9\) and .*U\+0301\) print alike .*NFC"),
        # Item 7: "yes\x00" was accepted and classes_ printed it as 'yes'.
        (["yes\x00", "no"], r"'yes\\x00' holds .*U\+0000.*print as 'yes'"),
        (["yes\u200b", "no"], r"U\+200B"),
        (["yes", "no\u202e"], r"U\+202E"),  # a bidirectional override
        # Item 7: invisible characters only are empty, like whitespace only.
        (["yes", "\u200b"], r"label '\\u200b' is empty"),
        (["yes", "\u00a0\ufeff"], r"is empty"),
        # Item 5: a lone surrogate was the tokenizer's TypeError, naming nothing.
        (["yes", "\ud800"], r"label '\\ud800' holds a lone surrogate U\+D800 at character 0"),
    ],
)
def test_labels_that_look_alike_or_are_not_text_are_refused_by_name(tokenizer, labels, match):
    from semsoft_plugin.core.labels import label_names

    with pytest.raises(ValueError, match=match):
        label_names(labels)
    with pytest.raises(ValueError, match=match):
        LabelSet(labels, tokenizer)


def test_labels_that_only_look_unusual_are_taken(tokenizer):
    """Joiners are part of writing (Persian, emoji), NFD alone is one label, and a label
    is kept as given (not rewritten to NFC)."""
    persian = "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645"  # with a zero-width non-joiner
    labels = LabelSet([NFD_CAFE, "tea", persian, "\U0001f468\u200d\U0001f469"], tokenizer)
    assert labels.names == (NFD_CAFE, "tea", persian, "\U0001f468\u200d\U0001f469")


@pytest.mark.parametrize(
    "text, labels",
    [
        # Item 9: this was three labels: 'yes', '"no', 'maybe"'.
        ('yes,"no, maybe"', ["yes", "no, maybe"]),
        ('yes,  "no, maybe",later', ["yes", "no, maybe", "later"]),
        ('"say ""hi""",bye', ['say "hi"', "bye"]),
        ("joy , sadness,anger", ["joy", "sadness", "anger"]),
    ],
)
def test_command_line_labels_are_one_csv_row(text, labels):
    from semsoft_plugin.core.labels import split_labels

    assert split_labels(text) == labels


@pytest.mark.parametrize(
    "text, match",
    [
        ('yes,"no, maybe', "not one comma-separated.*unexpected end"),
        ('"no, maybe" ,yes', "not one comma-separated.*',' expected"),
        ("yes,,no", "empty label"),
        ("", "empty"),
    ],
)
def test_command_line_labels_that_are_not_one_csv_row_are_refused(text, match):
    from semsoft_plugin.core.labels import split_labels

    with pytest.raises(ValueError, match=match):
        split_labels(text)
