"""OpenAI Files and Vector Stores through the official ``openai`` SDK, unchanged, against the whole
application over real HTTP (real shards, MiniLM, the job runner): upload, attach and poll, batches,
search with filters, a store as chat's and ``/retrieve``'s ``index_name``, deletes, and what a
client gets wrong (unknown ids, wrong purpose, corrupt files, filters that cannot map, fields
ragserve does not support)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.live_server import live_app

KEY = "sk-vs"
#: A key for vector stores only: it may create stores (``vs_*``) but not use the server's Files.
STORES_ONLY = "sk-vs-stores-only"
ANSWER = "Refunds take 14 days [1]."
FILES = {
    "refunds.md": "# Refunds\n\nA refund is paid back to the original card within 14 days of the return.\n",
    "shipping.md": "# Shipping\n\nOrders ship from the Rotterdam warehouse; delivery takes two to four days.\n",
    "warranty.md": "# Warranty\n\nThe inverter carries a ten year warranty against manufacturing defects.\n",
}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, embedding_model: Any) -> Iterator[str]:
    from ragserve.testing.embedder import InProcessEmbedder

    with live_app(
        tmp_path_factory.mktemp("vs"),
        InProcessEmbedder(embedding_model),
        answer=ANSWER,
        api_keys=[KEY, {"key": STORES_ONLY, "indexes": ["vs_*"], "role": "admin"}],
    ) as (
        url,
        _,
    ):
        yield url


@pytest.fixture(scope="module")
def client(base: str) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0)


def eq(key: str, value: object) -> dict[str, object]:
    return {"type": "eq", "key": key, "value": value}


def upload(client: Any, name: str, text: str | bytes, purpose: str = "assistants") -> Any:
    data = text.encode() if isinstance(text, str) else text
    return client.files.create(file=(name, io.BytesIO(data)), purpose=purpose)


def test_upload_attach_poll_and_search_with_attributes(client: Any) -> None:
    store = client.vector_stores.create(name="policies", metadata={"team": "support"})
    assert (store.object, store.name, store.metadata, store.status) == (
        "vector_store",
        "policies",
        {"team": "support"},
        "completed",
    )
    ids = {}
    for name, text in FILES.items():
        f = upload(client, name, text)
        done = client.vector_stores.files.create_and_poll(
            file_id=f.id, vector_store_id=store.id, attributes={"topic": name.removesuffix(".md"), "year": 2026}
        )
        assert done.status == "completed" and done.last_error is None and done.usage_bytes > 0, done
        ids[name] = f.id
    got = client.vector_stores.retrieve(store.id)
    assert got.file_counts.completed == 3 and got.file_counts.total == 3 and got.usage_bytes > 0

    page = client.vector_stores.search(store.id, query="how long until my refund arrives", max_num_results=2)
    assert page.data and page.data[0].file_id == ids["refunds.md"], page
    top = page.data[0]
    assert top.filename == "refunds.md" and "14 days" in top.content[0].text
    assert top.attributes == {"topic": "refunds", "year": 2026} and 0 <= top.score <= 1

    # a filter on the attributes keeps only that file's chunks, whatever the query
    only = client.vector_stores.search(
        store.id, query="how long until my refund arrives", filters=eq("topic", "warranty")
    )
    assert {r.file_id for r in only.data} == {ids["warranty.md"]}
    both = client.vector_stores.search(
        store.id,
        query=["refund", "warehouse"],
        filters={"type": "and", "filters": [eq("year", 2026), eq("topic", "shipping")]},
    )
    assert {r.file_id for r in both.data} == {ids["shipping.md"]} and both.search_query == ["refund", "warehouse"]
    # a threshold above every score leaves nothing
    assert not client.vector_stores.search(store.id, query="refund", ranking_options={"score_threshold": 1.0}).data

    listed = client.vector_stores.files.list(vector_store_id=store.id, limit=2)
    assert len(listed.data) == 2 and listed.has_more
    assert {f.id for f in client.vector_stores.files.list(vector_store_id=store.id)} == set(ids.values())
    parsed = client.vector_stores.files.content(ids["refunds.md"], vector_store_id=store.id)
    assert "14 days" in "".join(p.text for p in parsed)  # the text it was indexed as
    completed = client.vector_stores.files.list(vector_store_id=store.id, filter="completed")
    assert len(completed.data) == 3
    assert not client.vector_stores.files.list(vector_store_id=store.id, filter="failed").data


def test_a_store_is_an_index_for_chat_and_retrieve(client: Any, base: str) -> None:
    store = client.vector_stores.create(name="kb")
    f = upload(client, "refunds.md", FILES["refunds.md"])
    client.vector_stores.files.create_and_poll(file_id=f.id, vector_store_id=store.id)
    completion = client.chat.completions.create(
        model="fake-model",
        messages=[{"role": "user", "content": "How long does a refund take?"}],
        extra_body={"index_name": store.id},
    )
    sources = completion.model_extra["source_nodes"]
    assert sources and sources[0]["metadata"]["file_id"] == f.id
    r = httpx.post(
        f"{base}/retrieve",
        json={"index_name": store.id, "query": "refund to the original card"},
        headers={"Authorization": f"Bearer {KEY}"},
    )
    assert r.status_code == 200 and r.json()["results"][0]["metadata"]["filename"] == "refunds.md", r.text


def test_batches_poll_to_completion_and_list_their_files(client: Any) -> None:
    store = client.vector_stores.create(name="batch")
    files = [upload(client, name, text) for name, text in FILES.items()]
    batch = client.vector_stores.file_batches.create_and_poll(
        vector_store_id=store.id, file_ids=[f.id for f in files], attributes={"source": "batch"}
    )
    assert batch.status == "completed" and batch.file_counts.completed == 3 and batch.file_counts.total == 3
    listed = client.vector_stores.file_batches.list_files(batch_id=batch.id, vector_store_id=store.id)
    assert {f.id for f in listed.data} == {f.id for f in files}
    assert all(f.attributes == {"source": "batch"} for f in listed.data)
    # cancelling a batch that has ended changes nothing
    again = client.vector_stores.file_batches.cancel(batch_id=batch.id, vector_store_id=store.id)
    assert again.status == "completed"
    # files each with their own attributes
    per_file = client.vector_stores.file_batches.create_and_poll(
        vector_store_id=store.id, files=[{"file_id": files[0].id, "attributes": {"rank": 1}}]
    )
    assert per_file.status == "completed"
    assert client.vector_stores.files.retrieve(files[0].id, vector_store_id=store.id).attributes == {"rank": 1}


def test_create_with_file_ids_and_static_chunking(client: Any) -> None:
    long_text = " ".join(f"Sentence {i} talks about the solar inverter warranty terms." for i in range(200))
    f = upload(client, "long.txt", long_text)
    store = client.vector_stores.create(
        name="static",
        file_ids=[f.id],
        chunking_strategy={"type": "static", "static": {"max_chunk_size_tokens": 100, "chunk_overlap_tokens": 10}},
    )
    done = client.vector_stores.files.poll(f.id, vector_store_id=store.id)
    assert done.status == "completed"
    assert done.chunking_strategy.type == "static" and done.chunking_strategy.static.max_chunk_size_tokens == 100
    assert client.vector_stores.retrieve(store.id).file_counts.completed == 1


def test_deletes_detach_and_drop(client: Any, base: str) -> None:
    store = client.vector_stores.create(name="deletes")
    a, b = upload(client, "refunds.md", FILES["refunds.md"]), upload(client, "shipping.md", FILES["shipping.md"])
    for f in (a, b):
        client.vector_stores.files.create_and_poll(file_id=f.id, vector_store_id=store.id)
    gone = client.vector_stores.files.delete(a.id, vector_store_id=store.id)
    assert gone.deleted and gone.object == "vector_store.file.deleted"
    found = client.vector_stores.search(store.id, query="refund to the original card", max_num_results=10)
    assert {r.file_id for r in found.data} == {b.id}  # the detached file's chunks are gone
    assert client.files.retrieve(a.id).id == a.id  # the File itself stays
    # deleting the File detaches it from every store
    client.files.delete(b.id)
    assert not client.vector_stores.search(store.id, query="warehouse delivery").data
    assert client.vector_stores.retrieve(store.id).file_counts.total == 0
    # deleting the store drops its index
    assert client.vector_stores.delete(store.id).deleted
    from openai import NotFoundError

    with pytest.raises(NotFoundError):
        client.vector_stores.retrieve(store.id)
    r = httpx.post(
        f"{base}/retrieve", json={"index_name": store.id, "query": "x"}, headers={"Authorization": f"Bearer {KEY}"}
    )
    assert r.status_code == 404


def test_a_corrupt_or_unsupported_file_fails_with_last_error_and_never_hangs(client: Any) -> None:
    store = client.vector_stores.create(name="bad")
    corrupt = upload(client, "broken.pdf", b"%PDF-1.7 this is not a pdf at all")
    done = client.vector_stores.files.create_and_poll(file_id=corrupt.id, vector_store_id=store.id)
    assert done.status == "failed" and done.last_error is not None and done.last_error.code == "invalid_file"
    binary = upload(client, "tool.exe", b"MZ\x90\x00")
    done = client.vector_stores.files.create_and_poll(file_id=binary.id, vector_store_id=store.id)
    assert done.status == "failed" and done.last_error is not None and done.last_error.code == "unsupported_file"
    counts = client.vector_stores.retrieve(store.id).file_counts
    assert (counts.failed, counts.total) == (2, 2)


def test_client_mistakes_are_openai_errors_that_name_the_field(client: Any) -> None:
    from openai import BadRequestError, NotFoundError

    store = client.vector_stores.create(name="mistakes")
    with pytest.raises(NotFoundError):
        client.vector_stores.retrieve("vs_unknown")
    with pytest.raises(NotFoundError) as nf:
        client.vector_stores.files.create(vector_store_id=store.id, file_id="file-unknown")
    assert "file-unknown" in str(nf.value)
    with pytest.raises(NotFoundError):
        client.vector_stores.files.retrieve("file-unknown", vector_store_id=store.id)
    with pytest.raises(NotFoundError):
        client.vector_stores.file_batches.retrieve("job_unknown", vector_store_id=store.id)
    batch_file = upload(client, "data.jsonl", '{"custom_id": "1"}\n', purpose="batch")
    with pytest.raises(BadRequestError) as wrong:
        client.vector_stores.files.create(vector_store_id=store.id, file_id=batch_file.id)
    assert "purpose" in str(wrong.value)
    with pytest.raises(BadRequestError) as flt:
        client.vector_stores.search(store.id, query="x", filters={"type": "gt", "key": "year", "value": 2020})
    assert "'gt'" in str(flt.value)
    with pytest.raises(BadRequestError) as exp:
        client.vector_stores.create(name="x", expires_after={"anchor": "last_active_at", "days": 1})
    assert "expires_after" in str(exp.value)
    with pytest.raises(BadRequestError) as rw:
        client.vector_stores.search(store.id, query="x", rewrite_query=True)
    assert "rewrite_query" in str(rw.value)
    f = upload(client, "a.md", "# A\n\ntext\n")
    with pytest.raises(BadRequestError) as reserved:
        client.vector_stores.files.create(vector_store_id=store.id, file_id=f.id, attributes={"path": "x"})
    assert "path" in str(reserved.value)
    with pytest.raises(BadRequestError):
        client.vector_stores.files.create(
            vector_store_id=store.id, file_id=f.id, attributes={f"k{i}": i for i in range(17)}
        )
    with pytest.raises(BadRequestError):
        client.vector_stores.file_batches.create(vector_store_id=store.id, file_ids=[f.id, f.id])
    with pytest.raises(BadRequestError):
        client.vector_stores.search(store.id, query="x", max_num_results=51)
    # the filter's keys are bounded as a metadata_filter's are (1,001 keys was a 500 from SQLite)
    wide = {"type": "and", "filters": [eq(f"k{i}", i) for i in range(1001)]}
    with pytest.raises(BadRequestError) as many:
        client.vector_stores.search(store.id, query="x", filters=wide)
    assert many.value.param == "filters" and "keys" in str(many.value)
    with pytest.raises(BadRequestError):
        client.vector_stores.search(store.id, query="x", filters=eq("year", 2**70))


def test_listing_stores_pages_newest_first(client: Any) -> None:
    made = [client.vector_stores.create(name=f"page-{i}").id for i in range(3)]
    first = client.vector_stores.list(limit=2)
    assert [s.id for s in first.data] == made[::-1][:2] and first.has_more
    seen = [s.id for s in client.vector_stores.list(limit=2)]  # the SDK follows the cursor
    assert seen[:3] == made[::-1]
    updated = client.vector_stores.update(made[0], name="renamed", metadata={"k": "v"})
    assert (updated.name, updated.metadata) == ("renamed", {"k": "v"})


def test_a_key_scoped_to_stores_cannot_attach_files_it_could_not_read(client: Any, base: str) -> None:
    """Files are one namespace for the whole server (only a key for every index may read them):
    attaching one by id and reading it back through the store would be a way round that."""
    from openai import OpenAI, PermissionDeniedError

    secret = upload(client, "secret.md", "# Payroll\n\nThe CEO earns 1.2 million a year.\n")
    scoped = OpenAI(base_url=f"{base}/v1", api_key=STORES_ONLY, max_retries=0)
    store = scoped.vector_stores.create(name="mine")  # its own store: allowed
    with pytest.raises(PermissionDeniedError) as err:
        scoped.vector_stores.files.create(vector_store_id=store.id, file_id=secret.id)
    assert err.value.code == "unscoped_key_required"
    with pytest.raises(PermissionDeniedError):
        scoped.vector_stores.file_batches.create(vector_store_id=store.id, file_ids=[secret.id])
    with pytest.raises(PermissionDeniedError):
        scoped.vector_stores.create(name="with files", file_ids=[secret.id])
    assert client.vector_stores.retrieve(store.id).file_counts.total == 0
