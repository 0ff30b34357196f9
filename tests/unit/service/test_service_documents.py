"""DocumentService over real shards, the real chunker and the real embedding model, in-process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragserve.api.documents import Document, UpdateDocument
from ragserve.errors import BadRequestError, ConflictError, NotFoundError
from ragserve.ingest import DocumentChunker, hf_token_counter
from ragserve.service.documents import DocumentService
from ragserve.service.pool import LocalShardPool
from ragserve.service.routing import shard_for
from ragserve.service.shard_service import LayoutMismatchError, ShardService, check_layout

TEXTS = {
    "kaito": "KAITO is a Kubernetes operator that automates AI model inference and fine-tuning on GPU nodes.",
    "rag": "Retrieval Augmented Generation grounds a language model's answers in documents found by search.",
    "faiss": "FAISS is a library for efficient similarity search and clustering of dense vectors.",
    "bread": "To bake sourdough bread, feed the starter, mix flour and water, and let the dough rise overnight.",
    "tides": "Ocean tides are caused by the gravitational pull of the moon and the sun on the earth's water.",
}


def make_service(tmp_path: Path, embedder, num_shards: int = 3) -> tuple[DocumentService, LocalShardPool]:
    check_layout(tmp_path, num_shards)
    pool = LocalShardPool([ShardService(tmp_path, i, num_shards) for i in range(num_shards)])
    chunker = DocumentChunker(hf_token_counter(embedder.model.tokenizer), chunk_size=64, chunk_overlap=8)
    return DocumentService(pool, embedder, chunker, storage_dir=tmp_path, embedding_model="all-MiniLM-L6-v2"), pool


@pytest.fixture
def service(tmp_path, embedder):
    svc, pool = make_service(tmp_path, embedder)
    yield svc
    pool.close()


def docs(*keys: str, **meta) -> list[Document]:
    return [Document(text=TEXTS[k], metadata={"topic": k, **meta}) for k in keys]


async def test_add_list_and_retrieve(service: DocumentService) -> None:
    records = await service.add_documents("kb", docs("kaito", "rag", "faiss", "bread", "tides"))
    assert len({r.doc_id for r in records}) == 5
    assert all(len(r.hash_value) == 64 for r in records)
    assert await service.list_indexes() == ["kb"]
    page = await service.list_documents("kb", limit=10)
    assert page.total_items == 5 and page.count == 5
    nodes, timings = await service.retrieve("kb", "What does the KAITO operator do on Kubernetes?", 3)
    assert nodes[0].metadata["topic"] == "kaito"
    assert nodes[0].score > 0.5
    assert [n.score for n in nodes] == sorted((n.score for n in nodes), reverse=True)
    assert set(timings) == {"embed", "search"}


async def test_documents_spread_over_shards_by_doc_id(service: DocumentService) -> None:
    given = [Document(text=f"document number {i} about topic {i % 7}", doc_id=f"d{i}") for i in range(30)]
    await service.add_documents("kb", given)
    counts = await service.pool.call_all(ShardService.count_documents, "kb")
    assert sum(counts) == 30
    assert all(c > 0 for c in counts)
    for i in range(30):
        owner = shard_for(f"d{i}", 3)
        assert f"d{i}" in await service.pool.call(owner, ShardService.get_documents, index="kb", doc_ids=[f"d{i}"])


async def test_re_adding_same_content_is_idempotent(service: DocumentService, embedder) -> None:
    first = await service.add_documents("kb", docs("kaito", "rag"))
    calls = embedder.calls
    again = await service.add_documents("kb", docs("kaito", "rag"))
    assert [r.doc_id for r in again] == [r.doc_id for r in first]
    assert embedder.calls == calls  # nothing embedded again
    assert (await service.list_documents("kb")).total_items == 2


async def test_duplicate_within_one_request_is_stored_once(service: DocumentService) -> None:
    records = await service.add_documents("kb", docs("kaito", "kaito"))
    assert records[0].doc_id == records[1].doc_id
    assert (await service.list_documents("kb")).total_items == 1


async def test_pagination_filter_and_truncation(service: DocumentService) -> None:
    batch = [
        Document(text=f"note {i}: " + "word " * 50, metadata={"team": "a" if i % 3 == 0 else "b"}, doc_id=f"n{i:02d}")
        for i in range(25)
    ]
    await service.add_documents("kb", batch)
    seen = []
    for offset in range(0, 25, 10):
        page = await service.list_documents("kb", limit=10, offset=offset, max_text_length=20)
        assert page.total_items == 25
        assert all(len(d.text) <= 20 and d.is_truncated for d in page.documents)
        seen += [d.doc_id for d in page.documents]
    assert sorted(seen) == sorted(d.doc_id for d in batch)  # every document exactly once
    team_a = await service.list_documents("kb", limit=100, metadata_filter={"team": "a"})
    assert team_a.total_items == 9 and {d.metadata["team"] for d in team_a.documents} == {"a"}
    beyond = await service.list_documents("kb", limit=10, offset=30)
    assert beyond.count == 0 and beyond.total_items == 25


async def test_update_outcomes_and_reembedding(service: DocumentService, embedder) -> None:
    a, b = await service.add_documents("kb", docs("kaito", "bread"))
    calls = embedder.calls
    result = await service.update_documents(
        "kb",
        [
            UpdateDocument(doc_id=a.doc_id, text=TEXTS["kaito"], metadata={"topic": "kaito"}),  # unchanged
            UpdateDocument(doc_id=b.doc_id, text=TEXTS["tides"], metadata={"topic": "tides"}),  # changed
            UpdateDocument(doc_id="missing", text="x"),
        ],
    )
    assert [d.doc_id for d in result.unchanged_documents] == [a.doc_id]
    assert [d.doc_id for d in result.updated_documents] == [b.doc_id]
    assert [d.doc_id for d in result.not_found_documents] == ["missing"]
    assert embedder.calls == calls + 1  # only the changed document was embedded
    nodes, _ = await service.retrieve("kb", "what causes ocean tides", 1)
    assert nodes[0].doc_id == b.doc_id and nodes[0].metadata["topic"] == "tides"
    nodes, _ = await service.retrieve("kb", "sourdough bread starter", 5)
    assert all("sourdough" not in n.text for n in nodes)


async def test_delete_and_drop(service: DocumentService) -> None:
    a, _ = await service.add_documents("kb", docs("kaito", "rag"))
    result = await service.delete_documents("kb", [a.doc_id, "ghost", a.doc_id])
    assert result.deleted_doc_ids == [a.doc_id] and result.not_found_doc_ids == ["ghost"]
    nodes, _ = await service.retrieve("kb", "Kubernetes operator", 5)
    assert all(n.doc_id != a.doc_id for n in nodes)
    assert await service.drop_index("kb") == "Successfully deleted index kb."
    assert not await service.index_exists("kb")
    with pytest.raises(NotFoundError):
        await service.drop_index("kb")
    with pytest.raises(NotFoundError):
        await service.list_documents("kb")


async def test_code_documents_and_unknown_language(service: DocumentService) -> None:
    code = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
    await service.add_documents("code", [Document(text=code, metadata={"split_type": "code", "language": "python"})])
    nodes, _ = await service.retrieve("code", "add two numbers", 2)
    assert any("def add" in n.text for n in nodes)
    with pytest.raises(BadRequestError, match="documents\\[0\\]"):
        await service.add_documents("code", [Document(text=code, metadata={"split_type": "code", "language": "cobol"})])


async def test_persist_and_load_into_a_different_shard_count(tmp_path: Path, embedder) -> None:
    svc, pool = make_service(tmp_path / "a", embedder, num_shards=3)
    records = await svc.add_documents("kb", docs("kaito", "rag", "faiss", "bread", "tides"))
    message = await svc.persist("kb", "backups/kb1")
    assert message == "Successfully persisted index kb to backups/kb1/kb."  # KAITO: <path>/<name>
    manifest = json.loads((tmp_path / "a" / "snapshots" / "backups" / "kb1" / "kb" / "manifest.json").read_text())
    assert manifest["documents"] == 5 and manifest["embedding_model"] == "all-MiniLM-L6-v2"
    with pytest.raises(ConflictError):
        await svc.load("kb", "backups/kb1/kb")
    await svc.load("kb", "backups/kb1/kb", overwrite=True)
    assert (await svc.list_documents("kb")).total_items == 5
    pool.close()

    # the snapshot loads into a storage_dir with another number of shards
    (tmp_path / "b").mkdir()
    import shutil

    shutil.copytree(tmp_path / "a" / "snapshots", tmp_path / "b" / "snapshots")
    svc2, pool2 = make_service(tmp_path / "b", embedder, num_shards=2)
    await svc2.load("kb", "backups/kb1/kb")
    page = await svc2.list_documents("kb", limit=100)
    assert sorted(d.doc_id for d in page.documents) == sorted(r.doc_id for r in records)
    nodes, _ = await svc2.retrieve("kb", "similarity search over vectors", 1)
    assert nodes[0].metadata["topic"] == "faiss"
    pool2.close()


@pytest.mark.parametrize(
    "path",
    ["../outside", "/etc", "%2e%2e/x", "%252e%252e/x", "..%2f..%2fx", "a/../../x", "a/../../../shards", "x\x00y", "."],
)
async def test_persist_and_load_paths_are_confined(service: DocumentService, path: str) -> None:
    await service.add_documents("kb", docs("kaito"))
    with pytest.raises(BadRequestError):
        await service.persist("kb", path)
    with pytest.raises(BadRequestError):
        await service.load("kb", path)


async def test_default_and_nested_snapshot_paths_stay_in_the_snapshot_folder(service: DocumentService) -> None:
    await service.add_documents("kb", docs("kaito"))
    assert (await service.persist("kb", None)).endswith("to kb.")
    assert (service.storage_dir / "snapshots" / "kb" / "manifest.json").is_file()
    # a path that names a live-data folder lands in snapshots/, never on the shards
    assert (await service.persist("kb", "shards")).endswith("to shards/kb.")
    assert (service.storage_dir / "snapshots" / "shards" / "kb" / "manifest.json").is_file()
    assert (service.storage_dir / "shards").is_dir() and (await service.list_documents("kb")).total_items == 1


async def test_symlink_escaping_the_storage_dir_is_refused(service: DocumentService, tmp_path_factory) -> None:
    await service.add_documents("kb", docs("kaito"))
    outside = tmp_path_factory.mktemp("outside")
    snapshots = service.storage_dir / "snapshots"
    snapshots.mkdir(parents=True, exist_ok=True)
    (snapshots / "link").symlink_to(outside, target_is_directory=True)
    with pytest.raises(BadRequestError, match="outside the storage directory"):
        await service.persist("kb", "link/kb")
    with pytest.raises(BadRequestError, match="outside the storage directory"):
        await service.load("kb", "link")
    assert not any(outside.iterdir())


async def test_load_missing_snapshot_is_404(service: DocumentService) -> None:
    with pytest.raises(NotFoundError):
        await service.load("kb", "nowhere")


def test_layout_guard(tmp_path: Path) -> None:
    check_layout(tmp_path, 2)
    check_layout(tmp_path, 2)
    with pytest.raises(LayoutMismatchError, match="holds 2 shards"):
        check_layout(tmp_path, 3)


class _DeleteBeforeWrite(LocalShardPool):
    """A pool on which a delete lands between an update's read and its write (the race a soak found)."""

    def __init__(self, shards, victim: str):
        super().__init__(shards)
        self.victim = victim

    async def call(self, shard: int, method, *args, **kwargs):
        if method is ShardService.upsert_documents and self.victim:
            victim, self.victim = self.victim, ""
            await super().call(
                shard_for(victim, self.num_shards),
                ShardService.delete_documents,
                index=kwargs["index"],
                doc_ids=[victim],
            )
        return await super().call(shard, method, *args, **kwargs)


async def test_an_update_racing_a_delete_does_not_bring_the_document_back(tmp_path: Path, embedder) -> None:
    check_layout(tmp_path, 2)
    pool = _DeleteBeforeWrite([ShardService(tmp_path, i, 2) for i in range(2)], victim="")
    chunker = DocumentChunker(hf_token_counter(embedder.model.tokenizer), chunk_size=64, chunk_overlap=8)
    svc = DocumentService(pool, embedder, chunker, storage_dir=tmp_path, embedding_model="all-MiniLM-L6-v2")
    await svc.add_documents("kb", [Document(text="first", doc_id="a"), Document(text="second", doc_id="b")])
    pool.victim = "a"
    result = await svc.update_documents(
        "kb", [UpdateDocument(doc_id="a", text="first, edited"), UpdateDocument(doc_id="b", text="second, edited")]
    )
    assert [d.doc_id for d in result.not_found_documents] == ["a"]
    assert [d.doc_id for d in result.updated_documents] == ["b"]
    page = await svc.list_documents("kb")
    assert page.total_items == 1 and page.documents[0].text == "second, edited"
    assert await pool.call_all(ShardService.verify) == [[], []]
    pool.close()


async def test_the_query_encoder_gets_a_bounded_part_of_a_pasted_page(service: DocumentService, embedder) -> None:
    """The encoder reads its first max_seq_length tokens; a megabyte pasted as the query was split
    whole by its tokenizer first (seconds of a worker thread). It is given QUERY_EMBED_CHARS."""
    from ragserve.service.retrieval import QUERY_EMBED_CHARS

    await service.add_documents("kb", docs("kaito", "bread"))
    seen: list[str] = []
    embed_query = embedder.embed_query

    async def recording(text: str):
        seen.append(text)
        return await embed_query(text)

    embedder.embed_query = recording
    try:
        question = "What does the KAITO operator do on Kubernetes? "
        nodes, _ = await service.retrieve("kb", question + "!" * 1_000_000, 1, mode="hybrid")
    finally:
        del embedder.embed_query
    assert [len(t) for t in seen] == [QUERY_EMBED_CHARS] and seen[0].startswith(question)
    assert nodes[0].metadata["topic"] == "kaito"


class _HeldEmbedder:
    """The embedder seam as the Embedder's handle is: each call waits until the test lets it
    answer; records every call (its ``bulk`` flag too) and how many were in flight at once."""

    def __init__(self, inner) -> None:
        import asyncio

        self.inner, self.model = inner, inner.model
        self.calls: list[tuple[int, bool]] = []
        self.in_flight = self.most_in_flight = 0
        self.release = asyncio.Semaphore(0)

    async def embed_documents(self, texts: list[str], *, bulk: bool = False):
        import numpy as np

        self.calls.append((len(texts), bulk))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await self.release.acquire()
        finally:
            self.in_flight -= 1
        return np.ones((len(texts), self.model.dim), dtype=np.float32) / np.sqrt(self.model.dim)

    async def embed_query(self, text: str):
        return await self.inner.embed_query(text)

    async def count_tokens(
        self, texts: list[str], *, over: int | None = None, total_over: int | None = None
    ) -> list[int]:
        return await self.inner.count_tokens(texts, over=over, total_over=total_over)


async def test_a_large_document_sends_a_few_bulk_batches_at_a_time_and_none_once_cancelled(
    tmp_path: Path, embedder
) -> None:
    """A megabyte of "." is ~4,600 chunks, minutes of one core: its batches go a few at a time as
    ``bulk`` work (which waits for queries in the embedder), so they never fill the embedder's queue;
    and a request cancelled (its client left) sends no batch after that."""
    import asyncio

    from ragserve.service.documents import EMBED_BATCHES_IN_FLIGHT

    held = _HeldEmbedder(embedder)
    svc, pool = make_service(tmp_path, held)
    svc.embed_batch = 8
    try:
        text = " ".join(f"Sentence number {i} is about a topic of its own." for i in range(400))
        task = asyncio.ensure_future(svc.add_documents("kb", [Document(text=text, doc_id="big")]))
        while len(held.calls) < EMBED_BATCHES_IN_FLIGHT:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert held.in_flight == EMBED_BATCHES_IN_FLIGHT and len(held.calls) == EMBED_BATCHES_IN_FLIGHT
        for _ in range(6):  # six answer: six more are sent, never more than the bound at once
            held.release.release()
            await asyncio.sleep(0.02)
        assert len(held.calls) == EMBED_BATCHES_IN_FLIGHT + 6 and held.most_in_flight == EMBED_BATCHES_IN_FLIGHT
        assert all(bulk for _, bulk in held.calls)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(50):
            held.release.release()
        await asyncio.sleep(0.05)
        assert len(held.calls) == EMBED_BATCHES_IN_FLIGHT + 6  # nothing sent after the cancel
        assert held.in_flight == 0
        assert not await svc.index_exists("kb")  # nothing stored half-way
        # a request that is not cancelled gets every batch (the bound only paces them)
        held.release = asyncio.Semaphore(10_000)
        (record,) = await svc.add_documents("kb", [Document(text=text, doc_id="big")])
        assert record.doc_id == "big" and held.most_in_flight == EMBED_BATCHES_IN_FLIGHT
        assert (await svc.list_documents("kb")).total_items == 1
    finally:
        pool.close()


async def test_a_failed_batch_stops_the_request_sending_the_others(tmp_path: Path, embedder) -> None:
    """One batch refused (the embedder down, a 4xx): the request fails at once with that error and
    its batches still waiting are not sent."""
    import asyncio

    held = _HeldEmbedder(embedder)
    svc, pool = make_service(tmp_path, held)
    svc.embed_batch = 8
    calls = 0

    async def failing(texts: list[str], *, bulk: bool = False):
        nonlocal calls
        calls += 1
        if calls == 2:
            raise ConflictError("the embedder refused a batch")
        await asyncio.sleep(0.05)
        return await held.embed_documents(texts, bulk=bulk)

    held.release = asyncio.Semaphore(10_000)
    svc.embedder.embed_documents = failing  # type: ignore[method-assign]
    try:
        text = " ".join(f"Sentence number {i} is about a topic of its own." for i in range(400))
        with pytest.raises(ConflictError, match="refused a batch"):
            await svc.add_documents("kb", [Document(text=text, doc_id="big")])
        await asyncio.sleep(0.2)
        assert calls <= 4  # the bound's first batches; none sent after the failure
        assert not await svc.index_exists("kb")
    finally:
        pool.close()
