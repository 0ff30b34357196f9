"""Follow-up questions: what to retrieve with when the newest user turn alone finds nothing.

"How do I install it?" says nothing about *what* to install: its embedding is close to no document
(cosine 0.14 against the install guide with all-MiniLM-L6-v2), and its one content word matches
every install guide. The earlier user turns name the subject, so the retry joins them to the
question (newest first, whole turns, within a token bound): deterministic, no model call. A
rewrite by the generator (``query_rewrite: llm``) is the optional, costlier alternative.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ragserve.api.messages import message_text

REWRITE_INSTRUCTIONS = (
    "Rewrite the user's last question as one standalone question that can be understood without the "
    "conversation: replace pronouns and references with what they refer to. Reply with the question only."
)
#: What the rewrite sees of the conversation: the newest messages, each cut to this many characters.
REWRITE_MESSAGES = 6
REWRITE_CHARS = 600
REWRITE_MAX_TOKENS = 64


def previous_user_turns(history: Sequence[dict[str, Any]]) -> list[str]:
    """The texts of the earlier user turns, newest first."""
    return [t for m in reversed(history) if m.get("role") == "user" and (t := message_text(m).strip())]


def joined_query(query: str, previous: Sequence[str], count_text: Callable[[str], int], max_tokens: int) -> str:
    """``query`` preceded by as many earlier user turns (``previous``, newest first, whole turns) as
    fit in ``max_tokens`` together with it, oldest first, blank-line separated; ``query`` alone
    when none fits."""
    kept: list[str] = []
    spent = count_text(query)
    for turn in previous:
        cost = count_text(turn)
        if spent + cost > max_tokens:
            break
        kept.insert(0, turn)
        spent += cost
    return "\n\n".join([*kept, query])


def rewrite_messages(history: Sequence[dict[str, Any]], query: str) -> list[dict[str, str]]:
    """The prompt asking the generator for a standalone version of ``query``."""
    lines = []
    for m in list(history)[-REWRITE_MESSAGES:]:
        if m.get("role") in ("user", "assistant"):
            text = message_text(m).strip()
            if text:
                lines.append(f"{m['role'].capitalize()}: {text[:REWRITE_CHARS]}")
    transcript = "\n".join(lines)
    return [
        {"role": "system", "content": REWRITE_INSTRUCTIONS},
        {
            "role": "user",
            "content": f"Conversation:\n{transcript}\n\nLast question: {query[:REWRITE_CHARS]}\n\nStandalone question:",
        },
    ]
