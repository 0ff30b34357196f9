"""The knowledge one caller may read, behind its key: the ``KnowledgeBase`` of the MCP tools in the
server (``ragserve.agent``), and the body of the HTTP routes that do the same (``GET /indexes``,
``POST /retrieve``, ``GET /indexes/{name}/documents/{doc_id}``), so a key's scope and the request
limits are checked in one place whichever way the caller came."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ragserve.api.documents import DocumentRecord, RetrieveRequest, RetrieveResponse
from ragserve.service.access import Principal, Role
from ragserve.service.chat import ChatService
from ragserve.service.limits import RequestLimits
from ragserve.telemetry import Telemetry


class ScopedKnowledge:
    """What ``principal`` may read of the indexes (``ragserve.ports.KnowledgeBase``)."""

    def __init__(
        self,
        chat: ChatService,
        limits: RequestLimits,
        principal: Principal,
        telemetry: Telemetry,
        on_search: Callable[[str, Sequence[str]], None] | None = None,
    ):
        self.chat = chat
        self.documents = chat.documents
        self.limits = limits
        self.principal = principal
        self.telemetry = telemetry
        self.on_search = on_search  # told each search's query and indexes (usage metering)

    async def list_indexes(self) -> list[str]:
        """The index names this key may read, sorted."""
        self.principal.require(Role.READ)
        return [name for name in await self.documents.list_indexes() if self.principal.sees(name)]

    async def retrieve(self, request: RetrieveRequest) -> RetrieveResponse:
        response, _ = await self.retrieve_timed(request)
        return response

    async def retrieve_timed(self, request: RetrieveRequest) -> tuple[RetrieveResponse, dict[str, float]]:
        """``/retrieve``: the best nodes of one index or several (a 403 naming an index the key
        does not reach, a 404 naming one that does not exist), with the stage timings (reported to
        the retrieval latency metrics, whichever way the caller came)."""
        self.principal.require(Role.READ, request.indexes)
        self.limits.top_k(request.max_node_count, "max_node_count")
        response, timings = await self.chat.retrieve(request)
        for stage, seconds in timings.items():
            self.telemetry.latency(stage, seconds)
        if self.on_search is not None:
            self.on_search(request.query, request.indexes)
        return response, timings

    async def get_document(self, index: str, doc_id: str, max_text_length: int | None = None) -> DocumentRecord:
        self.principal.require(Role.READ, index)
        return await self.documents.get_document(index, doc_id, max_text_length)
