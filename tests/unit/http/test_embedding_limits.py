"""``/v1/embeddings`` bounds its inputs as OpenAI does and counts what the model reads: an input over
``max_embedding_input_tokens`` or a request over ``max_embedding_request_tokens`` is a 400 that says
which and how to fix it, before anything is embedded; ``usage`` counts at most the model's
``max_seq_length`` tokens an input (all-MiniLM-L6-v2 reads 256 and cuts the rest). A hostile probe
found 500 inputs of 45 KB billed as ~5 M tokens while 128,000 were embedded."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from ragserve.testing.inprocess import inprocess_app

WORDS = ["the", "cat", "sat", "on", "a", "red", "mat", "today"]  # a token each


def words(n: int) -> str:
    return " ".join((WORDS * (n // len(WORDS) + 1))[:n])


@pytest.fixture
def client(tmp_path, embedder) -> Iterator[TestClient]:
    settings = {"max_embedding_request_tokens": 20_000}
    with inprocess_app(tmp_path, embedder, "http://127.0.0.1:9/v1", **settings) as (app, _), TestClient(app) as c:
        yield c


def test_usage_counts_the_tokens_the_model_reads(client: TestClient, embedding_model) -> None:
    short, long = words(20), words(1_000)
    exact = [len(embedding_model.tokenizer.encode(t)) for t in (short, long)]
    assert exact[0] < 256 < exact[1]
    r = client.post("/v1/embeddings", json={"input": [short, long]})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == exact[0] + embedding_model.max_seq_length


def test_an_input_over_the_bound_is_a_400_naming_it_and_nothing_is_embedded(client: TestClient, embedder) -> None:
    calls = embedder.calls
    r = client.post("/v1/embeddings", json={"input": ["fine", words(9_000)]})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "input" and "input[1]" in err["message"] and "8,192" in err["message"]
    assert embedder.calls == calls
    single = client.post("/v1/embeddings", json={"input": words(9_000)}).json()["error"]["message"]
    assert single.startswith("input has at least")


def test_the_bound_itself_is_accepted(client: TestClient, embedding_model) -> None:
    text = words(8_190)  # 8,190 words of one token each, with [CLS] and [SEP]: 8,192
    assert len(embedding_model.tokenizer.encode(text)) == 8_192
    assert client.post("/v1/embeddings", json={"input": text}).status_code == 200
    assert client.post("/v1/embeddings", json={"input": text + " more"}).status_code == 400


def test_a_request_over_its_token_bound_is_a_400(client: TestClient) -> None:
    r = client.post("/v1/embeddings", json={"input": [words(5_000)] * 5})  # 25,010 > 20,000
    assert r.status_code == 400
    assert "in all" in r.json()["error"]["message"] and "several" in r.json()["error"]["message"]
    assert client.post("/v1/embeddings", json={"input": [words(5_000)] * 3}).status_code == 200


@pytest.mark.parametrize(
    "text",
    [
        "." * 1_000_000,  # one token a character, no whitespace: counted whole
        ". " * 500_000,  # one token a character pair: refused from a prefix
        " " * 999_000 + words(100),  # a prefix of spaces has no tokens: counted whole, and accepted
        "a" * 200 + " " + "x" * 999_000,  # words over 100 characters are one [UNK]
        "가" * 40_000 + " " + "나 " * 20_000,  # Hangul: a run is one word; then one token a syllable
        "中文字" * 20_000,  # CJK ideographs: a piece each, no spaces
        "word\u3000" * 20_000,  # ideographic spaces
        "word\u00a0" * 20_000,  # no-break spaces
        "e\u0301t\u00e9." * 20_000,  # combining accents and precomposed ones (stripped), then a stop
    ],
    ids=["dots", "dot-space", "spaces-then-words", "long-words", "hangul", "cjk", "u3000", "nbsp", "accents"],
)
def test_a_prefix_count_is_a_lower_bound_and_only_given_over_the_bound(embedding_model, text: str) -> None:
    exact = len(embedding_model.tokenizer.encode(text))
    (counted,) = embedding_model.count_tokens([text], over=8_192)
    assert counted == exact or exact >= counted > 8_192
    assert embedding_model.count_tokens([text]) == [exact]


def test_a_prefix_count_never_exceeds_the_whole_on_random_text(embedding_model) -> None:
    """Seeded fuzz over the characters that change where pieces split, with a small bound so every
    text takes the prefix path."""
    import random

    rng = random.Random(28)
    alphabet = [*"ab .,;-'\"\n\t", *"\u00a0\u3000\u0301\u00e9\u4e2d\uac00\u200b\x00\U0001f600", "[MASK]"]
    over = 20
    checked = 0
    for _ in range(400):
        text = "".join(rng.choices(alphabet, k=rng.randint(150, 600)))
        exact = len(embedding_model.tokenizer.encode(text))
        (counted,) = embedding_model.count_tokens([text], over=over)
        assert counted == exact or exact >= counted > over, (text, counted, exact)
        checked += counted != exact
    assert checked > 50  # the prefix path was taken


def test_refusing_a_megabyte_tokenizes_a_prefix_not_the_whole(embedding_model, monkeypatch) -> None:
    """~0.1 s instead of ~3 s of a core: what the tokenizer is given, not a timing."""
    tokenizer, read = embedding_model.tokenizer, []

    class Recording:
        def encode(self, text: str, **kwargs: object) -> list[int]:
            read.append(len(text))
            return tokenizer.encode(text, **kwargs)

    monkeypatch.setattr(type(embedding_model), "tokenizer", property(lambda self: Recording()))
    (counted,) = embedding_model.count_tokens([". " * 500_000], over=8_192)
    assert counted > 8_192 and read == [(8_192 + embedding_model.PREFIX_SLACK) * 4 - 1]


def test_counting_stops_at_the_first_input_over_or_once_the_total_is_passed(embedding_model) -> None:
    """1,000 inputs of 40 KB in one request: a refusal reads the first, not 40 MB."""
    over = [". " * 20_000] * 3
    assert len(embedding_model.count_tokens(["ok", *over], over=8_192)) == 2
    fine = [words(1_000)] * 10  # 1,002 tokens each
    assert embedding_model.count_tokens(fine, over=8_192, total_over=3_000) == [1_002] * 3
    assert embedding_model.count_tokens(fine, over=8_192) == [1_002] * 10


def test_a_remote_model_s_estimates_bound_nothing_and_count_as_usage() -> None:
    """A remote embedding server bounds its own inputs; chars/4 here would refuse 40,000 spaces."""
    import asyncio

    import numpy as np

    from ragserve.api.openai import EmbeddingRequest
    from ragserve.models.tokenizers import ApproxTokenCounter
    from ragserve.service.embeddings import EmbeddingService

    approx = ApproxTokenCounter("test")

    async def embed(texts: list[str]) -> np.ndarray:
        return np.ones((len(texts), 4), dtype=np.float32) / 2

    async def count(texts: list[str], **bounds: object) -> list[int]:
        assert bounds == {}  # no bound asked of an estimate
        return [approx.count_text(t) for t in texts]

    service = EmbeddingService(embed, count, "remote-model", max_input_tokens=None, max_tokens_per_input=8_192)
    out = asyncio.run(service.create(EmbeddingRequest(input=[" " * 40_000 + "hi", "short"])))
    assert len(out.data) == 2 and out.usage.prompt_tokens == 10_001 + 2
