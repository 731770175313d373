"""Prompt conversion shared by the OpenCompass model and the run manifest (no OpenCompass import).

OpenCompass hands a model either a string or a prompt list of ``{"role": "HUMAN"|"BOT"|
"SYSTEM", "prompt": ...}`` items. :class:`ChatParser` (the model's ``template_parser``) turns
the prompt list into chat messages *including* a trailing pre-filled assistant turn (MBPP's
``[BEGIN]\\n``), so a prompt is rendered exactly as the native runner renders the same row
(``dllm_eval.runner``); OpenCompass's own API parser would drop that last turn. A meta item
``{"role": "DLLM_SAMPLE", "prompt": "<int>"}`` carries the sample index used for the
per-sample seed and is removed from the messages.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from dllm_eval.data import Message
from dllm_eval.runner import _encode

__all__ = ["ROLES", "SAMPLE_ROLE", "ChatParser", "ParsedPrompt", "encode_messages",
           "has_chat_template", "to_messages"]

ROLES = {"HUMAN": "user", "BOT": "assistant", "SYSTEM": "system"}
"""OpenCompass role -> chat role."""

SAMPLE_ROLE = "DLLM_SAMPLE"
"""Meta role whose prompt is the sample index (seed offset); not part of the conversation."""

ParsedPrompt = dict[str, Any]
"""``{"messages": [...], "sample": int | None}``: one parsed prompt."""


def to_messages(prompt: Any, *, merge_role: bool = True) -> ParsedPrompt:
    """Chat messages (and sample index) of one OpenCompass prompt (str or prompt list).

    Section markers are skipped, empty turns dropped and consecutive same-role turns joined
    with a newline (as OpenCompass's chat models do); the sample-index meta item is extracted.
    """
    if isinstance(prompt, Mapping) and "messages" in prompt:
        return dict(prompt)
    if isinstance(prompt, str):
        return {"messages": [{"role": "user", "content": prompt}], "sample": None}
    messages: list[Message] = []
    sample: int | None = None
    for item in prompt:
        if isinstance(item, str):
            if item.strip():
                messages.append({"role": "user", "content": item})
            continue
        if "section" in item:
            continue
        role = item.get("role")
        text = item.get("prompt", item.get("content", ""))
        if role == SAMPLE_ROLE:
            sample = int(text)
            continue
        if not text:
            continue
        chat_role = ROLES.get(str(role), str(role))
        if merge_role and messages and messages[-1]["role"] == chat_role:
            messages[-1]["content"] += "\n" + text
        else:
            messages.append({"role": chat_role, "content": text})
    return {"messages": messages, "sample": sample}


class ChatParser:
    """``template_parser`` for the dLLM OpenCompass model: prompt list -> :data:`ParsedPrompt`."""

    def parse_template(self, prompt_template: Any, mode: str) -> Any:
        if isinstance(prompt_template, (list, tuple)) and not _is_prompt_list(prompt_template):
            return [self.parse_template(p, mode) for p in prompt_template]
        return to_messages(prompt_template)


def _is_prompt_list(obj: Sequence[Any]) -> bool:
    # A PromptList is a list of dicts/strings; a batch is a list of PromptLists or strings.
    from_oc = type(obj).__name__ == "PromptList"
    return from_oc or (len(obj) > 0 and all(isinstance(x, dict) for x in obj))


def has_chat_template(tokenizer: Any) -> bool:
    """Whether the tokenizer carries a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def encode_messages(tokenizer: Any, messages: list[Message]) -> list[int]:
    """Token ids of a conversation: chat template with ``add_generation_prompt=True`` (as the
    native runner) when the tokenizer has one, else the contents joined by newlines and
    tokenised with the tokenizer's default special tokens (OpenCompass base-model behaviour)."""
    if has_chat_template(tokenizer):
        return _encode(tokenizer, messages)
    text = "\n".join(m["content"] for m in messages)
    return [int(t) for t in tokenizer(text, add_special_tokens=True)["input_ids"]]
