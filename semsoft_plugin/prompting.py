"""Prompts, written once: templates, chat formatting, encoding, left padding, pad id.

Every engine adapter (transformers, vLLM's batch classifier), the ``semsoft`` command
and the evaluation format and encode prompts with these functions, so an input is
tokenised the same way everywhere.

Templates: a user message, an optional system message, a pre-filled answer prefix.

Every template ends the chat with an assistant message holding the answer prefix
(``"Answer:"``): the chat template then continues that message, so the next token is
the answer and labels are scored as leading-space whole words (``" joy"``), which on
BPE tokenizers are mostly single tokens. Without the prefix the model starts with
filler ("The emotion is ...") and labels split into fragments.

A template file (``--prompt-file`` of ``semsoft classify`` and ``semsoft eval``) is
JSON with the same keys as :class:`PromptTemplate`::

    {"user": "Which emotion? Options: {labels}.\\n\\nComment: {text}",
     "answer_prefix": "Emotion:", "system": null}

``{text}`` and ``{labels}`` (comma-separated label names) are filled in. This module
lives in the plugin (stdlib only at import; torch for :func:`left_padded`) so that
``semsoft classify`` reads the same files as the evaluation package, which imports it
from here.
"""

from __future__ import annotations

import json
import string
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "DEFAULT_PROMPT",
    "DEFAULT_TEMPLATE",
    "PromptTemplate",
    "build_inputs",
    "encode_prompts",
    "format_prompt",
    "left_padded",
    "load_template",
    "pad_token_id",
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


def build_inputs(
    template: PromptTemplate, texts: list[str], labels: list[str], tokenizer: Any
) -> list[Any]:
    """Chat message lists (or plain strings without a chat template) for ``classify``."""
    if getattr(tokenizer, "chat_template", None) is None:
        return [template.plain(t, labels) for t in texts]
    return [template.messages(t, labels) for t in texts]


def format_prompt(tokenizer: Any, item: str | Sequence[Mapping[str, str]]) -> tuple[str, bool]:
    """The prompt text for one input, and whether it already holds special tokens.

    A string is used as is. A chat message list goes through the chat template: with
    a generation prompt, or, when the last message is the assistant's, continuing
    that message (how an answer prefix like ``"Emotion:"`` is pre-filled).
    """
    if isinstance(item, str):
        return item, False
    if not isinstance(item, Sequence) or not item or not all(isinstance(m, Mapping) for m in item):
        raise ValueError(f"input {item!r} is neither a string nor a list of chat messages")
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("chat messages given but the tokenizer has no chat template")
    last: Mapping[str, str] = item[-1]  # type: ignore[assignment]  # checked: all Mappings
    continue_last = last.get("role") == "assistant"
    text = tokenizer.apply_chat_template(
        list(item),
        tokenize=False,
        add_generation_prompt=not continue_last,
        continue_final_message=continue_last,
    )
    return text, True


def encode_prompts(tokenizer: Any, texts: Sequence[tuple[str, bool]]) -> list[list[int]]:
    """Token ids of :func:`format_prompt` outputs; special tokens are added only to plain text."""
    encoded = [tokenizer.encode(text, add_special_tokens=not special) for text, special in texts]
    if any(len(ids) == 0 for ids in encoded):
        raise ValueError("an input tokenises to nothing: give a non-empty prompt")
    return encoded


def left_padded(tokenizer: Any, texts: list[tuple[str, bool]], pad_id: int) -> dict[str, Tensor]:
    """A left-padded batch (``input_ids``, ``attention_mask``) of :func:`format_prompt` outputs."""
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
    models have no pad token); ``ValueError`` when the tokenizer has neither."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise ValueError("the tokenizer has neither a pad nor an eos token id")
    return int(pad)
