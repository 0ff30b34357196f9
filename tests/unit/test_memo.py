"""Values remembered by their text (``ragserve.memo.TextMemo``): the same values, in a bounded
memory, safe across threads and across a pickle; and the token counters that remember their counts
with it (the generator's counter travels to the ingress, perhaps from an older replica)."""

from __future__ import annotations

import pickle
import sys
import threading

import pytest

from ragserve.memo import ENTRY_UNITS, TextMemo, remembered
from ragserve.models.gemma import render_gemma
from ragserve.models.tokenizers import (
    MEMO_MAX_TEXT_CHARS,
    HFTokenCounter,
    TiktokenCounter,
    load_tiktoken_encoding,
)

TEXTS = [
    "Line 3's pump is serviced every 30 minutes by the night shift, as the manual says. " * k for k in range(1, 12)
] + ["Ünïcödé — 日本語のテキスト, emoji 🙂 and a lone\u00a0space. " * 4, "user", "x"]


def _length(text: str) -> int:
    return len(text.split())


def test_a_remembered_count_is_the_count_and_each_text_is_counted_once() -> None:
    memo = TextMemo(100_000)
    calls: list[str] = []

    def count(text: str) -> int:
        calls.append(text)
        return _length(text)

    for _ in range(3):
        assert [memo.get(t, count) for t in TEXTS] == [_length(t) for t in TEXTS]
    assert calls == TEXTS and len(memo) == len(TEXTS)  # short ones too: a lookup is cheaper than a count
    assert memo.units == sum(sys.getsizeof(t) + ENTRY_UNITS for t in TEXTS)


def test_the_memo_keeps_within_its_bound_dropping_the_least_recently_used() -> None:
    memo = TextMemo(1_300)
    texts = [f"{i:04d} " + "word " * 40 for i in range(50)]  # 205 characters, 254 bytes, 354 with the entry's cost
    for t in texts:
        memo.get(t, _length)
        assert memo.units <= 1_300
    assert len(memo) == 3
    kept_first = texts[-3]
    memo.get(kept_first, _length)  # used again: the newest now
    memo.get(texts[0], _length)  # a fourth: the oldest goes, which is not kept_first
    calls: list[str] = []
    memo.get(kept_first, lambda t: calls.append(t) or 0)
    assert calls == [] and memo.units <= 1_300
    assert memo.get("y" * 2_000, _length) == 1 and memo.units <= 1_300  # larger than the bound: counted, not kept
    tiny = TextMemo(10 * (sys.getsizeof(chr(0x4E00)) + ENTRY_UNITS))
    for i in range(1_000):  # many one-character texts: the entries' cost bounds them
        tiny.get(chr(0x4E00 + i), _length)
    assert len(tiny) == 10
    emoji = TextMemo(10_000)
    for i in range(100):  # a character of emoji text is 4 bytes: charged as such, not as one
        emoji.get(f"{i:03d}" + "\U0001f600" * 200, _length)
        assert emoji.units <= 10_000
    assert len(emoji) == 10_000 // (sys.getsizeof("\U0001f600" * 203) + ENTRY_UNITS)


def test_a_memo_of_no_characters_remembers_nothing_and_a_negative_bound_is_refused() -> None:
    memo = TextMemo(0)
    assert memo.get(TEXTS[3], _length) == _length(TEXTS[3]) and len(memo) == 0
    with pytest.raises(ValueError):
        TextMemo(-1)


def test_counts_on_many_threads_at_once_are_the_counts() -> None:
    memo = TextMemo(2_000)  # small: threads evict each other's texts all the time
    texts = [f"{i} " + "token " * (i % 30 + 10) for i in range(200)]
    errors: list[str] = []

    def work(seed: int) -> None:
        for k in range(600):
            t = texts[(seed * 7 + k * 13) % len(texts)]
            if memo.get(t, _length) != _length(t):
                errors.append(t)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == [] and memo.units <= 2_000
    assert memo.units == sum(sys.getsizeof(t) + ENTRY_UNITS for t in memo._data)


@pytest.fixture(scope="module")
def counters(embedding_model) -> list:
    encoding = load_tiktoken_encoding()
    assert encoding is not None
    return [
        TiktokenCounter(encoding),
        HFTokenCounter(embedding_model.tokenizer),
        HFTokenCounter(embedding_model.tokenizer, render=render_gemma),
    ]


def test_the_counters_count_the_same_with_their_memo_and_without(counters) -> None:
    for counter in counters:
        fresh = pickle.loads(pickle.dumps(counter))  # an empty memo
        assert len(fresh.memo) == 0 and fresh.memo.max_units == counter.memo.max_units
        off = pickle.loads(pickle.dumps(counter))
        off.memo = TextMemo(0)
        for text in TEXTS * 2:
            assert counter.count_text(text) == off.count_text(text) == fresh.count_text(text)
            chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]
            for grounded in (False, True):
                want = off.count_messages(chat, grounded=grounded)
                assert counter.count_messages(chat, grounded=grounded) == want
        assert len(counter.memo) > 0 and len(off.memo) == 0


def test_what_a_value_holds_counts_against_the_bound_and_a_long_text_is_not_kept() -> None:
    memo: TextMemo[tuple[str, ...]] = TextMemo(5_000, max_text_chars=200, weigh=lambda v: sum(map(len, v)))
    words = memo.get("alpha beta gamma", lambda t: tuple(t.split()))
    assert words == ("alpha", "beta", "gamma") and memo.units == sys.getsizeof("alpha beta gamma") + ENTRY_UNITS + 14
    assert memo.get("x " * 150, lambda t: tuple(t.split())) == ("x",) * 150 and "x " * 150 not in memo  # > 200 chars
    heavy = memo.get("heavy", lambda t: (t * 2_000,))  # its value alone outweighs the memo
    assert heavy == ("heavy" * 2_000,) and "heavy" not in memo and memo.units <= 5_000
    for i in range(200):  # values weigh ~900 units: the bound holds by value, not by entry count
        memo.get(f"{i:03d}", lambda t: (t * 300,))
        assert memo.units <= 5_000
    assert len(memo) == 4  # 1,003 units each: a fifth would pass 5,000


def test_remembered_computes_each_text_once_and_clears() -> None:
    calls: list[str] = []

    @remembered(10_000)
    def upper(text: str) -> str:
        """Upper case."""
        calls.append(text)
        return text.upper()

    assert [upper(t) for t in ("a", "b", "a", "a")] == ["A", "B", "A", "A"]
    assert calls == ["a", "b"] and upper.memo.hits == 2 and upper.memo.misses == 2
    assert upper.__name__ == "upper" and upper.__doc__ == "Upper case."
    upper.memo.clear()
    assert len(upper.memo) == 0 and upper.memo.units == 0 and upper("a") == "A" and calls[-1] == "a"


def test_a_memo_pickles_empty_with_its_bounds() -> None:
    memo: TextMemo[int] = TextMemo(9_000, max_text_chars=300, entry_units=7)
    memo.get("some text", len)
    copy = pickle.loads(pickle.dumps(memo))
    assert len(copy) == 0 and copy.units == 0
    assert (copy.max_units, copy.max_text_chars, copy.entry_units) == (9_000, 300, 7)
    assert copy.get("some text", len) == 9 and len(copy) == 1
    with pytest.raises(ValueError):
        TextMemo(10, max_text_chars=-1)


def test_a_counter_pickled_without_a_memo_still_counts(counters) -> None:
    """An older replica's counter (before counts were remembered) has no memo in its state."""
    for counter in counters:
        state = dict(counter.__dict__)
        state.pop("_memo", None)
        old = type(counter).__new__(type(counter))
        old.__dict__.update(state)
        assert old.count_text(TEXTS[4]) == counter.count_text(TEXTS[4]) and len(old.memo) == 1


def test_a_counter_pickled_with_the_old_length_memo_unpickles_and_counts(counters) -> None:
    """A replica of the release before TextMemo pickled its counter with a ``LengthMemo`` (state
    ``{"max_chars": ...}``) under ``memo``: the name still unpickles, and the counter counts with a
    memo of its own."""
    from ragserve.models.tokenizers import LengthMemo

    for counter in counters:
        old = type(counter).__new__(type(counter))
        state = {k: v for k, v in counter.__dict__.items() if k != "_memo"}
        memo = LengthMemo()
        memo.__dict__["max_chars"] = 4_000_000  # what the old memo's __getstate__ gave
        old.__dict__.update(state, memo=memo)
        loaded = pickle.loads(pickle.dumps(old))
        assert loaded.count_text(TEXTS[4]) == counter.count_text(TEXTS[4])
        assert isinstance(loaded.memo, TextMemo) and len(loaded.memo) == 1


def test_a_counter_counts_an_unusually_long_text_without_keeping_it(counters) -> None:
    long_text = "A long prompt about pumps. " * (MEMO_MAX_TEXT_CHARS // 27 + 1)
    for counter in counters:
        counter.memo.get(TEXTS[2], counter._encoded_length)
        before = len(counter.memo)
        n = counter.count_text(long_text)
        assert n == counter._encoded_length(long_text) and long_text not in counter.memo
        assert TEXTS[2] in counter.memo and len(counter.memo) == before


def test_tiktoken_counts_a_run_of_whitespace_too_long_for_its_regex() -> None:
    """tiktoken refuses ~1 M spaces whole ("Max stack size exceeded for backtracking"): the count
    is taken in pieces instead of a 500, and a chat holding such a run is counted too."""
    encoding = load_tiktoken_encoding()
    assert encoding is not None
    counter = TiktokenCounter(encoding)
    for blank in (" ", "\t", "\u3000"):
        text = "a" + blank * 1_000_000 + "b"
        n = counter.count_text(text)
        assert 2 < n <= len(text)
        pieces = -(-len(text) // 100_000)
        whole = sum(counter.count_text(text[i : i + 100_000]) for i in range(0, len(text), 100_000))
        assert abs(n - whole) <= pieces
        assert counter.count_messages([{"role": "user", "content": text}]) > n
