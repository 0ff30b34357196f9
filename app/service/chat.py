"""The chat-completion pipeline: plan → (passthrough | retrieve → fit → generate) → OpenAI response.

It talks to a ``Generator`` (the generator deployment, or an engine in-process) and to the
``DocumentService``. The ingress only turns HTTP into a call of ``ChatService.complete`` and
the outcome back into HTTP (headers, SSE).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.api.documents import NodeWithScore, QueryRequest, QueryResponse
from app.api.openai import ChatCompletionRequest, SamplingParams, new_completion_id
from app.budget import PromptTooLongError, fit, fit_passthrough
from app.budget.tokenizers import Message, TokenCounter
from app.chat import ChatError, Passthrough, PassthroughReason, RagPlan, plan
from app.config import Settings
from app.engines.base import GenerationDelta, GenerationResult
from app.retrieval import relevant
from app.service.documents import DocumentService
from app.service.errors import BadRequestError, ServiceError


class ChatRequestError(ServiceError):
    """A chat request the client must fix, with the OpenAI error fields."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message, param=param, code=code)
        self.status = status


class Generator(Protocol):
    """What the pipeline needs from the LLM side."""

    model_id: str

    async def context_window(self) -> int: ...

    async def token_counter(self) -> TokenCounter: ...

    async def chat(self, messages: Sequence[Message], params: SamplingParams) -> GenerationResult: ...

    def chat_stream(self, messages: Sequence[Message], params: SamplingParams) -> AsyncIterator[GenerationDelta]: ...

    async def passthrough(self, body: dict[str, Any]) -> dict[str, Any]: ...

    def passthrough_stream(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]: ...


@dataclass
class ChatOutcome:
    """What happened and what to send: a whole body, or a stream of chunk bodies."""

    mode: str  # "rag" | "passthrough"
    reason: str | None
    response: dict[str, Any] | None = None
    stream: AsyncIterator[dict[str, Any]] | None = None
    source_nodes: list[NodeWithScore] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class ChatService:
    def __init__(self, settings: Settings, documents: DocumentService, generator: Generator):
        self.settings = settings
        self.documents = documents
        self.generator = generator

    # --- entry points -------------------------------------------------------------------------
    async def complete(self, request: ChatCompletionRequest) -> ChatOutcome:
        exists = await self.documents.index_exists(request.index_name) if request.index_name else False
        decided = plan(request, lambda _name: exists)
        if isinstance(decided, ChatError):
            raise ChatRequestError(decided.status, decided.message, param=decided.param, code=decided.code)
        if isinstance(decided, Passthrough):
            return await self._passthrough(decided.body, decided.reason, request.stream)
        return await self._rag(decided, request)

    async def query(self, req: QueryRequest) -> QueryResponse:
        """KAITO's ``/query``: retrieve, answer with the relevant nodes, return both."""
        threshold = self._threshold(req.similarity_threshold)
        nodes, _ = await self.documents.retrieve(req.index_name, req.query, req.top_k, req.metadata_filter)
        params = dict(req.llm_params)
        requested = params.pop("max_tokens", None)
        result = await self._fit(system=[], history=[], query=req.query, nodes=nodes, requested=requested,
                                 threshold=threshold, ratio=None)
        sampling = SamplingParams(max_tokens=result.max_tokens, **{
            k: v for k, v in params.items() if k in {"temperature", "top_p", "stop", "seed"}})
        answer = await self.generator.chat(result.messages, sampling)
        used = result.nodes_used
        return QueryResponse(response=answer.text, source_nodes=used,
                             metadata={n.node_id: n.metadata for n in used})

    # --- passthrough --------------------------------------------------------------------------
    async def _passthrough(self, body: dict[str, Any], reason: PassthroughReason, stream: bool,
                           timings: dict[str, float] | None = None) -> ChatOutcome:
        body = dict(body)
        counter = await self.generator.token_counter()
        window = await self.generator.context_window()
        requested = body.get("max_completion_tokens") or body.get("max_tokens")
        try:
            prompt_tokens, max_tokens = fit_passthrough(
                counter=counter, window=window, messages=body["messages"], requested_max_tokens=requested,
                default_max_tokens=self.settings.default_max_tokens,
                min_completion_tokens=self.settings.min_completion_tokens)
        except PromptTooLongError as e:
            raise ChatRequestError(400, str(e), param="messages", code="context_length_exceeded") from e
        body["max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"] = max_tokens
        outcome = ChatOutcome(mode="passthrough", reason=reason.value, timings=dict(timings or {}),
                              stats={"prompt_tokens": prompt_tokens})
        if stream:
            outcome.stream = self._timed(self.generator.passthrough_stream(body), outcome)
        else:
            t0 = time.perf_counter()
            outcome.response = await self.generator.passthrough(body)
            outcome.timings["generate"] = time.perf_counter() - t0
            outcome.response.setdefault("id", new_completion_id())
            outcome.response.setdefault("object", "chat.completion")
            outcome.response.setdefault("created", int(time.time()))
        return outcome

    async def _timed(self, chunks: AsyncIterator[dict[str, Any]],
                     outcome: ChatOutcome) -> AsyncIterator[dict[str, Any]]:
        t0 = time.perf_counter()
        cid, created = new_completion_id(), int(time.time())
        try:
            async for chunk in chunks:
                chunk.setdefault("id", cid)
                chunk.setdefault("object", "chat.completion.chunk")
                chunk.setdefault("created", created)
                yield chunk
        finally:
            outcome.timings["generate"] = time.perf_counter() - t0

    # --- RAG ----------------------------------------------------------------------------------
    def _threshold(self, requested: float | None) -> float:
        return self.settings.similarity_threshold if requested is None else requested

    async def _fit(self, *, system: list[dict[str, Any]], history: list[dict[str, Any]], query: str,
                   nodes: list[NodeWithScore], requested: int | None, threshold: float, ratio: float | None):
        counter = await self.generator.token_counter()
        window = await self.generator.context_window()
        s = self.settings
        try:
            return fit(counter=counter, window=window, system=system, history=history, query=query, nodes=nodes,
                       requested_max_tokens=requested, default_max_tokens=s.default_max_tokens,
                       min_completion_tokens=s.min_completion_tokens,
                       context_ratio=ratio if ratio is not None else s.context_token_ratio,
                       similarity_threshold=threshold, safety_ratio=s.budget_safety_ratio,
                       history_min_messages=s.history_min_messages, history_max_messages=s.history_max_messages)
        except PromptTooLongError as e:
            raise ChatRequestError(400, str(e), param="messages", code="context_length_exceeded") from e

    async def _rag(self, p: RagPlan, request: ChatCompletionRequest) -> ChatOutcome:
        k = p.params.top_k or self.settings.top_k
        try:
            nodes, timings = await self.documents.retrieve(p.params.index_name, p.query, k, p.params.metadata_filter)
        except BadRequestError as e:
            raise ChatRequestError(400, e.message, param="metadata_filter") from e
        threshold = self._threshold(p.params.similarity_threshold)
        if not relevant(nodes, threshold):
            return await self._passthrough(p.body, PassthroughReason.NO_CONTEXT, request.stream, timings)
        result = await self._fit(system=p.system, history=p.history, query=p.query, nodes=nodes,
                                 requested=request.requested_max_tokens(), threshold=threshold,
                                 ratio=p.params.context_token_ratio)
        if not result.nodes_used:  # relevant nodes existed but none fitted the budget
            return await self._passthrough(p.body, PassthroughReason.NO_CONTEXT, request.stream, timings)
        sampling = SamplingParams(max_tokens=result.max_tokens, temperature=request.temperature,
                                  top_p=request.top_p, stop=request.stop_list(), seed=request.seed)
        outcome = ChatOutcome(
            mode="rag", reason=None, source_nodes=result.nodes_used, timings=timings,
            stats={"prompt_tokens": result.prompt_tokens, "context_tokens": result.context_tokens,
                   "history_tokens": result.history_tokens, "history_dropped": result.history_dropped,
                   "nodes_used": len(result.nodes_used)})
        model = request.model or self.generator.model_id
        sources = [n.model_dump() for n in result.nodes_used]
        if request.stream:
            include_usage = bool((request.stream_options or {}).get("include_usage"))
            outcome.stream = self._rag_stream(result.messages, sampling, model, sources, include_usage, outcome)
            return outcome
        t0 = time.perf_counter()
        answer = await self.generator.chat(result.messages, sampling)
        outcome.timings["generate"] = time.perf_counter() - t0
        outcome.response = {
            "id": new_completion_id(), "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": answer.text},
                         "finish_reason": answer.finish_reason}],
            "usage": _usage(answer.prompt_tokens, answer.completion_tokens),
            "source_nodes": sources,
        }
        return outcome

    async def _rag_stream(self, messages: list[dict[str, Any]], sampling: SamplingParams, model: str,
                          sources: list[dict[str, Any]], include_usage: bool,
                          outcome: ChatOutcome) -> AsyncIterator[dict[str, Any]]:
        """OpenAI chunks; the first carries the role and ``source_nodes``."""
        cid, created = new_completion_id(), int(time.time())

        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
            return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}

        t0 = time.perf_counter()
        deltas = aiter(self.generator.chat_stream(messages, sampling))
        try:
            # Wait for the model's first output before the first chunk: an upstream that fails at once
            # becomes an HTTP error status (as in passthrough), not a 200 with an error event.
            first = await anext(deltas, None)
            yield chunk({"role": "assistant", "content": ""}, source_nodes=sources)
            usage: dict[str, int] | None = None
            async for d in _prepend(first, deltas):
                if d.prompt_tokens is not None:
                    usage = _usage(d.prompt_tokens, d.completion_tokens or 0)
                if d.text or d.finish_reason:
                    yield chunk({"content": d.text} if d.text else {}, d.finish_reason)
            if include_usage and usage is not None:
                yield {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                       "choices": [], "usage": usage}
        finally:
            outcome.timings["generate"] = time.perf_counter() - t0
            close = getattr(deltas, "aclose", None)
            if close is not None:
                await close()


async def _prepend(first: GenerationDelta | None,
                   rest: AsyncIterator[GenerationDelta]) -> AsyncIterator[GenerationDelta]:
    if first is not None:
        yield first
    async for item in rest:
        yield item
