"""Gemma's chat turn format, rendered in Python.

A Gemma GGUF carries no chat template, so the tokenizer converted from it has none either. The
packaged Gemma 3 270M is a *base* model, which echoes chat turns, so by default it is prompted in the
plain-text completion format instead (``ragserve.models.prompt_format``); this format serves a Gemma
instruct GGUF under ``prompt_format: chat``. Generation and token counting both go through the
renderer the engine picks, so the prompt the model sees and the prompt the budget counts are the same
string (docs/architecture.md §5).

Format (as Gemma's own template renders it)::

    <bos><start_of_turn>user
    {system}

    {first user message}<end_of_turn>
    <start_of_turn>model
    {assistant message}<end_of_turn>
    <start_of_turn>model

Gemma has no system role: system and developer messages are folded into the first user turn,
separated from it by a blank line.
"""

from __future__ import annotations

from collections.abc import Sequence

from ragserve.api.messages import Message, message_text

BOS = "<bos>"
START_OF_TURN = "<start_of_turn>"
END_OF_TURN = "<end_of_turn>"
SYSTEM_ROLES = frozenset({"system", "developer"})


def _turn(role: str, text: str) -> str:
    return f"{START_OF_TURN}{role}\n{text}{END_OF_TURN}\n"


def render_gemma(messages: Sequence[Message], *, grounded: bool = False) -> str:
    """The Gemma prompt for ``messages``, ending with the generation prompt ``<start_of_turn>model\\n``.

    ``assistant`` turns become ``model`` turns; every other non-system role (user, and the tool or
    function results a passthrough may carry) becomes a ``user`` turn, since Gemma knows only these
    two. Contents are trimmed, as Gemma's own template does. ``grounded`` changes nothing: a
    question over sources is a user turn like any other (a ``ChatRenderer`` takes it).
    """
    system_parts = [message_text(m).strip() for m in messages if m.get("role") in SYSTEM_ROLES]
    system = "\n\n".join(p for p in system_parts if p)
    turns: list[tuple[str, str]] = []
    for m in messages:
        role = m.get("role")
        if role in SYSTEM_ROLES:
            continue
        turns.append(("model" if role == "assistant" else "user", message_text(m).strip()))
    if system:
        first_user = next((i for i, (role, _) in enumerate(turns) if role == "user"), None)
        if first_user is None:
            turns.insert(0, ("user", system))
        else:
            role, text = turns[first_user]
            turns[first_user] = (role, f"{system}\n\n{text}" if text else system)
    return BOS + "".join(_turn(role, text) for role, text in turns) + f"{START_OF_TURN}model\n"
