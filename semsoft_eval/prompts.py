"""Prompt templates for `semsoft eval` and `semsoft tune`, one per task.

`PromptTemplate`, the `--prompt-file` reader and `build_inputs` live in
the plugin (`semsoft_plugin.prompts`), so that `semsoft classify` reads the same
files without the evaluation package; they are re-exported here.
"""

from __future__ import annotations

from semsoft_plugin.engines.prompting import PromptTemplate, build_inputs, load_template

__all__ = ["PromptTemplate", "TEMPLATES", "load_template", "build_inputs"]


TEMPLATES: dict[str, PromptTemplate] = {
    "emotion": PromptTemplate(
        user=(
            "Which emotion does this Reddit comment express? "
            "Choose one of: {labels}.\n\nComment: {text}\n\nAnswer with the emotion only."
        ),
        answer_prefix="Emotion:",
    ),
    "sentiment": PromptTemplate(
        user=(
            "Is the sentiment of this movie review {labels}?\n\nReview: {text}\n\n"
            "Answer with one word."
        ),
        answer_prefix="Sentiment:",
    ),
    "toxicity": PromptTemplate(
        user=(
            "Is this tweet toxic, that is hateful or offensive? Answer {labels}.\n\nTweet: {text}"
        ),
        answer_prefix="Toxic:",
    ),
    "abuse": PromptTemplate(
        user=(
            "Is this message to a conversational assistant abusive? Answer {labels}.\n\n"
            "Message: {text}"
        ),
        answer_prefix="Abusive:",
    ),
    "topic": PromptTemplate(
        user=(
            "Which topic is this news article about? Choose one of: {labels}.\n\n"
            "Article: {text}\n\nAnswer with the topic only."
        ),
        answer_prefix="Topic:",
    ),
    "question": PromptTemplate(
        user=(
            "What type of answer does this question ask for? Choose one of: {labels}.\n\n"
            "Question: {text}\n\nAnswer with the type only."
        ),
        answer_prefix="Type:",
    ),
    "generic": PromptTemplate(
        user="Classify the text into one of these labels: {labels}.\n\nText: {text}\n\nAnswer with the label only.",
        answer_prefix="Label:",
    ),
}
