"""The text of a generation, one token at a time, at a bounded cost a token.

A local engine used to decode every token id generated so far after each new token (a tokenizer's
``decode`` of the whole list, on the event loop): 4.9 ms a token at 16,000 tokens with Gemma's
tokenizer, so a long answer cost the square of its length. :class:`IncrementalDecoder` decodes a
short window instead, the way vLLM's and TGI's detokenizers do:

- the text is a fixed head (what the tokens before the window contributed) plus the window
  decoded;
- the window moves on (to the tokens after its context) each time its text ends cleanly: longer
  than before, not ending in U+FFFD. So the window starts where a character starts and holds the
  tokens before the newest as context: a word's leading space (which a tokenizer may drop at the
  start of what it decodes) and a character written as several byte tokens come out as decoding
  everything gives them. A byte-fallback decoder (Gemma, Llama) shows a whole run of byte tokens as
  U+FFFD while any character of it is incomplete; the window holds such a run from a character's
  start, so it decodes right once the character completes;
- tokens that ``decode`` skips wherever they are (``silent``: special tokens, found once by
  ``silent_tokens``) never enter the window, so any run of them costs nothing and changes nothing;
- tokens that end inside a character (a byte-level BPE's tokens may cross characters' boundaries
  for long stretches of emoji or CJK) wait in the window; every ``MAX_PENDING`` of them, it moves on
  to a place among the newest where both sides decode as the whole window did (a boundary of
  characters), if there is one; after ``MAX_WINDOW`` it moves on regardless, but for the last
  ``CHARACTER_TAIL`` tokens. A token costs a few decodes of a window of at most ``MAX_WINDOW``
  tokens whatever a model writes (a few dozen ids on average where tokens end at characters'
  boundaries now and then; a few hundred where they never do).

Text a model writes in whole characters comes out as decoding everything gives it, at every token
(tests: random byte streams, byte-fallback and byte-level decoders, runs of skipped special tokens,
Gemma's own tokenizer). Bytes that never complete a character differ in one way: a byte-fallback
decoder shows the whole run they are in as U+FFFD, where this may show the characters of the run
that came whole (and a decoder that strips the leading space of what it decodes keeps the space
after them).

Left: in a stream that writes U+FFFD itself (its bytes, or tokens of it) the window cannot tell an
incomplete character from a replacement character, and may break a character written in byte
tokens after it (19 of 11,379 streams made of such runs, with Gemma's tokenizer); a tokenizer's
clean-up of spaces (`` n't`` to ``n't``), where a model's configuration asks
for it, sees only the window; a window that finds no boundary of characters in ``MAX_WINDOW``
tokens breaks the character it is cut in (neither applies to the packaged Gemma: no clean-up, and
its tokens end at characters' boundaries).

Pure: ``decode`` is any function from token ids to text (a tokenizer's, with its options bound).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

#: Tokens past the context after which the window tries to move on without ending cleanly (at a
#: place where both sides decode as the whole did), and tries again every as many tokens after.
MAX_PENDING = 16
#: Tokens past the context after which the window moves on regardless (module docstring).
MAX_WINDOW = 256
#: Tokens kept in the window when it moves on regardless: a character's bytes after its first.
CHARACTER_TAIL = 3


class IncrementalDecoder:
    """``add`` a token id at a time; ``text`` is the text so far (module docstring). ``silent``:
    token ids that ``decode`` skips wherever they are (a tokenizer's special tokens, decoded with
    ``skip_special_tokens``), kept out of the window."""

    def __init__(self, decode: Callable[[Sequence[int]], str], silent: Collection[int] = ()):
        self._decode = decode
        self._silent = silent
        self.ids: list[int] = []
        self._head = ""  # what the tokens before the window contributed
        self._window: list[int] = []  # the context (the first _read ids) and the tokens after it
        self._read = 0
        self._alone = ""  # the context decoded on its own
        self._said = ""  # what the context contributed (decoded where it came)
        self._pending = ""  # what the tokens after the context add so far, while they do not end cleanly

    @property
    def text(self) -> str:
        return self._head + self._said + self._pending

    def add(self, token: int) -> str:
        """Add ``token``; the whole text so far."""
        self.ids.append(token)
        if token in self._silent:
            return self.text
        self._window.append(token)
        text = self._decode(self._window)
        waiting = len(self._window) - self._read
        if not text.startswith(self._alone):  # a byte-fallback run shown as U+FFFD: the context decodes otherwise now
            if text.endswith("\ufffd") and waiting < MAX_WINDOW:
                self._pending = ""  # nothing new to show until the character completes
            else:  # settled as the window decodes now, context and all; its last token stays as context
                self._head += text
                self._settle(self._window[-1:], "", "")
            return self.text
        added = text[len(self._alone) :]
        if added and not added.endswith("\ufffd"):  # ends cleanly: the newest tokens become the context
            self._head += self._said
            self._settle(self._window[self._read :], added, "")
        elif waiting >= MAX_WINDOW:  # never completing: settled as it decodes but for the newest tokens
            self._cut(len(self._window) - CHARACTER_TAIL)
        elif waiting % MAX_PENDING != 0 or not self._move_on(text):
            self._pending = added
        return self.text

    def _settle(self, context: list[int], said: str, pending: str) -> None:
        self._window, self._read = context, len(context)
        self._alone = self._decode(context) if context else ""
        self._said, self._pending = said, pending

    def _move_on(self, text: str) -> bool:
        """Move the window on to the newest place among the last ``MAX_PENDING`` where both sides
        decode as the whole window did and the text before it ends in a whole character (a boundary
        of characters), else where both sides decode as the whole did before the newest
        ``CHARACTER_TAIL`` tokens (a byte-fallback decoder shows an incomplete run of byte tokens as
        one U+FFFD a byte, so a cut inside one also decodes as the whole did). False if neither."""
        end = len(self._window)
        low = max(self._read, end - MAX_PENDING)
        tried: dict[int, tuple[str, str]] = {}
        for at in range(end - 1, low, -1):
            before, rest = tried[at] = self._decode(self._window[:at]), self._decode(self._window[at:])
            if before + rest == text and not before.endswith("\ufffd"):
                self._cut(at, before, rest)
                return True
        for at in range(end - CHARACTER_TAIL, low, -1):
            before, rest = tried[at]
            if before + rest == text:
                self._cut(at, before, rest)
                return True
        return False

    def _cut(self, at: int, before: str | None = None, rest: str | None = None) -> None:
        """Settle the window's tokens before ``at`` (``before``: their text decoded from the window's
        start); those from ``at`` on stay in it, pending (``rest``: their text)."""
        before = self._decode(self._window[:at]) if before is None else before
        rest = self._decode(self._window[at:]) if rest is None else rest
        # what the context said stands; the window's text up to the cut follows it
        self._head += self._said + before[len(self._alone) :] if before.startswith(self._alone) else before
        tail = self._window[at:]
        self._window, self._read, self._alone, self._said, self._pending = tail, 0, "", "", rest


def silent_tokens(
    decode: Callable[[Sequence[int]], str], candidates: Collection[int], probe: Sequence[int]
) -> frozenset[int]:
    """The ``candidates`` (a tokenizer's special tokens) that ``decode`` skips wherever they are:
    each placed inside ``probe`` (a few ordinary tokens) leaves its text as it was."""
    if len(probe) < 2:
        return frozenset()
    whole, mid = decode(probe), len(probe) // 2
    return frozenset(t for t in candidates if decode([*probe[:mid], t, *probe[mid:]]) == whole and decode([t]) == "")
