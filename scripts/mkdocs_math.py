"""mkdocs hook: the formulas typeset when the site is built, as MathML, so that a page
shows them with no script and no network (an air-gapped cluster reads the same page).

`pymdownx.arithmatex` (generic mode) marks each formula of the pages and docstrings,
`$...$` and `\\(...\\)` as a `<span class="arithmatex">`, `$$...$$` and `\\[...\\]` as a
`<div class="arithmatex">`; this hook replaces each mark with the MathML that
`latex2mathml` (pure Python, the `docs` extra) makes of its TeX, which browsers render
natively. A formula it cannot convert, or converts leaving a TeX command in the MathML,
fails the build naming the page and the TeX.
Named in `mkdocs.yaml` under `hooks:`.
"""

from __future__ import annotations

import html
import re
from typing import Any

from latex2mathml.converter import convert

# What arithmatex writes in generic mode: the TeX, HTML-escaped, between \( \) or \[ \].
MARK = re.compile(
    r'<(?P<tag>span|div) class="arithmatex">\s*\\(?P<open>[(\[])(?P<tex>.*?)\\[)\]]\s*</(?P=tag)>',
    re.S,
)


def typeset(content: str, where: str = "") -> str:
    """`content` with every arithmatex mark replaced by its MathML (`display="block"` for a
    displayed formula)."""

    def one(match: re.Match[str]) -> str:
        tex = html.unescape(match.group("tex")).strip()
        block = match.group("open") == "["
        try:
            mathml = convert(tex, display="block" if block else "inline")
        except Exception as exc:  # latex2mathml raises its own errors and plain ones
            raise ValueError(f"{where}: cannot typeset the formula {tex!r}: {exc}") from exc
        if "\\" in mathml:  # a command latex2mathml does not know is left as text
            raise ValueError(f"{where}: the formula {tex!r} leaves TeX in its MathML: {mathml}")
        return f'<div class="math">{mathml}</div>' if block else mathml

    return MARK.sub(one, content)


def on_page_content(html_text: str, page: Any, **_: Any) -> str:
    return typeset(html_text, page.file.src_uri)
