"""The texts a [`Classifier`][semsoft_plugin.app.classifier.Classifier] takes: the check that
refuses what is not a list of non-empty strings (by index and type, before any model
work), the same for the labels `fit` is given, and `TextFitter`, the
token-boundary cut of a text that is longer than the context allows.

Apart from the classifier because they concern the input text and the prompt around it
(none needs the model's weights).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Set
from typing import Any

from semsoft_plugin.core.text_rules import is_blank, lone_surrogate
from semsoft_plugin.engines.prompting import (
    PromptTemplate,
    build_inputs,
    encode_prompts,
    format_prompt,
    item_list,
)

__all__ = ["TextFitter", "target_list", "text_list", "token_prefixes"]


def text_list(texts: Iterable[str]) -> list[str]:
    """`texts` as a list of non-empty strings; `ValueError` naming the bad element.

    Taken as scikit-learn users pass them: a list, tuple, 1-D numpy array or pandas
    Series (its values, not its index). Anything else is refused naming its type: a dict
    (its keys would be scored), a set (no order: rows would come back shuffled), a
    generator, a single string (iterating it would classify its characters); and so is an element that is not a
    string (a NaN from a pandas column, a number, `None`), by index and type; an
    empty one (whitespace or invisible characters only, `is_blank`) and one that is not
    valid Unicode (a lone surrogate: no UTF-8 encoding, no tokenizer takes it), by index.
    """
    # An array of another dimension goes on to item_list, whose refusal names its shape.
    ordered = isinstance(texts, list | tuple) or (
        hasattr(texts, "ndim") and hasattr(texts, "tolist")
    )
    if not ordered and not isinstance(texts, str | bytes):
        raise ValueError(
            f"texts must be a list, tuple, 1-D numpy array or pandas Series of strings, not "
            f"a {type(texts).__name__}"
            + (" (a dict's keys are not the texts: pass list(d.values()) or list(d))"
               if isinstance(texts, Mapping) else "")
            + (" (a set has no order: the rows would come back in an arbitrary order)"
               if isinstance(texts, Set) else "")
        )  # fmt: skip
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


def target_list(y: Iterable[str], n: int) -> list[str]:
    """`y` as a list of `n` label names (strings); `ValueError` naming the bad
    element, or the count when it is not one label per text."""
    values = item_list(y, "y", "labels")
    if len(values) != n:
        raise ValueError(f"y must hold one label per text ({n}), got {len(values)}")
    for index, label in enumerate(values):
        if not isinstance(label, str):
            raise ValueError(
                f"y[{index}] = {label!r:.60} is a {type(label).__name__}, not a label name "
                "(a string: the model is asked for the label's words)"
            )
    return [str(label) for label in values]


def token_prefixes(tokenizer: Any, text: str) -> tuple[int, Callable[[int], str]]:
    """The number of tokens of `text` (no special tokens) and a function giving the
    text of its first `n` tokens: cut at the character offset where token `n` starts,
    exact in the original string (fast tokenizers); decoded otherwise."""
    try:
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        starts = [int(start) for start, _ in encoded["offset_mapping"]]
        return len(starts), lambda n: text[: starts[n]] if n < len(starts) else text
    except (NotImplementedError, KeyError, TypeError, ValueError):
        ids = tokenizer.encode(text, add_special_tokens=False)
        return len(ids), lambda n: tokenizer.decode(ids[:n]) if n < len(ids) else text


class TextFitter:
    """The prompts for texts within the length bound, and the tokens cut per text.

    The prompt is encoded exactly as the engines encode it, so the bound holds for
    the tokens they see: at most `context - 1` (the decision token follows the
    prompt), and at most `max_text_tokens` of the text. A text whose UTF-8 length
    plus the prompt's own tokens is within both bounds needs no check (a token is at
    least one byte); only longer ones are tokenised here.

    Parameters
    ----------
    tokenizer : Any
        What the prompts are built from
    prompt : PromptTemplate
        What the prompts are built from
    labels : list[str]
        What the prompts are built from
    context : int | None
        The model's context in tokens (`None`: unknown, no bound)
    max_text_tokens : int | None
        At most this many tokens of a text (`None`: no bound)
    truncate : bool
        Cut a longer text (`True`) or refuse it (`ValueError` naming it)
    """

    def __init__(
        self,
        tokenizer: Any,
        prompt: PromptTemplate,
        labels: list[str],
        *,
        context: int | None,
        max_text_tokens: int | None,
        truncate: bool,
    ) -> None:
        self.tokenizer = tokenizer
        self.prompt = prompt
        self.labels = list(labels)
        self.budget = None if context is None else context - 1
        self.max_text_tokens = max_text_tokens
        self.truncate = truncate
        self._overhead: int | None = None

    def prompts(self, texts: list[str]) -> tuple[list[Any], list[int]]:
        """The prompts for `texts` (checked by `text_list`) and the tokens cut
        from each."""
        if self._overhead is None:
            self._overhead = self._prompt_length("x")
        cut = [0] * len(texts)
        fitted = list(texts)
        budget = self.budget
        for index, text in enumerate(texts):
            size = len(text.encode("utf-8"))
            small_enough = self.max_text_tokens is None or size <= self.max_text_tokens
            if small_enough and (budget is None or size + self._overhead + 8 <= budget):
                continue
            fitted[index], cut[index] = self._fit_one(index, text)
        return build_inputs(self.prompt, fitted, self.labels, self.tokenizer), cut

    def _prompt_length(self, text: str) -> int:
        item = build_inputs(self.prompt, [text], self.labels, self.tokenizer)[0]
        return len(encode_prompts(self.tokenizer, [format_prompt(self.tokenizer, item)])[0])

    def _fit_one(self, index: int, text: str) -> tuple[str, int]:
        """One text cut at a token boundary to fit; (text, tokens dropped)."""
        budget = self.budget
        size, prefix = token_prefixes(self.tokenizer, text)
        keep = size if self.max_text_tokens is None else min(size, self.max_text_tokens)
        for _ in range(4):  # the cut text can tokenise with the prompt a token longer
            piece = prefix(keep)
            over = 0 if budget is None else self._prompt_length(piece) - budget
            if over <= 0:
                break
            keep -= over
            if keep < 1:
                raise ValueError(
                    f"texts[{index}]: the prompt without the text is about "
                    f"{self._overhead} tokens; it leaves no room for text in the context of "
                    f"{budget + 1 if budget is not None else '?'} tokens"
                )
        else:
            raise ValueError(f"texts[{index}] could not be cut to fit the context")
        dropped = size - keep
        if dropped and not self.truncate:
            limit = "max_text_tokens" if keep == self.max_text_tokens else "the context"
            raise ValueError(
                f"texts[{index}] has {size} tokens; {limit} leaves room for {keep} "
                "(pass truncate=True to score its first tokens)"
            )
        return piece, dropped
