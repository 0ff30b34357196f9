"""The incremental decoder gives, after every token, what decoding all the tokens gives, at a cost
a token that does not grow with the text."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence

from ragserve.models.detokenize import MAX_PENDING, IncrementalDecoder, silent_tokens


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


def byte_fallback_decode() -> Callable[[Sequence[int]], str]:
    """A Llama-style decoder from the ``tokenizers`` library: byte-fallback tokens (a run of them
    shown as U+FFFD while any character of it is incomplete), and the leading space of what it
    decodes stripped; special tokens skipped."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    vocab = {"<unk>": 0, "▁Hello": 1, "▁world": 2, "<0xE2>": 3, "<0x82>": 4, "<0xAC>": 5, "<0xFF>": 6, "▁ok": 7}
    vocab["\ufffd"] = 8  # a token of U+FFFD itself, as Gemma's vocabulary has
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.add_special_tokens([AddedToken("<unk>", special=True), AddedToken("[INST]", special=True)])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return lambda ids: tok.decode(list(ids), skip_special_tokens=True)


def test_runs_of_byte_tokens_and_skipped_special_tokens_decode_as_the_whole_does() -> None:
    """A byte-fallback decoder shows a whole run of byte tokens as U+FFFD while a character of it is
    incomplete: three euro signs written as nine byte tokens came out as "€€���" when the context
    was one token. And a word after skipped special tokens keeps its space."""
    decode = byte_fallback_decode()
    special, replacement = 9, 8  # [INST], U+FFFD
    euro = [3, 4, 5]
    rng = random.Random(5)
    cases = [euro * 3 + [2], [1] + [special] * 12 + [2], [1, *euro, special, *euro, 7]]
    cases += [[*euro, *[special] * n, *euro, 7] for n in (13, 15, 40)]  # skipped tokens between byte runs
    cases += [[1, *[replacement] * n, *euro, 7] for n in range(10, 20)]  # a character after U+FFFD tokens
    broken = [[1, *euro, 3, 2, 2], [1, 3, 2, 2], [1, *euro, 4, 2, 2]]  # a stray byte: the next words keep their space
    units = [[1], [2], [7], [special], euro]  # what a model writes: whole characters, in bytes or not
    cases += [[t for _ in range(rng.randint(1, 30)) for t in rng.choice(units)] for _ in range(2000)]
    for ids in cases:
        decoder = IncrementalDecoder(decode, silent_tokens(decode, [special, 2], [1, 2, 7]))
        for i, token in enumerate(ids):
            text, whole = decoder.add(token), decode(ids[: i + 1])
            if "\ufffd" not in whole:  # a character split in bytes shows as U+FFFD until complete
                assert text == whole, (ids[: i + 1], text, whole)
        assert decoder.text == decode(ids), ids
    for ids in broken:
        decoder = IncrementalDecoder(decode)
        for token in ids:
            decoder.add(token)
        assert decoder.text == decode(ids) and decoder.text.endswith(" world world"), (ids, decoder.text)


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
    junk = IncrementalDecoder(counting)  # bytes that never complete a character: the window moves on
    seen = 0
    for b in bytes([0xF0, 0xFF, 0x9F]) * 5000:
        junk.add(b)
    assert seen < 4 * MAX_PENDING * 15_000, seen
    assert time.thread_time() - t0 < 2.0
