"""The MCP tools, defined once over a ``KnowledgeBase`` (docs/architecture.md §8d).

``build_mcp_server(knowledge)`` returns an :class:`mcp.server.MCPServer` (the official SDK) with
three tools:

* ``list_indexes``: the indexes the caller's key may read;
* ``search``: one ranking over one index, several, or every index the key reads (query, top k,
  metadata filter, retrieval mode); each result names its index, document, source and title, score
  and text, so an agent can cite it;
* ``fetch_document``: a document's text and metadata by index and id.

``knowledge`` gives the ``KnowledgeBase`` of the caller of one tool call, from the HTTP request
that carried it (None over stdio): the services behind that request's API key in the server
(``/mcp``), or one server's HTTP API with one key (``ragserve mcp``). A key's scope thus limits
what the tools list and return exactly as it limits the HTTP routes. Every failure reaches the
agent as an MCP tool error (``isError``) whose text says what to fix: a ``ServiceError``'s own
message, or the fields that did not validate.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, TypeVar

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field, ValidationError

from ragserve.api.agent import FetchedDocument, IndexList, SearchResult, SearchResults
from ragserve.api.documents import MAX_QUERY_INDEXES, RetrievalMode, RetrieveRequest, validate_index_name
from ragserve.errors import ServiceError
from ragserve.ports import KnowledgeBase

T = TypeVar("T")

#: The characters of a document ``fetch_document`` returns unless asked for more or fewer.
DEFAULT_FETCH_CHARS = 20_000
#: The most it returns at once: a longer text is cut, and ``is_truncated`` says so.
MAX_FETCH_CHARS = 1_000_000

INSTRUCTIONS = (
    "ragserve answers from indexed documents. Call list_indexes to see the indexes you may read, "
    "search to find passages (name one or several index_names, or none to search every index), and "
    "fetch_document to read a whole document. Cite results by their source or title and doc_id."
)


@contextmanager
def _logging_untouched() -> Iterator[None]:
    """Keep the root logger as it was: the process's logging is its owner's (Ray's, uvicorn's, the
    CLI's) to configure, and a handler added here would format every later record of the process."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def request_of(ctx: Context[Any, Any]) -> Any:
    """The HTTP request that carried this tool call (a Starlette ``Request``), None over stdio."""
    try:
        return ctx.request_context.request
    except ValueError:  # no request context: a direct call, as in a test of the tool function
        return None


def _fields(error: ValidationError) -> str:
    """A validation error as the agent can act on it: each field and what is wrong with it."""
    return "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}" for err in error.errors())


async def _answer(call: Awaitable[T]) -> T:
    """The outcome of a call to the knowledge base; a refusal as a tool error with its message."""
    try:
        return await call
    except ServiceError as e:
        raise ToolError(f"{e.message} (HTTP {e.status}{f', {e.code}' if e.code else ''})") from None


def build_mcp_server(knowledge: Callable[[Any], KnowledgeBase], *, version: str = "") -> MCPServer:
    """The MCP server of ragserve's tools over ``knowledge`` (see the module's docstring)."""
    with _logging_untouched():  # the SDK's constructor calls logging.basicConfig with a handler of its own
        server: MCPServer = MCPServer("ragserve", instructions=INSTRUCTIONS, version=version)

    @server.tool(
        name="list_indexes",
        description="The indexes (knowledge bases) your key may read: their names, for search's index_names.",
    )
    async def list_indexes(ctx: Context[Any, Any]) -> IndexList:
        names = await _answer(knowledge(request_of(ctx)).list_indexes())
        return IndexList(indexes=names, count=len(names))

    @server.tool(
        name="search",
        description="Search indexed documents for passages relevant to a query: one ranking across the "
        "indexes named (or every index you may read when index_names is omitted). Each result names its "
        "index, doc_id, source, title, score and text; cite them, and fetch_document for the whole text.",
    )
    async def search(
        ctx: Context[Any, Any],
        query: Annotated[str, Field(min_length=1, description="What to look for: a question or keywords.")],
        index_names: Annotated[
            list[str] | None,
            Field(
                default=None,
                min_length=1,
                max_length=MAX_QUERY_INDEXES,
                description="The indexes to search (list_indexes names them); omitted: every index you may read.",
            ),
        ] = None,
        top_k: Annotated[int, Field(ge=1, le=100, description="How many passages to return.")] = 5,
        metadata_filter: Annotated[
            dict[str, Any] | None,
            Field(description='Only documents whose metadata has these values, e.g. {"lang": "en"}.'),
        ] = None,
        mode: Annotated[
            RetrievalMode | None,
            Field(description="hybrid (default: meaning and keywords), dense (meaning) or lexical (keywords)."),
        ] = None,
    ) -> SearchResults:
        kb = knowledge(request_of(ctx))
        names = index_names or await _answer(kb.list_indexes())
        if not names:
            raise ToolError("there is no index to search: your key reads none, or none exists yet (index documents)")
        if len(names) > MAX_QUERY_INDEXES:
            raise ToolError(
                f"your key reads {len(names)} indexes and one search covers at most {MAX_QUERY_INDEXES}: "
                "name the ones to search in index_names (list_indexes names them)"
            )
        try:
            request = RetrieveRequest(
                index_name=names,
                query=query,
                max_node_count=top_k,
                metadata_filter=metadata_filter,
                retrieval_mode=mode,
            )
        except ValidationError as e:
            raise ToolError(_fields(e).replace("index_name", "index_names")) from None
        found = await _answer(kb.retrieve(request))
        results = [SearchResult.of(node, names[0]) for node in found.results]
        return SearchResults(query=query, indexes=list(request.indexes), results=results, count=len(results))

    @server.tool(
        name="fetch_document",
        description="A document's text and metadata by index_name and doc_id (as search returns them).",
    )
    async def fetch_document(
        ctx: Context[Any, Any],
        index_name: Annotated[str, Field(min_length=1, description="The index the document is in.")],
        doc_id: Annotated[str, Field(min_length=1, max_length=256, description="The document's id.")],
        max_chars: Annotated[
            int, Field(ge=1, le=MAX_FETCH_CHARS, description="Return at most this many characters of its text.")
        ] = DEFAULT_FETCH_CHARS,
    ) -> FetchedDocument:
        try:
            validate_index_name(index_name)  # the rule every route applies, said before any call
        except ValueError as e:
            raise ToolError(f"index_name: {e}") from None
        record = await _answer(knowledge(request_of(ctx)).get_document(index_name, doc_id, max_chars))
        return FetchedDocument.of(record, index_name)

    return server
