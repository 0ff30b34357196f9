"""The document API's logic: chunk, embed, route, write; list, update, delete, search, persist, load.

Everything here is async and talks to two seams only: an ``Embedder`` and a ``ShardPool``. Under
Ray Serve those are deployment and actor handles; in unit tests they are in-process objects.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from app.api.documents import (
    DeleteDocumentsResponse,
    Document,
    DocumentRecord,
    ListDocumentsResponse,
    NodeWithScore,
    UpdateDocument,
    UpdateDocumentsResponse,
)
from app.api.stats import IndexStats, ShardStats
from app.ingest import ChunkingError, DocumentChunker, content_hash, new_doc_id, node_id_for
from app.paths import PathOutsideStorageError, confine
from app.routing import group_by_shard
from app.service.errors import BadRequestError, ConflictError, NotFoundError
from app.service.pool import ShardPool
from app.store import ChunkWrite, DocumentWrite, SearchHit, StoredDocument

MANIFEST = "manifest.json"
SNAPSHOTS = "snapshots"  # persist/load paths are relative to <storage_dir>/snapshots
SNAPSHOT_FORMAT = 1


class Embedder(Protocol):
    """Turns texts into L2-normalised float32 vectors."""

    async def embed_documents(self, texts: list[str]) -> np.ndarray: ...

    async def embed_query(self, text: str) -> np.ndarray: ...


@dataclass
class _Prepared:
    """A document ready to write: its id, hash and chunks (vectors filled in later)."""

    doc_id: str
    text: str
    metadata: dict[str, Any]
    hash_value: str
    chunk_texts: list[str]


def _record(doc: StoredDocument | _Prepared, is_truncated: bool = False) -> DocumentRecord:
    return DocumentRecord(doc_id=doc.doc_id, text=doc.text, hash_value=doc.hash_value,
                          metadata=dict(doc.metadata), is_truncated=is_truncated)


def hit_to_node(hit: SearchHit) -> NodeWithScore:
    return NodeWithScore(doc_id=hit.doc_id, node_id=hit.node_id, text=hit.text, score=float(hit.score),
                         metadata=dict(hit.metadata))


class DocumentService:
    """Index management over a pool of shards."""

    def __init__(self, pool: ShardPool, embedder: Embedder, chunker: DocumentChunker, *,
                 storage_dir: str | Path, embedding_model: str = "", embed_batch: int = 128):
        self.pool = pool
        self.embedder = embedder
        self.chunker = chunker
        self.storage_dir = Path(storage_dir)
        self.embedding_model = embedding_model
        self.embed_batch = embed_batch

    # --- indexes ------------------------------------------------------------------------------
    async def list_indexes(self) -> list[str]:
        names: set[str] = set()
        for part in await self.pool.call_all("list_indexes"):
            names.update(part)
        return sorted(names)

    async def index_exists(self, index: str) -> bool:
        return any(await self.pool.call_all("has_index", index))

    async def require_index(self, index: str) -> None:
        if not await self.index_exists(index):
            raise NotFoundError(f"No such index: '{index}' exists.")

    async def count_documents(self, index: str) -> int:
        return sum(await self.pool.call_all("count_documents", index))

    async def drop_index(self, index: str) -> str:
        dropped = await self.pool.call_all("drop_index", index)
        if not any(dropped):
            raise NotFoundError(f"No such index: '{index}' exists.")
        return f"Successfully deleted index {index}."

    # --- writes -------------------------------------------------------------------------------
    def _chunk(self, text: str, metadata: dict[str, Any], where: str) -> list[str]:
        try:
            chunks = self.chunker.chunk(text, metadata)
        except ChunkingError as e:
            raise BadRequestError(f"{where}: {e}") from e
        if not chunks:
            raise BadRequestError(f"{where}: text has no content to index")
        return [c.text for c in chunks]

    async def _embed_chunks(self, prepared: Sequence[_Prepared]) -> dict[str, list[ChunkWrite]]:
        """Embed every chunk of ``prepared`` in batches sent concurrently (replicas share the work)."""
        flat = [(p.doc_id, i, t) for p in prepared for i, t in enumerate(p.chunk_texts)]
        batches = [flat[i:i + self.embed_batch] for i in range(0, len(flat), self.embed_batch)]
        vectors = await asyncio.gather(*(self.embedder.embed_documents([t for _, _, t in b]) for b in batches))
        out: dict[str, list[ChunkWrite]] = {p.doc_id: [] for p in prepared}
        for batch, vecs in zip(batches, vectors, strict=True):
            for (doc_id, i, text), vec in zip(batch, vecs, strict=True):
                out[doc_id].append(ChunkWrite(node_id=node_id_for(doc_id, i), chunk_index=i, text=text,
                                              vector=np.asarray(vec, dtype=np.float32)))
        return out

    async def _write(self, index: str, prepared: Sequence[_Prepared], only_existing: bool = False) -> set[str]:
        """Embed and write; returns once every shard has committed (the acknowledgement point), with
        the doc ids written (with ``only_existing``, those deleted meanwhile are not)."""
        if not prepared:
            return set()
        chunks = await self._embed_chunks(prepared)
        writes = [DocumentWrite(doc_id=p.doc_id, text=p.text, metadata=p.metadata, hash_value=p.hash_value,
                                chunks=chunks[p.doc_id]) for p in prepared]
        groups = group_by_shard(writes, lambda w: w.doc_id, self.pool.num_shards)
        written = await asyncio.gather(*(self.pool.call(s, "upsert_documents", index, ws, only_existing)
                                         for s, ws in groups.items()))
        return {doc_id for part in written for doc_id in part}

    async def add_documents(self, index: str, docs: Sequence[Document]) -> list[DocumentRecord]:
        """Create or extend ``index``. Re-adding the same text and metadata is idempotent: the
        existing document is returned and nothing is embedded again."""
        hashes = [content_hash(d.text, d.metadata) for d in docs]
        chunk_texts = await asyncio.to_thread(
            lambda: [self._chunk(d.text, d.metadata, f"documents[{i}]") for i, d in enumerate(docs)])
        existing_by_hash: dict[str, str] = {}
        for part in await self.pool.call_all("find_by_hash", index, sorted(set(hashes))):
            existing_by_hash.update(part)
        given_ids = [d.doc_id for d in docs if d.doc_id]
        existing_given = await self._get_documents(index, given_ids) if given_ids else {}

        records: list[DocumentRecord] = []
        to_write: list[_Prepared] = []
        seen: dict[str, str] = {}  # hash -> doc_id within this request
        for d, h, texts in zip(docs, hashes, chunk_texts, strict=True):
            if d.doc_id:
                doc_id = d.doc_id
                old = existing_given.get(doc_id)
                unchanged = old is not None and old.hash_value == h
            else:
                doc_id = existing_by_hash.get(h) or seen.get(h) or new_doc_id()
                unchanged = h in existing_by_hash or h in seen
            seen.setdefault(h, doc_id)
            prep = _Prepared(doc_id, d.text, dict(d.metadata), h, texts)
            records.append(_record(prep))
            if not unchanged and all(p.doc_id != doc_id for p in to_write):
                to_write.append(prep)
        await self._write(index, to_write)
        return records

    async def _get_documents(self, index: str, doc_ids: Sequence[str]) -> dict[str, StoredDocument]:
        groups = group_by_shard(list(dict.fromkeys(doc_ids)), lambda x: x, self.pool.num_shards)
        parts = await asyncio.gather(*(self.pool.call(s, "get_documents", index, ids) for s, ids in groups.items()))
        found: dict[str, StoredDocument] = {}
        for p in parts:
            found.update(p)
        return found

    async def update_documents(self, index: str, docs: Sequence[UpdateDocument]) -> UpdateDocumentsResponse:
        """Re-chunk and re-embed only documents whose text or metadata changed."""
        await self.require_index(index)
        current = await self._get_documents(index, [d.doc_id for d in docs])
        updated: list[_Prepared] = []
        unchanged: list[DocumentRecord] = []
        not_found: list[UpdateDocument] = []
        for i, d in enumerate(docs):
            old = current.get(d.doc_id)
            if old is None:
                not_found.append(d)
                continue
            h = content_hash(d.text, d.metadata)
            if h == old.hash_value:
                unchanged.append(_record(old))
                continue
            texts = await asyncio.to_thread(self._chunk, d.text, d.metadata, f"documents[{i}]")
            updated.append(_Prepared(d.doc_id, d.text, dict(d.metadata), h, texts))
        written = await self._write(index, updated, only_existing=True)
        by_id = {d.doc_id: d for d in docs}
        not_found += [by_id[p.doc_id] for p in updated if p.doc_id not in written]  # deleted meanwhile
        updated = [p for p in updated if p.doc_id in written]
        return UpdateDocumentsResponse(updated_documents=[_record(p) for p in updated],
                                       unchanged_documents=unchanged, not_found_documents=not_found)

    async def delete_documents(self, index: str, doc_ids: Sequence[str]) -> DeleteDocumentsResponse:
        await self.require_index(index)
        unique = list(dict.fromkeys(doc_ids))
        groups = group_by_shard(unique, lambda x: x, self.pool.num_shards)
        results = await asyncio.gather(
            *(self.pool.call(s, "delete_documents", index, ids) for s, ids in groups.items()))
        deleted = {d for r in results for d in r[0]}
        return DeleteDocumentsResponse(deleted_doc_ids=[d for d in unique if d in deleted],
                                       not_found_doc_ids=[d for d in unique if d not in deleted])

    # --- reads --------------------------------------------------------------------------------
    async def list_documents(self, index: str, *, limit: int = 10, offset: int = 0,
                             max_text_length: int | None = 1000,
                             metadata_filter: dict[str, Any] | None = None) -> ListDocumentsResponse:
        """A page of documents in a stable order: shard by shard, insertion order within a shard.
        Per-shard totals are asked first, so a page costs O(limit) rows whatever the offset."""
        await self.require_index(index)
        totals = [t for _, t in await self.pool.call_all(
            "list_documents", index, limit=1, offset=0, max_text_length=0, metadata_filter=metadata_filter)]
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
        pages = await asyncio.gather(*(
            self.pool.call(s, "list_documents", index, limit=n, offset=o, max_text_length=max_text_length,
                           metadata_filter=metadata_filter) for s, o, n in wanted))
        docs = [_record(d, d.is_truncated) for page, _ in pages for d in page]
        return ListDocumentsResponse(documents=docs, count=len(docs), total_items=total)

    async def search(self, index: str, vector: np.ndarray, k: int,
                     metadata_filter: dict[str, Any] | None = None) -> list[NodeWithScore]:
        """Scatter to every shard, gather, merge the top ``k`` by cosine score. A shard without the
        index answers None; when every shard does, the index does not exist."""
        parts = await self.pool.call_all("search", index, vector, k, metadata_filter)
        if all(p is None for p in parts):
            raise NotFoundError(f"No such index: '{index}' exists.")
        hits = sorted((h for p in parts if p for h in p), key=lambda h: h.score, reverse=True)[:k]
        return [hit_to_node(h) for h in hits]

    async def retrieve(self, index: str, query: str, k: int,
                       metadata_filter: dict[str, Any] | None = None) -> tuple[list[NodeWithScore], dict[str, float]]:
        """Nodes for ``query`` and the time spent embedding and searching (seconds)."""
        t0 = time.perf_counter()
        vector = await self.embedder.embed_query(query)  # the search itself tells a missing index
        t1 = time.perf_counter()
        nodes = await self.search(index, vector, k, metadata_filter)
        t2 = time.perf_counter()
        return nodes, {"embed": t1 - t0, "search": t2 - t1}

    # --- persistence --------------------------------------------------------------------------
    def _confine(self, path: str | None, index: str) -> Path:
        try:
            # Snapshots live apart from the live data: a path can never name a shard or model folder.
            return confine(Path(self.storage_dir) / SNAPSHOTS, path, default=index)
        except PathOutsideStorageError as e:
            raise BadRequestError(str(e), param="path") from e

    async def persist(self, index: str, path: str | None = None) -> str:
        """Write a portable snapshot (one part per shard + a manifest) and swap it in atomically."""
        await self.require_index(index)
        dest = self._confine(path, index)
        tmp = dest.parent / f".{dest.name}.tmp-{uuid.uuid4().hex[:8]}"
        tmp.mkdir(parents=True)
        try:
            parts = await self.pool.call_all("export_part", index, str(tmp))
            dims = {p["dim"] for p in parts if p["dim"]}
            manifest = {
                "format": SNAPSHOT_FORMAT, "index_name": index, "embedding_model": self.embedding_model,
                "dim": dims.pop() if len(dims) == 1 else None, "created_at": time.time(),
                "parts": [p["file"] for p in parts if p["file"]],
                "documents": sum(p["documents"] for p in parts),
            }
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
            if dest.exists():
                shutil.rmtree(dest)
            tmp.rename(dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return f"Successfully persisted index {index} to {dest.relative_to(self.storage_dir.resolve())}."

    async def load(self, index: str, path: str | None = None, overwrite: bool = False) -> str:
        src = self._confine(path, index)
        manifest_file = src / MANIFEST
        if not manifest_file.is_file():
            raise NotFoundError(f"No snapshot at {path or src.name!r}: {MANIFEST} not found")
        try:
            manifest = json.loads(manifest_file.read_text())
            names = [str(p) for p in manifest["parts"]]
        except (ValueError, KeyError, TypeError) as e:
            raise BadRequestError(f"snapshot manifest is unreadable: {e}") from e
        for name in names:  # part names are plain file names inside the snapshot directory
            if Path(name).name != name or not (src / name).is_file():
                raise BadRequestError(f"snapshot part missing or invalid: {name!r}")
        parts = [str(src / name) for name in names]
        if (self.embedding_model and manifest.get("embedding_model")
                and manifest["embedding_model"] != self.embedding_model):
            raise BadRequestError(
                f"snapshot was embedded with {manifest['embedding_model']!r}, this server uses "
                f"{self.embedding_model!r}; vectors would not be comparable")
        if await self.index_exists(index):
            if not overwrite:
                raise ConflictError(f"Index {index} already exists; pass overwrite=true to replace it.")
            await self.pool.call_all("drop_index", index)
        await self.pool.call_all("import_parts", index, parts)
        return f"Successfully loaded index {index} from {src.relative_to(self.storage_dir.resolve())}."

    # --- statistics ---------------------------------------------------------------------------
    async def stats(self, index: str) -> IndexStats:
        """Totals and per-shard counts of ``index``, asked of every shard at once; 404 when no shard
        holds it. Shards without a part of it are left out of ``shards``."""
        parts = [p for p in await self.pool.call_all("index_stats", index) if p is not None]
        if not parts:
            raise NotFoundError(f"No such index: '{index}' exists.")
        shards = [ShardStats(**{k: p[k] for k in ShardStats.model_fields}) for p in parts]
        dims = {p["dimension"] for p in parts}
        kinds = {p["index_kind"] for p in parts}
        dim = dims.pop() if len(dims) == 1 else None
        return IndexStats(index_name=index, documents=sum(s.documents for s in shards),
                          chunks=sum(s.chunks for s in shards), bytes=sum(s.bytes for s in shards),
                          vectors=sum(s.vectors for s in shards),
                          vector_bytes=sum(s.vectors * p["dimension"] * 4 for s, p in zip(shards, parts, strict=True)),
                          dimension=dim, index_kind=kinds.pop() if len(kinds) == 1 else "mixed", shards=shards)
