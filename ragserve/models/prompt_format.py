"""How a local model is prompted: with its chat template, or as a plain-text completion.

Why two formats. An instruct model was trained on chat turns, so its own chat template is the
prompt it answers best. A *base* model was trained on plain text only: the packaged Gemma 3 270M
GGUF is one (no ``-it``, no chat template), and rendered as ``<start_of_turn>`` turns it repeats
the prompt back. Given text that reads like a document it can continue instead: instructions,
the numbered sources, then ``Question: …`` / ``Answer:``. Prompted that way, greedy, cut at the
end of the line, it answered 7 of 8 single-fact questions from its source; as chat turns, 1 of 8.

The completion format (``render_completion``) turns the OpenAI-style messages every engine
receives into that text:

* system and developer messages first, as plain paragraphs (for RAG: the instructions and the
  numbered sources);
* earlier turns as ``User: …`` / ``Assistant: …`` lines;
* the last user turn as ``Question: …`` + ``Answer:`` when the request is ``grounded`` (a question
  over sources), else as ``User: …`` + ``Assistant:`` (a plain chat, passthrough).

Whether a request is grounded is the caller's to say (``SamplingParams.grounded``, set by the chat
service, which knows whether it built a RAG prompt with sources): the format does not read the
system text to guess, so it knows nothing of how the RAG prompt is laid out, and a client's own
system text is never taken for ours.

A base model does not stop by itself where the answer ends: it goes on writing the next
``Question:`` or ``User:`` block, a blank line and more of what its sources read like, a copy of the
sources block, or the same line again. ``completion_answer_rule`` is where the answer ends in this
format (``ragserve.models.stops.AnswerLines``): a one-line answer at the end of its line; steps or a
list (asked for by the question, or opened by the answer's first line) over their following lines,
up to what a base model writes after an answer. The engine stops generating as soon as the rule says
the answer has ended, and never sends what follows it.

One renderer serves generation and token counting: the engine builds its ``HFTokenCounter`` with
the renderer chosen here and generates from ``counter.render(messages, grounded=params.grounded)``;
the budget counts with the same counter and the same ``grounded``, so it counts exactly the string
the model sees (docs/architecture.md §5).

This module is pure (no torch, no tokenizer): the format logic is unit-tested in milliseconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ragserve.api.messages import Message, message_text
from ragserve.models.stops import AnswerLines, asks_for_list
from ragserve.ports import ChatRenderer

#: ``auto``: the chat template when the model has one, else the completion format.
PromptFormat = Literal["auto", "chat", "completion"]

SYSTEM_ROLES = frozenset({"system", "developer"})
USER_LABEL = "User:"
ASSISTANT_LABEL = "Assistant:"
QUESTION_LABEL = "Question:"
ANSWER_LABEL = "Answer:"

#: A line of the answer starting with one of these is the model writing the next block of the
#: prompt (the format's labels, and the heading of a RAG prompt's sources, ragserve.rag.prompt's
#: ``SOURCES_HEADING``), never the answer.
COMPLETION_LABELS: tuple[str, ...] = (
    QUESTION_LABEL,
    ANSWER_LABEL,
    USER_LABEL,
    ASSISTANT_LABEL,
    "Sources:",
    "The passage that best answers the question:",  # ragserve.rag.prompt's EVIDENCE_HEADING
)
#: A prompt's first line shorter than this is too common a text to call an answer line starting
#: with it an echo.
MIN_ECHO_LINE = 16


def _label(role: str) -> str:
    return ASSISTANT_LABEL if role == "assistant" else USER_LABEL


def render_completion(messages: Sequence[Message], bos: str = "", *, grounded: bool = False) -> str:
    """The plain-text prompt for ``messages``, ending with ``Answer:`` (``grounded``: a question over
    the sources in the system messages) or ``Assistant:`` (any other chat), where the model writes
    its reply. A chat that does not end with a user turn is continued as the assistant's either way.

    ``bos``: the tokenizer's begin-of-sequence text, for a model that expects one (the engine
    tokenizes rendered prompts without adding special tokens, so the prompt carries it).
    Contents are trimmed; roles other than system, developer and assistant (tool results a
    passthrough may carry) are shown as the user's.
    """
    system = "\n\n".join(t for t in (message_text(m).strip() for m in messages if m.get("role") in SYSTEM_ROLES) if t)
    turns = [(str(m.get("role")), message_text(m).strip()) for m in messages if m.get("role") not in SYSTEM_ROLES]
    last_user = turns.pop() if turns and turns[-1][0] != "assistant" else None
    lines = [f"{_label(role)} {text}".rstrip() for role, text in turns]
    if last_user is None:
        lines.append(ASSISTANT_LABEL)  # the chat ends with an assistant turn (or has none): continue it
    elif grounded:
        lines += [f"{QUESTION_LABEL} {last_user[1]}".rstrip(), ANSWER_LABEL]
    else:
        lines += [f"{USER_LABEL} {last_user[1]}".rstrip(), ASSISTANT_LABEL]
    head = f"{system}\n\n" if system else ""
    return bos + head + "\n".join(lines)


def completion_answer_rule(messages: Sequence[Message]) -> AnswerLines:
    """Where the answer to ``messages``, rendered by ``render_completion``, ends: at the end of its
    line, or, where the last user turn asks for steps or a list (or the answer opens one), after
    its list; and before any line that starts with a label, the sources' heading or head, or the
    first line of the system text (the instructions the prompt starts with)."""
    system = next((t for t in (message_text(m).strip() for m in messages if m.get("role") in SYSTEM_ROLES) if t), "")
    first_line = system.split("\n", 1)[0].strip()
    last = messages[-1] if messages else None
    question = message_text(last) if last is not None and last.get("role") not in SYSTEM_ROLES | {"assistant"} else ""
    return AnswerLines(
        labels=COMPLETION_LABELS,
        echoes=(first_line,) if len(first_line) >= MIN_ECHO_LINE else (),
        multiline=asks_for_list(question),
    )


def completion_renderer(bos: str = "") -> ChatRenderer:
    """``render_completion`` bound to a tokenizer's ``bos`` (a picklable callable: counters cross
    process boundaries)."""
    return _CompletionRenderer(bos)


@dataclass(frozen=True)
class _CompletionRenderer:
    bos: str

    def __call__(self, messages: Sequence[Message], *, grounded: bool = False) -> str:
        return render_completion(messages, bos=self.bos, grounded=grounded)


def resolve_format(setting: PromptFormat, has_chat_template: bool) -> Literal["chat", "completion"]:
    """The format a model is prompted in: ``setting`` unless ``auto``, which picks ``chat`` for a
    model with a chat template and ``completion`` for one without (a base model)."""
    if setting == "auto":
        return "chat" if has_chat_template else "completion"
    return setting
