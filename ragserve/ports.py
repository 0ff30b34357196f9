"""Every seam of ragserve in one place: what the services need from the parts that can be swapped
(docs/architecture.md §12). Each is a ``Protocol``, so an implementation only has to have the
methods: an engine in this process or a Serve handle to another replica, a local shard or a shard
actor, a real model or a test's fake.

- ``ShardPool``: calls a method of one shard, or of every shard, of the sharded index.
- ``TextEmbedder``: texts to L2-normalised vectors, and the embedding model's token counts.
- ``LanguageModel``: chat, streamed chat and pass-through, with the model's window, counter and prefill speed.
- ``Reranker``: scores (query, text) pairs.
- ``TokenCounter`` (and ``ChatRenderer``): tokens of a text or of a chat as the model sees it.

This module sits just above ``ragserve.api`` (docs/architecture.md §2): it names wire shapes and nothing else of the
package, so every layer above may type against it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar, runtime_checkable

import numpy as np

from ragserve.api.documents import DocumentRecord, RetrieveRequest, RetrieveResponse
from ragserve.api.generation import GenerationDelta, GenerationResult
from ragserve.api.messages import Message
from ragserve.api.openai import ChatCompletionChunk, ChatCompletionResponse
from ragserve.api.sampling import SamplingParams


class ChatRenderer(Protocol):
    """Renders a chat to the prompt text a model sees when the engine renders it itself (a base
    model's plain format, a template written in Python). ``grounded``: the last user turn is a
    question over sources in the system messages (``SamplingParams.grounded``); a format with
    turns renders it like any other."""

    def __call__(self, messages: Sequence[Message], *, grounded: bool = False) -> str: ...


@runtime_checkable
class TokenCounter(Protocol):
    """Counts tokens; ``exact`` says whether the counts are the model's own."""

    name: str
    exact: bool

    def count_text(self, text: str) -> int: ...

    def count_messages(self, messages: Sequence[Message], *, grounded: bool = False) -> int:
        """Prompt tokens of ``messages`` rendered for generation (template + generation prompt);
        ``grounded`` as the engine will be told in ``SamplingParams.grounded``, since a plain-text
        format ends a question over sources otherwise than a chat."""
        ...


class TextEmbedder(Protocol):
    """Turns texts into L2-normalised float32 vectors (one row per text) and counts the embedding
    model's tokens (``/v1/embeddings`` usage)."""

    async def embed_documents(self, texts: list[str], *, bulk: bool = False) -> np.ndarray:
        """``bulk``: an ingestion's batches, which wait while interactive work (a query, a chat's
        passages, ``/v1/embeddings``) goes first (``ragserve.models.embeddings.EncodeWorkers``)."""
        ...

    async def embed_query(self, text: str) -> np.ndarray: ...

    async def count_tokens(
        self, texts: list[str], *, over: int | None = None, total_over: int | None = None
    ) -> list[int]:
        """Each text's tokens as the model reads it, before the model's own truncation (approximate
        for a remote model); a count above ``over`` may be a lower bound of it, from a prefix. The
        list may stop after the first count above ``over``, or once the counts pass ``total_over``."""
        ...


class LanguageModel(Protocol):
    """What the pipeline needs from the LLM side: an engine in this process
    (``ragserve.service.local.EngineClient``) or the Generator deployment behind a handle
    (``ragserve.deployments.clients.HandleGenerator``)."""

    @property
    def model_id(self) -> str: ...

    async def context_window(self) -> int: ...

    async def token_counter(self) -> TokenCounter: ...

    async def prefill_tokens_per_s(self) -> float | None:
        """Prompt tokens per second the model reads, where that bounds the context a request can
        afford (the embedded CPU engine, measured at start); None where the window does (a GPU or a
        remote server). Sizes the context of a chat without ``top_k`` (``ragserve.rag.context_size``)."""
        ...

    async def chat(self, messages: Sequence[Message], params: SamplingParams) -> GenerationResult: ...

    def chat_stream(self, messages: Sequence[Message], params: SamplingParams) -> AsyncIterator[GenerationDelta]: ...

    async def passthrough(self, body: dict[str, Any], default_max_tokens: int) -> ChatCompletionResponse: ...

    def passthrough_stream(
        self, body: dict[str, Any], default_max_tokens: int
    ) -> AsyncIterator[ChatCompletionChunk]: ...


class Reranker(Protocol):
    """Scores (query, text) pairs; higher is more relevant."""

    async def score(self, query: str, texts: list[str]) -> list[float]: ...


S_co = TypeVar("S_co", covariant=True)
P = ParamSpec("P")
R = TypeVar("R")


class ShardPool(Protocol[S_co]):
    """Calls a method of one shard, or of every shard: ``pool.call(0, ShardService.search, index=...)``.

    The method itself is passed (unbound), not its name, so that mypy checks every call's arguments
    and result against the shard's own signature. ``S_co`` is the shard type
    (``ragserve.service.shard_service.ShardService``, which this module, below the service layer,
    cannot name); a pool of a subclass's shards is a pool of its base class's. Callers pass
    keyword arguments when there is more than one, so the order cannot differ between layers. Only
    the Ray pool turns the method into its name, to cross to the shard actor."""

    @property
    def num_shards(self) -> int: ...

    async def call(
        self, shard: int, method: Callable[Concatenate[S_co, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> R: ...

    async def call_all(self, method: Callable[Concatenate[S_co, P], R], *args: P.args, **kwargs: P.kwargs) -> list[R]:
        """Every shard's answer, in shard order."""
        ...


class KnowledgeBase(Protocol):
    """What an agent reaches through the MCP tools (``ragserve.agent``), as one caller: the indexes
    its key may read, a search of one or several, a document by id. In the server it is the
    services behind the caller's key (``ragserve.service.knowledge``); in ``ragserve mcp`` a
    server's HTTP API with a key (``ragserve.cli.knowledge``). Failures are ``ServiceError`` with
    the message that says what to fix."""

    async def list_indexes(self) -> list[str]: ...

    async def retrieve(self, request: RetrieveRequest) -> RetrieveResponse: ...

    async def get_document(self, index: str, doc_id: str, max_text_length: int | None = None) -> DocumentRecord: ...
