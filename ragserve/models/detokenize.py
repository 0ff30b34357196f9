"""The text of a generation, one token at a time, at a bounded cost a token.

A local engine used to decode every token id generated so far after each new token (a tokenizer's
``decode`` of the whole list, on the event loop): 4.9 ms a token at 16,000 tokens with Gemma's
tokenizer, so a long answer cost the square of its length. :class:`IncrementalDecoder` decodes a
short window instead, the way vLLM's and TGI's detokenizers do:

- the text is ``head`` (the text of ``ids[:start]``, fixed) plus the window ``ids[start:]``
  decoded;
- the window moves on (``start`` to where the last step that ended cleanly ended) each time its
  text ends cleanly: longer than before, not ending in U+FFFD. So the window always starts where a
  character starts and holds the token before the newest as context: a word's leading space (which
  a tokenizer may drop at the start of what it decodes) and a character written as several byte
  tokens come out as decoding everything gives them. A byte-fallback decoder (Gemma, Llama) shows
  a whole run of byte tokens as U+FFFD while any character of it is incomplete; the window holds
  such a run from a character's start, so it decodes right once the character completes;
- tokens that add nothing (skipped special tokens) or end inside a character wait in the window;
  after ``MAX_PENDING`` of them it moves on regardless, but for the last ``CHARACTER_TAIL`` or so
  (a character is at most four bytes: one begun before them either completed or never will; the
  cut is put where both sides decode as the whole did, when such a place is near), so a token
  costs a few decodes of a short window whatever a model writes.

Text a model writes in whole characters comes out as decoding everything gives it, at every token
(tests: random byte streams, a byte-fallback decoder that strips leading spaces, Gemma's own
tokenizer). Bytes that never complete a character differ in one way: a byte-fallback decoder shows
the whole run they are in as U+FFFD, where this shows the characters of the run that came whole.

Left: after more than ``MAX_PENDING`` tokens that add nothing in a row, a decoder that drops the
leading space of what it decodes drops the next word's space; and a tokenizer's clean-up of spaces
(`` n't`` to ``n't``), where a model's configuration asks for it, sees only the window (neither
applies to the packaged Gemma: no clean-up, no stripped space).

Pure: ``decode`` is any function from token ids to text (a tokenizer's, with its options bound).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

#: Tokens the window may hold past its context before it moves on regardless (module docstring).
MAX_PENDING = 16
#: Tokens kept in the window when it moves on regardless: a character's bytes after its first.
CHARACTER_TAIL = 3


class IncrementalDecoder:
    """``add`` a token id at a time; ``text`` is the text so far (module docstring)."""

    def __init__(self, decode: Callable[[Sequence[int]], str]):
        self._decode = decode
        self.ids: list[int] = []
        self._head = ""  # what ids[:_start] contributed
        self._start = 0  # the window: ids[_start:]
        self._read = 0  # ids[_start:_read]: the context
        self._alone = ""  # the context decoded from the window's start
        self._said = ""  # what the context contributed (decoded where it came)
        self._pending = ""  # what ids[_read:] add so far, while they do not end cleanly

    @property
    def text(self) -> str:
        return self._head + self._said + self._pending

    def add(self, token: int) -> str:
        """Add ``token``; the whole text so far."""
        self.ids.append(token)
        window = self._decode(self.ids[self._start :])
        alone = self._alone
        if not window.startswith(alone):  # a byte-fallback run shown as U+FFFD: the context decodes otherwise now
            if window.endswith("\ufffd") and len(self.ids) - self._read < MAX_PENDING:
                self._pending = ""  # nothing new to show until the character completes
                return self.text
            self._head += window  # settled as the window decodes now, context and all
            self._said = self._alone = self._pending = ""
            self._start = self._read = len(self.ids)
            return self.text
        added = window[len(alone) :]
        if added and not added.endswith("\ufffd"):  # ends cleanly: the newest tokens become the context
            self._head += self._said
            self._said, self._pending = added, ""
            self._start, self._read = self._read, len(self.ids)
            self._alone = self._decode(self.ids[self._start :])
        elif len(self.ids) - self._read >= MAX_PENDING:  # never completing: settled as it decodes
            self._move_on(window)
        else:
            self._pending = added
        return self.text

    def _move_on(self, window: str) -> None:
        """Settle the window but for its newest ``CHARACTER_TAIL`` tokens (a character they may still
        complete), cut where its two parts decode to the window's text, if such a place is near."""
        end = len(self.ids)
        cut, head, rest = end - CHARACTER_TAIL, "", ""
        for at in range(cut, max(self._read, end - MAX_PENDING), -1):
            head, rest = self._decode(self.ids[self._start : at]), self._decode(self.ids[at:])
            if head + rest == window:
                cut = at
                break
        else:
            head, rest = self._decode(self.ids[self._start : cut]), self._decode(self.ids[cut:])
        # what the context said stands; the rest of the window's text to the cut follows it
        self._head += self._said + head[len(self._alone) :] if head.startswith(self._alone) else head
        self._start = self._read = cut
        self._said = self._alone = ""
        self._pending = rest
