"""The clients people already use, unchanged, against the whole application over real HTTP: the
official ``openai`` SDK (sync, async, streaming, embeddings), LangChain's ``ChatOpenAI`` and
LlamaIndex's ``OpenAILike``. RAG fields travel in ``extra_body``; the sources come back as
``source_nodes`` (on the response, or on the first streamed chunk)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.live_server import live_app

ANSWER = "KAITO automates model inference on Kubernetes [1]."
DOCS = [
    {
        "text": "KAITO is a Kubernetes operator that automates AI model inference and fine-tuning on GPU nodes.",
        "metadata": {"topic": "kaito"},
    },
    {
        "text": "FAISS is a library for efficient similarity search and clustering of dense vectors.",
        "metadata": {"topic": "faiss"},
    },
]
QUESTION = "What does the KAITO operator automate?"


@pytest.fixture(scope="module")
def base(tmp_path_factory, embedding_model) -> Iterator[str]:
    from ragserve.testing.embedder import InProcessEmbedder

    with live_app(
        tmp_path_factory.mktemp("clients"), InProcessEmbedder(embedding_model), answer=ANSWER, api_keys=["sk-client"]
    ) as (url, _):
        r = httpx.post(
            f"{url}/index", json={"index_name": "kb", "documents": DOCS}, headers={"Authorization": "Bearer sk-client"}
        )
        assert r.status_code == 200, r.text
        yield f"{url}/v1"


def test_openai_sync_with_sources_and_rag_headers(base: str) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=base, api_key="sk-client")
    raw = client.chat.completions.with_raw_response.create(
        model="fake-model",
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=32,
        extra_body={"index_name": "kb", "top_k": 2},
    )
    assert raw.headers["x-rag-mode"] == "rag"
    completion = raw.parse()
    assert completion.choices[0].message.content == ANSWER
    assert completion.model_extra["source_nodes"][0]["metadata"]["topic"] == "kaito"
    assert [m.id for m in client.models.list()] == ["fake-model"]
    emb = client.embeddings.create(model="all-MiniLM-L6-v2", input=["hello", "world"])
    assert len(emb.data) == 2 and len(emb.data[0].embedding) == 384
    with pytest.raises(Exception) as err:  # a wrong key is the SDK's own AuthenticationError
        OpenAI(base_url=base, api_key="wrong", max_retries=0).models.list()
    assert type(err.value).__name__ == "AuthenticationError"


def test_openai_streaming_first_chunk_carries_sources(base: str) -> None:
    from openai import OpenAI

    stream = OpenAI(base_url=base, api_key="sk-client").chat.completions.create(
        model="fake-model",
        messages=[{"role": "user", "content": QUESTION}],
        stream=True,
        extra_body={"index_name": "kb"},
    )
    chunks = list(stream)
    assert chunks[0].model_extra["source_nodes"][0]["metadata"]["topic"] == "kaito"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ANSWER


async def test_openai_async_plain_and_streaming(base: str) -> None:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base, api_key="sk-client")
    completion = await client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": QUESTION}], extra_body={"index_name": "kb"}
    )
    assert completion.choices[0].message.content == ANSWER
    stream = await client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "hi"}], stream=True
    )  # passthrough
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == ANSWER
    await client.close()


def test_langchain_chat_openai(base: str) -> None:
    pytest.importorskip("langchain_openai", reason="langchain-openai is in the test extra")
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        base_url=base,
        api_key="sk-client",
        model="fake-model",
        max_tokens=32,
        extra_body={"index_name": "kb", "top_k": 2},
    )
    message = llm.invoke(QUESTION)
    assert message.content == ANSWER
    assert "".join(chunk.content for chunk in llm.stream(QUESTION)) == ANSWER


async def test_langchain_async(base: str) -> None:
    pytest.importorskip("langchain_openai", reason="langchain-openai is in the test extra")
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=base, api_key="sk-client", model="fake-model", extra_body={"index_name": "kb"})
    assert (await llm.ainvoke(QUESTION)).content == ANSWER


def test_llamaindex_openai_like(base: str) -> None:
    pytest.importorskip(
        "llama_index.llms.openai_like",
        reason="llama-index-llms-openai-like is in the test extra",
    )
    from llama_index.core.llms import ChatMessage
    from llama_index.llms.openai_like import OpenAILike

    llm = OpenAILike(
        model="fake-model",
        api_base=base,
        api_key="sk-client",
        is_chat_model=True,
        context_window=4096,
        additional_kwargs={"extra_body": {"index_name": "kb"}},
    )
    response = llm.chat([ChatMessage(role="user", content=QUESTION)])
    assert response.message.content == ANSWER
    assert "".join(r.delta or "" for r in llm.stream_chat([ChatMessage(role="user", content=QUESTION)])) == ANSWER
    assert llm.complete(QUESTION).text == ANSWER
