"""One shard as a service: the ``ragserve.store.Shard`` plus the operations that span files
(portable export parts, import with re-routing) and the storage layout on disk.

Under Ray this class is the body of a shard actor (``ragserve.deployments.vector_index``); it keeps every
method explicit so that Ray can expose it as an actor method. Store errors a client caused or can
retry are turned into ``ragserve.errors`` here (they survive Ray's pickling with their status).

Shard 0 is every index's *home*: it always holds the index (empty if no document routes to it)
and allocates its generation (see ``ragserve.store.shard``), so the document service asks it, and only
it, which generation a write, a drop or a load is about.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import sqlite3
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ragserve import tracing
from ragserve.api.documents import index_names
from ragserve.errors import BadRequestError, ConflictError
from ragserve.service.cache import TTLCache
from ragserve.service.routing import shard_for
from ragserve.store import DocumentWrite, SearchCandidates, SearchHit, Shard, StoredDocument, read_export
from ragserve.store.types import IndexDroppedError, IndexExistsError, IndexNotFoundError

LAYOUT_FILE = "ragserve-layout.json"
IMPORT_BATCH = 256
HOME_SHARD = 0
STAGING_PREFIX = "~staging~"  # index names start with a letter or digit, so none can look like this
# A staging index older than this at shard open belongs to a load whose service died; a younger one
# may belong to a load still running (this shard restarted under it), so it is kept for the swap.
STAGING_MAX_AGE_S = 3600.0
#: Searches kept per shard (``search_indexes``): a repeated question costs a lookup while nothing
#: in the shard changed. A result larger than ``SEARCH_MEMO_MAX_ENTRY_BYTES`` (its hits' text and
#: their overhead, estimated) is not kept, so the memo holds at most their product (24 MiB).
SEARCH_MEMO_ENTRIES = 256
SEARCH_MEMO_MAX_ENTRY_BYTES = 96 * 1024
SEARCH_MEMO_TTL_S = 3600.0
#: What a hit costs besides its text, about (the object, its ids and scores, its metadata).
_HIT_OVERHEAD_BYTES = 400
#: The reads ``ShardService.read_many`` runs, several in one call (a pool holds them back under
#: load and sends them together: ``ragserve.service.pool.ReadBatcher``): the query path's reads,
#: short and lock-free. Not the others: ``index_stats`` waits for the shard's write lock, and a
#: listing or a count of a large index takes long; held in one call, the reads behind them would
#: wait for them too, so they always go alone, each on an actor thread of its own.
READ_METHODS = frozenset(
    {
        "list_indexes",
        "has_index",
        "index_generation",
        "index_versions",
        "search",
        "mentioned",
        "search_candidates",
        "search_indexes",
    }
)
#: One read of ``read_many``: the method's name, the caller's trace carrier (None when the caller
#: traces nothing; empty when it traces but has no current span), its positional and its keyword
#: arguments.
ReadCall = tuple[str, Mapping[str, str] | None, tuple[Any, ...], dict[str, Any]]
log = logging.getLogger("ragserve.store")


def is_staging(index: str) -> bool:
    """A load's private copy of a snapshot, invisible to clients until it is swapped in."""
    return index.startswith(STAGING_PREFIX)


def dropped_while_writing(index: str) -> ConflictError:
    return ConflictError(
        f"Index '{index}' was deleted or replaced while these documents were being written; "
        "none of them were kept. Retry to write them into the index as it is now."
    )


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
                f"or persist each index and load it into a fresh storage_dir"
            )
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"num_shards": num_shards, "version": 1}))
    tmp.replace(path)


def vector_options(
    faiss_kind: str = "flat", faiss_device: str = "cpu", faiss_params: dict[str, Any] | None = None
) -> dict[str, Any]:
    """How a shard opens its vectors, as ``ShardService``'s keyword arguments: what a running shard
    reports (``open_options``) and what settings ask for compare equal exactly when they agree."""
    return {"faiss_kind": faiss_kind, "faiss_device": faiss_device, "faiss_params": dict(faiss_params or {})}


class ShardService:
    """The shard numbered ``shard_index`` of ``num_shards`` under ``storage_dir``."""

    def __init__(
        self,
        storage_dir: str | Path,
        shard_index: int,
        num_shards: int,
        *,
        faiss_kind: str = "flat",
        faiss_device: str = "cpu",
        faiss_params: dict[str, Any] | None = None,
    ):
        self.shard_index = shard_index
        self.num_shards = num_shards
        self._open_options = vector_options(faiss_kind, faiss_device, faiss_params)
        #: searches by their arguments, with the shard's change count read before each ran
        self._searches: TTLCache[tuple[int, list[SearchCandidates | None]]] = TTLCache(
            SEARCH_MEMO_ENTRIES, SEARCH_MEMO_TTL_S
        )
        self._memo_changes = 0
        self._shard = Shard(
            shard_directory(storage_dir, shard_index),
            faiss_kind=faiss_kind,
            faiss_device=faiss_device,
            faiss_params=faiss_params,
        )
        for name in self._shard.list_indexes():  # loads that never finished (their service died)
            created = self._shard.created_at(name)
            if is_staging(name) and created is not None and time.time() - created > STAGING_MAX_AGE_S:
                log.warning("shard %d: dropping %r, left by a load that did not finish", shard_index, name)
                self._shard.drop_index(name)

    # --- indexes ------------------------------------------------------------------------------
    def ping(self) -> int:
        return self.shard_index

    def open_options(self) -> dict[str, Any]:
        """How this shard opened its vectors (kind, device, params) and the class serving it
        (``code``): a long-lived shard process opened under other settings, or started by another
        package (an actor of the old ``app`` package, whose replies name types this code cannot
        unpickle), must be replaced."""
        return {**self._open_options, "code": SHARD_CODE}

    def list_indexes(self) -> list[str]:
        return [name for name in self._shard.list_indexes() if not is_staging(name)]

    def has_index(self, index: str) -> bool:
        return self._shard.has_index(index) and not is_staging(index)

    def index_generation(self, index: str) -> int | None:
        """The generation of ``index`` on this shard (ask the home shard), None when absent."""
        return self._shard.generation(index)

    def index_versions(self, indexes: list[str], shard_wide: bool = False) -> list[tuple[str, int | None, int]]:
        """``(epoch, generation, stamp)`` of each of ``indexes`` on this shard, in their order
        (``Shard.versions``): every write that changes what a search of an index here sees changes
        its version, and a restarted shard has a new epoch. With ``shard_wide``, one more,
        ``(epoch, None, changes)``, that moves with a write to *any* index here: BM25's statistics are
        the shard's, so another index's text reorders this one's keyword hits. The answer cache
        compares them (docs/architecture.md §4, "Answer cache")."""
        versions = self._shard.versions(list(indexes))
        if shard_wide:
            versions.append((self._shard.epoch, None, self._shard.changes()))
        return versions

    def ensure_index(self, index: str, dim: int) -> int:
        """On the home shard: the generation writes to ``index`` carry, creating it when absent."""
        return self._shard.ensure_index(index, dim)

    def drop_index(self, index: str, generation: int | None = None) -> bool:
        return self._shard.drop_index(index, generation)

    def replace_index(
        self,
        staging: str,
        index: str,
        generation: int | None = None,
        overwrite: bool = True,
        dim: int | None = None,
        expect_staged: bool = False,
    ) -> int | None:
        """Swap a load's staging copy in as ``index`` (``Shard.replace_index``); 409 when it exists
        and ``overwrite`` is false (asked of the home shard first, before any other changes), or
        when the staging copy this shard imported is gone."""
        try:
            return self._shard.replace_index(
                staging, index, generation=generation, overwrite=overwrite, dim=dim, expect_staged=expect_staged
            )
        except IndexExistsError as e:
            raise ConflictError(f"Index {index} already exists; pass overwrite=true to replace it.") from e
        except IndexNotFoundError as e:
            raise ConflictError(
                f"The load of index {index} was interrupted (shard {self.shard_index} lost its "
                "imported copy); retry the load"
            ) from e

    def verify(self) -> list[str]:
        """The shard's self-check (``Shard.verify``): empty when healthy."""
        return self._shard.verify()

    # Reads of an index this shard does not hold (never had, or dropped while the call was on its
    # way) answer empty: whether the index exists is the document service's question, not a 500.
    def count_documents(self, index: str) -> int:
        try:
            return self._shard.count_documents(index)
        except IndexNotFoundError:
            return 0

    def stats(self) -> dict[str, Any]:
        """Documents and chunks of each index (the shard metrics), each index's counts taken
        together (``Shard.index_stats``, without reading the texts); an index dropped meanwhile is
        left out."""
        indexes: dict[str, dict[str, int]] = {}
        for name in self.list_indexes():
            counts = self._shard.index_stats(name, text_bytes=False)
            if counts is not None:
                indexes[name] = {"documents": counts["documents"], "chunks": counts["chunks"]}
        return {"shard": self.shard_index, "indexes": indexes}

    # --- documents ----------------------------------------------------------------------------
    def find_by_hash(self, index: str, hashes: list[str]) -> dict[str, str]:
        try:
            return self._shard.find_by_hash(index, hashes)
        except IndexNotFoundError:
            return {}

    def get_documents(self, index: str, doc_ids: list[str]) -> dict[str, StoredDocument]:
        try:
            return self._shard.get_documents(index, doc_ids)
        except IndexNotFoundError:
            return {}

    def upsert_documents(
        self,
        index: str,
        docs: list[DocumentWrite],
        only_existing: bool = False,
        generation: int | None = None,
        if_absent: bool = False,
        expected: dict[str, str] | None = None,
    ) -> list[str]:
        """``Shard.upsert_documents``; a write for a dropped or replaced generation is a 409."""
        try:
            return self._shard.upsert_documents(
                index, docs, only_existing=only_existing, if_absent=if_absent, generation=generation, expected=expected
            )
        except IndexDroppedError as e:
            raise dropped_while_writing(index) from e

    def delete_documents(
        self, index: str, doc_ids: list[str], expected: dict[str, str] | None = None
    ) -> tuple[list[str], list[str]]:
        try:
            return self._shard.delete_documents(index, doc_ids, expected)
        except IndexNotFoundError:
            return [], list(dict.fromkeys(doc_ids))

    def list_documents(
        self,
        index: str,
        *,
        limit: int,
        offset: int,
        max_text_length: int | None,
        metadata_filter: dict[str, Any] | None,
    ) -> tuple[list[StoredDocument], int]:
        try:
            return self._shard.list_documents(
                index, limit=limit, offset=offset, max_text_length=max_text_length, metadata_filter=metadata_filter
            )
        except IndexNotFoundError:
            return [], 0

    def search(
        self, index: str, vector: np.ndarray, k: int, metadata_filter: dict[str, Any] | None = None
    ) -> list[SearchHit] | None:
        """Hits, or None when this shard has no such index (so a search needs no existence check)."""
        try:
            return self._shard.search(index, vector, k, metadata_filter=metadata_filter)
        except IndexNotFoundError:
            return None

    def mentioned(self, indexes: list[str] | str, words: list[str]) -> list[str]:
        """Those of ``words`` some chunk of one of ``indexes`` on this shard holds (an index this
        shard has no part of holds none). One name alone is what an ingress of the release before
        several indexes per query sends, during a rolling upgrade."""
        found: set[str] = set()
        for index in index_names(indexes):
            try:
                found.update(self._shard.mentioned(index, words))
            except IndexNotFoundError:
                continue
        return [w for w in words if w in found]

    def search_candidates(
        self,
        index: str,
        vector: np.ndarray,
        text: str,
        k: int,
        mode: str = "hybrid",
        metadata_filter: dict[str, Any] | None = None,
        min_match: float = 0.0,
        max_postings: int | None = None,
    ) -> SearchCandidates | None:
        """``search_indexes`` of one index: what an ingress of the release before several indexes per
        query calls, while a rolling upgrade has replaced the shards but not yet every ingress."""
        return self.search_indexes([index], vector, text, k, mode, metadata_filter, min_match, max_postings)[0]

    def search_indexes(
        self,
        indexes: list[str],
        vector: np.ndarray,
        text: str,
        k: int,
        mode: str = "hybrid",
        metadata_filter: dict[str, Any] | None = None,
        min_match: float = 0.0,
        max_postings: int | None = None,
    ) -> list[SearchCandidates | None]:
        """A retrieval's dense and lexical candidates in each of ``indexes``
        (``Shard.search_candidates``), in their order, in one call however many they are: None for
        an index this shard has no part of. The filter applies in each.

        The same search again while nothing in this shard changed (``Shard.changes``, read *before*
        searching: a write that lands meanwhile makes the result stale at once, never a stale result
        current) is answered from memory: warm questions under load cost a lookup here. What it
        returns is shared with later callers: read it, never change it."""
        changes = self._shard.changes()
        key = (
            tuple(indexes),
            np.ascontiguousarray(vector, dtype=np.float32).tobytes(),
            text,
            k,
            mode,
            json.dumps(metadata_filter, sort_keys=True, default=str),
            min_match,
            max_postings,
        )
        kept = self._searches.get(key)
        if kept is not None and kept[0] == changes:
            return list(kept[1])
        out = self._search_indexes(indexes, vector, text, k, mode, metadata_filter, min_match, max_postings)
        if changes > self._memo_changes:  # every result kept before a change is of no use any more
            self._searches.clear()
            self._memo_changes = changes
        if changes == self._memo_changes and _result_bytes(out) <= SEARCH_MEMO_MAX_ENTRY_BYTES:
            self._searches.put(key, (changes, out))
        return list(out)

    def _search_indexes(
        self,
        indexes: list[str],
        vector: np.ndarray,
        text: str,
        k: int,
        mode: str,
        metadata_filter: dict[str, Any] | None,
        min_match: float,
        max_postings: int | None,
    ) -> list[SearchCandidates | None]:
        out: list[SearchCandidates | None] = []
        for index in indexes:
            try:
                out.append(
                    self._shard.search_candidates(
                        index,
                        vector,
                        text,
                        k,
                        mode=mode,
                        metadata_filter=metadata_filter,
                        min_match=min_match,
                        max_postings=max_postings,
                    )
                )
            except IndexNotFoundError:
                out.append(None)
        return out

    def read_many(self, calls: list[ReadCall]) -> list[tuple[bool, Any]]:
        """Several reads in one call, each as its own call would run it (in its span when traced),
        in their order: ``(True, result)``, or ``(False, exception)`` for one that raised, which
        fails that read alone. Only ``READ_METHODS``: a write held back and run beside others
        would lose the order its caller saw."""
        out: list[tuple[bool, Any]] = []
        for name, trace, args, kwargs in calls:
            try:
                if name not in READ_METHODS:
                    raise TypeError(f"{name!r} is not a ShardService read that runs in a batch")
                if trace is None:  # an untraced caller: no span, as its own call would open none
                    out.append((True, getattr(self, name)(*args, **kwargs)))
                else:
                    out.append((True, traced_call(self, name, trace or None, *args, **kwargs)))
            except Exception as e:  # the read's own error, raised to its caller alone
                e.add_note(f"in shard {self.shard_index}:\n{traceback.format_exc()}")  # pickling drops the traceback
                out.append((False, e))
        return out

    # --- persistence --------------------------------------------------------------------------
    def export_part(self, index: str, dest_dir: str, tag: str = "") -> dict[str, Any]:
        """Write this shard's part of ``index`` to ``dest_dir/part-NNN[-tag].sqlite`` (a tag gives
        each persist its own part files, so a new snapshot never overwrites the one it replaces)."""
        dest = Path(dest_dir) / f"part-{self.shard_index:03d}{'-' + tag if tag else ''}.sqlite"
        if not self._shard.has_index(index):
            return {"file": None, "documents": 0, "dim": None}
        try:
            dim = self._shard.dim(index)
            docs = self._shard.export_index(index, dest)
        except IndexNotFoundError as e:
            raise ConflictError(f"Index '{index}' was deleted while it was being persisted; nothing was written") from e
        return {"file": dest.name if docs or dest.exists() else None, "documents": docs, "dim": dim}

    def import_parts(self, index: str, part_files: list[str]) -> int:
        """Import, from every part of a snapshot, the documents that route to this shard. Each shard
        reads the parts itself, so a snapshot taken with N shards loads into any number of shards.
        A load imports into a staging index (``STAGING_PREFIX``) and swaps it in only once every
        shard has succeeded. An unreadable part (truncated, not a snapshot) is a 400 naming it."""
        imported = 0
        for f in part_files:
            try:
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
            except (sqlite3.DatabaseError, ValueError, KeyError, TypeError) as e:
                raise BadRequestError(
                    f"snapshot part {Path(f).name!r} is unreadable ({e}); the snapshot is "
                    "damaged or incomplete, nothing was loaded",
                    param="path",
                ) from e
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


#: What a shard actor answers as ``open_options()["code"]``: the class that serves it, the methods
#: it answers and the fields of the search hits it returns (a shard actor started before a method
#: or a field was added cannot answer it, so it is replaced like one of another class).
SHARD_CODE = (
    f"{ShardService.__module__}.{ShardService.__qualname__}:"
    + hashlib.sha1(
        ",".join(
            [
                *sorted(n for n in vars(ShardService) if not n.startswith("_")),
                *(f.name for f in dataclasses.fields(SearchHit)),
            ]
        ).encode()
    ).hexdigest()[:12]
)


def shard_method_name(method: Callable[..., Any]) -> str:
    """The name a shard pool calls ``method`` by, once it is known to be a public method of
    ``ShardService`` itself: anything else (another class's method of the same name, a free
    function, ``__init__``) would be looked up on the shard by a name that merely looks alike."""
    name = getattr(method, "__name__", "")
    if not name or name.startswith("_") or getattr(ShardService, name, None) is not method:
        raise TypeError(f"{method!r} is not a ShardService method; pass one, e.g. ShardService.search")
    return name


def traced_call(shard: ShardService, name: str, trace: Mapping[str, str] | None, *args: Any, **kwargs: Any) -> Any:
    """``shard``'s method ``name`` (a public method of ``ShardService`` itself, checked by name as
    ``shard_method_name`` checks a method) called in its span ``shard.<name>``: a child of ``trace``,
    the caller's context carried across a process (a shard actor), or of the current span (a shard
    in this process); docs/architecture.md §7. Only index names are attributes, bounded."""
    if name.startswith("_") or not callable(getattr(ShardService, name, None)):
        raise TypeError(f"{name!r} is not a ShardService method")
    if not tracing.ENABLED:
        return getattr(shard, name)(*args, **kwargs)
    attributes: dict[str, Any] = {"ragserve.shard": shard.shard_index}
    if isinstance(kwargs.get("index"), str):
        attributes["ragserve.index"] = tracing.names([kwargs["index"]])
    elif isinstance(kwargs.get("indexes"), list):
        attributes["ragserve.index"] = tracing.names(kwargs["indexes"])
    if isinstance(kwargs.get("docs"), list):
        attributes["ragserve.documents"] = len(kwargs["docs"])
    with tracing.remote_span(f"shard.{name}", trace, attributes) as span:
        out = getattr(shard, name)(*args, **kwargs)
        if name == "search_indexes":
            span.set_attribute("ragserve.hits", sum(len(c.dense) + len(c.lexical) for c in out if c is not None))
        return out


def _result_bytes(result: list[SearchCandidates | None]) -> int:
    """About what a search result holds in memory: its hits' text and their overhead."""
    return sum(
        len(h.text) + _HIT_OVERHEAD_BYTES
        for found in result
        if found is not None
        for h in (*found.dense, *found.lexical)
    )
