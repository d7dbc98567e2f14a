"""Outlines output types -> the label strings they name (no Outlines import at load).

What [`semsoft_plugin.engines.outlines`][semsoft_plugin.engines.outlines] accepts as a choice: `Literal[...]` of strings, an
`Enum` with string values, `outlines.types.Choice`, or a regex that is an
alternation of literal strings. Anything else is refused naming what is supported:
Semantic Softmax needs a finite label set.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from semsoft_plugin.core.labels import MAX_LABELS, LabelSet, label_names

__all__ = ["SUPPORTED_TYPES", "choice_labels"]

SUPPORTED_TYPES = (
    "Literal[...] of strings, an Enum with string values, outlines.types.Choice, "
    "or a regex that is an alternation of literal strings such as '(joy|sadness)'"
)


_META = set(".^$*+?{}[]")


class _LiteralRegex:
    """Expands a regex made only of literals, groups and `|` into its strings.

    A small recursive-descent parser rather than `re._parser`: that module is
    private, and the accepted subset here is tiny on purpose. Anything else (a class,
    a quantifier, an anchor, `\\d`...) means the language is not a finite choice.
    """

    _ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v"}

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.pos = 0

    def parse(self) -> list[str] | None:
        try:
            strings = self._alternation()
        except _NotLiteral:
            return None
        if self.pos != len(self.pattern):
            return None
        return strings

    def _alternation(self) -> list[str]:
        strings = self._sequence()
        while self._peek() == "|":
            self.pos += 1
            strings = strings + self._sequence()
        return strings

    def _sequence(self) -> list[str]:
        strings = [""]
        while self.pos < len(self.pattern) and self._peek() not in "|)":
            part = self._atom()
            strings = [a + b for a in strings for b in part]
            if len(strings) > MAX_LABELS:
                raise _NotLiteral
        return strings

    def _atom(self) -> list[str]:
        char = self.pattern[self.pos]
        if char == "(":
            self.pos += 1
            if self.pattern.startswith("?:", self.pos):
                self.pos += 2
            elif self._peek() == "?":  # named groups, flags, lookarounds
                raise _NotLiteral
            inner = self._alternation()
            if self._peek() != ")":
                raise _NotLiteral
            self.pos += 1
            return inner
        if char == "\\":
            if self.pos + 1 >= len(self.pattern):
                raise _NotLiteral
            escaped = self.pattern[self.pos + 1]
            self.pos += 2
            if escaped in self._ESCAPES:
                return [self._ESCAPES[escaped]]
            if escaped.isalnum():  # \d, \w, \b, back-references...
                raise _NotLiteral
            return [escaped]
        if char in _META:
            raise _NotLiteral
        self.pos += 1
        return [char]

    def _peek(self) -> str:
        return self.pattern[self.pos] if self.pos < len(self.pattern) else ""


class _NotLiteral(Exception):
    pass


def _term_strings(term: Any) -> list[str] | None:
    from outlines.types.dsl import Alternatives, Choice, Regex, String, python_types_to_terms
    from outlines.types.dsl import Sequence as SequenceTerm

    if isinstance(term, String):
        return [term.value]
    if isinstance(term, Regex):
        return _LiteralRegex(term.pattern).parse()
    if isinstance(term, Alternatives | Choice):
        children = (
            term.terms
            if isinstance(term, Alternatives)
            else [python_types_to_terms(i) for i in term.items]
        )
        strings: list[str] = []
        for child in children:
            part = _term_strings(child)
            if part is None:
                return None
            strings += part
        return strings
    if isinstance(term, SequenceTerm):
        product = [""]
        for child in term.terms:
            part = _term_strings(child)
            if part is None:
                return None
            product = [a + b for a in product for b in part]
        return product
    return None


def choice_labels(output_type: Any) -> list[str]:
    """The strings an Outlines output type allows, if it is a finite choice.

    Parameters
    ----------
    output_type : Any
        An Outlines output type
        `Literal[...]`, an `Enum`, `outlines.types.Choice`, or a regex
        (`outlines.types.Regex` / `regex(...)`) of literal alternatives.
        The order is the order of the choices (duplicates dropped).

    Raises
    ------
    ValueError
        For any other output type (JSON schema, free regex, CFG, `int`, None...).
    """
    from outlines.types.dsl import python_types_to_terms

    if output_type is None:
        raise ValueError(f"an output type is needed; supported: {SUPPORTED_TYPES}")
    if isinstance(output_type, type) and issubclass(output_type, enum.Enum):
        values = [member.value for member in output_type]
        if not all(isinstance(v, str) for v in values):
            raise ValueError(
                f"Enum {output_type.__name__} has non-string values {values!r}; "
                f"supported: {SUPPORTED_TYPES}"
            )
    try:
        term = python_types_to_terms(output_type)
    except (TypeError, RecursionError) as error:
        raise ValueError(
            f"output type {output_type!r} is not supported ({error}); supported: {SUPPORTED_TYPES}"
        ) from None
    strings = _term_strings(term)
    if strings is None:
        raise ValueError(
            f"output type {output_type!r} (an Outlines {type(term).__name__}) is not a "
            f"finite choice of strings, so it cannot be scored; supported: {SUPPORTED_TYPES}"
        )
    return list(dict.fromkeys(strings))


def choice_label_set(
    choices: Sequence[str], tokenizer: Any, variants: Mapping[str, Iterable[str]] | None
) -> LabelSet:
    """Labels spelled exactly as Outlines writes them, at the start of the answer."""
    if len(choices) > MAX_LABELS:
        raise ValueError(f"{len(choices)} choices exceed the limit of {MAX_LABELS}")
    label_names(list(choices))  # the rule of every adapter: at least two distinct labels
    if any(not c.strip() for c in choices):
        raise ValueError(f"choices {list(choices)!r}: a choice is empty or only whitespace")
    spaced = all(c.startswith(" ") and not c[1:].startswith(" ") for c in choices)
    if any((c[1:] if spaced else c) != c.strip() for c in choices):
        raise ValueError(
            f"choices {list(choices)!r}: surrounding whitespace is supported only as one "
            "leading space on every choice"
        )
    try:
        # Names stay the choice text (" joy" stays " joy"); LabelSet adds the space.
        base = LabelSet(list(choices), tokenizer, leading_space=spaced, variants=variants)
    except ValueError as error:
        raise ValueError(
            f"{error}. Outlines writes choices verbatim at the start of the answer "
            "(no leading space), so choices that begin with the same token cannot be "
            "told apart at the decision step; reword one of them"
        ) from None
    for label, choice in zip(base.labels, choices, strict=True):
        decoded = tokenizer.decode(list(label.token_ids))
        if decoded != choice:
            raise ValueError(
                f"choice {choice!r} does not round-trip through the tokenizer "
                f"(decodes as {decoded!r}), so the scored tokens would not spell it"
            )
    return base
