"""The texts a :class:`~semsoft_plugin.app.classifier.Classifier` takes: the check that
refuses what is not a list of non-empty strings (by index and type, before any model
work), and the token-boundary cut of a text that is longer than the context allows.

Apart from the classifier because both concern the input text alone (neither needs the
model's weights or the labels).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from semsoft_plugin.core.text_rules import is_blank, lone_surrogate
from semsoft_plugin.engines.prompting import item_list

__all__ = ["text_list", "token_prefixes"]


def text_list(texts: Iterable[str]) -> list[str]:
    """``texts`` as a list of non-empty strings; ``ValueError`` naming the bad element.

    Any iterable is taken, as scikit-learn users pass them: a list, tuple, numpy array,
    pandas Series (its values, not its index), generator. A single string is refused
    (iterating it would classify its characters), and so is an element that is not a
    string (a NaN from a pandas column, a number, ``None``), by index and type; an
    empty one (whitespace or invisible characters only, ``is_blank``) and one that is not
    valid Unicode (a lone surrogate: no UTF-8 encoding, no tokenizer takes it), by index.
    """
    values = item_list(texts, "texts", "strings")
    for index, text in enumerate(values):
        if not isinstance(text, str):
            raise ValueError(
                f"texts[{index}] = {text!r:.60} is a {type(text).__name__}, not a string"
            )
        if is_blank(text):
            raise ValueError(
                f"texts[{index}] = {text!r:.60} is empty (whitespace or invisible characters only)"
            )
        at = lone_surrogate(text)
        if at is not None:
            raise ValueError(
                f"texts[{index}] holds a lone surrogate U+{ord(text[at]):04X} at character "
                f"{at} ({text[max(0, at - 20) : at + 20]!r}): not valid Unicode (it has no "
                "UTF-8 encoding), so it cannot be tokenised; fix or drop that text"
            )
    return [str(text) for text in values]


def token_prefixes(tokenizer: Any, text: str) -> tuple[int, Callable[[int], str]]:
    """The number of tokens of ``text`` (no special tokens) and a function giving the
    text of its first ``n`` tokens: cut at the character offset where token ``n`` starts,
    exact in the original string (fast tokenizers); decoded otherwise."""
    try:
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        starts = [int(start) for start, _ in encoded["offset_mapping"]]
        return len(starts), lambda n: text[: starts[n]] if n < len(starts) else text
    except (NotImplementedError, KeyError, TypeError, ValueError):
        ids = tokenizer.encode(text, add_special_tokens=False)
        return len(ids), lambda n: tokenizer.decode(ids[:n]) if n < len(ids) else text
