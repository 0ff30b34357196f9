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

The same cutter serves ``chat`` and ``chat_stream``, so a streamed answer is exactly the whole one
in pieces. Pure: no tokenizer, no torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


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


def safe_length(text: str, stops: Sequence[str]) -> int:
    """How much of ``text`` can be sent now: not a trailing partial UTF-8 character (decoded as
    U+FFFD until its last byte arrives), and not a tail that may be the start of a stop sequence."""
    n = len(text)
    while n > 0 and text[n - 1] == "\ufffd":
        n -= 1
    held = 0
    for s in stops:
        for k in range(min(len(s) - 1, n), held, -1):
            if text.endswith(s[:k], 0, n):
                held = k
                break
    return n - held


class AnswerCutter:
    """Feeds on the decoded text so far; says what is new and safe to send, and whether a stop
    sequence ended the answer."""

    def __init__(self, stops: Sequence[str], strip: bool = False):
        self.stops = list(stops)
        self.strip = strip
        self.sent = 0
        self.stopped = False
        self._answer = ""

    def _visible(self, text: str) -> str:
        return text.lstrip() if self.strip else text

    def feed(self, text: str) -> str:
        """``text``: everything decoded so far. Returns the piece to send now (maybe empty); once a
        stop sequence is seen, ``stopped`` is set and the answer is final."""
        if self.stopped:
            return ""
        visible = self._visible(text)
        cut = stop_index(visible, self.stops)
        if cut is not None:
            self.stopped = True
            self._answer = visible[: max(cut, self.sent)]
            return ""
        self._answer = visible
        ready = safe_length(visible, self.stops)
        if self.strip:
            ready = max(self.sent, len(visible[:ready].rstrip()))
        piece = visible[self.sent : ready] if ready > self.sent else ""
        self.sent = max(self.sent, ready)
        return piece

    def finish(self) -> str:
        """The rest of the answer, once generation has ended (stopped, end of sequence, or length)."""
        answer = self._answer.rstrip() if self.strip else self._answer
        rest = answer[self.sent :] if len(answer) > self.sent else ""
        self.sent += len(rest)
        return rest

    @property
    def text(self) -> str:
        """The whole answer as it stands (final after ``finish``)."""
        return self._answer.rstrip() if self.strip else self._answer
