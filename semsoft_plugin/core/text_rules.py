"""The Unicode rules every path shares: what an empty text is, what a label may hold, and
when two labels are the same label.

Texts and labels reach the package from Python, the command line, files and HTTP bodies;
each path asks these functions, so that a text empty on one path is empty on all of them.

* **Blank.** A text of whitespace only (``str.isspace``: spaces, tabs, the no-break space)
  or of invisible characters only (Unicode categories ``Cc`` control and ``Cf`` format:
  the zero-width space, the byte-order mark, the word joiner, the soft hyphen) says
  nothing to the model: it is empty, whichever of these it is made of.
* **Lone surrogates.** JSON (``"\\ud800"``) and Python allow a surrogate code point on its
  own; it has no UTF-8 encoding, so no tokenizer takes it (vLLM's fails with a
  ``TypeError``, a file writer with ``UnicodeEncodeError``, both naming nothing). It is
  found up front and refused by position.
* **Hidden characters in a label.** A label holding a control or invisible format
  character (``"yes\\x00"``, ``"yes\\u200b"``, a bidirectional override) prints like
  another label (``yes``), so ``predict()`` would return a value that looks like a label
  it is not. Refused. The zero-width non-joiner and joiner (U+200C, U+200D) are kept:
  they are part of how Persian, Indic scripts and emoji sequences are written.
* **Label identity.** Two spellings of one text in Unicode (NFC ``"café"``, one code point
  for the é; NFD ``"café"``, an e and a combining accent) look the same and mean the same:
  labels are compared after NFC normalisation, so such a pair is a repeated label.
"""

from __future__ import annotations

import unicodedata
from typing import Any

__all__ = ["check_label", "hidden_characters", "is_blank", "label_identity", "lone_surrogate"]

_INVISIBLE = frozenset({"Cc", "Cf"})
# Format characters that are part of writing, not hidden marks (see the module docstring).
_JOINERS = frozenset({"\u200c", "\u200d"})


def is_blank(text: str) -> bool:
    """True when ``text`` holds nothing but whitespace and invisible characters
    (the empty string included): the model would be asked about nothing."""
    return all(c.isspace() or unicodedata.category(c) in _INVISIBLE for c in text)


def lone_surrogate(text: str) -> int | None:
    """The index of the first lone surrogate in ``text`` (a code point that UTF-8 cannot
    encode), or None when the text is valid Unicode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return int(error.start)
    return None


def hidden_characters(label: str) -> list[str]:
    """The control and invisible format characters in ``label`` (each once, in order);
    empty for a label that prints as what it is."""
    found = [c for c in label if unicodedata.category(c) in _INVISIBLE and c not in _JOINERS]
    return list(dict.fromkeys(found))


def label_identity(label: str) -> str:
    """What two labels are compared by: their NFC normalisation (so that one text in two
    Unicode spellings is one label)."""
    return unicodedata.normalize("NFC", label)


def check_label(label: Any) -> None:
    """Refuse one label that is not a string, is empty (:func:`is_blank`), is not valid
    Unicode (a lone surrogate) or holds a control or invisible character that would print
    as another label (the rules above); ``ValueError`` naming it. The character rule of
    :func:`~semsoft_plugin.core.labels.label_names`, which every path's labels go through."""
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
