"""DocumentService under races and bad input: writes racing a drop, failed loads, crash-safe and
KAITO-shaped snapshots, atomic dedupe, repeated doc ids, updates that omit metadata."""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
from pathlib import Path
from typing import Any

import pytest

from ragserve.api.documents import Document, UpdateDocument
from ragserve.errors import BadRequestError, ConflictError
from ragserve.ingest import DocumentChunker, content_hash, hf_token_counter
from ragserve.service.documents import DocumentService
from ragserve.service.pool import LocalShardPool
from ragserve.service.shard_service import ShardService, check_layout
from tests.unit.service.test_service_documents import TEXTS, docs, make_service


@pytest.fixture
def service(tmp_path, embedder):
    svc, pool = make_service(tmp_path, embedder)
    yield svc
    pool.close()


async def assert_healthy(svc: DocumentService) -> None:
    """Every shard passes its self-check (one vector per chunk row, nothing else)."""
    assert await svc.pool.call_all(ShardService.verify) == [[]] * svc.pool.num_shards


class _DropBeforeWrite(LocalShardPool):
    """A pool on which the index is dropped just before a write reaches its shard."""

    def __init__(self, shards: list[Any]):
        super().__init__(shards)
        self.armed = False
        self.service: DocumentService | None = None

    async def call(self, shard: int, method: Any, *args: Any, **kwargs: Any) -> Any:
        if method is ShardService.upsert_documents and self.armed:
            self.armed = False
            assert self.service is not None
            await self.service.drop_index(kwargs["index"])
        return await super().call(shard, method, *args, **kwargs)


def _service(tmp_path: Path, embedder: Any, pool_cls: type[LocalShardPool], num_shards: int = 2) -> DocumentService:
    check_layout(tmp_path, num_shards)
    pool = pool_cls([ShardService(tmp_path, i, num_shards) for i in range(num_shards)])
    chunker = DocumentChunker(hf_token_counter(embedder.model.tokenizer), chunk_size=64, chunk_overlap=8)
    return DocumentService(pool, embedder, chunker, storage_dir=tmp_path, embedding_model="all-MiniLM-L6-v2")


# --- item 2 -------------------------------------------------------------------------------------
@pytest.mark.parametrize("write", ["add", "update"])
async def test_a_write_racing_a_drop_fails_cleanly_and_leaves_no_rows(tmp_path: Path, embedder, write: str) -> None:
    """The index is dropped after the write read its generation: a 409 saying so, for an update too
    (a client that took "not found" for "deleted by someone" would add it back and re-create the index)."""
    svc = _service(tmp_path, embedder, _DropBeforeWrite)
    pool = svc.pool
    assert isinstance(pool, _DropBeforeWrite)
    pool.service = svc
    await svc.add_documents("kb", [Document(text="first document", doc_id="a")])
    pool.armed = True
    with pytest.raises(ConflictError, match="deleted"):
        if write == "add":
            await svc.add_documents("kb", [Document(text="second document", doc_id="b")])
        else:
            await svc.update_documents("kb", [UpdateDocument(doc_id="a", text="first document, edited")])
    assert not await svc.index_exists("kb")
    # the name is reused: nothing of the dropped index or of the refused write comes back
    await svc.add_documents("kb", [Document(text="third document", doc_id="c")])
    page = await svc.list_documents("kb")
    assert [d.doc_id for d in page.documents] == ["c"]
    await assert_healthy(svc)
    pool.close()


# --- item 4 -------------------------------------------------------------------------------------
def _truncate_a_part(snapshot: Path) -> None:
    manifest = json.loads((snapshot / "manifest.json").read_text())
    part = snapshot / manifest["parts"][0]
    data = part.read_bytes()
    part.write_bytes(data[: len(data) // 3])


async def test_a_failed_load_changes_nothing(tmp_path: Path, embedder) -> None:
    svc, pool = make_service(tmp_path, embedder)
    await svc.add_documents("kb", docs("kaito", "rag", "faiss", "bread", "tides"))
    await svc.persist("kb", "backups")
    snapshot = next((tmp_path / "snapshots" / "backups").rglob("manifest.json")).parent
    rel = str(snapshot.relative_to(tmp_path / "snapshots"))
    bread = [d.doc_id for d in (await svc.list_documents("kb")).documents if d.metadata["topic"] == "bread"]
    await svc.delete_documents("kb", bread)  # the live index differs from the snapshot now
    _truncate_a_part(snapshot)
    with pytest.raises(BadRequestError, match="snapshot"):
        await svc.load("kb", rel, overwrite=True)
    assert (await svc.list_documents("kb")).total_items == 4  # the live index is untouched
    nodes, _ = await svc.retrieve("kb", "ocean tides and the moon", 1)
    assert nodes and nodes[0].metadata["topic"] == "tides"
    with pytest.raises(BadRequestError, match="snapshot"):
        await svc.load("copy", rel)
    assert not await svc.index_exists("copy")  # nothing half-imported is left behind
    assert await svc.list_indexes() == ["kb"]
    await assert_healthy(svc)
    pool.close()


# --- items 5 and 12 -----------------------------------------------------------------------------
async def test_persist_and_load_follow_kaitos_layout(service: DocumentService) -> None:
    await service.add_documents("kb", docs("kaito", "rag"))
    message = await service.persist("kb", "backups")
    assert message == "Successfully persisted index kb to backups/kb."
    assert (service.storage_dir / "snapshots" / "backups" / "kb" / "manifest.json").is_file()
    # a KAITO client loads from <path>/<name>
    assert await service.load("kb", "backups/kb", overwrite=True) == "Successfully loaded index kb from backups/kb."
    assert (await service.list_documents("kb")).total_items == 2
    # no path: <snapshots>/<name>, both ways
    assert await service.persist("kb") == "Successfully persisted index kb to kb."
    await service.drop_index("kb")
    assert await service.load("kb") == "Successfully loaded index kb from kb."
    assert (await service.list_documents("kb")).total_items == 2
    await assert_healthy(service)


async def test_a_crash_while_persisting_keeps_the_previous_snapshot(service: DocumentService, monkeypatch) -> None:
    await service.add_documents("kb", docs("kaito", "rag"))
    await service.persist("kb", "b")
    snapshot = next((service.storage_dir / "snapshots" / "b").rglob("manifest.json")).parent
    await service.add_documents("kb", docs("bread"))

    def crash_on_commit(real):  # type: ignore[no-untyped-def]
        def wrapped(src, dst, *a, **k):  # type: ignore[no-untyped-def]
            target = Path(dst)
            if target == snapshot or target == snapshot / "manifest.json":
                raise OSError("simulated crash while swapping the snapshot in")
            return real(src, dst, *a, **k)

        return wrapped

    monkeypatch.setattr(os, "replace", crash_on_commit(os.replace))
    monkeypatch.setattr(os, "rename", crash_on_commit(os.rename))
    monkeypatch.setattr(Path, "rename", lambda self, dst: crash_on_commit(os.rename)(self, dst) or Path(dst))
    monkeypatch.setattr(Path, "replace", lambda self, dst: crash_on_commit(os.replace)(self, dst) or Path(dst))
    with pytest.raises(OSError, match="simulated crash"):
        await service.persist("kb", "b")
    monkeypatch.undo()
    rel = str(snapshot.relative_to(service.storage_dir / "snapshots"))
    await service.load("old", rel)  # the previous snapshot is complete
    assert (await service.list_documents("old")).total_items == 2


async def test_nested_snapshot_paths_never_destroy_each_other(service: DocumentService) -> None:
    await service.add_documents("kb", docs("kaito", "rag"))
    await service.persist("kb", "team/a")
    await service.persist("kb", "team")
    for rel in ("team/a/kb", "team/kb"):
        await service.load(f"copy-{rel.count('/')}", rel)
    assert (await service.list_documents("copy-2")).total_items == 2
    assert (await service.list_documents("copy-1")).total_items == 2
    # a snapshot inside another one, or around another one, is refused with what to do instead
    await service.persist("kb", "solo")  # snapshots/solo/kb
    with pytest.raises(BadRequestError, match="inside the snapshot"):
        await service.persist("kb", "solo/kb")  # snapshots/solo/kb/kb
    await service.add_documents("team", docs("bread"))
    with pytest.raises(BadRequestError, match="contains"):
        await service.persist("team")  # snapshots/team would hold team/a/kb and team/kb
    assert (await service.load("copy-3", "team/a/kb", overwrite=True)).startswith("Successfully loaded")


async def test_a_path_naming_a_file_is_a_400(service: DocumentService) -> None:
    await service.add_documents("kb", docs("kaito"))
    await service.persist("kb", "a")
    manifest = next((service.storage_dir / "snapshots" / "a").rglob("manifest.json"))
    rel = str(manifest.relative_to(service.storage_dir / "snapshots"))
    with pytest.raises(BadRequestError, match="file"):
        await service.persist("kb", rel)
    with pytest.raises(BadRequestError, match="file"):
        await service.load("kb", rel, overwrite=True)
    assert (await service.list_documents("kb")).total_items == 1


# --- item 6 -------------------------------------------------------------------------------------
async def test_identical_concurrent_adds_without_doc_id_store_one_document(service: DocumentService) -> None:
    first, second = await asyncio.gather(
        service.add_documents("kb", docs("kaito")), service.add_documents("kb", docs("kaito"))
    )
    assert first[0].doc_id == second[0].doc_id
    assert (await service.list_documents("kb")).total_items == 1
    await assert_healthy(service)


async def test_dedupe_survives_a_reused_content_id(service: DocumentService) -> None:
    """The content-derived id of a text already names another document (edited since): the new
    document gets another id and both are kept."""
    (rec,) = await service.add_documents("kb", docs("kaito"))
    await service.update_documents("kb", [UpdateDocument(doc_id=rec.doc_id, text=TEXTS["rag"], metadata={})])
    (again,) = await service.add_documents("kb", docs("kaito"))
    assert again.doc_id != rec.doc_id
    page = await service.list_documents("kb")
    assert {d.doc_id: d.text for d in page.documents} == {rec.doc_id: TEXTS["rag"], again.doc_id: TEXTS["kaito"]}
    (third,) = await service.add_documents("kb", docs("kaito"))
    assert third.doc_id == again.doc_id and (await service.list_documents("kb")).total_items == 2


# --- item 8 -------------------------------------------------------------------------------------
async def test_a_doc_id_repeated_in_one_request_is_a_400_naming_it(service: DocumentService) -> None:
    await service.add_documents("kb", [Document(text="one", doc_id="x"), Document(text="two", doc_id="y")])
    with pytest.raises(BadRequestError, match="'x'"):
        await service.update_documents(
            "kb", [UpdateDocument(doc_id="x", text="first text"), UpdateDocument(doc_id="x", text="second text")]
        )
    with pytest.raises(BadRequestError, match="'z'"):
        await service.add_documents("kb", [Document(text="a", doc_id="z"), Document(text="b", doc_id="z")])
    page = await service.list_documents("kb")
    assert {d.doc_id: d.text for d in page.documents} == {"x": "one", "y": "two"}  # nothing stored


# --- item 14 ------------------------------------------------------------------------------------
async def test_an_update_without_metadata_keeps_the_stored_metadata(service: DocumentService) -> None:
    await service.add_documents("kb", [Document(text="old text", doc_id="x", metadata={"team": "a"})])
    result = await service.update_documents("kb", [UpdateDocument(doc_id="x", text="new text")])
    assert result.updated_documents[0].metadata == {"team": "a"}
    page = await service.list_documents("kb")
    assert page.documents[0].text == "new text" and page.documents[0].metadata == {"team": "a"}
    # an explicit empty object still clears it
    await service.update_documents("kb", [UpdateDocument(doc_id="x", text="new text", metadata={})])
    assert (await service.list_documents("kb")).documents[0].metadata == {}


# --- if_exists: keep ----------------------------------------------------------------------------
_OTHER_CLIENT: contextvars.ContextVar[bool] = contextvars.ContextVar("other_client", default=False)


class _WriteBeforeWrite(LocalShardPool):
    """A pool on which another client's write (or delete) lands just before a call of a shard method
    reaches its shard (``before[method]``, once): before *every* shard's call of that method, since
    the request's calls to the other shards wait until the other client's calls have landed."""

    def __init__(self, shards: list[Any]):
        super().__init__(shards)
        self.before: dict[Any, Any] = {}
        self._landing: dict[Any, asyncio.Task[Any]] = {}

    async def call(self, shard: int, method: Any, *args: Any, **kwargs: Any) -> Any:
        if not _OTHER_CLIENT.get():
            before = self.before.pop(method, None)
            if before is not None:
                self._landing[method] = asyncio.ensure_future(self._as_other_client(before))
            landing = self._landing.get(method)
            if landing is not None:
                await asyncio.shield(landing)
        return await super().call(shard, method, *args, **kwargs)

    @staticmethod
    async def _as_other_client(before: Any) -> None:
        _OTHER_CLIENT.set(True)  # in this task's own context: its calls do not wait for it
        await before()


async def test_keep_existing_leaves_a_held_document_and_returns_it_as_stored(service: DocumentService) -> None:
    await service.add_documents("kb", [Document(text="the other client's text", doc_id="a", metadata={"o": 1})])
    out = await service.add_documents(
        "kb",
        [Document(text="mine", doc_id="a"), Document(text="also mine", doc_id="b")],
        keep_existing=True,
    )
    assert [(r.doc_id, r.text, r.metadata) for r in out] == [
        ("a", "the other client's text", {"o": 1}),
        ("b", "also mine", {}),
    ]
    stored = {d.doc_id: d.text for d in (await service.list_documents("kb")).documents}
    assert stored == {"a": "the other client's text", "b": "also mine"}
    # the same content again is no conflict: returned as stored, nothing written
    again = await service.add_documents("kb", [Document(text="also mine", doc_id="b")], keep_existing=True)
    assert again[0].hash_value == out[1].hash_value
    # and without the option the document is replaced, as before
    await service.add_documents("kb", [Document(text="mine", doc_id="a")])
    assert (await service.get_document("kb", "a")).text == "mine"
    await assert_healthy(service)


async def test_keep_existing_holds_against_a_write_landing_after_the_index_was_read(tmp_path: Path, embedder) -> None:
    """Another client writes the id between the request's read of the index and its write: the
    shard's write lock decides, so the other client's document stays and is what comes back."""
    svc = _service(tmp_path, embedder, _WriteBeforeWrite)
    pool = svc.pool
    assert isinstance(pool, _WriteBeforeWrite)
    await svc.add_documents("kb", [Document(text="seed", doc_id="seed")])

    async def other_client() -> None:
        await DocumentService.add_documents(svc, "kb", [Document(text="written meanwhile", doc_id="a")])

    pool.before[ShardService.upsert_documents] = other_client
    out = await svc.add_documents("kb", [Document(text="mine", doc_id="a")], keep_existing=True)
    assert (out[0].doc_id, out[0].text) == ("a", "written meanwhile")
    assert (await svc.get_document("kb", "a")).text == "written meanwhile"

    # written before the write and deleted again before it is read back: the id is free when the
    # write is tried again, so it is written
    async def write_c() -> None:
        await DocumentService.add_documents(svc, "kb", [Document(text="there a moment", doc_id="c")])
        pool.before[ShardService.get_documents] = delete_c

    async def delete_c() -> None:
        await svc.delete_documents("kb", ["c"])

    pool.before[ShardService.upsert_documents] = write_c
    out = await svc.add_documents("kb", [Document(text="mine c", doc_id="c")], keep_existing=True)
    assert out[0].text == "mine c" and (await svc.get_document("kb", "c")).text == "mine c"
    await assert_healthy(svc)
    pool.close()


# --- if_hash_value / if_hash_values: compare-and-set updates and deletes ---------------------------
async def test_updates_and_deletes_conditioned_on_a_hash_leave_what_another_client_changed(
    tmp_path: Path, embedder
) -> None:
    svc = _service(tmp_path, embedder, _WriteBeforeWrite, num_shards=3)
    pool = svc.pool
    assert isinstance(pool, _WriteBeforeWrite)
    first = await svc.add_documents("kb", [Document(text=f"document {c}", doc_id=c) for c in "abcdef"])
    read = {r.doc_id: r.hash_value for r in first}

    # the hash read before: updated; another hash: left and returned as stored; none: as before
    out = await svc.update_documents(
        "kb",
        [
            UpdateDocument(doc_id="a", text="a, mine", if_hash_value=read["a"]),
            UpdateDocument(doc_id="b", text="b, mine", if_hash_value="not-its-hash"),
            UpdateDocument(doc_id="zz", text="nowhere", if_hash_value=read["a"]),
        ],
    )
    assert [d.doc_id for d in out.updated_documents] == ["a"]
    assert [(d.doc_id, d.text) for d in out.conflicting_documents] == [("b", "document b")]
    assert [d.doc_id for d in out.not_found_documents] == ["zz"]

    # another client's write lands between the read and the write: it stands
    async def other_client_writes_c() -> None:
        await svc.update_documents("kb", [UpdateDocument(doc_id="c", text="c, the other client's")])

    pool.before[ShardService.upsert_documents] = other_client_writes_c
    out = await svc.update_documents("kb", [UpdateDocument(doc_id="c", text="c, mine", if_hash_value=read["c"])])
    assert out.updated_documents == [] and [d.text for d in out.conflicting_documents] == ["c, the other client's"]
    assert (await svc.get_document("kb", "c")).text == "c, the other client's"

    # deletes alike, the shard deciding under its write lock
    gone = await svc.delete_documents(
        "kb", ["d", "e", "zz", "f"], {"d": read["d"], "e": "not-its-hash", "zz": read["d"]}
    )
    assert (gone.deleted_doc_ids, gone.conflicting_doc_ids, gone.not_found_doc_ids) == (["d", "f"], ["e"], ["zz"])

    async def other_client_writes_e() -> None:
        await svc.update_documents("kb", [UpdateDocument(doc_id="e", text="e, the other client's")])

    pool.before[ShardService.delete_documents] = other_client_writes_e
    gone = await svc.delete_documents("kb", ["e"], {"e": read["e"]})
    assert (gone.deleted_doc_ids, gone.conflicting_doc_ids) == ([], ["e"])
    assert (await svc.get_document("kb", "e")).text == "e, the other client's"
    await assert_healthy(svc)
    pool.close()


async def _stored(svc: DocumentService, index: str) -> dict[str, tuple[str, str]]:
    page = await svc.list_documents(index, limit=100, max_text_length=None)
    return {d.doc_id: (d.text, d.hash_value) for d in page.documents}


async def test_keep_existing_decides_again_what_it_found_held_when_it_read(tmp_path: Path, embedder) -> None:
    """A document found held when the request read the index is decided again before answering:
    deleted since, the request's document is written; its index dropped and re-created since, the
    answer is what the new index holds (never a document of the dropped one)."""
    svc = _service(tmp_path, embedder, _WriteBeforeWrite)
    pool = svc.pool
    assert isinstance(pool, _WriteBeforeWrite)
    await svc.add_documents("kb", [Document(text="other client's", doc_id="a")])

    async def delete_a() -> None:
        await svc.delete_documents("kb", ["a"])

    pool.before[ShardService.ensure_index] = delete_a
    mine = [Document(text="mine a", doc_id="a"), Document(text="mine b", doc_id="b")]
    out = await svc.add_documents("kb", mine, keep_existing=True)
    now = await _stored(svc, "kb")
    assert [(r.doc_id, r.text) for r in out] == [("a", "mine a"), ("b", "mine b")]
    assert {k: v[0] for k, v in now.items()} == {"a": "mine a", "b": "mine b"}

    await svc.add_documents("kb", [Document(text="other client's again", doc_id="c")])

    async def recreate() -> None:
        await svc.drop_index("kb")
        await DocumentService.add_documents(svc, "kb", [Document(text="new index doc", doc_id="z")])

    pool.before[ShardService.ensure_index] = recreate
    out = await svc.add_documents(
        "kb", [Document(text="mine c", doc_id="c"), Document(text="mine d", doc_id="d")], keep_existing=True
    )
    now = await _stored(svc, "kb")
    assert [(r.doc_id, r.text) for r in out] == [("c", "mine c"), ("d", "mine d")]
    assert {k: v[0] for k, v in now.items()} == {"z": "new index doc", "c": "mine c", "d": "mine d"}

    # every document held when read: nothing embedded then; the index is dropped and re-created
    # after that read, so the answer is read again and the document written after all
    await svc.add_documents("kb", [Document(text="other client's c", doc_id="c")])

    async def recreate_after_this_read() -> None:
        pool.before[ShardService.get_documents] = recreate

    pool.before[ShardService.get_documents] = recreate_after_this_read
    out = await svc.add_documents("kb", [Document(text="mine c, again", doc_id="c")], keep_existing=True)
    now = await _stored(svc, "kb")
    assert [(r.doc_id, r.text) for r in out] == [("c", "mine c, again")]
    assert {k: v[0] for k, v in now.items()} == {"z": "new index doc", "c": "mine c, again"}
    await assert_healthy(svc)
    pool.close()


@pytest.mark.parametrize("num_shards", [2, 4])
async def test_keep_existing_answers_what_is_stored_with_mixed_ids_and_racing_writes(
    tmp_path: Path, embedder, num_shards: int
) -> None:
    svc = _service(tmp_path, embedder, _WriteBeforeWrite, num_shards=num_shards)
    pool = svc.pool
    assert isinstance(pool, _WriteBeforeWrite)
    pre = [Document(text=f"pre {i}", doc_id=f"d{i}") for i in range(0, 12, 3)]
    await svc.add_documents("kb", pre)
    racers = [Document(text=f"racer {i}", doc_id=f"d{i}") for i in (1, 7)]

    async def other() -> None:
        await DocumentService.add_documents(svc, "kb", racers)

    pool.before[ShardService.ensure_index] = other
    mine = [Document(text=f"mine {i}", doc_id=f"d{i}") for i in range(12)]
    mine.insert(2, Document(text="no id one"))
    mine.insert(5, Document(text="pre 3"))  # id-less, the content of d3
    mine.append(Document(text="no id one"))  # id-less, twice in one request
    out = await svc.add_documents("kb", mine, keep_existing=True)
    now = await _stored(svc, "kb")
    held = {p.doc_id for p in [*pre, *racers]}
    for d, r in zip(mine, out, strict=True):
        assert now[r.doc_id] == (r.text, r.hash_value), (d, r)
        if d.doc_id is not None:
            assert (r.hash_value == content_hash(d.text, d.metadata)) == (d.doc_id not in held), (d, r)
    assert all(now[p.doc_id][0] == p.text for p in [*pre, *racers])
    await assert_healthy(svc)
    pool.close()
