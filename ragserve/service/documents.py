"""The document API's logic: chunk, embed, route, write; list, update, delete, count, drop.

Everything here is async and talks to two seams only: a ``TextEmbedder`` and a ``ShardPool``. Under
Ray Serve those are deployment and actor handles; in unit tests they are in-process objects.
Searching an index is ``ragserve.service.retrieval`` (a ``Retriever``) and its snapshots on disk
are ``ragserve.service.snapshots``; ``DocumentService`` holds both and hands ``retrieve``,
``persist`` and ``load`` to them, so the routes and the chat service see one document service.

Concurrency: the service keeps no state of its own (ingress replicas run many at once), so every
race is settled in the shards, under their write locks. An index's home shard (``HOME_SHARD``)
hands out its generation: writes carry it, and a delete-index or a load names the generation it
removes, so a write racing either is kept whole before it or refused (409) with nothing stored.
Documents without a doc_id get an id derived from their content and are inserted only if absent,
so identical requests at once store one document.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ragserve import tracing
from ragserve.api.documents import (
    DeleteDocumentsResponse,
    Document,
    DocumentRecord,
    ListDocumentsResponse,
    NodeWithScore,
    UpdateDocument,
    UpdateDocumentsResponse,
    index_names,
)
from ragserve.api.stats import IndexStats, ShardStats
from ragserve.errors import BadRequestError, ConflictError, NotFoundError
from ragserve.ingest import ChunkingError, DocumentChunker, content_hash, node_id_for
from ragserve.ports import ShardPool, TextEmbedder
from ragserve.rag.plan import unknown_index
from ragserve.service.access import FULL_ACCESS, Principal
from ragserve.service.retrieval import Retriever
from ragserve.service.routing import group_by_shard
from ragserve.service.shard_service import HOME_SHARD, ShardService
from ragserve.service.snapshots import Snapshots
from ragserve.store import ChunkWrite, DocumentWrite, StoredDocument

MAX_CONTENT_ID_ATTEMPTS = 16
#: Embedding batches of one request in flight at once: enough to keep a few embedder replicas busy,
#: few enough that a request of thousands of chunks neither fills the embedder's queue (other
#: requests' batches take turns with its next ones) nor goes on being sent once it is cancelled.
EMBED_BATCHES_IN_FLIGHT = 4
_CONTENT_NAMESPACE = uuid.UUID("0b6f1f0e-7c3a-4d52-9b1e-2f8a64c1d9e3")


def content_doc_id(hash_value: str, attempt: int = 0) -> str:
    """The id of a document indexed without a doc_id: derived from its content hash, so identical
    concurrent requests choose the same id and the shard (which stores an id only once) keeps one
    document. ``attempt`` > 0 gives the next candidates, used when another document (edited since)
    already holds the id."""
    return uuid.uuid5(_CONTENT_NAMESPACE, f"{hash_value}:{attempt}").hex


@dataclass
class _Prepared:
    """A document ready to write: its id, hash and chunks (vectors filled in later)."""

    doc_id: str
    text: str
    metadata: dict[str, Any]
    hash_value: str
    chunk_texts: list[str]


def _record(doc: StoredDocument | _Prepared, is_truncated: bool = False) -> DocumentRecord:
    return DocumentRecord(
        doc_id=doc.doc_id,
        text=doc.text,
        hash_value=doc.hash_value,
        metadata=dict(doc.metadata),
        is_truncated=is_truncated,
    )


class DocumentService:
    """Index management over a pool of shards; retrieval and snapshots through its ``retriever``
    and ``snapshots``."""

    def __init__(
        self,
        pool: ShardPool[ShardService],
        embedder: TextEmbedder,
        chunker: DocumentChunker,
        *,
        storage_dir: str | Path,
        embedding_model: str = "",
        embed_batch: int = 128,
        embed_in_flight: int = EMBED_BATCHES_IN_FLIGHT,
        retriever: Retriever | None = None,
    ):
        self.pool = pool
        self.embedder = embedder
        self.chunker = chunker
        self.storage_dir = Path(storage_dir)
        self.embedding_model = embedding_model
        self.embed_batch = embed_batch
        self.embed_in_flight = max(1, embed_in_flight)
        self.retriever = retriever or Retriever(pool, embedder)
        self.snapshots = Snapshots(pool, storage_dir, index_exists=self.index_exists, embedding_model=embedding_model)

    # --- indexes ------------------------------------------------------------------------------
    async def list_indexes(self) -> list[str]:
        names: set[str] = set()
        for part in await self.pool.call_all(ShardService.list_indexes):
            names.update(part)
        return sorted(names)

    async def index_exists(self, index: str) -> bool:
        return any(await self.pool.call_all(ShardService.has_index, index))

    async def require_index(self, index: str) -> None:
        if not await self.index_exists(index):
            raise unknown_index(index)

    async def missing_index(self, indexes: Sequence[str]) -> str | None:
        """The first of ``indexes`` no shard holds, or None when every one exists (asked at once)."""
        exists = await asyncio.gather(*(self.index_exists(name) for name in indexes))
        return next((name for name, held in zip(indexes, exists, strict=True) if not held), None)

    async def mentioned(self, indexes: str | Sequence[str], words: list[str]) -> set[str]:
        """Those of ``words`` that some chunk of ``indexes`` (one, or any of several) holds, on any
        shard (lexical lookups, one call per shard)."""
        if not words:
            return set()
        found: set[str] = set()
        for part in await self.pool.call_all(ShardService.mentioned, indexes=list(index_names(indexes)), words=words):
            found.update(part)
        return found

    async def index_versions(
        self, indexes: Sequence[str], shard_wide: bool = False
    ) -> tuple[tuple[str, int | None, int], ...]:
        """The change versions of ``indexes`` on every shard (``ShardService.index_versions``, one
        call per shard, at once), shard by shard: equal tuples mean no write reached them between
        the two reads (the answer cache's test, docs/architecture.md §4). ``shard_wide``: also a write
        to any other index of those shards (what a keyword search's ranking depends on)."""
        parts = await self.pool.call_all(ShardService.index_versions, indexes=list(indexes), shard_wide=shard_wide)
        return tuple((str(e), g, int(c)) for part in parts for e, g, c in part)

    async def count_documents(self, index: str) -> int:
        return sum(await self.pool.call_all(ShardService.count_documents, index))

    async def drop_index(self, index: str) -> str:
        """Drop ``index`` on every shard. The generation is read on the home shard first and sent
        along, so every shard also refuses a write of that generation still in flight (it then
        fails with 409 and stores nothing) instead of recreating the index with its rows."""
        generation = await self.pool.call(HOME_SHARD, ShardService.index_generation, index)
        dropped = await self.pool.call_all(ShardService.drop_index, index=index, generation=generation)
        if not any(dropped):
            raise NotFoundError(f"No such index: '{index}' exists.")
        return f"Successfully deleted index {index}."

    # --- writes -------------------------------------------------------------------------------
    def _chunk(
        self, text: str, metadata: dict[str, Any], where: str, chunker: DocumentChunker | None = None
    ) -> list[str]:
        try:
            chunks = (chunker or self.chunker).chunk(text, metadata)
        except ChunkingError as e:
            raise BadRequestError(f"{where}: {e}") from e
        if not chunks:
            raise BadRequestError(
                f"{where}: text has no content to index (only whitespace, control or invisible characters)"
            )
        return [c.text for c in chunks]

    @staticmethod
    def _reject_repeated_ids(doc_ids: Sequence[str | None]) -> None:
        """A doc_id given twice in one request is ambiguous (which text wins?): a 400 naming it,
        before anything is stored."""
        seen: dict[str, int] = {}
        for i, doc_id in enumerate(doc_ids):
            if doc_id is None:
                continue
            if doc_id in seen:
                raise BadRequestError(
                    f"documents[{i}]: doc_id '{doc_id}' is repeated (also documents[{seen[doc_id]}]); "
                    "give each document once per request",
                    param="documents",
                )
            seen[doc_id] = i

    async def _embed_chunks(self, prepared: Sequence[_Prepared]) -> dict[str, list[ChunkWrite]]:
        """Embed every chunk of ``prepared`` in batches, ``embed_in_flight`` of them at a time
        (replicas share the work), each as ``bulk`` work: queries and chats' passages go first in the
        embedder. Cancelled (its client left), it sends no more batches."""
        flat = [(p.doc_id, i, t) for p in prepared for i, t in enumerate(p.chunk_texts)]
        batches = [flat[i : i + self.embed_batch] for i in range(0, len(flat), self.embed_batch)]
        turns = asyncio.Semaphore(self.embed_in_flight)
        failed = False

        async def embed(batch: list[tuple[str, int, str]]) -> Any:
            nonlocal failed
            async with turns:
                if failed:  # woken by the batch that failed: the request's answer is that failure
                    return None
                try:
                    return await self._embed_batch([t for _, _, t in batch])
                except BaseException:
                    failed = True
                    raise

        sent = [asyncio.ensure_future(embed(b)) for b in batches]
        try:
            vectors = await asyncio.gather(*sent)
        except BaseException:  # one failed, or this was cancelled: the others send nothing more
            for task in sent:
                task.cancel()
            raise
        out: dict[str, list[ChunkWrite]] = {p.doc_id: [] for p in prepared}
        for batch, vecs in zip(batches, vectors, strict=True):
            for (doc_id, i, text), vec in zip(batch, vecs, strict=True):
                out[doc_id].append(
                    ChunkWrite(
                        node_id=node_id_for(doc_id, i),
                        chunk_index=i,
                        text=text,
                        vector=np.asarray(vec, dtype=np.float32),
                    )
                )
        return out

    async def _embed_batch(self, texts: list[str]) -> Any:
        with tracing.span("embedding.documents", {"ragserve.texts": len(texts)} if tracing.ENABLED else None):
            return await self.embedder.embed_documents(texts, bulk=True)

    @staticmethod
    def _as_write(p: _Prepared, chunks: list[ChunkWrite], doc_id: str | None = None) -> DocumentWrite:
        """``p`` as a shard write, under ``doc_id`` when given (node ids follow the doc id)."""
        if doc_id is not None and doc_id != p.doc_id:
            chunks = [replace(c, node_id=node_id_for(doc_id, c.chunk_index)) for c in chunks]
        return DocumentWrite(
            doc_id=doc_id or p.doc_id, text=p.text, metadata=p.metadata, hash_value=p.hash_value, chunks=chunks
        )

    async def _write(
        self,
        index: str,
        writes: Sequence[DocumentWrite],
        *,
        generation: int | None,
        only_existing: bool = False,
        if_absent: bool = False,
        expected: dict[str, str] | None = None,
    ) -> set[str]:
        """Write to the owning shards; returns once every shard has committed (the acknowledgement
        point), with the doc ids written (with ``only_existing``, those deleted meanwhile are not;
        with ``if_absent``, those already stored are not)."""
        if not writes:
            return set()
        groups = group_by_shard(list(writes), lambda w: w.doc_id, self.pool.num_shards)
        written = await asyncio.gather(
            *(
                self.pool.call(
                    s,
                    ShardService.upsert_documents,
                    index=index,
                    docs=ws,
                    only_existing=only_existing,
                    generation=generation,
                    if_absent=if_absent,
                    expected=None
                    if expected is None
                    else {w.doc_id: expected[w.doc_id] for w in ws if w.doc_id in expected},
                )
                for s, ws in groups.items()
            )
        )
        return {doc_id for part in written for doc_id in part}

    async def _insert_by_content(
        self, index: str, generation: int, pending: dict[int, _Prepared], chunks: dict[str, list[ChunkWrite]]
    ) -> dict[int, str]:
        """Store documents that came without a doc_id under ids derived from their content, each
        shard inserting only ids it does not hold (under its write lock): two identical requests at
        once derive the same id and store one document. An id already held by other content (a
        document edited since) moves on to the next derived id. Returns request position -> doc_id."""
        final: dict[int, str] = {}
        attempt = 0
        while pending:
            ids = {i: p.doc_id if attempt == 0 else content_doc_id(p.hash_value, attempt) for i, p in pending.items()}
            by_id: dict[str, int] = {}
            for i, doc_id in ids.items():
                by_id.setdefault(doc_id, i)  # the same content twice in one request: written once
            writes = [self._as_write(pending[i], chunks[pending[i].doc_id], doc_id) for doc_id, i in by_id.items()]
            written = await self._write(index, writes, generation=generation, if_absent=True)
            held = await self._get_documents(index, [d for d in by_id if d not in written])
            retry: dict[int, _Prepared] = {}
            for i, doc_id in ids.items():
                other = held.get(doc_id)
                if doc_id in written or (other is not None and other.hash_value == pending[i].hash_value):
                    final[i] = doc_id
                else:  # taken by other content (or deleted meanwhile: the next id is as good)
                    retry[i] = pending[i]
            pending = retry
            attempt += 1
            if attempt > MAX_CONTENT_ID_ATTEMPTS:
                raise ConflictError("could not find a free document id for the new documents; retry the request")
        return final

    async def add_documents(
        self,
        index: str,
        docs: Sequence[Document],
        chunker: DocumentChunker | None = None,
        *,
        keep_existing: bool = False,
    ) -> list[DocumentRecord]:
        """Create or extend ``index`` (chunked by ``chunker``, default the server's). Re-adding the
        same text and metadata is idempotent: the existing document is returned and nothing is
        stored again, also when identical requests run at once (documents without a doc_id get an
        id derived from their content, and the shard stores an id only once). A doc_id given twice
        in the request is a 400. A given doc_id the index holds with other content is replaced,
        unless ``keep_existing``: then that document is left as it is and returned as stored (its
        ``hash_value`` not the one sent), decided by its shard under the write lock, so a document
        another client writes meanwhile is never overwritten either."""
        self._reject_repeated_ids([d.doc_id for d in docs])
        hashes = [content_hash(d.text, d.metadata) for d in docs]
        with tracing.span("ingest.chunk", {"ragserve.documents": len(docs)} if tracing.ENABLED else None) as span:
            chunk_texts = await asyncio.to_thread(
                lambda: [self._chunk(d.text, d.metadata, f"documents[{i}]", chunker) for i, d in enumerate(docs)]
            )
            if tracing.ENABLED:
                span.set_attribute("ragserve.chunks", sum(len(t) for t in chunk_texts))
        existing_by_hash: dict[str, str] = {}
        for part in await self.pool.call_all(ShardService.find_by_hash, index=index, hashes=sorted(set(hashes))):
            existing_by_hash.update(part)
        given_ids = [d.doc_id for d in docs if d.doc_id]
        existing_given = await self._get_documents(index, given_ids) if given_ids else {}

        prepared: list[_Prepared] = []
        slot: list[int | None] = []  # per request position: its key in by_content, if it is new and id-less
        given: list[_Prepared] = []  # client-chosen ids, written as they are
        kept: list[_Prepared] = []  # keep_existing: held with other content when read (checked again below)
        by_content: dict[int, _Prepared] = {}  # new id-less documents, by first request position
        seen: dict[str, int] = {}  # hash -> that first position
        for i, (d, h, texts) in enumerate(zip(docs, hashes, chunk_texts, strict=True)):
            key: int | None = None
            if d.doc_id:
                prep = _Prepared(d.doc_id, d.text, dict(d.metadata), h, texts)
                old = existing_given.get(d.doc_id)
                if old is not None and old.hash_value != h and keep_existing:
                    kept.append(prep)
                elif old is None or old.hash_value != h:
                    given.append(prep)
            elif h in existing_by_hash:
                prep = _Prepared(existing_by_hash[h], d.text, dict(d.metadata), h, texts)
            else:
                key = seen.setdefault(h, i)
                prep = by_content.setdefault(key, _Prepared(content_doc_id(h), d.text, dict(d.metadata), h, texts))
            prepared.append(prep)
            slot.append(key)
        to_embed = given + list(by_content.values())
        chunks: dict[str, list[ChunkWrite]] = {}
        generation: int | None = None
        if to_embed:
            chunks = await self._embed_chunks(to_embed)
            generation = await self._ensure_index(index, chunks)
            writes = [self._as_write(p, chunks[p.doc_id]) for p in given]
            written, final = await asyncio.gather(
                self._write(index, writes, generation=generation, if_absent=keep_existing),
                self._insert_by_content(index, generation, dict(by_content), chunks),
            )
            kept += [p for p in given if p.doc_id not in written]  # keep_existing: another client's since
            prepared = [
                p if key is None else replace(p, doc_id=final[key]) for p, key in zip(prepared, slot, strict=True)
            ]
        if kept:
            held = await self._held_instead(index, kept, chunks, generation)
            prepared = [held.get(p.doc_id, p) if key is None else p for p, key in zip(prepared, slot, strict=True)]
        return [_record(p) for p in prepared]

    async def _ensure_index(self, index: str, chunks: dict[str, list[ChunkWrite]]) -> int:
        """The generation of ``index``, created for the vectors' dimension when it does not exist."""
        dim = int(np.asarray(next(c for cs in chunks.values() for c in cs).vector).shape[-1])
        generation: int = await self.pool.call(HOME_SHARD, ShardService.ensure_index, index=index, dim=dim)
        return generation

    async def _held_instead(
        self, index: str, pending: list[_Prepared], chunks: dict[str, list[ChunkWrite]], generation: int | None
    ) -> dict[str, _Prepared]:
        """What the index holds under the ids of ``pending``, documents a ``keep_existing`` request
        found held by other content (when it read the index, or when its shard wrote), read again
        now: a document still there is returned in their place; one gone since is written after
        all (embedded then, if it was not), if-absent under the shard's write lock as before. By
        id, the documents to answer with."""
        held: dict[str, _Prepared] = {}
        for _ in range(MAX_CONTENT_ID_ATTEMPTS):
            found = await self._get_documents(index, [p.doc_id for p in pending])
            for doc_id, doc in found.items():
                held[doc_id] = _Prepared(doc_id, doc.text, dict(doc.metadata), doc.hash_value, [])
            pending = [p for p in pending if p.doc_id not in found]
            if not pending:
                return held
            missing = [p for p in pending if p.doc_id not in chunks]
            if missing:
                chunks.update(await self._embed_chunks(missing))
            if generation is None:
                generation = await self._ensure_index(index, chunks)
            writes = [self._as_write(p, chunks[p.doc_id]) for p in pending]
            written = await self._write(index, writes, generation=generation, if_absent=True)
            pending = [p for p in pending if p.doc_id not in written]
            if not pending:
                return held
        raise ConflictError("documents were written and deleted by other clients meanwhile; retry the request")

    async def _get_documents(self, index: str, doc_ids: Sequence[str]) -> dict[str, StoredDocument]:
        groups = group_by_shard(list(dict.fromkeys(doc_ids)), lambda x: x, self.pool.num_shards)
        parts = await asyncio.gather(
            *(self.pool.call(s, ShardService.get_documents, index=index, doc_ids=ids) for s, ids in groups.items())
        )
        found: dict[str, StoredDocument] = {}
        for p in parts:
            found.update(p)
        return found

    async def get_document(self, index: str, doc_id: str, max_text_length: int | None = None) -> DocumentRecord:
        """One document of ``index`` by id, its text cut to ``max_text_length`` characters when
        given (``is_truncated`` says so); a 404 naming what is missing, the index or the document."""
        found = (await self._get_documents(index, [doc_id])).get(doc_id)
        if found is None:
            await self.require_index(index)
            raise NotFoundError(
                f"No document '{doc_id}' in index '{index}'.", param="doc_id", code="document_not_found"
            )
        if max_text_length is not None and len(found.text) > max_text_length:
            return _record(replace(found, text=found.text[:max_text_length]), True)
        return _record(found)

    async def update_documents(self, index: str, docs: Sequence[UpdateDocument]) -> UpdateDocumentsResponse:
        """Re-chunk and re-embed only documents whose text or metadata changed. An omitted
        ``metadata`` keeps the stored one (``{}`` clears it). A doc_id given twice is a 400."""
        self._reject_repeated_ids([d.doc_id for d in docs])
        generation = await self.pool.call(HOME_SHARD, ShardService.index_generation, index)
        if generation is None:
            await self.require_index(index)  # an index from before generations has no home entry
        current = await self._get_documents(index, [d.doc_id for d in docs])
        updated: list[_Prepared] = []
        unchanged: list[DocumentRecord] = []
        not_found: list[UpdateDocument] = []
        conflicting: list[DocumentRecord] = []
        expected = {d.doc_id: d.if_hash_value for d in docs if d.if_hash_value is not None}
        for i, d in enumerate(docs):
            old = current.get(d.doc_id)
            if old is None:
                not_found.append(d)
                continue
            if expected.get(d.doc_id, old.hash_value) != old.hash_value:
                conflicting.append(_record(old))
                continue
            metadata = dict(old.metadata) if d.metadata is None else dict(d.metadata)
            h = content_hash(d.text, metadata)
            if h == old.hash_value:
                unchanged.append(_record(old))
                continue
            texts = await asyncio.to_thread(self._chunk, d.text, metadata, f"documents[{i}]")
            updated.append(_Prepared(d.doc_id, d.text, metadata, h, texts))
        chunks = await self._embed_chunks(updated) if updated else {}
        written = await self._write(
            index,
            [self._as_write(p, chunks[p.doc_id]) for p in updated],
            generation=generation,
            only_existing=True,
            expected=expected or None,  # sliced to each shard's writes by _write
        )
        by_id = {d.doc_id: d for d in docs}
        missed = [p for p in updated if p.doc_id not in written]  # deleted meanwhile, or changed
        changed = [p.doc_id for p in missed if p.doc_id in expected]  # (with if_hash_value) by another client
        now = await self._get_documents(index, changed) if changed else {}
        for p in missed:
            if p.doc_id in now:
                conflicting.append(_record(now[p.doc_id]))
            else:
                not_found.append(by_id[p.doc_id])
        updated = [p for p in updated if p.doc_id in written]
        echo = [d if d.metadata is not None else d.model_copy(update={"metadata": {}}) for d in not_found]
        return UpdateDocumentsResponse(
            updated_documents=[_record(p) for p in updated],
            unchanged_documents=unchanged,
            not_found_documents=echo,
            conflicting_documents=conflicting,
        )

    async def delete_documents(
        self, index: str, doc_ids: Sequence[str], if_hash_values: dict[str, str] | None = None
    ) -> DeleteDocumentsResponse:
        """Delete by id; ``if_hash_values`` (doc id -> hash) leaves a named document whose stored
        hash is another (decided by its shard under the write lock)."""
        await self.require_index(index)
        unique = list(dict.fromkeys(doc_ids))
        want = if_hash_values or {}
        groups = group_by_shard(unique, lambda x: x, self.pool.num_shards)
        results = await asyncio.gather(
            *(
                self.pool.call(
                    s,
                    ShardService.delete_documents,
                    index=index,
                    doc_ids=ids,
                    expected={i: want[i] for i in ids if i in want} or None,
                )
                for s, ids in groups.items()
            )
        )
        deleted = {d for r in results for d in r[0]}
        missing = {d for r in results for d in r[1]}
        return DeleteDocumentsResponse(
            deleted_doc_ids=[d for d in unique if d in deleted],
            not_found_doc_ids=[d for d in unique if d in missing],
            conflicting_doc_ids=[d for d in unique if d not in deleted and d not in missing],
        )

    # --- reads --------------------------------------------------------------------------------
    async def matching_documents(
        self, index: str, metadata_filter: dict[str, Any], max_text_length: int | None = 0
    ) -> list[DocumentRecord]:
        """Every document of ``index`` that ``metadata_filter`` matches, read a page at a time
        (none when the index does not exist): a file's documents, for one that replaces or removes them."""
        found: list[DocumentRecord] = []
        if not await self.index_exists(index):
            return found
        while True:
            page = await self.list_documents(
                index, limit=100, offset=len(found), max_text_length=max_text_length, metadata_filter=metadata_filter
            )
            found += page.documents
            if not page.count or len(found) >= page.total_items:
                return found

    async def list_documents(
        self,
        index: str,
        *,
        limit: int = 10,
        offset: int = 0,
        max_text_length: int | None = 1000,
        metadata_filter: dict[str, Any] | None = None,
    ) -> ListDocumentsResponse:
        """A page of documents in a stable order: shard by shard, insertion order within a shard.
        Per-shard totals are asked first, so a page costs O(limit) rows whatever the offset."""
        await self.require_index(index)
        totals = [
            t
            for _, t in await self.pool.call_all(
                ShardService.list_documents,
                index=index,
                limit=1,
                offset=0,
                max_text_length=0,
                metadata_filter=metadata_filter,
            )
        ]
        total = sum(totals)
        wanted: list[tuple[int, int, int]] = []  # (shard, local offset, count)
        start, remaining = offset, limit
        for shard, n in enumerate(totals):
            if remaining <= 0:
                break
            if start >= n:
                start -= n
                continue
            take = min(n - start, remaining)
            wanted.append((shard, start, take))
            remaining -= take
            start = 0
        pages = await asyncio.gather(
            *(
                self.pool.call(
                    s,
                    ShardService.list_documents,
                    index=index,
                    limit=n,
                    offset=o,
                    max_text_length=max_text_length,
                    metadata_filter=metadata_filter,
                )
                for s, o, n in wanted
            )
        )
        docs = [_record(d, d.is_truncated) for page, _ in pages for d in page]
        return ListDocumentsResponse(documents=docs, count=len(docs), total_items=total)

    # --- search and snapshots (``Retriever``, ``Snapshots``) -----------------------------------
    async def retrieve(
        self,
        indexes: str | Sequence[str],
        query: str,
        k: int,
        metadata_filter: dict[str, Any] | None = None,
        mode: str | None = None,
    ) -> tuple[list[NodeWithScore], dict[str, float]]:
        """The top ``k`` nodes for ``query`` in one index or several as one ranking, and the seconds
        spent (``Retriever.retrieve``)."""
        return await self.retriever.retrieve(indexes, query, k, metadata_filter, mode)

    async def persist(self, index: str, path: str | None = None, principal: Principal = FULL_ACCESS) -> str:
        """Write a snapshot of ``index`` (``Snapshots.persist``)."""
        return await self.snapshots.persist(index, path, principal)

    async def load(
        self, index: str, path: str | None = None, overwrite: bool = False, principal: Principal = FULL_ACCESS
    ) -> str:
        """Load a snapshot as ``index`` (``Snapshots.load``)."""
        return await self.snapshots.load(index, path, overwrite, principal)

    # --- statistics ---------------------------------------------------------------------------
    async def stats(self, index: str) -> IndexStats:
        """Totals and per-shard counts of ``index``, asked of every shard at once; 404 when no shard
        holds it. Shards without a part of it are left out of ``shards``."""
        parts = [p for p in await self.pool.call_all(ShardService.index_stats, index) if p is not None]
        if not parts:
            raise unknown_index(index)
        shards = [ShardStats(**{k: p[k] for k in ShardStats.model_fields}) for p in parts]
        dims = {p["dimension"] for p in parts}
        kinds = {p["index_kind"] for p in parts}
        dim = dims.pop() if len(dims) == 1 else None
        return IndexStats(
            index_name=index,
            documents=sum(s.documents for s in shards),
            chunks=sum(s.chunks for s in shards),
            bytes=sum(s.bytes for s in shards),
            vectors=sum(s.vectors for s in shards),
            vector_bytes=sum(s.vectors * p["dimension"] * 4 for s, p in zip(shards, parts, strict=True)),
            dimension=dim,
            index_kind=kinds.pop() if len(kinds) == 1 else "mixed",
            shards=shards,
        )
