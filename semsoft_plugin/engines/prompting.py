"""Prompts, written once: templates, chat formatting, encoding, left padding, pad id.

Every engine adapter, the `semsoft` command and the evaluation format and encode prompts
with these functions, so an input is tokenised the same way everywhere. A template is a
user message, an optional system message and a pre-filled answer prefix: the chat ends
with an assistant message holding the prefix (`"Answer:"`), which the chat template
continues, so the next token is the answer and labels are scored as leading-space whole
words (`" joy"`). Without the prefix the model starts with filler ("The emotion is ...")
and labels split into fragments.

A template file (`--prompt-file`) is JSON with `PromptTemplate`'s keys, `{text}` and
`{labels}` filled in: docs/input-files.md ("A prompt file"). This module lives in the
plugin (stdlib only at import; torch for `left_padded`) so that `semsoft classify` reads
the same files as the evaluation package, which imports it from here.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "DEFAULT_PROMPT",
    "DEFAULT_TEMPLATE",
    "PromptTemplate",
    "PromptText",
    "build_inputs",
    "encode_prompts",
    "format_prompt",
    "left_padded",
    "load_template",
    "pad_token_id",
    "padding_batches",
]


@dataclass(frozen=True)
class PromptTemplate:
    """A user message, an optional system message and the pre-filled answer prefix."""

    user: str
    answer_prefix: str = "Answer:"
    system: str | None = None

    def __post_init__(self) -> None:
        fields = {name for _, name, _, _ in string.Formatter().parse(self.user) if name is not None}
        unknown = fields - {"text", "labels"}
        if unknown:
            raise ValueError(
                f"prompt template has unknown placeholder(s) {sorted(unknown)}; use {{text}} and {{labels}}"
            )
        if "text" not in fields:
            raise ValueError("prompt template must contain {text}")

    def messages(self, text: str, labels: list[str]) -> list[dict[str, str]]:
        """Chat messages for one item, ending with the assistant's answer prefix."""
        out = []
        if self.system:
            out.append({"role": "system", "content": self.system})
        out.append(
            {"role": "user", "content": self.user.format(text=text, labels=", ".join(labels))}
        )
        if self.answer_prefix:
            out.append({"role": "assistant", "content": self.answer_prefix})
        return out

    def plain(self, text: str, labels: list[str]) -> str:
        """The same prompt as plain text, for tokenizers without a chat template."""
        parts = [self.system] if self.system else []
        parts.append(self.user.format(text=text, labels=", ".join(labels)))
        parts.append(self.answer_prefix)
        return "\n".join(p for p in parts if p)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# The prompt of `semsoft classify` and of `semsoft_plugin.Classifier` by default.
DEFAULT_PROMPT = (
    "Classify the text into one of these labels: {labels}.\n"
    "Text: {text}\nAnswer with the label only."
)
DEFAULT_TEMPLATE = PromptTemplate(user=DEFAULT_PROMPT, answer_prefix="Answer:")


def load_template(path: str | Path) -> PromptTemplate:
    """Read a JSON template file (see the module docstring)."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"prompt file not found: {path}") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"prompt file {path} is not valid JSON: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("user"), str):
        raise ValueError(f"prompt file {path} must hold a JSON object with a string 'user'")
    unknown = set(data) - {"user", "answer_prefix", "system"}
    if unknown:
        raise ValueError(f"prompt file {path} has unknown key(s) {sorted(unknown)}")
    return PromptTemplate(**data)


class PromptText(str):
    """A rendered prompt that knows where untrusted text spelled a special token.

    `literal_spans` are the `(start, end)` character spans of the prompt where the
    *text* (a chat message's content, an item inserted into a template) spelled a
    special token such as `<|im_end|>`: `encode_prompts` encodes them as text,
    so a text cannot close its turn and forge another. Everywhere else the
    prompt's special tokens are the chat template's own. A plain `str` (built by
    concatenation, say) loses the spans and is encoded as the tokenizer reads it.
    """

    literal_spans: tuple[tuple[int, int], ...]

    def __new__(cls, text: str, literal_spans: Sequence[tuple[int, int]] = ()) -> PromptText:
        made = super().__new__(cls, text)
        made.literal_spans = tuple(literal_spans)
        return made


def _special_tokens(tokenizer: Any) -> dict[str, int]:
    """The tokenizer's special (control) tokens: text -> id."""
    found: dict[str, int] = {}
    for token_id, token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(token, "special", False) and getattr(token, "content", ""):
            found[str(token.content)] = int(token_id)
    for text in getattr(tokenizer, "all_special_tokens", None) or ():
        if text and text not in found:
            token_id = tokenizer.convert_tokens_to_ids(text)
            if isinstance(token_id, int):
                found[text] = token_id
    return found


def _special_pattern(specials: Mapping[str, int]) -> re.Pattern[str] | None:
    if not specials:
        return None
    return re.compile("|".join(re.escape(t) for t in sorted(specials, key=len, reverse=True)))


def _literal(
    render: Callable[[Callable[[str], str]], str], tokenizer: Any
) -> tuple[str, tuple[tuple[int, int], ...]]:
    """`render(mask)` with the special-token strings the untrusted parts spell (each
    part goes through `mask`) kept as text: they are swapped for private placeholders
    before rendering and put back after, and their spans are returned."""
    pattern = _special_pattern(_special_tokens(tokenizer))
    if pattern is None:
        return render(lambda part: part), ()
    nonce = secrets.token_hex(8)
    originals: list[str] = []

    def mask(part: str) -> str:
        def swap(match: re.Match[str]) -> str:
            originals.append(match.group(0))
            return f"\ue000{nonce}:{len(originals) - 1}\ue001"

        return pattern.sub(swap, part)

    rendered = render(mask)
    if not originals:
        return rendered, ()
    out: list[str] = []
    spans: list[tuple[int, int]] = []
    size = 0
    for piece in re.split(f"(\ue000{nonce}:[0-9]+\ue001)", rendered):
        if piece.startswith(f"\ue000{nonce}:"):
            piece = originals[int(piece[len(nonce) + 2 : -1])]
            spans.append((size, size + len(piece)))
        out.append(piece)
        size += len(piece)
    return "".join(out), tuple(spans)


def build_inputs(
    template: PromptTemplate, texts: list[str], labels: list[str], tokenizer: Any
) -> list[Any]:
    """Chat message lists (or plain strings without a chat template) for `classify`.

    The texts are untrusted: without a chat template the plain prompt is a
    `PromptText` whose special-token strings from the text stay text; with one,
    `format_prompt` treats every message's content that way."""
    if getattr(tokenizer, "chat_template", None) is None:
        out: list[Any] = []
        for t in texts:

            def render(mask: Callable[[str], str], t: str = t) -> str:
                return template.plain(mask(t), labels)

            text, spans = _literal(render, tokenizer)
            out.append(PromptText(text, spans) if spans else text)
        return out
    return [template.messages(t, labels) for t in texts]


def format_prompt(tokenizer: Any, item: str | Sequence[Mapping[str, str]]) -> tuple[str, bool]:
    """The prompt text for one input, and whether it already holds special tokens.

    A string is used as is (a `PromptText` keeps its spans). A chat message list
    goes through the chat template: with a generation prompt, or, when the last message
    is the assistant's, continuing that message (how an answer prefix like
    `"Emotion:"` is pre-filled). Message contents are text: a special-token string
    in one (`<|im_end|>`) is returned as a `PromptText` span, which
    `encode_prompts` encodes as text, never as the control token.
    """
    if isinstance(item, str):
        return item, False
    if not isinstance(item, Sequence) or not item or not all(isinstance(m, Mapping) for m in item):
        raise ValueError(f"input {item!r} is neither a string nor a list of chat messages")
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("chat messages given but the tokenizer has no chat template")
    last: Mapping[str, str] = item[-1]  # type: ignore[assignment]  # checked: all Mappings
    continue_last = last.get("role") == "assistant"

    given: list[Mapping[str, Any]] = list(item)  # type: ignore[arg-type]  # checked above

    def render(mask: Callable[[str], str]) -> str:
        messages = [
            {**m, "content": mask(m["content"])} if isinstance(m.get("content"), str) else dict(m)
            for m in given
        ]
        return str(
            tokenizer.apply_chat_template(
                messages,
                tokenize=False,
                add_generation_prompt=not continue_last,
                continue_final_message=continue_last,
            )
        )

    text, spans = _literal(render, tokenizer)
    return (PromptText(text, spans) if spans else text), True


def _encode_literal(tokenizer: Any, text: PromptText, add_special_tokens: bool) -> list[int]:
    """Token ids of a `PromptText`: split at the special tokens outside its
    literal spans (as the tokenizer itself splits at special tokens), every piece in
    between encoded with `split_special_tokens=True`, so the text's spellings of
    special tokens become ordinary tokens."""
    specials = _special_tokens(tokenizer)
    pattern = _special_pattern(specials)
    spans = text.literal_spans
    plain = str(text)

    def piece(part: str) -> list[int]:
        if not part:
            return []
        return list(tokenizer.encode(part, add_special_tokens=False, split_special_tokens=True))

    ids: list[int] = []
    start = 0
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    for match in pattern.finditer(plain) if pattern is not None else ():
        if any(a < match.end() and match.start() < b for a, b in spans):
            continue  # the text spelled it: text, encoded with its piece
        token_id = specials[match.group(0)]
        before = plain[start : match.start()]
        if getattr(decoder.get(token_id), "lstrip", False):
            before = before.rstrip()
        ids += piece(before)
        ids.append(token_id)
        start = match.end()
        if getattr(decoder.get(token_id), "rstrip", False):
            while start < len(plain) and plain[start].isspace():
                start += 1
    ids += piece(plain[start:])
    if add_special_tokens:  # the tokenizer's own BOS/EOS around the whole prompt
        bare = list(tokenizer.encode("a", add_special_tokens=False))
        full = list(tokenizer.encode("a", add_special_tokens=True))
        at = next(i for i in range(len(full) - len(bare) + 1) if full[i : i + len(bare)] == bare)
        ids = full[:at] + ids + full[at + len(bare) :]
    return ids


def encode_prompts(tokenizer: Any, texts: Sequence[tuple[str, bool]]) -> list[list[int]]:
    """Token ids of `format_prompt` outputs; special tokens are added only to plain
    text. A `PromptText` keeps the special-token strings its text spelled as text."""
    encoded = [
        _encode_literal(tokenizer, text, not special)
        if isinstance(text, PromptText) and text.literal_spans
        else tokenizer.encode(text, add_special_tokens=not special)
        for text, special in texts
    ]
    if any(len(ids) == 0 for ids in encoded):
        raise ValueError("an input tokenises to nothing: give a non-empty prompt")
    return encoded


def left_padded(tokenizer: Any, texts: list[tuple[str, bool]], pad_id: int) -> dict[str, Tensor]:
    """A left-padded batch (`input_ids`, `attention_mask`) of `format_prompt` outputs."""
    import torch

    encoded = encode_prompts(tokenizer, texts)
    width = max(len(ids) for ids in encoded)
    input_ids = torch.full((len(encoded), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(encoded), width), dtype=torch.long)
    for row, ids in enumerate(encoded):
        input_ids[row, width - len(ids) :] = torch.tensor(ids)
        attention_mask[row, width - len(ids) :] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def pad_token_id(tokenizer: Any) -> int:
    """The id to left-pad batches with: the pad token, else EOS (most decoder-only
    models have no pad token); `ValueError` when the tokenizer has neither."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise ValueError("the tokenizer has neither a pad nor an eos token id")
    return int(pad)


def item_list(items: Any, name: str, kind: str) -> list[Any]:
    """Any one-dimensional iterable as a list (numpy arrays and pandas Series through
    `tolist`: Python values, a Series' values not its index); a single string, a
    non-iterable or a 2-D array is a `ValueError` naming `name`."""
    if isinstance(items, str | bytes):
        raise ValueError(f"{name} must be an iterable of {kind}, not a single string")
    if not isinstance(items, Iterable):
        raise ValueError(f"{name} must be an iterable of {kind}, not {type(items).__name__}")
    if getattr(items, "ndim", 1) != 1:
        raise ValueError(
            f"{name} must be one-dimensional, got shape {getattr(items, 'shape', None)}"
        )
    return list(items.tolist() if hasattr(items, "tolist") else items)


def padding_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices grouped into left-padded batches: sorted by length, at most
    `batch_size` each, and a batch is cut early where padding would fill more than
    half of it (rows x longest > 2 x the rows' own lengths), so one very long input
    runs with inputs of its own length instead of padding a whole batch to its size.
    Results keep input order; the grouping depends only on the lengths.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    real = 0
    for index in order:
        batch = batches[-1] if batches else None
        grown = real + lengths[index]
        if (
            batch is None
            or len(batch) == batch_size
            or (len(batch) + 1) * lengths[index] > 2 * grown
        ):
            batches.append([index])
            real = lengths[index]
        else:
            batch.append(index)
            real = grown
    return batches
