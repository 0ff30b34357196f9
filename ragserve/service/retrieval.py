"""Retrieval: the top ``k`` nodes of an index (or of several as one) for a query, asked of every shard at once.

The query is embedded (``TextEmbedder.embed_query``: in the ingress for a small encoder, else the
Embedder deployment) while its lexical form is parsed; then one call per shard
(``ShardService.search_indexes``) returns that shard's dense (FAISS) and lexical (FTS5 BM25)
candidates in each index searched, which are fused here, across shards and indexes, by their
scores (``ragserve.rag.fusion``, docs/quality.md). A reranker, when configured, reorders the fused
candidates. Nothing asks first whether the index exists: the search itself tells (every shard
answers None), so a RAG request costs one call per shard (issue 13).

Like the document service this keeps no state of its own; it is the document service's
``retriever`` (``DocumentService.retrieve`` delegates to it), built from the settings by
``ragserve.service.wiring``.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ragserve import tracing
from ragserve.api.documents import NodeWithScore, index_names
from ragserve.config import Settings
from ragserve.ports import Reranker, ShardPool, TextEmbedder
from ragserve.rag.fusion import FusionOptions, fuse_candidates
from ragserve.rag.plan import unknown_index
from ragserve.rag.rerank import rerank
from ragserve.service.shard_service import ShardService
from ragserve.store.lexical import MAX_QUERY_CHARS, lexical_query

#: The part of a query the query encoder is given (see ``Retriever.retrieve``).
QUERY_EMBED_CHARS = 65_536
#: Candidates fused on the event loop; more are fused on a worker thread.
FUSE_INLINE_HITS = 2_000


async def _no_tokens() -> int:
    return 0


@dataclass(frozen=True)
class RetrievalOptions:
    """How ``retrieve`` searches by default and fuses (the settings ``retrieval_mode``,
    ``retrieval_candidates``, ``lexical_min_match``, ``lexical_max_postings``, ``hybrid_dense_weight``,
    ``lexical_match_min_terms``)."""

    mode: str = "hybrid"
    candidates: int = 20
    min_match: float = 0.0
    max_postings: int | None = 2000
    fusion: FusionOptions = field(default_factory=FusionOptions)

    @classmethod
    def from_settings(cls, s: Settings) -> RetrievalOptions:
        return cls(
            mode=s.retrieval_mode,
            candidates=s.retrieval_candidates,
            min_match=s.lexical_min_match,
            max_postings=s.lexical_max_postings,
            fusion=FusionOptions(dense_weight=s.hybrid_dense_weight, match_min_terms=s.lexical_match_min_terms),
        )


class Retriever:
    """Searches an index over a pool of shards: embeds the query, fans the search out, fuses and
    reranks."""

    def __init__(
        self,
        pool: ShardPool[ShardService],
        embedder: TextEmbedder,
        options: RetrievalOptions | None = None,
        reranker: Reranker | None = None,
    ):
        self.pool = pool
        self.embedder = embedder
        self.options = options or RetrievalOptions()
        self.reranker = reranker

    async def retrieve(
        self,
        indexes: str | Sequence[str],
        query: str,
        k: int,
        metadata_filter: dict[str, Any] | None = None,
        mode: str | None = None,
    ) -> tuple[list[NodeWithScore], dict[str, float]]:
        """The top ``k`` nodes for ``query`` in ``mode`` (the server's ``retrieval_mode`` when None)
        of one index or of several as one ranking, and the time spent embedding and searching
        (seconds).

        One call per shard returns its dense and its lexical candidates in each index (in hybrid
        mode ``retrieval_candidates`` of each, at least ``k``), so several indexes cost more work in
        each shard call, never more calls; they are fused here, across shards and indexes
        (``fuse_candidates``); a reranker, when configured, reorders the fused candidates and the
        best ``k`` are kept. The query is embedded once, in every mode: lexical hits carry their
        cosine score too. An index no shard holds is a ``NotFoundError`` naming it."""
        names = index_names(indexes)
        mode = mode or self.options.mode
        # how many tokens the lexical query holds (for keyword_match): parsed on a worker thread, as
        # everything that reads user text is, beside the embedding (the parser is linear and bounded)
        query_tokens = asyncio.ensure_future(
            asyncio.to_thread(lambda: lexical_query(query).tokens) if mode != "dense" else _no_tokens()
        )
        timings: dict[str, float] = {}
        # the encoder reads its first max_seq_length tokens (256 for all-MiniLM-L6-v2; a few
        # thousand for the largest), which lie well inside QUERY_EMBED_CHARS characters; its
        # tokenizer would still split all of a pasted megabyte first (seconds of a worker thread)
        with tracing.stage("embed", timings, {"ragserve.query": tracing.content(query)} if tracing.ENABLED else None):
            vector = await self.embedder.embed_query(query[:QUERY_EMBED_CHARS])  # the search tells a missing index
        # fusion and reranking choose among more than k; a single list, as is, needs only k
        wide = mode == "hybrid" or self.reranker is not None
        depth = max(k, self.options.candidates) if wide else k
        attributes = (
            {
                "ragserve.index": tracing.names(names),
                "ragserve.retrieval_mode": mode,
                "ragserve.top_k": k,
                "ragserve.candidates": depth,
                "ragserve.shards": self.pool.num_shards,
            }
            if tracing.ENABLED
            else None
        )
        with tracing.stage("search", timings, attributes) as span:  # the shards' spans are its children
            parts = await self.pool.call_all(
                ShardService.search_indexes,
                indexes=list(names),
                vector=vector,
                text=query[: MAX_QUERY_CHARS + 1],  # all the lexical parser reads (the +1 tells a word cut at the end)
                k=depth,
                mode=mode,
                metadata_filter=metadata_filter,
                min_match=self.options.min_match,
                max_postings=self.options.max_postings,
            )
            for i, name in enumerate(names):
                if all(p[i] is None for p in parts):
                    raise unknown_index(name)
            found = [c for p in parts for c in p if c is not None]
            fuse = functools.partial(
                fuse_candidates,
                [p.dense for p in found],
                [p.lexical for p in found],
                depth if self.reranker is not None else k,
                self.options.fusion,
                await query_tokens,
            )
            # a few hundred candidates fuse in well under a millisecond; many indexes with a large k
            # bring tens of thousands (k of each list of each index on each shard): off the event loop
            hits = sum(len(p.dense) + len(p.lexical) for p in found)
            with tracing.span("retrieval.fuse", {"ragserve.candidates_fused": hits} if tracing.ENABLED else None):
                nodes = await asyncio.to_thread(fuse) if hits > FUSE_INLINE_HITS else fuse()
            if tracing.ENABLED:
                tracing.set_attributes(span, _found_attributes(nodes))
        if self.reranker is not None and nodes:
            with tracing.stage("rerank", timings) as span:
                nodes = (await rerank(self.reranker, query, nodes))[:k]
                if tracing.ENABLED:
                    tracing.set_attributes(span, _found_attributes(nodes))
        return nodes, timings


def _found_attributes(nodes: list[NodeWithScore]) -> dict[str, Any]:
    """How many nodes a search returned and the best one's score, for its span."""
    return {"ragserve.nodes_returned": len(nodes), "ragserve.top_score": nodes[0].score if nodes else None}
