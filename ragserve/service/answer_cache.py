"""The answer cache: whole RAG answers kept in an ingress replica and served again, never after a
write to an index they were retrieved from (docs/architecture.md §4, "Answer cache").

- **Key** (:func:`answer_key`): a sha256 of the canonical JSON of everything the answer depends on:
  the question (whitespace normalised, :func:`normalise_question`), the system messages and the
  history, the indexes (as a set), the metadata filter, the retrieval parameters, every sampling
  and OpenAI field the request forwards, and what the server decides (``ChatOptions``, the retrieval
  options, the model, its window, the context a chat without ``top_k`` gets). Not ``stream``,
  ``stream_options`` or ``user``: they change how an answer is delivered and who asked, not what it
  says. The key without the question (``rest``) groups answers for the near-duplicate lookup.
- **Validity**: each entry keeps the change versions of its indexes on every shard
  (``ShardService.index_versions``), read *before* retrieval; a lookup reads them again and serves
  the entry only when they are equal. A write that lands while an answer is computed therefore
  makes it stale at once, never a stale answer that looks fresh. The shards are the truth, so each
  replica's cache is right on its own.
- **Bounds**: entries and bytes (an entry counts its serialised answer, its question's vector and
  ``ENTRY_OVERHEAD``), least recently used first out; an answer larger than the byte bound is not
  kept; each entry expires after a TTL.

Not thread-safe by design: it is used on the event loop only, and no method awaits.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from ragserve.api.documents import NodeWithScore
from ragserve.api.openai import (
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    Citation,
    InvalidCitation,
    RagInfo,
    ResponseMessage,
    UsageInfo,
)
from ragserve.config import Settings
from ragserve.rag.plan import RagPlan

#: ``(epoch, generation, stamp)`` of each index on each shard (``DocumentService.index_versions``).
Versions = tuple[tuple[str, int | None, int], ...]

#: What a request got from the cache (``X-RAG-Cache``) and the events counted (telemetry).
HIT, MISS, BYPASS = "hit", "miss", "bypass"
EVICTION, INVALIDATION = "eviction", "invalidation"

#: Entries of the same rest-of-key compared with a question in the near-duplicate lookup (the most
#: recently kept first): bounds its cost whatever the cache holds.
SIMILAR_SCAN = 256
#: Bytes an entry takes beyond its answer and vector: its key and bookkeeping, and each of its
#: versions (one per index and shard), estimated.
ENTRY_OVERHEAD = 512
VERSION_BYTES = 120
#: A request whose messages hold more characters than this is keyed on a worker thread.
INLINE_KEY_CHARS = 32_768
#: Request fields that change how an answer is delivered, or who asked, not what it says.
NOT_KEYED = frozenset({"messages", "stream", "stream_options", "user"})

_WHITESPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class AnswerCacheOptions:
    """The settings the answer cache reads (named as in ``Settings``, where their defaults live)."""

    answer_cache: bool
    answer_cache_max_entries: int
    answer_cache_max_bytes: int
    answer_cache_ttl_s: float
    answer_cache_similarity: float | None
    answer_cache_sampled: bool

    @classmethod
    def from_settings(cls, settings: Settings) -> AnswerCacheOptions:
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls)})


@dataclass(frozen=True)
class CachePolicy:
    """What one request may do with the cache: read a kept answer, keep its own."""

    read: bool
    write: bool

    @property
    def used(self) -> bool:
        return self.read or self.write


NO_CACHE = CachePolicy(read=False, write=False)


def cache_policy(request: ChatCompletionRequest, cache_control: str | None, options: AnswerCacheOptions) -> CachePolicy:
    """The rules: off with the setting; ``cache: false`` or ``Cache-Control: no-store`` neither read
    nor keep; ``Cache-Control: no-cache`` computes afresh and keeps the answer; a sampled request
    (``temperature`` > 0) is answered afresh unless it sends ``cache: true`` or
    ``answer_cache_sampled`` is on. A ``temperature`` left out is the engine's default (greedy for
    the embedded engine)."""
    if not options.answer_cache or request.cache is False:
        return NO_CACHE
    directives = {d.split("=", 1)[0].strip().lower() for d in (cache_control or "").split(",")}
    if "no-store" in directives:
        return NO_CACHE
    sampled = request.temperature is not None and request.temperature > 0
    if sampled and not (request.cache is True or options.answer_cache_sampled):
        return NO_CACHE
    return CachePolicy(read="no-cache" not in directives, write=True)


def normalise_question(text: str) -> str:
    """The question as keyed: leading and trailing whitespace dropped, each inner run of whitespace
    one character (a newline when it holds one, else its first). Only that: letter case marks the
    names the "not covered" rule looks for ("CORS", "PostgreSQL"), a "?" marks the sentences that
    ask, punctuation is a token to the encoder, and the model reads the text, so any of them may
    change the answer; whitespace runs change none of these (a newline still ends a sentence)."""
    return _WHITESPACE.sub(lambda m: "\n" if "\n" in m.group() else m.group()[0], text.strip())


@dataclass(frozen=True)
class AnswerKey:
    """``key``: the sha256 of everything the answer depends on; ``rest``: of all of it but the
    question (what a near-duplicate must share)."""

    key: str
    rest: str


def large_key(plan: RagPlan, limit: int = INLINE_KEY_CHARS) -> bool:
    """Whether :func:`answer_key` would serialise more than about ``limit`` characters (then it runs
    on a worker thread): the question, messages and forwarded fields are walked only until that
    much is counted, so a huge request costs no more than a small one to tell."""
    total = 0
    todo: list[Any] = [plan.query, plan.system, plan.history, plan.body]
    while todo:
        value = todo.pop()
        if isinstance(value, str):
            total += len(value)
        elif isinstance(value, dict):
            total += len(value)
            todo.extend(value.keys())
            todo.extend(value.values())
        elif isinstance(value, list | tuple):
            total += len(value)
            todo.extend(value)
        else:
            total += 1
        if total > limit:
            return True
    return False


def answer_key(plan: RagPlan, server: Mapping[str, Any]) -> AnswerKey:
    """The key of a RAG plan's answer (module docstring). ``server``: what the server decides
    (options, model, window, context size), JSON-serialisable."""
    p = plan.params
    rest = {
        "system": plan.system,
        "history": plan.history,
        "indexes": sorted(set(p.indexes)),
        "metadata_filter": p.metadata_filter,
        "retrieval": {
            "top_k": p.top_k,
            "similarity_threshold": p.similarity_threshold,
            "context_token_ratio": p.context_token_ratio,
            "retrieval_mode": p.retrieval_mode,
            "query_rewrite": p.query_rewrite,
            "sources_in_content": p.sources_in_content,
        },
        # model, temperature, top_p, max_tokens, stop, seed and every other field forwarded upstream
        "sampling": {k: v for k, v in plan.body.items() if k not in NOT_KEYED},
        "server": server,
    }
    rest_hash = _sha256(rest)
    return AnswerKey(key=_sha256({"rest": rest_hash, "question": normalise_question(plan.query)}), rest=rest_hash)


def _sha256(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class CachedAnswer:
    """A kept answer: the response's JSON without ``id``, ``created`` and ``usage`` (a hit gets
    them afresh), its ``X-RAG-Reason`` (None, or ``not_covered``), the versions it was computed
    under, its question's vector (near-duplicates), when it expires and its size in bytes."""

    body: bytes
    reason: str | None
    versions: Versions
    rest: str
    vector: np.ndarray | None
    expires: float
    size: int

    def response(self, cid: str, created: int) -> ChatCompletionResponse:
        """The answer as served from the cache: a fresh ``id`` and ``created``; ``usage`` zero, as
        no model token was spent on it (docs/architecture.md §4)."""
        response = ChatCompletionResponse.model_validate_json(self.body)
        response.id, response.created, response.usage = cid, created, UsageInfo.of(0, 0)
        return response


class AnswerCache:
    """LRU of answers bounded in entries and bytes, each valid while the versions it was computed
    under hold and its TTL lasts. ``on_event`` is told each eviction and invalidation here, and
    each hit, miss and bypass the chat service records (``record``): the telemetry counters."""

    def __init__(
        self,
        options: AnswerCacheOptions,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_event: Callable[[str], None] | None = None,
    ):
        self.options = options
        self._clock = clock
        self._on_event = on_event
        self._entries: OrderedDict[str, CachedAnswer] = OrderedDict()
        self._by_rest: dict[str, OrderedDict[str, None]] = {}  # near-duplicates: keys by rest, oldest first
        self.bytes = 0
        self.counts: dict[str, int] = {HIT: 0, MISS: 0, BYPASS: 0, EVICTION: 0, INVALIDATION: 0}

    def __len__(self) -> int:
        return len(self._entries)

    def record(self, event: str, n: int = 1) -> None:
        self.counts[event] = self.counts.get(event, 0) + n
        if self._on_event is not None:
            for _ in range(n):
                self._on_event(event)

    # --- lookups ------------------------------------------------------------------------------
    def get(self, key: str, versions: Versions) -> CachedAnswer | None:
        """The answer kept under ``key`` if it is still valid under ``versions`` (now read from the
        shards); a stale or expired one is dropped."""
        entry = self._entries.get(key)
        if entry is None or not self._valid(key, entry, versions):
            return None
        self._entries.move_to_end(key)
        return entry

    def similar(self, rest: str, vector: np.ndarray, versions: Versions) -> CachedAnswer | None:
        """The valid answer of the same ``rest`` whose question's vector is closest to ``vector``,
        if its cosine reaches ``answer_cache_similarity`` (None when that is off). Compares the
        ``SIMILAR_SCAN`` most recently kept of them."""
        threshold = self.options.answer_cache_similarity
        group = self._by_rest.get(rest)
        if threshold is None or not group:
            return None
        keys: list[str] = []
        vectors: list[np.ndarray] = []
        for key in list(itertools.islice(reversed(group), SIMILAR_SCAN)):
            entry = self._entries[key]
            if entry.vector is not None and self._valid(key, entry, versions):
                keys.append(key)
                vectors.append(entry.vector)
        if not keys:
            return None
        scores = np.stack(vectors) @ _unit(vector)
        best = int(np.argmax(scores))
        if not float(scores[best]) >= threshold:  # NaN is never a hit
            return None
        self._entries.move_to_end(keys[best])
        return self._entries[keys[best]]

    def _valid(self, key: str, entry: CachedAnswer, versions: Versions) -> bool:
        if entry.expires <= self._clock():
            self._remove(key)
            self.record(EVICTION)
            return False
        if entry.versions != versions:
            self._remove(key)
            self.record(INVALIDATION)
            return False
        return True

    # --- keeping ------------------------------------------------------------------------------
    def put(
        self,
        key: AnswerKey,
        versions: Versions,
        response: ChatCompletionResponse,
        reason: str | None,
        vector: np.ndarray | None = None,
    ) -> bool:
        """Keep ``response`` (computed under ``versions``, read before its retrieval) under ``key``;
        False when it alone is larger than the byte bound. Evicts the least recently used past the
        bounds."""
        body = response.model_dump_json(exclude_unset=True, exclude={"id", "created", "usage"}).encode()
        if self.options.answer_cache_similarity is None:
            vector = None
        elif vector is not None:
            vector = _unit(vector)
        size = len(body) + (vector.nbytes if vector is not None else 0) + ENTRY_OVERHEAD + VERSION_BYTES * len(versions)
        if size > self.options.answer_cache_max_bytes:
            return False
        if key.key in self._entries:
            self._remove(key.key)
        entry = CachedAnswer(
            body=body,
            reason=reason,
            versions=versions,
            rest=key.rest,
            vector=vector,
            expires=self._clock() + self.options.answer_cache_ttl_s,
            size=size,
        )
        self._entries[key.key] = entry
        self.bytes += size
        if vector is not None:
            self._by_rest.setdefault(key.rest, OrderedDict())[key.key] = None
        o = self.options
        while len(self._entries) > o.answer_cache_max_entries or self.bytes > o.answer_cache_max_bytes:
            self._remove(next(iter(self._entries)))
            self.record(EVICTION)
        return True

    def _remove(self, key: str) -> None:
        entry = self._entries.pop(key)
        self.bytes -= entry.size
        group = self._by_rest.get(entry.rest)
        if group is not None:
            group.pop(key, None)
            if not group:
                del self._by_rest[entry.rest]

    def clear(self) -> None:
        self._entries.clear()
        self._by_rest.clear()
        self.bytes = 0


def _unit(vector: np.ndarray) -> np.ndarray:
    v = np.asarray(vector, dtype=np.float32).reshape(-1)
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else v


class StreamRecorder:
    """Reads the chunks of a streamed RAG answer as they go by and gives back the whole answer once
    its closing chunk (the one with ``citations``) has passed: what a stream that ended normally
    leaves for the cache. The text is every content delta of choice 0, the footer included."""

    def __init__(self) -> None:
        self._text: list[str] = []
        self._model = ""
        self._sources: list[NodeWithScore] | None = None
        self._rag: RagInfo | None = None
        self._citations: list[Citation] | None = None
        self._invalid: list[InvalidCitation] | None = None
        self._finish: str | None = None
        self._closed = False

    def add(self, chunk: ChatCompletionChunk) -> None:
        self._model = chunk.model or self._model
        if chunk.source_nodes is not None and self._sources is None:
            self._sources = chunk.source_nodes
        if chunk.rag is not None:
            self._rag = chunk.rag
        for choice in chunk.choices:
            if choice.index != 0:
                continue
            if choice.delta.content:
                self._text.append(choice.delta.content)
        if chunk.citations is not None:  # the closing chunk
            self._closed = True
            self._citations, self._invalid = chunk.citations, chunk.invalid_citations
            self._finish = chunk.choices[0].finish_reason if chunk.choices else None

    def answer(self) -> ChatCompletionResponse | None:
        """The whole answer, or None when the closing chunk never came."""
        if not self._closed or self._sources is None:
            return None
        return ChatCompletionResponse(
            object="chat.completion",
            model=self._model,
            choices=[
                ChatCompletionChoice(
                    index=0,
                    message=ResponseMessage(role="assistant", content="".join(self._text)),
                    finish_reason=self._finish,
                )
            ],
            source_nodes=self._sources,
            citations=self._citations,
            invalid_citations=self._invalid if self._invalid is not None else [],
            rag=self._rag,
        )


def replay_pieces(text: str, size: int = 64) -> list[str]:
    """``text`` cut after whitespace into pieces of about ``size`` characters (a cached answer
    served as a stream); joined, they give it back."""
    pieces: list[str] = []
    start = 0
    while start < len(text):
        end = start + size
        if end < len(text):
            space = text.find(" ", end)
            end = len(text) if space < 0 else space + 1
        pieces.append(text[start:end])
        start = end
    return pieces
