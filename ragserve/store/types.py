"""Records and errors of one shard's storage."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ragserve.errors import ConflictError


@dataclass(frozen=True)
class ChunkWrite:
    node_id: str
    chunk_index: int
    text: str
    vector: np.ndarray  # float32 (dim,), L2-normalised by the caller


@dataclass(frozen=True)
class _Document:
    """What a shard keeps of a document besides its chunks."""

    doc_id: str
    text: str
    metadata: dict[str, Any]
    hash_value: str


@dataclass(frozen=True)
class DocumentWrite(_Document):
    """A document to write with its embedded chunks."""

    chunks: list[ChunkWrite] = field(default_factory=list)


@dataclass(frozen=True)
class StoredDocument(_Document):
    """A document as read back; ``text`` may be cut to a listing's ``max_text_length``."""

    is_truncated: bool = False


@dataclass(frozen=True)
class SearchHit:
    """One chunk found by a search. ``score`` is always the cosine similarity to the query (for a
    lexical hit too, from its stored vector), so thresholds mean the same in every mode.
    ``lexical_score`` is its BM25 score (higher is better) when the lexical search found it, and
    ``all_terms`` says that its text contains every term of the lexical query, and
    ``lexical_coverage`` what share of the query's information (its terms weighed by IDF) it holds
    (None in dense mode). ``index`` names the index it is from."""

    doc_id: str
    node_id: str
    chunk_index: int
    text: str
    score: float
    metadata: dict[str, Any]
    lexical_score: float | None = None
    all_terms: bool = False
    lexical_coverage: float | None = None
    index: str = ""  # the index it is from: one search may span several (a node id is unique only in its index)


@dataclass(frozen=True)
class SearchCandidates:
    """One shard's answer to a retrieval: its dense candidates (best cosine first) and its lexical
    candidates (best BM25 first), each at most ``k``; a chunk found by both is in both lists.
    The caller fuses the lists of every shard (``ragserve.rag.fusion``)."""

    dense: list[SearchHit] = field(default_factory=list)
    lexical: list[SearchHit] = field(default_factory=list)


class IndexNotFoundError(KeyError):
    """A per-index operation named an index this shard does not hold."""

    def __str__(self) -> str:
        return f"No such index: {self.args[0]!r}"


class DimensionMismatchError(ConflictError, ValueError):
    """Vectors of another dimension than the index's: the index was built with another embedding
    model than the one serving now. A 409 that says so: nothing is written, and the client can
    write into a new index or serve the model the index was built with."""

    def __init__(self, message: str, *, another_model: bool = True):
        if another_model:
            message += (
                ": the index was built with another embedding model than this server's; "
                "write into a new index, or serve the embedding model it was built with"
            )
        super().__init__(message)


class IndexDroppedError(LookupError):
    """A write carried a generation of an index that has since been dropped or replaced (by a
    delete-index or a load): nothing of it is stored. ``generation`` names what the writer saw."""

    def __init__(self, index: str, generation: int | None = None):
        super().__init__(index, generation)
        self.index = index
        self.generation = generation

    def __str__(self) -> str:
        return f"index {self.index!r} was deleted or replaced while this write was in flight"


class IndexExistsError(LookupError):
    """A load without ``overwrite`` found the index already there."""

    def __str__(self) -> str:
        return f"index {self.args[0]!r} already exists"
