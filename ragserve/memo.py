"""Values computed from a text, remembered by the exact text and bounded by the memory they hold.

One mechanism for the pure functions of a text that a RAG chat computes again for every question
that retrieves the same sources: a text's token count (``ragserve.models.tokenizers``), a
sentence's terms, a passage's model text and a source's reading (``ragserve.rag.evidence``). A
value is a pure function of its text, so a remembered one is the value itself (docs/architecture.md §5;
the measurements are in docs/benchmarks.md, "Remembered counts and terms").

The bound is in *units*, about a byte each: the text's size in memory (``sys.getsizeof``: a
character of emoji text is four bytes), ``entry_units`` for the entry
itself (so a million one-letter texts are bounded too), and what ``weigh`` says the value holds. A
text longer than ``max_text_chars`` is computed and not kept: one huge prompt neither evicts every
remembered source nor is worth keeping. Least recently used first out. Thread-safe: the budget is
fitted in worker threads; the value is computed outside the lock, so two threads may compute one
text, and none waits for another's computation. Values are shared between callers, so they must
be immutable (ints, strings, frozensets, tuples). Pickles as an empty memo of the same bounds.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, TypeVar

V = TypeVar("V")

#: What an entry costs besides its text and value: the dict slot, the key's object, the value's.
ENTRY_UNITS = 100


def _nothing(value: object) -> int:
    return 0


class TextMemo(Generic[V]):
    """``compute(text)``, remembered (see the module's docstring)."""

    def __init__(
        self,
        max_units: int,
        max_text_chars: int | None = None,
        weigh: Callable[[V], int] = _nothing,
        entry_units: int = ENTRY_UNITS,
    ):
        if max_units < 0 or entry_units < 0 or (max_text_chars is not None and max_text_chars < 0):
            raise ValueError("a TextMemo's bounds must be >= 0")
        self.max_units = max_units
        self.max_text_chars = max_units if max_text_chars is None else max_text_chars
        self.entry_units = entry_units
        self._weigh = weigh
        self._empty()

    def _empty(self) -> None:
        self._data: OrderedDict[str, tuple[V, int]] = OrderedDict()
        self._units = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, text: str, compute: Callable[[str], V]) -> V:
        """``compute(text)``, the remembered one if there is one."""
        if len(text) > self.max_text_chars:
            return compute(text)
        found = self._data.get(text)  # a hit takes no lock (one dict read is atomic), a chat asks thousands
        if found is not None:
            self.hits += 1  # an increment lost to another thread's only undercounts
            if self._lock.acquire(blocking=False):  # most recently used, unless another thread is writing
                try:
                    self._data.move_to_end(text)
                except KeyError:  # evicted since
                    pass
                finally:
                    self._lock.release()
            return found[0]
        self.misses += 1
        value = compute(text)  # outside the lock: nobody waits for another thread's computation
        cost = sys.getsizeof(text) + self.entry_units + self._weigh(value)
        if cost > self.max_units:
            return value
        with self._lock:
            if text not in self._data:
                self._data[text] = (value, cost)
                self._units += cost
                while self._units > self.max_units:
                    _, (_, old) = self._data.popitem(last=False)
                    self._units -= old
        return value

    def clear(self) -> None:
        """Forget every value, and the hits and misses counted."""
        with self._lock:
            self._data.clear()
            self._units = 0
            self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, text: object) -> bool:
        return text in self._data

    @property
    def units(self) -> int:
        """What the memo holds against ``max_units``."""
        return self._units

    def __getstate__(self) -> dict[str, Any]:
        return {
            "max_units": self.max_units,
            "max_text_chars": self.max_text_chars,
            "weigh": self._weigh,
            "entry_units": self.entry_units,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.max_units = int(state["max_units"])
        self.max_text_chars = int(state["max_text_chars"])
        self._weigh = state["weigh"]
        self.entry_units = int(state["entry_units"])
        self._empty()


class Remembered(Generic[V]):
    """A function of one text with its own ``TextMemo``: ``f(text)`` computes once per text, within
    the memo's bounds. ``memo`` is there to read its size and hits, and to ``clear`` it."""

    def __init__(self, fn: Callable[[str], V], memo: TextMemo[V]):
        self._fn = fn
        self.memo = memo
        self.__name__ = getattr(fn, "__name__", "remembered")
        self.__qualname__ = getattr(fn, "__qualname__", self.__name__)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __call__(self, text: str) -> V:
        return self.memo.get(text, self._fn)


def remembered(
    max_units: int, max_text_chars: int | None = None, weigh: Callable[[Any], int] = _nothing
) -> Callable[[Callable[[str], V]], Remembered[V]]:
    """A decorator: the function's values are remembered in a ``TextMemo`` of these bounds."""

    def wrap(fn: Callable[[str], V]) -> Remembered[V]:
        return Remembered(fn, TextMemo(max_units, max_text_chars, weigh))

    return wrap
