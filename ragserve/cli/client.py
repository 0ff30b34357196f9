"""A small synchronous client of the ragserve HTTP API (httpx), used by the ``ragserve`` CLI.

Errors come back as :class:`ApiError` carrying the server's own message (``detail`` on the
document API, ``error.message`` on ``/v1/*``), so the CLI can print what the server said.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

from ragserve.serve_port import DEFAULT_PORT, port_from_env

DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"


def default_url(environ: Mapping[str, str] | None = None) -> str:
    """Where the CLI calls when ``--url`` is not given: ``RAGSERVE_URL``, else the local server on
    ``RAGSERVE_PORT`` (the variable ``make run PORT=...`` serves on), else :data:`DEFAULT_URL`."""
    env = os.environ if environ is None else environ
    if env.get("RAGSERVE_URL"):
        return env["RAGSERVE_URL"]
    port = port_from_env(env)
    return DEFAULT_URL if port is None else f"http://127.0.0.1:{port}"


class ApiError(Exception):
    """A failed call: ``status`` is the HTTP status, 0 when the server could not be reached."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status
        self.message = message

    @property
    def retryable(self) -> bool:
        return self.status == 0 or self.status in (429, 502, 503, 504)


def _message(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:500] or resp.reason_phrase
    if isinstance(body, dict):
        if isinstance(body.get("error"), dict):
            return str(body["error"].get("message"))
        if "detail" in body:
            detail = body["detail"]
            return detail if isinstance(detail, str) else json.dumps(detail)
    return json.dumps(body)[:500]


@dataclass
class ChatStream:
    """A streaming chat completion: the RAG mode and reason from the headers, then the events."""

    mode: str
    reason: str
    events: Iterator[dict[str, Any]]
    sources: list[dict[str, Any]] = field(default_factory=list)


class RagClient:
    def __init__(
        self,
        url: str = DEFAULT_URL,
        api_key: str | None = None,
        timeout: float = 600.0,
        transport: httpx.BaseTransport | None = None,
    ):
        if api_key and not (api_key.isascii() and api_key.isprintable() and " " not in api_key):
            raise ValueError("the API key must be printable ASCII without spaces (check --api-key / RAGSERVE_API_KEY)")
        try:
            parsed = httpx.URL(url)
        except httpx.InvalidURL as e:
            raise ValueError(f"the server URL {url!r} is not valid: {e} (check --url / RAGSERVE_URL)") from None
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError(f"the server URL must be http://HOST[:PORT] or https://…, got {url!r} (check --url)")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = url.rstrip("/")
        self.http = httpx.Client(
            base_url=self.url, headers=headers, timeout=httpx.Timeout(timeout, connect=10.0), transport=transport
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> RagClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, *, retries: int = 0, **kwargs: Any) -> Any:
        """The decoded JSON body of a 2xx answer; :class:`ApiError` otherwise. Retries ``retries``
        times on connection failures and 429/502/503/504 (only for calls that are safe to repeat)."""
        attempt = 0
        while True:
            try:
                resp = self.http.request(method, path, **kwargs)
            except httpx.HTTPError as e:
                err = ApiError(0, f"cannot reach ragserve at {self.url}: {e}")
            else:
                if resp.is_success:
                    return self._json(resp) if resp.content else None
                err = ApiError(resp.status_code, _message(resp))
            if not err.retryable or attempt >= retries:
                raise err
            attempt += 1
            time.sleep(min(8.0, 0.5 * 2**attempt))

    def _lines(self, resp: httpx.Response) -> Iterator[str]:
        """The stream's lines; a connection lost while the caller reads them is an ApiError too."""
        try:
            yield from resp.iter_lines()
        except httpx.HTTPError as e:
            raise ApiError(0, f"stream from {self.url} failed: {e}") from e

    def _json(self, resp: httpx.Response) -> Any:
        try:
            return resp.json()
        except ValueError:
            raise ApiError(
                resp.status_code, f"the server at {self.url} did not answer with JSON: is it a ragserve server?"
            ) from None

    # --- indexes and documents -----------------------------------------------------------------
    def indexes(self) -> list[str]:
        return self.request("GET", "/indexes", retries=2)

    def stats(self, index: str) -> dict[str, Any]:
        return self.request("GET", f"/indexes/{quote(index, safe='')}/stats", retries=2)

    def config(self) -> dict[str, Any] | None:
        """The server's settings in force (``GET /ui/config``), None from a server without the route."""
        try:
            return self.request("GET", "/ui/config", retries=2)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def documents_page(
        self,
        index: str,
        *,
        limit: int = 100,
        offset: int = 0,
        max_text_length: int | None = 1000,
        metadata_filter: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if max_text_length is not None:
            params["max_text_length"] = max_text_length
        if metadata_filter:
            params["metadata_filter"] = json.dumps(metadata_filter)
        return self.request("GET", f"/indexes/{quote(index, safe='')}/documents", params=params, retries=2)

    def iter_documents(
        self,
        index: str,
        *,
        page_size: int = 100,
        max_text_length: int | None = 1,
        metadata_filter: dict[str, Any] | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Every document of ``index``, page by page (text cut to ``max_text_length``). A missing
        index yields nothing."""
        offset = 0
        while True:
            try:
                page = self.documents_page(
                    index,
                    limit=page_size,
                    offset=offset,
                    max_text_length=max_text_length,
                    metadata_filter=metadata_filter,
                )
            except ApiError as e:
                if e.status == 404 and offset == 0:
                    return
                raise
            docs = page["documents"]
            yield from docs
            offset += len(docs)
            if not docs or offset >= page["total_items"]:
                return

    def add_documents(
        self, index: str, documents: list[dict[str, Any]], if_exists: str | None = None
    ) -> list[dict[str, Any]]:
        """``POST /index``; ``if_exists="keep"`` leaves a document the index holds under a given id
        as it is (its record comes back instead; a server before the option answers 422 naming it).
        Idempotent (documents carry their ids), so safe to retry."""
        body: dict[str, Any] = {"index_name": index, "documents": documents}
        if if_exists is not None:
            body["if_exists"] = if_exists
        return self.request("POST", "/index", json=body, retries=3)

    def update_documents(self, index: str, documents: list[dict[str, Any]]) -> dict[str, Any]:
        return self.request(
            "POST", f"/indexes/{quote(index, safe='')}/documents", json={"documents": documents}, retries=3
        )

    def delete_documents(
        self, index: str, doc_ids: list[str], if_hash_values: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """Delete by id; ``if_hash_values`` (doc id -> the hash read) leaves a document another
        client changed since (``conflicting_doc_ids``; a server before the option answers 422 naming it)."""
        body: dict[str, Any] = {"doc_ids": doc_ids}
        if if_hash_values:
            body["if_hash_values"] = if_hash_values
        return self.request("POST", f"/indexes/{quote(index, safe='')}/documents/delete", json=body, retries=3)

    # --- ingestion jobs (POST /jobs) -------------------------------------------------------------
    def submit_job(
        self, index: str, documents: list[dict[str, Any]], webhook: bool = False, if_exists: str | None = None
    ) -> dict[str, Any]:
        """Start an ingestion job (``POST /jobs``, 202): the documents ``POST /index`` would take,
        indexed in the background; the answer is the job (``id``, ``status``, ``documents`` counts).
        Retried like ``add_documents``: documents carry their ids, so a job submitted twice stores
        nothing twice. ``webhook`` is off by default: the CLI polls, it needs no announcement.
        ``if_exists`` as for ``add_documents`` (a kept document is a ``document_exists`` error)."""
        body: dict[str, Any] = {"index_name": index, "documents": documents, "webhook": webhook}
        if if_exists is not None:
            body["if_exists"] = if_exists
        return self.request("POST", "/jobs", json=body, retries=2)

    def job(self, job_id: str) -> dict[str, Any]:
        """A job's status, document counts and first per-document errors (``GET /jobs/{id}``)."""
        return self.request("GET", f"/jobs/{quote(job_id, safe='')}", retries=2)

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        """Cancel a job (``POST /jobs/{id}/cancel``): what has not started is not indexed, a batch
        being indexed finishes. Cancelling a job that has ended returns it as it is, so a retry is safe."""
        return self.request("POST", f"/jobs/{quote(job_id, safe='')}/cancel", retries=2)

    def drop_index(self, index: str) -> dict[str, Any]:
        return self.request("DELETE", f"/indexes/{quote(index, safe='')}")

    # --- questions -----------------------------------------------------------------------------
    def retrieve(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /retrieve`` (``body``: a ``RetrieveRequest`` as JSON)."""
        return self.request("POST", "/retrieve", json=body, retries=2)

    def document(self, index: str, doc_id: str, max_text_length: int | None = None) -> dict[str, Any]:
        """One document by id (``GET /indexes/{index}/documents/{doc_id}``)."""
        params = {} if max_text_length is None else {"max_text_length": max_text_length}
        # an id of dots alone would be read as a relative path segment and resolved away
        segment = quote(doc_id, safe="") if doc_id.strip(".") else doc_id.replace(".", "%2E")
        path = f"/indexes/{quote(index, safe='')}/documents/{segment}"
        return self.request("GET", path, params=params, retries=2)

    def query(
        self,
        index: str | list[str],
        query: str,
        *,
        top_k: int = 5,
        metadata_filter: dict[str, Any] | None = None,
        llm_params: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"index_name": index, "query": query, "top_k": top_k}
        if metadata_filter:
            body["metadata_filter"] = metadata_filter
        if llm_params:
            body["llm_params"] = llm_params
        return self.request("POST", "/query", json=body)

    def chat(self, body: dict[str, Any]) -> tuple[dict[str, Any], str, str]:
        """A non-streaming chat completion and its ``X-RAG-Mode``/``X-RAG-Reason``."""
        try:
            resp = self.http.post("/v1/chat/completions", json={**body, "stream": False})
        except httpx.HTTPError as e:
            raise ApiError(0, f"cannot reach ragserve at {self.url}: {e}") from e
        if not resp.is_success:
            raise ApiError(resp.status_code, _message(resp))
        return self._json(resp), resp.headers.get("x-rag-mode", ""), resp.headers.get("x-rag-reason", "")

    def chat_stream(self, body: dict[str, Any]) -> Iterator[ChatStream]:
        """Yields one :class:`ChatStream` whose ``events`` are the decoded SSE events (``[DONE]`` ends
        them; an in-band ``error`` event raises ApiError). Use as ``for s in client.chat_stream(b)``
        so the connection is closed when the loop ends."""
        try:
            with self.http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as resp:
                if not resp.is_success:
                    resp.read()
                    raise ApiError(resp.status_code, _message(resp))
                yield ChatStream(
                    resp.headers.get("x-rag-mode", ""),
                    resp.headers.get("x-rag-reason", ""),
                    _sse_events(self._lines(resp)),
                )
        except httpx.HTTPError as e:
            raise ApiError(0, f"stream from {self.url} failed: {e}") from e


def _sse_events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    data: list[str] = []
    for line in lines:
        if line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
            continue
        if line or not data:
            continue
        payload, data = "\n".join(data), []
        if payload == "[DONE]":
            return
        event = _event(payload)
        if isinstance(event, dict) and isinstance(event.get("error"), dict):
            err = event["error"]
            raise ApiError(
                int(err.get("code") or 502) if str(err.get("code", "")).isdigit() else 502, str(err.get("message"))
            )
        yield event
    if data and data[-1] != "[DONE]":  # a stream cut without its final blank line
        yield _event("\n".join(data))


def _event(payload: str) -> Any:
    try:
        return json.loads(payload)
    except ValueError:
        raise ApiError(502, f"the stream carried an event that is not JSON: {payload[:200]!r}") from None
