"""How prompt text reaches a target as token ids, and how its output ids become response text.

A target whose tokenizer has a chat template (an instruct model) gets each prompt as one user
turn through that template, followed by the assistant header; other targets get the raw text.
Used by the sweep preflight, and by whatever else prompts a target (zoo cards, benchmarks).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from workers.datasets import DatasetSpec, load_prompts


def uses_chat_template(tokenizer: Any, setting: bool | None) -> bool:
    """Return whether prompts go through ``tokenizer``'s chat template under ``setting``.

    None (the default) means: when the tokenizer has a chat template.
    """
    return bool(getattr(tokenizer, "chat_template", None)) if setting is None else setting


def encode_prompt(tokenizer: Any, text: str, chat: bool, budget: int) -> list[int]:
    """Return the token ids of prompt ``text``, at most ``budget`` of them.

    A plain prompt keeps its last ``budget`` tokens. A chat prompt is one user turn through the
    chat template followed by the assistant header; when it is too long, the user text loses
    its first tokens, so that the template's markers stay whole.
    """
    if not chat:
        return tokenizer(text)["input_ids"][-budget:]
    ids = _chat_ids(tokenizer, text)
    excess = len(ids) - budget
    if excess > 0:
        content = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids = _chat_ids(tokenizer, tokenizer.decode(content[excess:]))[-budget:]
    return ids


def encode_prompts(
    tokenizer: Any, texts: Iterable[str], budget: int, chat_template: bool | None = None
) -> list[list[int]]:
    """Return the token ids of each prompt text (``encode_prompt``, at most ``budget`` each),
    through the chat template under ``chat_template`` (see ``uses_chat_template``)."""
    chat = uses_chat_template(tokenizer, chat_template)
    return [encode_prompt(tokenizer, text, chat, budget) for text in texts]


def encode_dataset(tokenizer: Any, dataset: str, samples: int, budget: int) -> list[list[int]]:
    """Return the token ids of ``dataset``'s first ``samples`` prompts (``encode_prompts``, at
    most ``budget`` each, through the chat template when the tokenizer has one)."""
    texts = [prompt.text for prompt in load_prompts(DatasetSpec(dataset, samples=samples))]
    return encode_prompts(tokenizer, texts, budget)


def response_text(tokenizer: Any, output_ids: list[int]) -> str:
    """Return the text of a generated response: its ids decoded without special tokens (the
    EOS that ended it, chat markers)."""
    return tokenizer.decode(output_ids, skip_special_tokens=True)


def _chat_ids(tokenizer: Any, text: str) -> list[int]:
    """Return the ids of ``text`` as one user turn plus the assistant header (template's own
    special tokens only: the rendered template is tokenized without adding more)."""
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer(rendered, add_special_tokens=False)["input_ids"]
