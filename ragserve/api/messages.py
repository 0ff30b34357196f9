"""The chat message as the pipeline passes it around: a dict in OpenAI's shape (``role``,
``content`` as a string or a list of content parts). The wire model is
``ragserve.api.openai.ChatMessage``; past validation the planner, the budget and the engines work on
plain dicts, so that fields a remote server understands pass through untouched."""

from __future__ import annotations

from typing import Any

Message = dict[str, Any]


def message_text(message: Message) -> str:
    """The text of a message dict whose content is a string or a list of content parts."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "text":
            parts.append(part.get("text") or "")
    return "\n".join(parts)
