"""Ingestion: chunking (sentence or code-aware), document ids and content hashes."""

from ragserve.ingest.chunker import DocumentChunker
from ragserve.ingest.chunks import Chunk, ChunkingError, TokenCount, hf_token_counter
from ragserve.ingest.code import SUPPORTED_LANGUAGES, CodeChunker, UnsupportedLanguageError
from ragserve.ingest.ids import content_hash, new_doc_id, node_id_for
from ragserve.ingest.sentence import SentenceChunker

__all__ = [
    "SUPPORTED_LANGUAGES",
    "Chunk",
    "ChunkingError",
    "CodeChunker",
    "DocumentChunker",
    "SentenceChunker",
    "TokenCount",
    "UnsupportedLanguageError",
    "content_hash",
    "hf_token_counter",
    "new_doc_id",
    "node_id_for",
]
