"""mkdocs hook: the changelog page (`docs/changelog.md`) includes the repository's
`CHANGELOG.md` (pymdownx.snippets), whose links are written from the repository root:
`docs/x.md` becomes the site's `x.md`, and a link to any other file of the repository
(`benchmarks/results/...`) its address under `repo_url`. Named in `mkdocs.yaml`.
"""

from __future__ import annotations

import re
from typing import Any

PAGE = "changelog.md"
LINK = re.compile(r"\]\((?!https?://|#)([^)\s]+)\)")


def site_links(markdown: str, repo_url: str) -> str:
    """`markdown`'s repository-relative links made the changelog page's."""

    def one(match: re.Match[str]) -> str:
        target = match.group(1)
        if target.startswith("docs/"):
            return f"]({target[len('docs/'):]})"
        return f"]({repo_url.rstrip('/')}/blob/main/{target})"

    return LINK.sub(one, markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, **_: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    return site_links(markdown, config["repo_url"])
