"""A fake OpenAI-compatible upstream (what KAITO's vLLM inference service looks like from outside).

A real HTTP server on 127.0.0.1 (ephemeral port, background thread, uvicorn + Starlette), so the
code under test goes through real sockets, real SSE framing and real connection failures, which a
mocked transport would hide. It answers deterministically, records every chat request body, and
misbehaves on command::

    with FakeOpenAI(answer="Hello there.", model="fake-model", max_model_len=4096) as fake:
        engine = OpenAIEngine(fake.url, None, None, timeout_s=5)
        ...
        assert fake.requests[-1]["max_tokens"] == 32
        fake.fail_next(status=503, message="model is loading")
        fake.delay_next(2.0)                   # the next request answers 2 s late
        fake.latency_s = 0.1                   # every chat request from now on answers 100 ms late
        fake.cut_stream_next(after_chunks=2)   # the next stream drops the connection mid-way
        fake.error_event_next(after_chunks=2)  # the next stream reports an error in-band, as vLLM does

Each ``*_next`` call queues one misbehaviour for one later chat request (first in, first out).
uvicorn's transports are asyncio's, which set ``TCP_NODELAY`` on every accepted socket, so small
writes (SSE chunks, a header block followed by a body) are not held back by Nagle's algorithm.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import re
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

Answer = str | Callable[[dict[str, Any]], str]


class _CutConnection(Exception):
    """Raised inside a streaming body: uvicorn then closes the socket without ending the chunked body."""


class _HideCuts(logging.Filter):
    """Keeps the deliberate connection cuts out of uvicorn's error log (they are not failures)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        while exc is not None:
            if isinstance(exc, _CutConnection):
                return False
            exc = exc.__cause__ or exc.__context__
        return True


if not any(isinstance(f, _HideCuts) for f in logging.getLogger("uvicorn.error").filters):
    logging.getLogger("uvicorn.error").addFilter(_HideCuts())


@dataclass
class _Misbehaviour:
    kind: str  # "fail" | "delay" | "cut" | "garble" | "error_event"
    status: int = 500
    message: str = ""
    seconds: float = 0.0
    after_chunks: int = 0


def _ascii_json(content: dict[str, Any]) -> Response:
    """JSON with non-ASCII escaped, as many servers send it: a lone surrogate in an answer goes out
    as ``\\ud800``, the way a broken upstream sends one (Starlette's JSONResponse cannot encode it)."""
    return Response(json.dumps(content), media_type="application/json")


def split_answer(text: str) -> list[str]:
    """The answer as stream pieces, one word (with its trailing whitespace) each; joined, they give it back."""
    return re.findall(r"\S+\s*|\s+", text)


def _message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return ""


class FakeOpenAI:
    """A fake ``/v1/models`` + ``/v1/chat/completions`` server; use as a context manager.

    ``answer`` is the reply text, or a function of the request body that returns it. Replies are
    split into word pieces; a request whose ``max_tokens`` is smaller than the number of pieces is
    cut to that many pieces with ``finish_reason="length"``. ``usage`` counts pieces as completion
    tokens and whitespace-separated words (+4 a message) as prompt tokens. If ``api_key`` is set,
    requests without ``Authorization: Bearer <api_key>`` get a 401. ``latency_s``: every chat
    request waits this long before its first byte (a model's time to answer, for benchmarks).
    """

    def __init__(
        self,
        answer: Answer = "This is the fake answer.",
        model: str = "fake-model",
        max_model_len: int | None = 4096,
        api_key: str | None = None,
        chunk_delay_s: float = 0.0,
        latency_s: float = 0.0,
    ):
        self.answer: Answer = answer
        self.model = model
        self.max_model_len = max_model_len
        self.api_key = api_key
        self.chunk_delay_s = chunk_delay_s
        self.latency_s = latency_s
        self.requests: list[dict[str, Any]] = []
        self.request_headers: list[dict[str, str]] = []
        self.models_requests = 0
        #: Streams whose client went away before the last chunk: the upstream stopped generating them.
        self.abandoned_streams = 0
        self._pending: collections.deque[_Misbehaviour] = collections.deque()
        self._lock = threading.Lock()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self.port = 0

    # --- control ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The server's root URL (``http://127.0.0.1:<port>``); the API is under ``/v1``."""
        return f"http://127.0.0.1:{self.port}"

    def fail_next(self, status: int = 500, message: str = "fake upstream failure") -> None:
        """The next chat request gets ``status`` with an OpenAI error body carrying ``message``."""
        self._push(_Misbehaviour("fail", status=status, message=message))

    def delay_next(self, seconds: float) -> None:
        """The next chat request is answered ``seconds`` late (before any byte of the response)."""
        self._push(_Misbehaviour("delay", seconds=seconds))

    def cut_stream_next(self, after_chunks: int = 1) -> None:
        """The next streamed chat request sends the role chunk and ``after_chunks`` content chunks, then
        drops the connection without finishing the response."""
        self._push(_Misbehaviour("cut", after_chunks=after_chunks))

    def garble_stream_next(self, after_chunks: int = 1) -> None:
        """The next streamed chat request sends ``after_chunks`` content chunks, then a ``data:`` line
        that is not JSON, then carries on normally."""
        self._push(_Misbehaviour("garble", after_chunks=after_chunks))

    def error_event_next(self, after_chunks: int = 1, status: int = 500, message: str = "fake stream error") -> None:
        """The next streamed chat request sends ``after_chunks`` content chunks, then an in-band error
        event ``data: {"error": {...}}`` (as vLLM does when generation fails mid-stream), then ends."""
        self._push(_Misbehaviour("error_event", status=status, message=message, after_chunks=after_chunks))

    def reset(self) -> None:
        """Forget recorded requests and queued misbehaviours."""
        with self._lock:
            self.requests.clear()
            self.request_headers.clear()
            self._pending.clear()
            self.models_requests = 0
            self.abandoned_streams = 0

    def _push(self, m: _Misbehaviour) -> None:
        with self._lock:
            self._pending.append(m)

    def _pop(self) -> _Misbehaviour | None:
        with self._lock:
            return self._pending.popleft() if self._pending else None

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> FakeOpenAI:
        """Bind an ephemeral port on 127.0.0.1 and serve from a daemon thread; returns when ready."""
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        config = uvicorn.Config(
            self._app(),
            log_config=None,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=1,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, name=f"fake-openai-{self.port}", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the fake OpenAI server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._sock is not None:
            self._sock.close()
        self._server = self._thread = self._sock = None

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the app ------------------------------------------------------------------------------

    def _app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
            ]
        )

    def _unauthorized(self, request: Request) -> Response | None:
        if self.api_key and request.headers.get("authorization") != f"Bearer {self.api_key}":
            return self._error(401, "Invalid API key", "authentication_error")
        return None

    @staticmethod
    def _error(status: int, message: str, type_: str = "server_error") -> JSONResponse:
        return JSONResponse(
            {"error": {"message": message, "type": type_, "param": None, "code": status}}, status_code=status
        )

    async def _models(self, request: Request) -> Response:
        if (denied := self._unauthorized(request)) is not None:
            return denied
        with self._lock:
            self.models_requests += 1
        card: dict[str, Any] = {"id": self.model, "object": "model", "created": 0, "owned_by": "fake"}
        if self.max_model_len is not None:
            card["max_model_len"] = self.max_model_len
        return JSONResponse({"object": "list", "data": [card]})

    async def _chat(self, request: Request) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError:
            return self._error(400, "body is not JSON", "invalid_request_error")
        with self._lock:
            self.requests.append(body)
            self.request_headers.append(dict(request.headers))
        if (denied := self._unauthorized(request)) is not None:
            return denied
        m = self._pop()
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        if m is not None and m.kind == "delay":
            await asyncio.sleep(m.seconds)
        if m is not None and m.kind == "fail":
            return self._error(m.status, m.message)
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            return self._error(400, "messages must be a non-empty list", "invalid_request_error")

        text = self.answer(body) if callable(self.answer) else self.answer
        pieces = split_answer(text)
        finish = "stop"
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        if isinstance(limit, int) and limit < len(pieces):
            pieces, finish = pieces[:limit], "length"
        prompt_tokens = sum(len(_message_text(msg).split()) + 4 for msg in body["messages"])
        if self.max_model_len is not None and prompt_tokens >= self.max_model_len:  # as vLLM answers it
            return self._error(
                400,
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"your messages resulted in {prompt_tokens} tokens.",
                "invalid_request_error",
            )
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(pieces),
            "total_tokens": prompt_tokens + len(pieces),
        }
        model = body.get("model") or self.model
        cid = f"chatcmpl-fake-{uuid.uuid4().hex[:12]}"
        if not body.get("stream"):
            return _ascii_json(
                {
                    "id": cid,
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "".join(pieces)},
                            "finish_reason": finish,
                        }
                    ],
                    "usage": usage,
                }
            )
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return StreamingResponse(
            self._sse(cid, model, pieces, finish, usage, include_usage, m), media_type="text/event-stream"
        )

    async def _sse(
        self,
        cid: str,
        model: str,
        pieces: list[str],
        finish: str,
        usage: dict[str, int],
        include_usage: bool,
        m: _Misbehaviour | None,
    ) -> AsyncIterator[bytes]:
        def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
            chunk = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": model,
                "choices": choices,
                **extra,
            }
            return f"data: {json.dumps(chunk)}\n\n".encode()

        finished = False
        try:
            async for chunk in self._sse_events(event, pieces, finish, usage, include_usage, m):
                yield chunk
            finished = True
        finally:
            if not finished:
                with self._lock:
                    self.abandoned_streams += 1

    async def _sse_events(
        self,
        event: Any,
        pieces: list[str],
        finish: str,
        usage: dict[str, int],
        include_usage: bool,
        m: _Misbehaviour | None,
    ) -> AsyncIterator[bytes]:
        yield event([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        for i, piece in enumerate(pieces):
            if m is not None and i == m.after_chunks:
                if m.kind == "cut":
                    raise _CutConnection("fake upstream drops the connection mid-stream")
                if m.kind == "garble":
                    yield b"data: {this is not json\n\n"
                if m.kind == "error_event":
                    error = {"error": {"message": m.message, "type": "server_error", "code": m.status}}
                    yield f"data: {json.dumps(error)}\n\n".encode() + b"data: [DONE]\n\n"
                    return
            if self.chunk_delay_s:
                await asyncio.sleep(self.chunk_delay_s)
            yield event([{"index": 0, "delta": {"content": piece}, "finish_reason": None}])
        if m is not None and m.kind == "cut" and m.after_chunks >= len(pieces):
            raise _CutConnection("fake upstream drops the connection before the end of the stream")
        yield event([{"index": 0, "delta": {}, "finish_reason": finish}])
        if include_usage:
            yield event([], usage=usage)
        yield b"data: [DONE]\n\n"
