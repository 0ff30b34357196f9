"""One shard as a service: the ``app.store.Shard`` plus the operations that span files
(portable export parts, import with re-routing) and the storage layout on disk.

Under Ray this class is the body of a shard actor (``deployments.vector_index``); it keeps every
method explicit so that Ray can expose it as an actor method.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from app.routing import shard_for
from app.store import DocumentWrite, SearchHit, Shard, StoredDocument, read_export

LAYOUT_FILE = "ragserve-layout.json"
IMPORT_BATCH = 256


class LayoutMismatchError(RuntimeError):
    """``storage_dir`` was written with another number of shards; routing would lose documents."""


def shard_directory(storage_dir: str | Path, index: int) -> Path:
    return Path(storage_dir) / "shards" / f"shard-{index:03d}"


def check_layout(storage_dir: str | Path, num_shards: int) -> None:
    """Record ``num_shards`` on first use and refuse a different value later: documents are routed
    by ``shard_for(doc_id, num_shards)``, so changing it silently would strand documents."""
    root = Path(storage_dir)
    root.mkdir(parents=True, exist_ok=True)
    path = root / LAYOUT_FILE
    if path.exists():
        recorded = json.loads(path.read_text())["num_shards"]
        if recorded != num_shards:
            raise LayoutMismatchError(
                f"{root} holds {recorded} shards but num_shards={num_shards}; use the same value, "
                f"or persist each index and load it into a fresh storage_dir")
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"num_shards": num_shards, "version": 1}))
    tmp.replace(path)


def vector_options(faiss_kind: str = "flat", faiss_device: str = "cpu",
                   faiss_params: dict[str, Any] | None = None) -> dict[str, Any]:
    """How a shard opens its vectors, as ``ShardService``'s keyword arguments: what a running shard
    reports (``open_options``) and what settings ask for compare equal exactly when they agree."""
    return {"faiss_kind": faiss_kind, "faiss_device": faiss_device, "faiss_params": dict(faiss_params or {})}


class ShardService:
    """The shard numbered ``shard_index`` of ``num_shards`` under ``storage_dir``."""

    def __init__(self, storage_dir: str | Path, shard_index: int, num_shards: int, *, faiss_kind: str = "flat",
                 faiss_device: str = "cpu", faiss_params: dict[str, Any] | None = None):
        self.shard_index = shard_index
        self.num_shards = num_shards
        self._open_options = vector_options(faiss_kind, faiss_device, faiss_params)
        self._shard = Shard(shard_directory(storage_dir, shard_index), faiss_kind=faiss_kind,
                            faiss_device=faiss_device, faiss_params=faiss_params)

    # --- indexes ------------------------------------------------------------------------------
    def ping(self) -> int:
        return self.shard_index

    def open_options(self) -> dict[str, Any]:
        """How this shard opened its vectors (kind, device, params): a long-lived shard process
        opened under other settings must be replaced to apply new ones."""
        return dict(self._open_options)

    def list_indexes(self) -> list[str]:
        return self._shard.list_indexes()

    def has_index(self, index: str) -> bool:
        return self._shard.has_index(index)

    def drop_index(self, index: str) -> bool:
        return self._shard.drop_index(index)

    def count_documents(self, index: str) -> int:
        return self._shard.count_documents(index) if self._shard.has_index(index) else 0

    def stats(self) -> dict[str, Any]:
        return {
            "shard": self.shard_index,
            "indexes": {
                name: {"documents": self._shard.count_documents(name), "chunks": self._shard.count_chunks(name)}
                for name in self._shard.list_indexes()
            },
        }

    # --- documents ----------------------------------------------------------------------------
    def find_by_hash(self, index: str, hashes: list[str]) -> dict[str, str]:
        return self._shard.find_by_hash(index, hashes) if self._shard.has_index(index) else {}

    def get_documents(self, index: str, doc_ids: list[str]) -> dict[str, StoredDocument]:
        return self._shard.get_documents(index, doc_ids) if self._shard.has_index(index) else {}

    def upsert_documents(self, index: str, docs: list[DocumentWrite], only_existing: bool = False) -> list[str]:
        if only_existing and not self._shard.has_index(index):
            return []
        return self._shard.upsert_documents(index, docs, only_existing=only_existing)

    def delete_documents(self, index: str, doc_ids: list[str]) -> tuple[list[str], list[str]]:
        if not self._shard.has_index(index):
            return [], list(doc_ids)
        return self._shard.delete_documents(index, doc_ids)

    def list_documents(self, index: str, *, limit: int, offset: int, max_text_length: int | None,
                       metadata_filter: dict[str, Any] | None) -> tuple[list[StoredDocument], int]:
        if not self._shard.has_index(index):
            return [], 0
        return self._shard.list_documents(index, limit=limit, offset=offset, max_text_length=max_text_length,
                                          metadata_filter=metadata_filter)

    def search(self, index: str, vector: np.ndarray, k: int,
               metadata_filter: dict[str, Any] | None = None) -> list[SearchHit] | None:
        """Hits, or None when this shard has no such index (so a search needs no existence check)."""
        if not self._shard.has_index(index):
            return None
        return self._shard.search(index, vector, k, metadata_filter=metadata_filter)

    # --- persistence --------------------------------------------------------------------------
    def export_part(self, index: str, dest_dir: str) -> dict[str, Any]:
        """Write this shard's part of ``index`` to ``dest_dir/part-NNN.sqlite``."""
        dest = Path(dest_dir) / f"part-{self.shard_index:03d}.sqlite"
        docs = self._shard.export_index(index, dest) if self._shard.has_index(index) else 0
        dim = self._shard.dim(index) if self._shard.has_index(index) else None
        return {"file": dest.name if docs or dest.exists() else None, "documents": docs, "dim": dim}

    def import_parts(self, index: str, part_files: list[str]) -> int:
        """Import, from every part of a snapshot, the documents that route to this shard. Each shard
        reads the parts itself, so a snapshot taken with N shards loads into any number of shards."""
        imported = 0
        for f in part_files:
            _, docs = read_export(f)
            batch: list[DocumentWrite] = []
            for doc in docs:
                if shard_for(doc.doc_id, self.num_shards) != self.shard_index:
                    continue
                batch.append(doc)
                if len(batch) >= IMPORT_BATCH:
                    self._shard.upsert_documents(index, batch)
                    imported += len(batch)
                    batch = []
            if batch:
                self._shard.upsert_documents(index, batch)
                imported += len(batch)
        return imported

    def snapshot(self) -> None:
        self._shard.snapshot()

    def close(self) -> None:
        self._shard.close()

    # --- statistics ---------------------------------------------------------------------------
    def index_stats(self, index: str) -> dict[str, Any] | None:
        """This shard's counts for ``index`` (``Shard.index_stats``) with its shard number; None when
        the shard has no such index. A Ray shard actor exposes it as it does every method here."""
        stats = self._shard.index_stats(index)
        return None if stats is None else {"shard": self.shard_index, **stats}
