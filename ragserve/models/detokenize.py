"""The text of a generation, one token at a time, at a constant cost a token.

A local engine used to decode every token id generated so far after each new token (a tokenizer's
``decode`` of the whole list, on the event loop): 7.7 ms a token at 8,000 tokens with Gemma's
tokenizer, so a long answer cost the square of its length. :class:`IncrementalDecoder` decodes
only the newest tokens beside a few before them, the way vLLM's and TGI's detokenizers do: the
tokens before give the new piece its context (a word's leading space, which a tokenizer may drop
at the start of what it decodes), and the text grows by what decoding the newest token adds to
decoding its context alone.

A token that ends inside a UTF-8 character (a byte-fallback token) decodes as U+FFFD until the
character's last byte arrives: such a tail stays pending and is shown as ``decode`` shows it, so
``text`` is what ``decode`` of all the ids gives. A tail still pending after ``MAX_PENDING`` tokens
is not a character that will complete (a character is at most four bytes): it is settled as it
decodes, so the cost stays bounded whatever a model writes. Should the context decode otherwise
beside the new token than alone (a settled U+FFFD that a later byte completes, after such a tail),
the whole list is decoded afresh once.

Pure: ``decode`` is any function from token ids to text (a tokenizer's, with its options bound).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

#: Tokens a pending tail may hold before it is settled as it decodes (module docstring).
MAX_PENDING = 8


class IncrementalDecoder:
    """``add`` a token id at a time; ``text`` is what ``decode`` gives for all of them."""

    def __init__(self, decode: Callable[[Sequence[int]], str]):
        self._decode = decode
        self.ids: list[int] = []
        self._settled = ""  # the text of ids[:_read]
        self._context = 0  # ids[_context:_read]: decoded again beside each new token
        self._read = 0
        self._pending = ""  # what ids[_read:] add, while they end inside a character

    @property
    def text(self) -> str:
        return self._settled + self._pending

    def add(self, token: int) -> str:
        """Add ``token``; the whole text so far."""
        self.ids.append(token)
        before = self._decode(self.ids[self._context : self._read])
        after = self._decode(self.ids[self._context :])
        if not after.startswith(before):  # the context decodes otherwise beside the new token: all afresh
            self._settled, self._pending = self._decode(self.ids), ""
            self._context, self._read = len(self.ids) - 1, len(self.ids)
            return self._settled
        added = after[len(before) :]
        # a tail that adds nothing yet (a byte that continues a character) stays pending as one ending
        # inside a character does: moving the context past it would split that character
        if (not added or added.endswith("\ufffd")) and len(self.ids) - self._read < MAX_PENDING:
            self._pending = added
        else:
            self._settled += added
            self._pending = ""
            self._context, self._read = self._read, len(self.ids)
        return self.text
