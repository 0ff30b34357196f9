"""The chat-completion pipeline: plan → (passthrough | retrieve → fit → generate) → OpenAI response.

It talks to a ``LanguageModel`` (the generator deployment, or an engine in-process) and to the
``DocumentService``. The HTTP layer only turns a request into a call of ``ChatService.complete``
and the outcome (a response model, or a stream of chunk models) back into HTTP (headers, SSE).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np

from ragserve import tracing
from ragserve.api.documents import (
    Evidence,
    NodeWithScore,
    QueryRequest,
    QueryResponse,
    QueryRewrite,
    RetrievalMode,
    RetrieveRequest,
    RetrieveResponse,
)
from ragserve.api.generation import GenerationDelta
from ragserve.api.openai import (
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionChunkChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    DeltaMessage,
    QuerySource,
    RagInfo,
    ResponseMessage,
    UsageInfo,
    new_completion_id,
)
from ragserve.api.sampling import SamplingParams
from ragserve.config import Settings
from ragserve.errors import BadRequestError, ServiceError
from ragserve.ports import LanguageModel, TextEmbedder, TokenCounter
from ragserve.rag.answerable import AnswerabilityRule, answerable, closest, not_covered_answer
from ragserve.rag.citations import parse_citations, sources_footer
from ragserve.rag.context import passes_threshold, relevant
from ragserve.rag.context_size import ContextSize, chat_context_size
from ragserve.rag.evidence import Assessment, Shortlist, assess, candidates, embed_text, shortlist
from ragserve.rag.fit import ContextBudgetError, FitResult, fit, fit_passthrough
from ragserve.rag.followup import (
    REWRITE_MAX_TOKENS,
    followup_query,
    previous_user_turns,
    refers_back,
    rewrite_messages,
)
from ragserve.rag.plan import Passthrough, PassthroughReason, RagPlan, plan
from ragserve.rag.prompt import with_evidence
from ragserve.service.answer_cache import (
    BYPASS,
    HIT,
    MISS,
    NO_CACHE,
    AnswerCache,
    AnswerKey,
    CachedAnswer,
    StreamRecorder,
    Versions,
    answer_key,
    cache_policy,
    large_key,
    replay_pieces,
)
from ragserve.service.cache import PassageVectors
from ragserve.service.documents import DocumentService
from ragserve.service.retrieval import QUERY_EMBED_CHARS

log = logging.getLogger("ragserve.chat")

#: The parts of the answer being computed that failed and were done without (``_fell_back``): an
#: answer made so (no evidence, a "not covered" for want of a lookup) is served but not kept.
_FALLBACKS: ContextVar[list[str] | None] = ContextVar("ragserve_chat_fallbacks", default=None)


def _fell_back(part: str) -> None:
    """Note that ``part`` of the answer being computed failed and the answer goes on without it."""
    noted = _FALLBACKS.get()
    if noted is not None:
        noted.append(part)


#: ``X-RAG-Reason`` of a RAG answer that says the documents do not cover the question (no model call).
NOT_COVERED = "not_covered"


@dataclass(frozen=True)
class ChatOptions:
    """The settings the chat pipeline reads, and only those (named as in ``Settings``, where their
    defaults live): the token budget's (docs/architecture.md §5), what chat retrieves with when a
    request does not say, and whether answers end with a "Sources:" list. A narrow object, so what
    the pipeline depends on is plain to see, and a setting it does not read cannot change it."""

    # the budget (``ragserve.rag.fit``)
    default_max_tokens: int
    min_completion_tokens: int
    context_token_ratio: float
    budget_safety_ratio: float | None
    history_min_messages: int
    history_max_messages: int
    # the context of a chat without top_k (``ragserve.rag.context_size``)
    chat_context_tokens: int | None
    chat_context_prefill_s: float
    llm_timeout_s: float
    # retrieval for chat: threshold, mode, how many candidates, follow-up questions
    similarity_threshold: float
    retrieval_mode: RetrievalMode
    max_top_k: int
    chunk_size: int
    followup_terms: int
    query_rewrite: QueryRewrite
    # the answer: its "Sources:" list, its evidence, whether the sources can answer (docs/architecture.md §4)
    sources_in_content: bool
    evidence_passages: int
    evidence_in_prompt: int
    passage_cache_size: int
    answerability: bool
    answerable_threshold: float
    answerable_coverage: float
    answerable_evidence: float

    @classmethod
    def from_settings(cls, settings: Settings) -> ChatOptions:
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls)})


@dataclass
class ChatOutcome:
    """What happened and what to send: a whole body, or a stream of chunk bodies."""

    mode: str  # "rag" | "passthrough"
    reason: str | None
    response: ChatCompletionResponse | None = None
    stream: AsyncGenerator[ChatCompletionChunk, None] | None = None
    source_nodes: list[NodeWithScore] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)
    rag: RagInfo | None = None  # what retrieval searched with, when it ran
    usage: UsageInfo | None = None  # a stream's token usage (the engine's), once it has ended
    # what a stream relayed so far and the model's counter, for the tokens of one that ends without
    # the engine's usage (a client that left; an upstream that sends none): usage metering counts it
    relayed: list[str] = field(default_factory=list)
    counter: TokenCounter | None = None
    # the answer cache (RAG answers; None where it is off): hit, miss or bypass (X-RAG-Cache)
    cache: str | None = None
    # the queries whose embedding tokens the request spent, where not ``rag.query`` (usage metering):
    # an answer served from the cache embedded none, or only the question its lookup compared
    embedded: list[str] | None = None


def _stamp(body: ChatCompletionResponse | ChatCompletionChunk, cid: str, created: int) -> None:
    """Give a body from an engine the id, object and creation time of this answer, unless it came
    with its own (a remote upstream's are relayed as sent)."""
    if not body.id:
        body.id = cid
    if body.created == 0 or "created" not in body.model_fields_set:
        body.created = created
    body.object = body.object  # marks it set, so it is written


class ChatService:
    def __init__(
        self,
        options: ChatOptions,
        documents: DocumentService,
        llm: LanguageModel,
        embedder: TextEmbedder | None = None,
        cache: AnswerCache | None = None,
    ):
        """``embedder`` embeds the sentences that may be an answer's evidence (the one retrieval
        embeds queries with); without one, answers carry no evidence and none is "not covered".
        ``cache``: the answer cache of this replica (docs/architecture.md §4), None for none."""
        self.options = options
        self.documents = documents
        self.llm = llm
        self.embedder = embedder
        #: the evidence windows' vectors, by text: the same sources come back for many questions
        self.passages = (
            PassageVectors(embedder.embed_documents, options.passage_cache_size) if embedder is not None else None
        )
        self.cache = cache
        # what the server decides that answers depend on and that never changes in a process (the
        # answer cache's key; read only with a cache, so a test's stand-in documents need no retriever)
        self._fixed_key: dict[str, Any] = {}
        if cache is not None:
            retrieval = documents.retriever
            self._fixed_key = {
                "chat": asdict(options),
                "retrieval": asdict(retrieval.options),
                "reranker": type(retrieval.reranker).__qualname__ if retrieval.reranker is not None else None,
                "embedding_model": documents.embedding_model,
            }

    # --- entry points -------------------------------------------------------------------------
    async def complete(self, request: ChatCompletionRequest, cache_control: str | None = None) -> ChatOutcome:
        """Answer ``request``: passed through, or from the indexes (RAG); ``cache_control``, the
        request's ``Cache-Control`` header, tells the answer cache ``no-cache`` or ``no-store``."""
        # No separate existence call to every shard before a RAG request's search: the search
        # reports a missing index itself (``_rag``), so the plan assumes the index exists. Only an
        # outcome that will not search (a bypass, a client error) asks the shards, and is decided
        # again knowing, so a missing index is a 404 in the same cases and order as before.
        with tracing.span("rag.plan") as span:
            decided = plan(request, lambda _name: True)
            if request.index_name and not isinstance(decided, RagPlan):
                missing = await self.documents.missing_index(request.indexes)
                if missing is not None:
                    decided = plan(request, lambda name: name != missing)
            if tracing.ENABLED:
                tracing.set_attributes(span, _plan_attributes(request, decided))
        if isinstance(decided, ServiceError):
            raise decided
        if isinstance(decided, Passthrough):
            return await self._passthrough(decided.body, decided.reason, request.stream)
        return await self._rag(decided, request, cache_control)

    async def query(self, req: QueryRequest, on_usage: Callable[[int, int], None] | None = None) -> QueryResponse:
        """KAITO's ``/query``: retrieve, answer with the relevant nodes, return both. ``on_usage`` is
        told the answer's prompt and completion tokens (the engine's count), when a model answered."""
        threshold = self._threshold(req.similarity_threshold)
        nodes, _ = await self.documents.retrieve(
            req.indexes, req.query, req.top_k, req.metadata_filter, req.retrieval_mode
        )
        result = await self._fit(
            system=[],
            history=[],
            query=req.query,
            nodes=nodes,
            requested=req.llm_params.max_tokens,
            threshold=threshold,
            ratio=None,
            max_tokens_param="llm_params.max_tokens",
        )
        used = result.nodes_used
        assessment = await self._assess(req.indexes, req.query, used)
        if used and not self._answerable(used, assessment):
            near = closest(used)
            return QueryResponse(
                response=not_covered_answer(near),
                source_nodes=near,
                metadata=_metadata_by_node(near, len(req.indexes) > 1),
                evidence=[],
                answerable=False,
            )
        result = await self._with_evidence_hint(result, assessment)
        sampling = req.llm_params.to_sampling_params(result.max_tokens, grounded=result.grounded)
        attributes = _llm_attributes(self.llm.model_id, sampling.max_tokens, stream=False) if tracing.ENABLED else None
        with tracing.stage("generate", None, attributes) as span:
            answer = await self.llm.chat(result.messages, sampling)
            if tracing.ENABLED:
                _usage_attributes(span, UsageInfo.of(answer.prompt_tokens, answer.completion_tokens), answer.model)
        usage = answer.usage()
        if on_usage is not None and usage is not None:
            on_usage(usage.prompt_tokens, usage.completion_tokens)
        return QueryResponse(
            response=answer.text,
            source_nodes=used,
            metadata=_metadata_by_node(used, len(req.indexes) > 1),
            evidence=self._shown(assessment),
            answerable=True if used else None,
        )

    async def retrieve(self, req: RetrieveRequest) -> tuple[RetrieveResponse, dict[str, float]]:
        """KAITO's ``/retrieve``: the best nodes, without generation; with ``similarity_threshold``
        only those that reach it. Also returns the stage timings."""
        nodes, timings = await self.documents.retrieve(
            req.indexes, req.query, req.max_node_count, req.metadata_filter, req.retrieval_mode
        )
        if req.similarity_threshold is not None:
            nodes = [n for n in nodes if passes_threshold(n, req.similarity_threshold)]
        return RetrieveResponse(query=req.query, results=nodes, count=len(nodes)), timings

    # --- passthrough --------------------------------------------------------------------------
    async def _passthrough(
        self, body: dict[str, Any], reason: PassthroughReason, stream: bool, timings: dict[str, float] | None = None
    ) -> ChatOutcome:
        body = dict(body)
        counter = await self.llm.token_counter()
        window = await self.llm.context_window()
        requested = body.get("max_completion_tokens") or body.get("max_tokens")
        # token counting reads the client's messages (up to the request size): on a worker thread
        prompt_tokens, max_tokens = await asyncio.to_thread(
            fit_passthrough,
            counter=counter,
            window=window,
            messages=body["messages"],
            requested_max_tokens=requested,
            default_max_tokens=self.options.default_max_tokens,
            min_completion_tokens=self.options.min_completion_tokens,
        )
        if requested is not None and requested > max_tokens:  # forwarded as sent, unless it cannot fit
            body["max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"] = max_tokens
        outcome = ChatOutcome(
            mode="passthrough", reason=reason.value, timings=dict(timings or {}), stats={"prompt_tokens": prompt_tokens}
        )
        model = str(body.get("model") or self.llm.model_id)
        if stream:
            outcome.counter = counter
            outcome.stream = self._relay(body, max_tokens, model, outcome)
        else:
            attributes = _llm_attributes(model, max_tokens, stream=False) if tracing.ENABLED else None
            with tracing.stage("generate", outcome.timings, attributes) as span:
                outcome.response = await self.llm.passthrough(body, max_tokens)
                if tracing.ENABLED:
                    _usage_attributes(span, outcome.response.usage, outcome.response.model)
            _stamp(outcome.response, new_completion_id(), int(time.time()))
        return outcome

    async def _relay(
        self, body: dict[str, Any], max_tokens: int, model: str, outcome: ChatOutcome
    ) -> AsyncGenerator[ChatCompletionChunk, None]:
        t0 = time.perf_counter()
        cid, created = new_completion_id(), int(time.time())
        # the stream's span is current only while the next chunk is awaited (tracing.within)
        span = (
            tracing.start("llm.generate", _llm_attributes(model, max_tokens, stream=True)) if tracing.ENABLED else None
        )
        chunks: AsyncIterator[ChatCompletionChunk] = self.llm.passthrough_stream(body, max_tokens)
        if span is not None:
            chunks = tracing.within(span, chunks)
        first = True
        try:
            async for chunk in chunks:
                if first and span is not None:
                    span.set_attribute(TTFT, time.perf_counter() - t0)
                first = False
                outcome.usage = chunk.usage or outcome.usage
                outcome.relayed.extend(c.delta.content for c in chunk.choices if c.index == 0 and c.delta.content)
                _stamp(chunk, cid, created)
                yield chunk
        except BaseException as e:
            if span is not None:
                tracing.failed(span, e)
            raise
        finally:
            outcome.timings["generate"] = time.perf_counter() - t0
            await _close(chunks)
            if span is not None:
                _usage_attributes(span, outcome.usage, None)
                span.end()

    # --- RAG ----------------------------------------------------------------------------------
    def _threshold(self, requested: float | None) -> float:
        return self.options.similarity_threshold if requested is None else requested

    async def _fit(
        self,
        *,
        system: list[dict[str, Any]],
        history: list[dict[str, Any]],
        query: str,
        nodes: list[NodeWithScore],
        requested: int | None,
        threshold: float,
        ratio: float | None,
        max_tokens_param: str,
        max_context_tokens: int | None = None,
    ) -> FitResult:
        """The request fitted into the window, its sources within ``max_context_tokens`` if given;
        ``ContextBudgetError`` when relevant nodes were retrieved but none fits
        (``max_tokens_param`` names the field to lower)."""
        counter = await self.llm.token_counter()
        window = await self.llm.context_window()
        o = self.options
        result = await asyncio.to_thread(  # counts the client's messages: on a worker thread
            fit,
            counter=counter,
            window=window,
            system=system,
            history=history,
            query=query,
            nodes=nodes,
            requested_max_tokens=requested,
            default_max_tokens=o.default_max_tokens,
            min_completion_tokens=o.min_completion_tokens,
            context_ratio=ratio if ratio is not None else o.context_token_ratio,
            similarity_threshold=threshold,
            safety_ratio=o.budget_safety_ratio,
            history_min_messages=o.history_min_messages,
            history_max_messages=o.history_max_messages,
            max_context_tokens=max_context_tokens,
        )
        if result.relevant_sources and not result.nodes_used:
            raise ContextBudgetError(result, param=max_tokens_param, requested_max_tokens=requested)
        return result

    async def _rag(self, p: RagPlan, request: ChatCompletionRequest, cache_control: str | None) -> ChatOutcome:
        # without top_k: the context the model can use (its cost, its window); a request's top_k gets what it asks
        size, k = None, p.params.top_k
        if not k:
            size = await self.context_size(request.requested_max_tokens(), p.params.context_token_ratio)
            k = size.top_k
        cache = self.cache
        policy = cache_policy(request, cache_control, cache.options) if cache is not None else NO_CACHE
        if cache is None or not policy.used:
            outcome = await self._answer(p, request, size, k, {})
            if cache is not None and outcome.mode == "rag":
                outcome.cache = BYPASS
                cache.record(BYPASS)
            return outcome
        # The versions are read BEFORE retrieval: a write that lands while this answer is computed
        # makes the entry kept with them stale at once (docs/architecture.md §4, "Answer cache").
        timings: dict[str, float] = {}
        vector: np.ndarray | None = None
        with tracing.stage("cache", timings):
            key = await self._answer_key(p, size)
            # a keyword search's ranking reads the whole shard's statistics: then a write to any
            # index of the shards counts (docs/architecture.md §4, "Answer cache")
            dense = (p.params.retrieval_mode or self.options.retrieval_mode) == "dense"
            versions = await self.documents.index_versions(sorted(set(p.params.indexes)), shard_wide=not dense)
            found = cache.get(key.key, versions) if policy.read else None
            similar = False
            if found is None and cache.options.answer_cache_similarity is not None:
                vector = await self._question_vector(p.query)
                if vector is not None and policy.read:
                    found = cache.similar(key.rest, vector, versions)
                    similar = found is not None
        if found is not None:
            cache.record(HIT)
            embedded = [p.query] if vector is not None else []
            return self._cached(found, request, timings, embedded, asked=p.query if similar else None)
        cache.record(MISS)
        fallbacks = _FALLBACKS.set([])
        try:
            outcome = await self._answer(p, request, size, k, timings)
            degraded = bool(_FALLBACKS.get())
        finally:
            _FALLBACKS.reset(fallbacks)
        if outcome.mode != "rag":  # a passthrough (no_context) is not kept
            return outcome
        outcome.cache = MISS
        if policy.write and not degraded:  # an answer made without a part that failed is not kept
            self._keep(outcome, key, versions, vector)
        return outcome

    async def _answer(
        self,
        p: RagPlan,
        request: ChatCompletionRequest,
        size: ContextSize | None,
        k: int,
        timings: dict[str, float],
    ) -> ChatOutcome:
        """The RAG answer computed: retrieve, fit, evidence (or not covered), generate; ``timings``
        holds the stages so far."""
        threshold = self._threshold(p.params.similarity_threshold)
        try:
            nodes, spent, rag = await self._retrieve_for_chat(p, k, threshold)  # a missing index: its 404
        except BadRequestError as e:
            raise BadRequestError(e.message, param="metadata_filter") from e
        for stage, seconds in spent.items():
            timings[stage] = timings.get(stage, 0.0) + seconds
        if not relevant(nodes, threshold):
            return self._with_rag(
                await self._passthrough(p.body, PassthroughReason.NO_CONTEXT, request.stream, timings), rag
            )
        with tracing.stage("fit", timings) as fit_span:  # token counting and prompt assembly
            result = await self._fit(
                system=p.system,
                history=p.history,
                query=p.query,
                nodes=nodes,
                requested=request.requested_max_tokens(),
                threshold=threshold,
                ratio=p.params.context_token_ratio,
                max_tokens_param="max_completion_tokens" if request.max_completion_tokens else "max_tokens",
                max_context_tokens=size.cap if size is not None else None,
            )
            if tracing.ENABLED:
                tracing.set_attributes(
                    fit_span,
                    {
                        "ragserve.nodes_used": len(result.nodes_used),
                        "ragserve.context_tokens": result.context_tokens,
                        "ragserve.history_tokens": result.history_tokens,
                        "ragserve.history_dropped": result.history_dropped,
                        "gen_ai.request.max_tokens": result.max_tokens,
                    },
                )
        with tracing.stage("evidence", timings):
            assessment = await self._assess(p.params.indexes, rag.query, result.nodes_used, asked=p.query)
        if not self._answerable(result.nodes_used, assessment):
            return self._not_covered(closest(result.nodes_used), rag, request, timings)
        shown = self._shown(assessment)
        rag = rag.model_copy(update={"answerable": True, **({"evidence": shown} if shown is not None else {})})
        result = await self._with_evidence_hint(result, assessment)
        sampling = request.to_sampling_params(result.max_tokens, grounded=result.grounded)
        footer = self.options.sources_in_content if p.params.sources_in_content is None else p.params.sources_in_content
        outcome = ChatOutcome(
            mode="rag",
            reason=None,
            source_nodes=result.nodes_used,
            timings=timings,
            rag=rag,
            stats={
                "prompt_tokens": result.prompt_tokens,
                "context_tokens": result.context_tokens,
                "history_tokens": result.history_tokens,
                "history_dropped": result.history_dropped,
                "nodes_used": len(result.nodes_used),
            },
        )
        if request.stream:
            include_usage = bool((request.stream_options or {}).get("include_usage"))
            outcome.counter = await self.llm.token_counter()
            outcome.stream = self._rag_stream(
                result.messages, sampling, result.nodes_used, include_usage, outcome, footer
            )
            return outcome
        attributes = _llm_attributes(self.llm.model_id, sampling.max_tokens, stream=False) if tracing.ENABLED else None
        with tracing.stage("generate", outcome.timings, attributes) as span:
            answer = await self.llm.chat(result.messages, sampling)
            if tracing.ENABLED:
                _usage_attributes(span, UsageInfo.of(answer.prompt_tokens, answer.completion_tokens), answer.model)
        citations, invalid = parse_citations(answer.text, result.nodes_used)
        text = answer.text + (sources_footer(result.nodes_used, citations) if footer else "")
        outcome.response = ChatCompletionResponse(
            id=new_completion_id(),
            object="chat.completion",
            created=int(time.time()),
            model=answer.model or self.llm.model_id,
            choices=[
                ChatCompletionChoice(
                    index=0, message=ResponseMessage(role="assistant", content=text), finish_reason=answer.finish_reason
                )
            ],
            usage=answer.usage(),
            source_nodes=result.nodes_used,
            citations=citations,
            invalid_citations=invalid,
            rag=rag,
        )
        return outcome

    # --- the answer cache (ragserve.service.answer_cache, docs/architecture.md §4) ---------------
    async def _answer_key(self, p: RagPlan, size: ContextSize | None) -> AnswerKey:
        """The key of ``p``'s answer: the request's part, and what the server decides now (the model,
        its window, the context of a chat without ``top_k``, which follows the engine's measured
        speed). A large request is keyed on a worker thread."""
        server = {
            **self._fixed_key,
            "model": self.llm.model_id,
            "window": await self.llm.context_window(),
            "context": None if size is None else [size.top_k, size.cap],
        }
        if large_key(p):
            return await asyncio.to_thread(answer_key, p, server)
        return answer_key(p, server)

    async def _question_vector(self, question: str) -> np.ndarray | None:
        """The question's embedding for the near-duplicate lookup (the one retrieval embeds a new
        question with, so a query-vector cache serves retrieval); None when the embedder fails."""
        embedder = self.embedder or self.documents.embedder
        try:
            return await embedder.embed_query(question[:QUERY_EMBED_CHARS])
        except ServiceError as e:
            log.warning("near-duplicate lookup skipped, the embedder failed: %s", e.message)
            return None

    def _cached(
        self,
        found: CachedAnswer,
        request: ChatCompletionRequest,
        timings: dict[str, float],
        embedded: list[str],
        asked: str | None = None,
    ) -> ChatOutcome:
        """A kept answer served: a fresh ``id`` and ``created``, zero ``usage`` (no model call);
        replayed as chunks of the shape a RAG stream has when the request streams. ``asked``: this
        request's question, when the answer was kept for another, near-duplicate one: its ``rag.query``
        (and ``X-RAG-Query``) say this one, never the other caller's words."""
        response = found.response(new_completion_id(), int(time.time()))
        if asked is not None and response.rag is not None:
            response.rag = response.rag.model_copy(update={"query": asked, "query_source": "message"})
        outcome = ChatOutcome(
            mode="rag",
            reason=found.reason,
            source_nodes=response.source_nodes or [],
            timings=timings,
            rag=response.rag,
            usage=response.usage,
            cache=HIT,
            embedded=embedded,
        )
        if request.stream:
            include_usage = bool((request.stream_options or {}).get("include_usage"))
            outcome.stream = _replay(response, include_usage)
        else:
            outcome.response = response
        return outcome

    def _keep(self, outcome: ChatOutcome, key: AnswerKey, versions: Versions, vector: np.ndarray | None) -> None:
        """Keep ``outcome``'s answer under ``versions`` (read before its retrieval): a whole one now,
        a streamed one when its stream has ended normally (not when it failed or its client left)."""
        cache = self.cache
        assert cache is not None
        if outcome.response is not None:
            cache.put(key, versions, outcome.response, outcome.reason, vector)
        elif outcome.stream is not None:
            outcome.stream = _kept(
                outcome.stream, lambda answer: cache.put(key, versions, answer, outcome.reason, vector)
            )

    # --- evidence and answerability (ragserve.rag.evidence, ragserve.rag.answerable) ---------------
    def _answerable(self, nodes: list[NodeWithScore], assessment: Assessment | None) -> bool:
        o = self.options
        rule = AnswerabilityRule(
            enabled=o.answerability,
            score=o.answerable_threshold,
            coverage=o.answerable_coverage,
            evidence=o.answerable_evidence,
        )
        return answerable(nodes, assessment, rule)

    async def _with_evidence_hint(self, result: FitResult, assessment: Assessment | None) -> FitResult:
        """``result`` with its best ``evidence_in_prompt`` evidence passages repeated after the
        sources (``ragserve.rag.prompt.with_evidence``) when the prompt, counted as sent, still fits
        what ``fit`` allows (``FitResult.room_for``: its margin for estimated counts kept); else
        ``result`` as it is."""
        n = self.options.evidence_in_prompt
        if not n or assessment is None or not assessment.evidence or not result.nodes_used:
            return result
        messages = with_evidence(result.messages, assessment.evidence[:n])
        counter = await self.llm.token_counter()
        prompt = await asyncio.to_thread(counter.count_messages, messages, grounded=result.grounded)
        if not result.room_for(prompt):
            return result
        return replace(result, messages=messages, prompt_tokens=prompt)

    def _shown(self, assessment: Assessment | None) -> list[Evidence] | None:
        """The evidence an answer carries; None when none is asked for or it was not computed."""
        if assessment is None or self.options.evidence_passages == 0:
            return None
        return assessment.evidence[: self.options.evidence_passages]

    async def _assess(
        self, indexes: tuple[str, ...], query: str, nodes: list[NodeWithScore], asked: str | None = None
    ) -> Assessment | None:
        """The passages of ``nodes`` (numbered as sent in ``source_nodes``) that best support an
        answer to ``query``, best first, and how much of the question they mention
        (``ragserve.rag.evidence``): the sentences are cut and shortlisted by the query's terms on a
        worker thread, the shortlisted ones embedded in one small batch beside the query (whose
        vector retrieval has just computed: a cache hit where queries are cached; the windows'
        vectors come from ``PassageVectors``, which embeds only those it has not seen), then scored.
        None when neither evidence nor answerability is asked for, or the embedder failed (the
        answer then goes on without them). ``asked``: the newest turn, whose coverage and names the
        rule reads when ``query`` joins earlier turns to it."""
        o = self.options
        embedder, passages = self.embedder, self.passages
        if embedder is None or passages is None or not nodes or (o.evidence_passages == 0 and not o.answerability):
            return None
        short = await asyncio.to_thread(_shortlist, query, nodes, asked)
        texts = [embed_text(short.found[i]) for i in short.to_embed]
        try:
            query_vector, vectors = await asyncio.gather(
                embedder.embed_query(query[:QUERY_EMBED_CHARS]),
                passages.embed(texts) if texts else _no_vectors(),
            )
        except ServiceError as e:
            log.warning("evidence not computed, the embedder failed: %s", e.message)
            _fell_back("evidence")
            return None
        assessment = assess(query_vector, short, vectors, max(o.evidence_passages, 1))  # a few dozen numbers: inline
        if assessment.missing:  # names the sources lack: the question is not covered only if the indexes lack them too
            try:
                held = await self.documents.mentioned(indexes, assessment.missing)
            except ServiceError as e:
                log.warning("could not look the question's names up in the index: %s", e.message)
                _fell_back("mentioned")
                held = set()
            assessment = replace(assessment, missing=[n for n in assessment.missing if n not in held])
        return assessment

    def _not_covered(
        self, sources: list[NodeWithScore], rag: RagInfo, request: ChatCompletionRequest, timings: dict[str, float]
    ) -> ChatOutcome:
        """The answer that the indexed documents do not cover the question, with the closest
        ``sources``; no model call. Mode ``rag``, reason ``not_covered``, ``rag.answerable`` false."""
        rag = rag.model_copy(update={"evidence": [], "answerable": False})
        text = not_covered_answer(sources)
        outcome = ChatOutcome(
            mode="rag",
            reason=NOT_COVERED,
            source_nodes=sources,
            timings=timings,
            rag=rag,
            stats={"prompt_tokens": 0, "context_tokens": 0, "history_tokens": 0, "history_dropped": 0, "nodes_used": 0},
        )
        cid, created, model = new_completion_id(), int(time.time()), self.llm.model_id
        if not request.stream:
            outcome.response = ChatCompletionResponse(
                id=cid,
                object="chat.completion",
                created=created,
                model=model,
                choices=[
                    ChatCompletionChoice(
                        index=0, message=ResponseMessage(role="assistant", content=text), finish_reason="stop"
                    )
                ],
                usage=UsageInfo.of(0, 0),
                source_nodes=sources,
                citations=[],
                invalid_citations=[],
                rag=rag,
            )
            return outcome
        include_usage = bool((request.stream_options or {}).get("include_usage"))

        async def chunks() -> AsyncGenerator[ChatCompletionChunk, None]:
            head = _stream_chunk(cid, created, model, DeltaMessage(role="assistant", content=""))
            head.source_nodes, head.rag = sources, rag
            yield head
            yield _stream_chunk(cid, created, model, DeltaMessage(content=text))
            last = _stream_chunk(cid, created, model, DeltaMessage(), "stop")
            last.citations, last.invalid_citations, last.rag = [], [], rag
            yield last
            if include_usage:
                usage = UsageInfo.of(0, 0)
                yield ChatCompletionChunk(
                    id=cid, object="chat.completion.chunk", created=created, model=model, choices=[], usage=usage
                )

        outcome.stream = chunks()
        return outcome

    @staticmethod
    def _with_rag(outcome: ChatOutcome, rag: RagInfo) -> ChatOutcome:
        outcome.rag = rag  # a no_context fallback still says what it searched with (a header, not the body)
        return outcome

    # --- what chat retrieves with (candidates, follow-ups) ------------------------------------
    async def context_size(self, requested_max_tokens: int | None = None, ratio: float | None = None) -> ContextSize:
        """The context of a chat request without ``top_k`` (``ragserve.rag.context_size``): what its
        sources may take and how many candidates it retrieves, from ``chat_context_tokens``, else the
        model's prefill speed (the embedded CPU engine), else its window. ``requested_max_tokens`` and
        ``ratio``: the request's ``max_tokens`` and ``context_token_ratio``; with neither, what a
        request that sets neither gets (what the playground's settings show)."""
        o = self.options
        return chat_context_size(
            window=await self.llm.context_window(),
            reserve=requested_max_tokens or o.default_max_tokens,
            ratio=ratio if ratio is not None else o.context_token_ratio,
            chunk_size=o.chunk_size,
            max_top_k=o.max_top_k,
            configured_tokens=o.chat_context_tokens,
            prefill_tokens_per_s=await self.llm.prefill_tokens_per_s(),
            prefill_s=o.chat_context_prefill_s,
            timeout_s=o.llm_timeout_s,
        )

    async def _retrieve_for_chat(
        self, p: RagPlan, k: int, threshold: float
    ) -> tuple[list[NodeWithScore], dict[str, float], RagInfo]:
        """Retrieve for the newest user turn, or, when it refers to earlier turns ("How do I set it
        up?"), for it with the salient terms of the earlier user turns (``ragserve.rag.followup``:
        deterministic, no model call); with ``query_rewrite: llm``, for such a turn, a standalone
        rewrite by the generator first. The first of these (rewrite, follow-up, newest turn) that
        finds a relevant source is used: a turn that refers back keeps its follow-up query even
        where the turn alone scores higher, since alone it finds the same kind of answer about
        anything. Returns the nodes, the summed timings and which query found them (the newest
        turn alone when none found a relevant source)."""
        mode = p.params.retrieval_mode or self.options.retrieval_mode
        rewrite = p.params.query_rewrite or self.options.query_rewrite
        previous = previous_user_turns(p.history)
        timings: dict[str, float] = {}
        attempts: list[tuple[str, QuerySource]] = []
        # a turn with a subject of its own needs neither: the embedded 270M model's rewrite of a
        # new topic often repeats the old one (docs/quality.md, "Follow-ups")
        refers = bool(previous) and await asyncio.to_thread(refers_back, p.query)
        if rewrite == "llm" and refers:
            with tracing.stage("rewrite", timings):
                rewritten = await self._rewrite(p)
            if rewritten:
                attempts.append((rewritten, "rewritten"))
        if refers:  # text work on a worker thread: earlier turns may be long
            followup = await asyncio.to_thread(followup_query, p.query, p.history, self.options.followup_terms)
            if followup is not None:
                attempts.append((followup, "followup"))
        attempts.append((p.query, "message"))
        first: tuple[list[NodeWithScore], RagInfo] | None = None
        for query, source in attempts:
            nodes, spent = await self.documents.retrieve(p.params.indexes, query, k, p.params.metadata_filter, mode)
            for stage, seconds in spent.items():
                timings[stage] = timings.get(stage, 0.0) + seconds
            info = RagInfo(query=query, query_source=source, retrieval_mode=mode)
            if relevant(nodes, threshold):
                return nodes, timings, info
            if source == "message":
                first = (nodes, info)
        assert first is not None  # the newest turn itself is always attempted, last
        return first[0], timings, first[1]

    async def _rewrite(self, p: RagPlan) -> str | None:
        """A standalone version of the newest question, by the generator (greedy, short); None when
        the generator fails or answers nothing, so retrieval goes on deterministically."""
        try:
            answer = await self.llm.chat(
                rewrite_messages(p.history, p.query), SamplingParams(max_tokens=REWRITE_MAX_TOKENS, temperature=0.0)
            )
        except ServiceError as e:
            log.warning("query rewrite failed, retrieving without it: %s", e.message)
            _fell_back("rewrite")
            return None
        text = answer.text.strip().strip('"').strip()
        return text.splitlines()[0].strip() if text else None

    async def _rag_stream(
        self,
        messages: list[dict[str, Any]],
        sampling: SamplingParams,
        sources: list[NodeWithScore],
        include_usage: bool,
        outcome: ChatOutcome,
        footer: bool = False,
    ) -> AsyncGenerator[ChatCompletionChunk, None]:
        """OpenAI chunks; the first carries the role, ``source_nodes`` and ``rag``; the final one (with
        the finish reason) the answer's ``citations``, preceded by the "Sources:" text when
        ``footer``. ``model`` names the model that generates the answer (the remote server's own
        name for it, where it says)."""
        cid, created = new_completion_id(), int(time.time())
        model = self.llm.model_id

        def closing(finish: str | None) -> list[ChatCompletionChunk]:
            citations, invalid = parse_citations("".join(text), sources)
            out = []
            if footer and (extra := sources_footer(sources, citations)):
                out.append(_stream_chunk(cid, created, model, DeltaMessage(content=extra)))
            last = _stream_chunk(cid, created, model, DeltaMessage(), finish)
            last.citations, last.invalid_citations = citations, invalid
            if outcome.rag is not None:  # the evidence again, beside the whole answer it supports
                last.rag = outcome.rag
            out.append(last)
            return out

        t0 = time.perf_counter()
        # the stream's span is current only while the next delta is awaited (tracing.within)
        span = (
            tracing.start("llm.generate", _llm_attributes(model, sampling.max_tokens, stream=True))
            if tracing.ENABLED
            else None
        )
        deltas = aiter(self.llm.chat_stream(messages, sampling))
        if span is not None:
            deltas = tracing.within(span, deltas)
        text: list[str] = []
        usage = None
        try:
            # Wait for the model's first output before the first chunk: an upstream that fails at once
            # becomes an HTTP error status (as in passthrough), not a 200 with an error event.
            first = await anext(deltas, None)
            if span is not None:
                span.set_attribute(TTFT, time.perf_counter() - t0)
            model = (first.model if first is not None else None) or model
            head = _stream_chunk(cid, created, model, DeltaMessage(role="assistant", content=""))
            head.source_nodes = sources
            if outcome.rag is not None:
                head.rag = outcome.rag
            yield head
            closed = False
            async for d in _prepend(first, deltas):
                usage = d.usage() or usage
                outcome.usage = usage
                if d.text:
                    text.append(d.text)
                    outcome.relayed.append(d.text)
                    yield _stream_chunk(cid, created, model, DeltaMessage(content=d.text))
                if d.finish_reason and not closed:
                    closed = True
                    for c in closing(d.finish_reason):
                        yield c
            if not closed:
                for c in closing(None):
                    yield c
            if include_usage and usage is not None:
                yield ChatCompletionChunk(
                    id=cid, object="chat.completion.chunk", created=created, model=model, choices=[], usage=usage
                )
        except BaseException as e:
            if span is not None:
                tracing.failed(span, e)
            raise
        finally:
            outcome.timings["generate"] = time.perf_counter() - t0
            await _close(deltas)
            if span is not None:
                _usage_attributes(span, usage, model)
                span.end()


#: Seconds from the generation's start to its first output, on a stream's ``llm.generate`` span.
TTFT = "gen_ai.server.time_to_first_token"


def _plan_attributes(request: ChatCompletionRequest, decided: object) -> dict[str, Any]:
    """What ``rag.plan`` decided, for its span: the indexes named (bounded), the mode and the reason
    of a passthrough; the query itself only with content capture on."""
    attributes: dict[str, Any] = {"ragserve.index_count": len(request.indexes)}
    if request.indexes:
        attributes["ragserve.index"] = tracing.names(request.indexes)
    if isinstance(decided, Passthrough):
        attributes["ragserve.rag_mode"] = "passthrough"
        attributes["ragserve.passthrough_reason"] = decided.reason.value
    elif isinstance(decided, RagPlan):
        attributes["ragserve.rag_mode"] = "rag"
        attributes["ragserve.query"] = tracing.content(decided.query)
    return attributes


def _llm_attributes(model: str, max_tokens: int | None, stream: bool) -> dict[str, Any]:
    """The GenAI semantic conventions' request attributes of a chat generation."""
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": tracing.bounded(model),
        "gen_ai.request.max_tokens": max_tokens,
        "ragserve.stream": stream,
    }


def _usage_attributes(span: Any, usage: UsageInfo | None, model: str | None) -> None:
    """The GenAI usage attributes (and the model that answered) once a generation is done."""
    attributes: dict[str, Any] = {"gen_ai.response.model": tracing.bounded(model) if model else None}
    if usage is not None:
        attributes["gen_ai.usage.input_tokens"] = usage.prompt_tokens
        attributes["gen_ai.usage.output_tokens"] = usage.completion_tokens
    tracing.set_attributes(span, attributes)


def _stream_chunk(
    cid: str, created: int, model: str, delta: DeltaMessage, finish: str | None = None
) -> ChatCompletionChunk:
    """One chunk of a streamed answer (``chat.completion.chunk``) with one choice."""
    return ChatCompletionChunk(
        id=cid,
        object="chat.completion.chunk",
        created=created,
        model=model,
        choices=[ChatCompletionChunkChoice(index=0, delta=delta, finish_reason=finish)],
    )


def _metadata_by_node(nodes: list[NodeWithScore], several: bool) -> dict[str, Any]:
    """``/query``'s ``metadata``: each node's metadata by its node id (KAITO's shape); by
    ``index/node_id`` when several indexes were searched, where one node id may be in two."""
    return {f"{n.index_name}/{n.node_id}" if several else n.node_id: n.metadata for n in nodes}


def _shortlist(query: str, nodes: list[NodeWithScore], asked: str | None = None) -> Shortlist:
    return shortlist(query, candidates(nodes), asked=asked)


async def _no_vectors() -> np.ndarray:
    return np.zeros((0, 0), dtype=np.float32)


async def _kept(
    stream: AsyncGenerator[ChatCompletionChunk, None], keep: Callable[[ChatCompletionResponse], object]
) -> AsyncGenerator[ChatCompletionChunk, None]:
    """``stream`` as it is, and its whole answer handed to ``keep`` once it has ended normally: not
    when it raised or was closed early (a client that left)."""
    recorder = StreamRecorder()
    try:
        async for chunk in stream:
            recorder.add(chunk)
            yield chunk
    finally:
        await stream.aclose()
    answer = recorder.answer()
    if answer is not None:
        keep(answer)


async def _replay(response: ChatCompletionResponse, include_usage: bool) -> AsyncGenerator[ChatCompletionChunk, None]:
    """A cached answer as a RAG stream: the first chunk with the role, ``source_nodes`` and ``rag``,
    the text in pieces, the closing chunk with the finish reason, ``citations`` and ``rag``, then
    the usage chunk when asked for."""
    cid, created, model = response.id, response.created, response.model
    choice = response.choices[0]
    head = _stream_chunk(cid, created, model, DeltaMessage(role="assistant", content=""))
    head.source_nodes = response.source_nodes or []
    if response.rag is not None:
        head.rag = response.rag
    yield head
    for piece in replay_pieces(choice.message.content or ""):
        yield _stream_chunk(cid, created, model, DeltaMessage(content=piece))
    last = _stream_chunk(cid, created, model, DeltaMessage(), choice.finish_reason)
    last.citations = response.citations or []
    last.invalid_citations = response.invalid_citations or []
    if response.rag is not None:
        last.rag = response.rag
    yield last
    if include_usage:
        yield ChatCompletionChunk(
            id=cid, object="chat.completion.chunk", created=created, model=model, choices=[], usage=response.usage
        )


async def _close(iterator: AsyncIterator[Any]) -> None:
    """Close an async generator early (a client that left): the engine stops generating."""
    close = getattr(iterator, "aclose", None)
    if close is not None:
        await close()


async def _prepend(
    first: GenerationDelta | None, rest: AsyncIterator[GenerationDelta]
) -> AsyncIterator[GenerationDelta]:
    if first is not None:
        yield first
    async for item in rest:
        yield item
