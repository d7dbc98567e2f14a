"""The Unicode rules every path shares: what an empty text is, what a label may hold, and
when two labels are the same label.

Texts and labels reach the package from Python, the command line, files and HTTP bodies;
each path asks these functions, so that a text empty on one path is empty on all of them.
A blank text is whitespace or characters that print as nothing; a lone surrogate is
refused by position; a label holding a control or invisible character is refused; two
labels that print the same (after NFC, without default-ignorable code points, by their
UTS #39 confusable skeleton) are one label given twice. Each rule and why:
docs/troubleshooting.md ("A label or text refused").

The two Unicode tables the standard library lacks ship as `unicode_tables.json` beside
this module, written by `scripts/make_unicode_tables.py` from ICU and checked against it
there: labels are compared with the standard library alone, nothing to compile on install.
"""

from __future__ import annotations

import bisect
import functools
import json
import unicodedata
from importlib import resources
from typing import Any

__all__ = [
    "check_label",
    "code_points",
    "confusable_skeleton",
    "hidden_characters",
    "is_blank",
    "is_ignorable",
    "label_identity",
    "lone_surrogate",
    "without_ignorable",
]

_INVISIBLE = frozenset({"Cc", "Cf"})
# Format characters that are part of writing, not hidden marks (see the module docstring).
_JOINERS = frozenset({"\u200c", "\u200d"})


@functools.cache
def _tables() -> tuple[list[int], list[int], dict[str, str]]:
    """The default-ignorable ranges (starts and ends) and the per-code-point skeleton map,
    read once from `unicode_tables.json`."""
    text = resources.files("semsoft_plugin.core").joinpath("unicode_tables.json").read_text()
    table = json.loads(text)
    starts = [int(r[0]) for r in table["default_ignorable"]]
    ends = [int(r[1]) for r in table["default_ignorable"]]
    skeleton = {chr(int(k, 16)): str(v) for k, v in table["skeleton"].items()}
    return starts, ends, skeleton


def is_ignorable(char: str) -> bool:
    """True for a Default_Ignorable_Code_Point (one character).

    Examples
    --------
    >>> is_ignorable("\u200b"), is_ignorable("\u00ad"), is_ignorable("a")
    (True, True, False)
    """
    starts, ends, _ = _tables()
    at = bisect.bisect_right(starts, ord(char)) - 1
    return at >= 0 and ord(char) <= ends[at]


def is_blank(text: str) -> bool:
    """True when `text` holds nothing but whitespace, control, format and
    default-ignorable characters (the empty string included): the model would be asked
    about nothing.

    Parameters
    ----------
    text : str
        The text.

    Returns
    -------
    bool
        Whether it is blank.
    """
    return all(
        c.isspace() or unicodedata.category(c) in _INVISIBLE or is_ignorable(c) for c in text
    )


def without_ignorable(text: str) -> str:
    """`text` with every default-ignorable code point removed.

    Parameters
    ----------
    text : str
        The text.

    Returns
    -------
    str
        What prints the same.
    """
    return "".join(c for c in text if not is_ignorable(c))


def lone_surrogate(text: str) -> int | None:
    """The index of the first lone surrogate in `text` (a code point that UTF-8 cannot
    encode), or None when the text is valid Unicode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return int(error.start)
    return None


def hidden_characters(label: str) -> list[str]:
    """The control and invisible format characters in `label` (each once, in order);
    empty for a label that prints as what it is."""
    found = [c for c in label if unicodedata.category(c) in _INVISIBLE and c not in _JOINERS]
    return list(dict.fromkeys(found))


def label_identity(label: str) -> str:
    """What two labels are compared by: the UTS #39 confusable skeleton of their NFC
    normalisation without default-ignorable code points (the rules above).

    Parameters
    ----------
    label : str
        A label.

    Returns
    -------
    str
        Equal for two labels that print alike.
    """
    return confusable_skeleton(without_ignorable(unicodedata.normalize("NFC", label)))


def confusable_skeleton(text: str) -> str:
    """The UTS #39 skeleton of `text`: equal for two strings a reader cannot tell apart
    (a Latin `a` and a Cyrillic `а`, `rn` and `m`): `NFD` of the code points'
    prototypes (UTS #39's confusable mapping) in the text's `NFD`.

    Parameters
    ----------
    text : str
        The text.

    Returns
    -------
    str
        Its skeleton.
    """
    mapping = _tables()[2]
    decomposed = unicodedata.normalize("NFD", text)
    return unicodedata.normalize("NFD", "".join(mapping.get(c, c) for c in decomposed))


def code_points(text: str) -> str:
    """`text` with its code points, for a message about texts that print alike.

    Parameters
    ----------
    text : str
        The text.

    Returns
    -------
    str
        E.g. `'ab' (U+0061 U+0062)`.
    """
    return f"{text!r} ({' '.join(f'U+{ord(c):04X}' for c in text)})"


def check_label(label: Any) -> None:
    """Refuse one label that is not a string, is empty (`is_blank`), is not valid
    Unicode (a lone surrogate) or holds a control or invisible character that would print
    as another label (the rules above); `ValueError` naming it. The character rule of
    [`label_names`][semsoft_plugin.core.labels.label_names], which every path's labels go through."""
    if not isinstance(label, str):
        raise ValueError(f"label {label!r} is not a string")
    if is_blank(label):
        raise ValueError(f"label {label!r} is empty")
    at = lone_surrogate(label)
    if at is not None:
        raise ValueError(
            f"label {label!r} holds a lone surrogate U+{ord(label[at]):04X} at character "
            f"{at}: not valid Unicode (it has no UTF-8 encoding), so no tokenizer can read it"
        )
    hidden = hidden_characters(label)
    if hidden:
        shown = "".join(c for c in label if c not in hidden)
        raise ValueError(
            f"label {label!r} holds the control or invisible character(s) "
            f"{', '.join(f'U+{ord(c):04X}' for c in hidden)}: it would print as {shown!r}, "
            "so a prediction would look like a label it is not; remove them"
        )
