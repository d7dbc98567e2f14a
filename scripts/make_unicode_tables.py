"""Writes semsoft_plugin/core/unicode_tables.json: the two Unicode tables the label checks need,
so that the package compares labels with the standard library alone (no ICU to compile).

- `default_ignorable`: the ranges of Default_Ignorable_Code_Point (DerivedCoreProperties).
- `skeleton`: UTS #39's confusable mapping, one entry per code point that has one: the
  skeleton of that code point alone (ICU's `SpoofChecker.getSkeleton`). UTS #39 defines
  `skeleton(X) = NFD(map(NFD(X)))` with `map` acting code point by code point, so a
  string's skeleton is the NFD of the concatenated per-code-point skeletons of its NFD.

Run by hand when the Unicode data should move (needs PyICU and regex; not a dependency):

    python scripts/make_unicode_tables.py

It checks the table against ICU on every mapped code point and on random strings.
"""

from __future__ import annotations

import json
import random
import sys
import unicodedata
from pathlib import Path

import icu
import regex

OUT = Path(__file__).resolve().parents[1] / "semsoft_plugin" / "core" / "unicode_tables.json"


def _code_points() -> list[str]:
    return [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]


def main() -> None:
    checker = icu.SpoofChecker()
    ignorable = regex.compile(r"\p{Default_Ignorable_Code_Point}")
    ranges: list[list[int]] = []
    skeleton: dict[str, str] = {}
    for ch in _code_points():
        c = ord(ch)
        if ignorable.fullmatch(ch):
            if ranges and ranges[-1][1] == c - 1:
                ranges[-1][1] = c
            else:
                ranges.append([c, c])
        if unicodedata.normalize("NFD", ch) == ch:
            mapped = str(checker.getSkeleton(0, ch))
            if mapped != ch:
                skeleton[f"{c:X}"] = mapped
    table = {
        "source": f"ICU {icu.ICU_VERSION} (Unicode {icu.UNICODE_VERSION}), "
        "scripts/make_unicode_tables.py",
        "default_ignorable": ranges,
        "skeleton": skeleton,
    }
    OUT.write_text(json.dumps(table, ensure_ascii=True, separators=(",", ":")) + "\n")

    # The table reproduces ICU on random strings of mapped, plain and combining code points.
    sys.path.insert(0, str(OUT.parents[2]))
    from semsoft_plugin.core.text_rules import confusable_skeleton

    pool = [chr(int(k, 16)) for k in skeleton] + list("abcmnrlI10O \u0301\u0430")
    rng = random.Random(0)
    for _ in range(20000):
        text = "".join(rng.choice(pool) for _ in range(rng.randint(1, 6)))
        want = str(checker.getSkeleton(0, text))
        assert confusable_skeleton(text) == want, (text, want)
    print(f"wrote {OUT}: {len(ranges)} ignorable ranges, {len(skeleton)} mapped code points")


if __name__ == "__main__":
    main()
