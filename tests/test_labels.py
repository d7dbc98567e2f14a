"""Label sets on the real default tokenizer."""

from __future__ import annotations

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
    labels = LabelSet(["positive", "negative"], tokenizer)
    positive = labels.labels[0]
    assert tokenizer.encode(" Positive", add_special_tokens=False)[0] in positive.own_token_ids
    assert not set(positive.own_token_ids) & set(labels.labels[1].own_token_ids)


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
