"""The incremental decoder gives, after every token, what decoding all the tokens gives, at a cost
a token that does not grow with the text."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

from ragserve.models.detokenize import MAX_PENDING, IncrementalDecoder


def byte_decode(ids: Sequence[int]) -> str:
    """A byte-level tokenizer's decode: each token one byte, invalid UTF-8 shown as U+FFFD (as a
    byte-fallback tokenizer shows a character not yet complete)."""
    return bytes(ids).decode("utf-8", "replace")


def words_decode(ids: Sequence[int]) -> str:
    """A word-piece decode that drops the leading space of what it decodes (as some tokenizers do):
    the context the decoder keeps is what gives a new word its space."""
    return "".join(f" w{i}" if i % 3 else f"p{i}" for i in ids).lstrip(" ")


def test_every_step_is_what_decoding_all_the_tokens_gives() -> None:
    rng = random.Random(3)
    chars = ["a", " ", "é", "€", "😀", "\n", "中"]
    for _ in range(2000):
        data = b"".join(rng.choice(chars).encode() for _ in range(rng.randint(1, 30)))
        if rng.random() < 0.4:  # junk: stray continuation bytes and lead bytes never completed
            cut = rng.randrange(len(data) + 1)
            junk = bytes(rng.choice([0x80, 0x9F, 0xBF, 0xC3, 0xE2, 0xF0, 0xFF]) for _ in range(rng.randint(1, 14)))
            data = data[:cut] + junk + data[cut:]
        decoder = IncrementalDecoder(byte_decode)
        for i, b in enumerate(data):
            assert decoder.add(b) == byte_decode(data[: i + 1]), (data, i)
    decoder = IncrementalDecoder(words_decode)
    ids = [rng.randrange(100) for _ in range(200)]
    for i, t in enumerate(ids):
        assert decoder.add(t) == words_decode(ids[: i + 1])


def test_a_token_costs_the_same_early_and_late_in_a_long_text() -> None:
    """Decoding calls see a few tokens each, never the whole list: 20,000 tokens take a few
    hundred thousand ids decoded in all, where decoding everything each time took 200 million."""
    seen = 0

    def counting(ids: Sequence[int]) -> str:
        nonlocal seen
        seen += len(ids)
        return byte_decode(ids)

    decoder = IncrementalDecoder(counting)
    data = ("The pump is serviced every 30 minutes; é € 😀. " * 500).encode()[:20_000]
    t0 = time.thread_time()
    for b in data:
        decoder.add(b)
    assert decoder.text == data.decode()
    assert seen < 4 * MAX_PENDING * len(data), seen
    assert time.thread_time() - t0 < 2.0
