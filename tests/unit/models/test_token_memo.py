"""The token counters remember the counts of long texts (``LengthMemo``): the same counts, in a
bounded memory, safe across threads and across a pickle (the generator's counter travels)."""

from __future__ import annotations

import pickle
import threading

import pytest

from ragserve.models.gemma import render_gemma
from ragserve.models.tokenizers import (
    MEMO_ENTRY_CHARS,
    HFTokenCounter,
    LengthMemo,
    TiktokenCounter,
    load_tiktoken_encoding,
)

TEXTS = [
    "Line 3's pump is serviced every 30 minutes by the night shift, as the manual says. " * k for k in range(1, 12)
] + ["Ünïcödé — 日本語のテキスト, emoji 🙂 and a lone\u00a0space. " * 4, "user", "x"]


def _length(text: str) -> int:
    return len(text.split())


def test_a_remembered_count_is_the_count_and_each_text_is_counted_once() -> None:
    memo = LengthMemo(max_chars=100_000)
    calls: list[str] = []

    def count(text: str) -> int:
        calls.append(text)
        return _length(text)

    for _ in range(3):
        assert [memo.length(t, count) for t in TEXTS] == [_length(t) for t in TEXTS]
    assert calls == TEXTS and len(memo) == len(TEXTS)  # short ones too: a lookup is cheaper than a count
    assert memo.chars == sum(len(t) + MEMO_ENTRY_CHARS for t in TEXTS)


def test_the_memo_keeps_within_its_bound_dropping_the_least_recently_used() -> None:
    memo = LengthMemo(max_chars=1_300)
    texts = [f"{i:04d} " + "word " * 40 for i in range(50)]  # 205 characters each, 305 with the entry's cost
    for t in texts:
        memo.length(t, _length)
        assert memo.chars <= 1_300
    assert len(memo) == 4
    kept_first = texts[-4]
    memo.length(kept_first, _length)  # used again: the newest now
    memo.length(texts[0], _length)  # a fifth: the oldest goes, which is not kept_first
    calls: list[str] = []
    memo.length(kept_first, lambda t: calls.append(t) or 0)
    assert calls == [] and memo.chars <= 1_300
    assert memo.length("y" * 2_000, _length) == 1 and memo.chars <= 1_300  # larger than the bound: counted, not kept
    tiny = LengthMemo(max_chars=10 * (1 + MEMO_ENTRY_CHARS))
    for i in range(1_000):  # many one-character texts: the entries' cost bounds them
        tiny.length(chr(0x4E00 + i), _length)
    assert len(tiny) == 10


def test_a_memo_of_no_characters_remembers_nothing_and_a_negative_bound_is_refused() -> None:
    memo = LengthMemo(max_chars=0)
    assert memo.length(TEXTS[3], _length) == _length(TEXTS[3]) and len(memo) == 0
    with pytest.raises(ValueError):
        LengthMemo(max_chars=-1)


def test_counts_on_many_threads_at_once_are_the_counts() -> None:
    memo = LengthMemo(max_chars=2_000)  # small: threads evict each other's texts all the time
    texts = [f"{i} " + "token " * (i % 30 + 10) for i in range(200)]
    errors: list[str] = []

    def work(seed: int) -> None:
        for k in range(600):
            t = texts[(seed * 7 + k * 13) % len(texts)]
            if memo.length(t, _length) != _length(t):
                errors.append(t)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == [] and memo.chars <= 2_000
    assert memo.chars == sum(len(t) + MEMO_ENTRY_CHARS for t in memo._data)


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
        assert len(fresh.memo) == 0 and fresh.memo.max_chars == counter.memo.max_chars
        off = pickle.loads(pickle.dumps(counter))
        off.memo = LengthMemo(max_chars=0)
        for text in TEXTS * 2:
            assert counter.count_text(text) == off.count_text(text) == fresh.count_text(text)
            chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]
            for grounded in (False, True):
                want = off.count_messages(chat, grounded=grounded)
                assert counter.count_messages(chat, grounded=grounded) == want
        assert len(counter.memo) > 0 and len(off.memo) == 0
