"""Cutting a generated text at its stop sequences, token by token, without leaking them.

A local engine decodes the whole generation after every token and asks ``AnswerCutter`` what may
be sent now. Two things make that subtle in streaming:

* a stop sequence arrives in pieces (``"\\nQue"`` then ``"stion:"``): a tail of the text that may be
  the start of a stop sequence is held back until the next token shows whether it is one, so no
  part of a label reaches the client;
* a partial UTF-8 character decodes as U+FFFD until its last byte arrives: it is held back too.

With ``strip`` (the completion format) the answer is also trimmed: the prompt ends with
``Answer:``, so the model's first token usually starts with a space or a newline, which is not part
of the answer and must not end it either; trailing whitespace is held back and dropped at the end.

With ``lines`` (an ``AnswerLines`` rule: the completion format, a base model) the answer ends where
the *answer* ends, not at a fixed string: a one-line answer at the end of its line, a list or steps
over their following lines, and never on what a base model writes after an answer (a blank line then
prose, a next ``Question:``, a copy of the sources block or the instructions, a line it repeats).
A line is held back until the rule has decided it belongs to the answer.

The same cutter serves ``chat`` and ``chat_stream``, so a streamed answer is exactly the whole one
in pieces. Pure: no tokenizer, no torch.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


def merge_stops(*groups: Iterable[str]) -> list[str]:
    """Stop sequences from several sources (the prompt format's, the client's), empties dropped,
    each once, in order."""
    merged: list[str] = []
    for group in groups:
        for stop in group:
            if stop and stop not in merged:
                merged.append(stop)
    return merged


def stop_index(text: str, stops: Sequence[str]) -> int | None:
    """Where the earliest stop sequence starts in ``text``, or None."""
    found = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(found) if found else None


def safe_length(text: str, stops: Sequence[str], sent: int = 0) -> int:
    """How much of ``text`` can be sent now: not a trailing partial UTF-8 character (decoded as
    U+FFFD until its last byte arrives), and not a tail that may be the start of a stop sequence.

    ``sent``: how much of ``text`` an earlier call let through. A tail that may start a stop
    sequence never begins before it (had it, the earlier call would have held it), so only the
    unsent tail is read: a token costs what it adds, not the whole answer against every stop
    sequence (four stops of 100,000 characters against 8,000 generated ones took 19 ms a token).
    Only the places where a stop sequence's first character occurs are tried, longest first, and
    each by its last character before the whole; a tail longer than a stop is never read, and
    requests bound each stop (``ragserve.api.sampling.MAX_STOP_CHARS``)."""
    n = len(text)
    while n > sent and text[n - 1] == "\ufffd":
        n -= 1
    held = 0
    for s in stops:
        longest = min(len(s) - 1, n - sent)
        if longest <= held:
            continue
        start = text.find(s[0], n - longest, n - held)
        while start != -1:
            if s[n - start - 1] == text[n - 1] and s.startswith(text[start:n]):  # the last character first
                held = n - start
                break
            start = text.find(s[0], start + 1, n - held)
    return n - held


#: A list answer ends at the end of the line that reaches either (a length cap: a base model that
#: loops on new wordings of its lines, which the repeated-line rule does not catch, stops there).
MAX_ANSWER_LINES = 24
MAX_ANSWER_CHARS = 2000
#: How much of a prompt line a generated line must start with to be an echo of it.
ECHO_CHARS = 32

#: A numbered or bulleted line ("1. ", "2) ", "- ", "* ", "• ", "Step 3: "), after any indentation.
_LIST_ITEM = re.compile(r"[ \t]*(?:\d{1,3}[.)]|[-*+•]|[Ss]tep[ \t]+\d{1,3}[:.)]?)[ \t]+(?=\S)")
#: A line that could still become a list item or a code fence, its marker not yet followed by text.
_LIST_ITEM_START = re.compile(
    r"[ \t]*(?:\d{1,3}[.)]?|[-*+•]|`{1,2}|[Ss](?:t(?:e(?:p(?:[ \t]+\d{0,3}[:.)]?)?)?)?)?)[ \t]*"
)
#: A reStructuredText directive that introduces a block (``.. code-block:: sh``): it opens a list
#: answer as a line ending with ":" does.
_DIRECTIVE = re.compile(r"\.\. [\w-]+::")
#: The head of a numbered source of a RAG prompt, ``[2] (title)``: a copy of the sources block.
_SOURCE_HEAD = re.compile(r"\[\d{1,4}\] \(")
_SOURCE_HEAD_START = re.compile(r"\[(?:\d{1,4}(?:\] ?)?)?")
_FENCE = "```"
_TRAILING = " \t.,:;!?"
_MIN_REPEAT = 4  # shorter lines ("}", "fi") may repeat in an answer

#: Questions that ask for steps or a list: their answers may go on over the following lines.
_ASKS_FOR_LIST = re.compile(
    r"\b(?:how[ \t]+(?:do|can|should|would|could|does)[ \t]+(?:i|you|we|one)\b|how[ \t]+to\b|steps?\b|list\b"
    r"|enumerate\b|instructions?\b|procedure\b|ways[ \t]+to\b|walk[ \t]+me[ \t]+through\b"
    r"|what[ \t]+are[ \t]+(?:the|some)\b)",
    re.IGNORECASE,
)


def asks_for_list(question: str) -> bool:
    """Whether ``question`` asks for steps or a list ("How do I …", "What are the steps …", "List …")."""
    return _ASKS_FOR_LIST.search(question) is not None


def _content(line: str) -> str:
    """A line as compared for repetition: without its list marker, lower case, spaces collapsed. A
    prefix of a line gives a prefix of its content once its marker is known."""
    m = _LIST_ITEM.match(line)
    return " ".join((line[m.end() :] if m else line).lower().split())


def _announces(line: str) -> bool:
    """A line that announces what follows it, even after a blank line: "… the following command:",
    an rst directive (``.. code-block:: sh``)."""
    stripped = line.strip()
    return stripped.endswith(":") or _DIRECTIVE.match(stripped) is not None


def _opens_list(line: str) -> bool:
    """A first line that announces more lines: "… the following steps:", a list item, a code block."""
    return _announces(line) or _LIST_ITEM.match(line) is not None or line.strip().startswith(_FENCE)


_ACCEPT, _HOLD, _END = "accept", "hold", "end"


@dataclass(frozen=True)
class AnswerLines:
    """Where a completion-format answer ends, line by line (see the module's docstring).

    The first line is the answer unless it opens a list (ends with ":", is a numbered or bulleted
    line or a code block) or ``multiline`` (the question asks for steps or a list, ``asks_for_list``).
    A list answer goes on over the lines that follow it directly (items, their continuations, short
    paragraphs), and, after a blank line, over a list item, an indented line or a code fence, or
    anything when the line before the blank announced it (ends with ":", an rst directive). It
    ends before:

    * a blank line followed by anything else (what a base model writes after an answer);
    * a line starting with one of ``labels`` (the format's ``Question:``, ``User:``, …) or with the
      first ``ECHO_CHARS`` of one of ``echoes`` (the prompt's instructions), or a source head
      ``[n] (``: the model writing the prompt again;
    * a line it already wrote (its content, list marker aside): a loop;
    * and after the line that reaches ``max_lines`` or ``max_chars``.

    Any line, the first included, that starts with a label, an echo or a source head ends the answer
    there; except that a first line that is a source head is the model citing the source it goes on
    to copy, so the answer starts after it (``lead``). ``judge`` expects the answer's text with its
    leading whitespace and that head trimmed.
    """

    labels: tuple[str, ...] = ()
    echoes: tuple[str, ...] = ()
    multiline: bool = False
    max_lines: int = MAX_ANSWER_LINES
    max_chars: int = MAX_ANSWER_CHARS

    def lead(self, text: str) -> int | None:
        """How much of ``text`` (leading whitespace trimmed) comes before the answer: a first line that
        is a source head (``[2] (install.rst)``, then the source's words); None while its first line
        may be one and is not complete yet."""
        if _SOURCE_HEAD.match(text):
            nl = text.find("\n")
            return None if nl < 0 else nl + 1
        return None if _SOURCE_HEAD_START.fullmatch(text) and text else 0

    def judge(self, text: str, final: bool = False) -> tuple[int | None, int]:
        """``(end, ready)``: where the answer ends in ``text`` (None while not yet known) and how much
        of it is decided to belong to the answer (may be sent). ``final``: the generation ended
        after ``text``, so its last line is complete. Monotone: more text never takes back what an
        earlier call said was ready."""
        listing = self.multiline
        seen: set[str] = set()
        kept = 0  # lines of the answer (blank ones aside)
        answer_end = 0  # the answer so far ends here: after its last line
        after_blank = in_fence = announced = False
        start = 0
        while True:
            nl = text.find("\n", start)
            complete = nl >= 0 or final
            stop = nl if nl >= 0 else len(text)
            line = text[start:stop]
            if not line.strip():
                if start == 0 and complete:
                    return 0, 0  # no first line
                if not complete:
                    return None, answer_end  # nothing but spaces yet: the line is still open
                after_blank = not in_fence and not announced  # a blank line after "…:" announces more
            else:
                verdict = self._line(line, complete, after_blank, in_fence, seen)
                if verdict == _END:
                    return answer_end, answer_end
                if verdict == _HOLD:
                    return None, answer_end
                if not complete:
                    return None, len(text)
                answer_end, kept, after_blank = stop, kept + 1, False
                announced = _announces(line)
                content = _content(line).rstrip(_TRAILING)
                if len(content) >= _MIN_REPEAT and not in_fence:
                    seen.add(content)
                if line.lstrip().startswith(_FENCE):
                    in_fence = not in_fence
                if start == 0 and not listing and not _opens_list(line):
                    return stop, stop  # a one-line answer ends with its line
                listing = True
                if kept >= self.max_lines or stop >= self.max_chars:
                    return stop, stop
            if nl < 0:
                return answer_end, answer_end  # final: the generation ended here
            start = nl + 1

    def _line(self, line: str, complete: bool, after_blank: bool, in_fence: bool, seen: set[str]) -> str:
        """A non-blank line's verdict: part of the answer, the end of it, or not decided yet."""
        bare = line.lstrip()
        hold = False
        for head in self.labels:
            if bare.startswith(head):
                return _END
            hold = hold or head.startswith(bare)
        for echo in self.echoes:
            echo = echo[:ECHO_CHARS]
            if bare.startswith(echo):
                return _END
            hold = hold or echo.startswith(bare)
        if _SOURCE_HEAD.match(bare):
            return _END
        hold = hold or _SOURCE_HEAD_START.fullmatch(bare) is not None
        if in_fence:
            return _HOLD if hold and not complete else _ACCEPT
        if not complete and _LIST_ITEM_START.fullmatch(line):
            return _HOLD  # "2." may become "2. <a line already written>"
        if after_blank and not (_LIST_ITEM.match(line) or line[0] in " \t" or bare.startswith(_FENCE)):
            return _END  # a blank line, then prose: what comes after an answer
        content = _content(line)
        if complete:
            return _END if content.rstrip(_TRAILING) in seen else _ACCEPT
        partial = content.rstrip(_TRAILING)
        if hold or any(s.startswith(partial) for s in seen):
            return _HOLD
        return _ACCEPT


class AnswerCutter:
    """Feeds on the decoded text so far; says what is new and safe to send, and whether the answer
    has ended (a stop sequence, or the ``lines`` rule)."""

    def __init__(self, stops: Sequence[str], strip: bool = False, lines: AnswerLines | None = None):
        self.stops = list(stops)
        self.strip = strip
        self.lines = lines
        self.sent = 0
        self.stopped = False
        self._answer = ""

    def _visible(self, text: str) -> str:
        if not self.strip:
            return text
        text = text.lstrip()
        if self.lines is not None:
            lead = self.lines.lead(text)
            text = "" if lead is None else text[lead:].lstrip()
        return text

    def _judge(self, body: str, final: bool) -> tuple[int | None, int]:
        if self.lines is None:
            return (len(body) if final else None), len(body)
        if not final:  # a partial UTF-8 character may still change: judge the text before it
            body = body.rstrip("\ufffd")
        return self.lines.judge(body, final)

    def feed(self, text: str) -> str:
        """``text``: everything decoded so far. Returns the piece to send now (maybe empty); once the
        answer has ended, ``stopped`` is set and the answer is final."""
        if self.stopped:
            return ""
        visible = self._visible(text)
        cut = stop_index(visible, self.stops)
        body = visible if cut is None else visible[:cut]
        end, ready = self._judge(body, final=cut is not None)
        if end is not None:
            self.stopped = True
            self._answer = body[: max(end, self.sent)]
            return ""
        self._answer = body
        ready = min(ready, safe_length(body, self.stops, min(self.sent, len(body))))
        if self.strip:
            ready = max(self.sent, len(body[:ready].rstrip()))
        piece = body[self.sent : ready] if ready > self.sent else ""
        self.sent = max(self.sent, ready)
        return piece

    def finish(self) -> str:
        """The rest of the answer, once generation has ended (stopped, end of sequence, or length).
        With ``lines``, the answer may end before the end of the text (then ``stopped`` is set)."""
        if not self.stopped and self.lines is not None:
            end, _ = self.lines.judge(self._answer, final=True)
            if end is not None and len(self._answer[:end].rstrip()) < len(self._answer.rstrip()):
                self.stopped = True
                self._answer = self._answer[: max(end, self.sent)]
        answer = self._answer.rstrip() if self.strip else self._answer
        rest = answer[self.sent :] if len(answer) > self.sent else ""
        self.sent += len(rest)
        return rest

    @property
    def text(self) -> str:
        """The whole answer as it stands (final after ``finish``)."""
        return self._answer.rstrip() if self.strip else self._answer
