"""A remote OpenAI-compatible server as the generation engine (e.g. KAITO's vLLM inference service).

One shared ``aiohttp.ClientSession`` per engine: connections are pooled and kept alive (with
``TCP_NODELAY``, aiohttp's default), so a chat costs one request on a warm connection rather than a
TCP handshake. aiohttp rather than httpx: a request on a warm connection costs ~0.3 ms against
~0.8 ms (docs/benchmarks.md), and this call is on every chat's path. Every failure becomes an
``EngineError`` that the ingress can show the client as it is (docs/architecture.md §4: an upstream error
keeps its status code and message):

* the upstream answered with an HTTP error: its status and its ``error.message`` (or body text);
* no answer in time: 504; the connection refused or dropped, a malformed answer: 502;
* a stream cut part-way: 502, raised from the iterator at the point of the cut.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import logging
import math
import os
import re
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from opentelemetry.trace import Span, SpanKind
from pydantic import ValidationError

from ragserve import tracing
from ragserve.api.generation import GenerationDelta, GenerationResult
from ragserve.api.messages import Message, message_text
from ragserve.api.openai import ChatCompletionChunk, ChatCompletionResponse
from ragserve.api.sampling import SamplingParams
from ragserve.api.values import replace_lone_surrogates
from ragserve.errors import EngineError
from ragserve.models.engine import GenerationEngine
from ragserve.models.tokenizers import HFTokenCounter, TiktokenCounter, counter_for_model
from ragserve.ports import TokenCounter

log = logging.getLogger(__name__)

UNKNOWN_MODEL = "unknown"
#: How long an idle upstream connection is kept (below uvicorn's, hence vLLM's, 5 s).
KEEPALIVE_S = 4.0


def redacted_url(url: str) -> str:
    """``url`` without the user and password it may carry (``http://user:pass@host`` → ``http://host``)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()


def normalise_base_url(url: str) -> str:
    """The ``.../v1`` root of an OpenAI-compatible API, whichever form the URL was given in.

    Accepts ``http://host:8000``, ``http://host:8000/v1`` and the full endpoint
    ``http://host:8000/v1/chat/completions`` (the form KAITO's RAGEngine is configured with).
    """
    root = url.strip().rstrip("/")
    for suffix in ("/chat/completions", "/completions", "/models"):
        if root.endswith(suffix):
            root = root[: -len(suffix)]
            break
    if not root.endswith("/v1"):
        root += "/v1"
    return root


def upstream_json(text: str) -> Any:
    """An upstream's JSON text parsed, its lone surrogates (only a ``\\uD8xx`` escape can make one:
    the text itself was decoded from UTF-8) replaced by U+FFFD, so that an answer a broken upstream
    sends can still be written out as UTF-8 (it was a 500 in every response that carried it)."""
    value = json.loads(text)
    if "\\ud" in text or "\\uD" in text:
        value = replace_lone_surrogates(value)
    return value


def _error_message(status: int, reason: str | None, text: str) -> tuple[str, str | None, Any]:
    """``(message, type, parsed body)`` of an upstream error response, whatever its shape."""
    try:
        body: Any = upstream_json(text)
    except ValueError:
        return (text.strip() or reason or f"HTTP {status}"), None, None
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            kind = err.get("type")  # a str where the error's type goes (a metric tag, the client's type)
            return str(err["message"]), (str(kind) if kind not in (None, "") else None), body
        if isinstance(err, str):
            return err, None, body
        for key in ("message", "detail"):
            if body.get(key):
                detail = body[key]
                return (detail if isinstance(detail, str) else json.dumps(detail)), None, body
    return text.strip() or f"HTTP {status}", None, body


def _token_count(value: Any) -> int | None:
    """An upstream's usage count as a count of tokens: a whole number >= 0 (``12.0`` too); None for
    anything else (absent, negative, a string, a bool, NaN), which is then counted here instead."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        return None
    return int(value) if value >= 0 else None


def env_proxy(url: str) -> str | None:
    """The proxy the environment names for ``url`` (``HTTP_PROXY``/``HTTPS_PROXY``, skipped for
    hosts in ``NO_PROXY``), as httpx and requests honour them; None for a direct connection."""
    import urllib.request
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if not parts.hostname or urllib.request.proxy_bypass(parts.hostname):
        return None
    return urllib.request.getproxies().get(parts.scheme)


def _is_openai_model(model: str | None) -> bool:
    """Whether tiktoken knows ``model`` by name, i.e. whether its counts are the model's own."""
    if not model:
        return False
    try:
        from tiktoken.model import encoding_name_for_model

        encoding_name_for_model(model)
        return True
    except Exception:  # tiktoken absent or model unknown to it
        return False


class OpenAIEngine(GenerationEngine):
    """Chat completions from a remote OpenAI-compatible server.

    ``model=None`` takes the first model the server lists; ``context_window=None`` takes the model
    card's ``max_model_len`` (vLLM reports it; a configured window is capped by it). ``timeout_s``
    bounds each phase of a request: connecting (at most 10 s), the wait for a response, and each
    gap between streamed chunks.
    """

    serves_rich_requests = True  # tools, images: the upstream decides what it serves
    engine_name = "openai"

    def __init__(
        self, base_url: str, model: str | None, api_key: str | None, timeout_s: float, context_window: int | None = None
    ):
        self.base_url = normalise_base_url(base_url)
        #: the URL as messages and logs show it: without credentials given in it (``user:pass@``)
        self.shown_url = redacted_url(self.base_url)
        self._configured_model = model
        self.model_id = model or UNKNOWN_MODEL
        self._api_key = api_key
        self._timeout_s = float(timeout_s)
        self._configured_window = context_window
        self._window = context_window
        self._counter: TokenCounter | None = None
        self._client: aiohttp.ClientSession | None = None

    # --- lifecycle ----------------------------------------------------------------------------

    def _http(self) -> aiohttp.ClientSession:
        """The shared session, created on first use (inside the event loop that will use it).
        Timeouts: connecting (with the wait for a pooled connection) at most 10 s, then each read
        (the wait for the response, each gap between streamed chunks) ``timeout_s``; no bound on a
        whole stream, which may rightly last long."""
        if self._client is None or self._client.closed:
            headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
            timeout = aiohttp.ClientTimeout(total=None, connect=min(10.0, self._timeout_s), sock_read=self._timeout_s)
            # Idle connections are dropped before the upstream drops them: vLLM (uvicorn) closes
            # them after 5 s, and a POST sent on a connection the server is closing fails (it is
            # not retried, not being idempotent).
            connector = aiohttp.TCPConnector(limit=256, keepalive_timeout=KEEPALIVE_S)
            # The environment's proxy settings are read once, here: aiohttp's ``trust_env`` reads them
            # (and ~/.netrc) on every request, which costs more than the request itself (~0.5 ms).
            self._client = aiohttp.ClientSession(
                headers=headers,
                timeout=timeout,
                connector=connector,
                trust_env=False,
                proxy=env_proxy(self.base_url),
            )
        return self._client

    def _url(self, path: str) -> str:
        return f"{self.base_url}{path}"

    async def start(self) -> None:
        """Ask the upstream for its models: the model id when none is configured, and its window.

        An upstream that is down or has no ``/v1/models`` is logged, not fatal: the server may come
        up after us, and requests will report their own errors.
        """
        try:
            async with self._http().get(self._url("/models")) as response:
                response.raise_for_status()
                listed = upstream_json((await response.read()).decode("utf-8", "replace"))
            cards = [c for c in listed.get("data", []) if isinstance(c, dict)]
        except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError) as exc:
            log.warning(
                "could not list models at %s/models (%s); continuing with model=%s", self.shown_url, exc, self.model_id
            )
            cards = []
        if self._configured_model is None and cards:
            self.model_id = str(cards[0].get("id"))
        card = next((c for c in cards if c.get("id") == self.model_id), None)
        if card is not None:
            self.set_window(self._configured_window, card.get("max_model_len"))
        elif cards:
            log.warning(
                "upstream %s does not list model %r (it lists %s)",
                self.shown_url,
                self.model_id,
                [c.get("id") for c in cards],
            )
        self._counter = await asyncio.to_thread(self._make_counter)
        log.info(
            "openai engine: upstream %s model=%s window=%s tokens counted by %s (exact=%s)",
            self.shown_url,
            self.model_id,
            self._window,
            self._counter.name,
            self._counter.exact,
        )

    async def stop(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    # --- engine facts -------------------------------------------------------------------------

    def _make_counter(self) -> TokenCounter:
        model = None if self.model_id == UNKNOWN_MODEL else self.model_id
        if model:
            hf = _local_hf_tokenizer(model)
            if hf is not None:
                hf_counter = HFTokenCounter(hf)
                if not getattr(hf, "chat_template", None):
                    hf_counter.exact = False  # the right tokens, but the chat layout is a guess
                return hf_counter
        counter = counter_for_model(model)
        if isinstance(counter, TiktokenCounter) and not _is_openai_model(model):
            # A tiktoken encoding is only an estimate for another vendor's model: say so, so the
            # budget keeps its safety margin (docs/architecture.md §5.7).
            counter.exact = False
            counter.name = f"{counter.name}~{model}"
            log.warning(
                "token counts for model %r are ESTIMATED with %s (no local tokenizer); the budget "
                "keeps a safety margin",
                model,
                counter.name,
            )
        return counter

    def token_counter(self) -> TokenCounter:
        if self._counter is None:
            self._counter = self._make_counter()
        return self._counter

    # --- requests -----------------------------------------------------------------------------

    def _with_model(self, body: dict[str, Any]) -> dict[str, Any]:
        body = dict(body)
        if not body.get("model") and self.model_id != UNKNOWN_MODEL:
            body["model"] = self.model_id
        return body

    def _chat_body(self, messages: Sequence[Message], params: SamplingParams, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            **params.extra,
            "messages": list(messages),
            "max_tokens": params.max_tokens,
            "stream": stream,
        }
        body.update(params.set_fields())
        if params.model:
            body["model"] = params.model
        if stream:
            body["stream_options"] = {"include_usage": True}
        return self._with_model(body)

    def _transport_error(self, exc: BaseException) -> EngineError:
        """An aiohttp failure (or a timeout) as the error the client sees: 504 for no answer in
        time, 502 for a refused or dropped connection or a broken answer."""
        if isinstance(exc, TimeoutError):  # aiohttp's own timeouts derive from it
            return EngineError(
                504,
                f"upstream LLM at {self.shown_url} timed out ({type(exc).__name__}, timeout {self._timeout_s:g}s)",
                type_="timeout",
            )
        if isinstance(exc, aiohttp.ClientConnectorError):
            return EngineError(502, f"cannot connect to upstream LLM at {self.shown_url}: {exc}")
        return EngineError(502, f"upstream LLM at {self.shown_url} failed: {type(exc).__name__}: {exc}")

    @staticmethod
    def _http_error(status: int, reason: str | None, text: str) -> EngineError:
        message, type_, body = _error_message(status, reason, text)
        return EngineError(status, message, type_=type_ or "upstream_error", body=body)

    def _client_span(self, body: dict[str, Any]) -> Span | None:
        """The CLIENT span of one request to the upstream (GenAI and HTTP semantic conventions); its
        ``traceparent`` goes with the request (docs/architecture.md §7). None with tracing off."""
        if not tracing.ENABLED:
            return None
        model = tracing.bounded(str(body.get("model") or self.model_id))
        url = urlsplit(self.base_url)
        return tracing.start(
            f"chat {model}",
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": "openai",
                "gen_ai.request.model": model,
                "gen_ai.request.max_tokens": body.get("max_completion_tokens") or body.get("max_tokens"),
                "http.request.method": "POST",
                "server.address": url.hostname or "",
                "server.port": url.port or 0,
                "ragserve.stream": bool(body.get("stream")),
            },
            SpanKind.CLIENT,
        )

    async def _post_json(self, body: dict[str, Any]) -> dict[str, Any]:
        span = self._client_span(body)
        if span is None:
            return await self._post_json_traced(body, None)
        try:
            data = await self._post_json_traced(body, span)
            usage = data["usage"] if isinstance(data.get("usage"), dict) else {}
            tracing.set_attributes(
                span,
                {
                    "gen_ai.response.model": tracing.bounded(str(data.get("model") or "")) or None,
                    "gen_ai.usage.input_tokens": usage.get("prompt_tokens"),
                    "gen_ai.usage.output_tokens": usage.get("completion_tokens"),
                },
            )
            return data
        except BaseException as e:
            tracing.failed(span, e)
            raise
        finally:
            span.end()

    async def _post_json_traced(self, body: dict[str, Any], span: Span | None) -> dict[str, Any]:
        try:
            headers = tracing.carrier(span) if span is not None else None
            async with self._http().post(self._url("/chat/completions"), json=body, headers=headers) as response:
                raw = await response.read()
                status, reason = response.status, response.reason
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise self._transport_error(exc) from exc
        if span is not None:
            span.set_attribute("http.response.status_code", status)
        text = raw.decode("utf-8", errors="replace")
        if status >= 400:
            raise self._http_error(status, reason, text)
        try:
            data = upstream_json(text)
        except ValueError as exc:
            raise EngineError(502, f"upstream LLM returned a body that is not JSON: {text[:200]!r}") from exc
        if not isinstance(data, dict):
            raise EngineError(502, "upstream LLM returned JSON that is not an object")
        if data.get("error") and not data.get("choices"):
            _raise_error_object(data)
        return data

    async def _stream_chunks(self, body: dict[str, Any]) -> AsyncGenerator[dict[str, Any], None]:
        """The upstream's SSE events as dicts, up to ``[DONE]``. Leaving early closes the response,
        which drops the connection, so the upstream stops generating."""
        finished = False
        span = self._client_span(body)  # ended with the stream, in the finally below
        try:
            headers = tracing.carrier(span) if span is not None else None
            async with self._http().post(self._url("/chat/completions"), json=body, headers=headers) as response:
                if span is not None:
                    span.set_attribute("http.response.status_code", response.status)
                if response.status >= 400:
                    text = (await response.read()).decode("utf-8", errors="replace")
                    raise self._http_error(response.status, response.reason, text)
                data_lines: list[str] = []
                # Leaving early (the caller closed this generator) must drop the connection, not
                # drain it: that is what tells the upstream to stop generating.
                done = False
                try:
                    async for line in _lines(response.content.iter_any()):
                        if line.startswith("data:"):
                            data_lines.append(line[5:].removeprefix(" "))
                            continue
                        if line or not data_lines:
                            continue  # comments, event:/id: fields, blank keep-alives
                        data = "\n".join(data_lines)
                        data_lines = []
                        if data.strip() == "[DONE]":
                            done = True
                            return
                        chunk = _parse_event(data)
                        finished = finished or _has_finish(chunk)
                        if span is not None:
                            _chunk_attributes(span, chunk)
                        yield chunk
                    done = True
                    if data_lines:  # a last event not followed by a blank line
                        data = "\n".join(data_lines)
                        if data.strip() == "[DONE]":
                            return
                        chunk = _parse_event(data)
                        finished = finished or _has_finish(chunk)
                        yield chunk
                finally:
                    if not done:
                        response.close()
        except (aiohttp.ClientError, TimeoutError) as exc:
            if span is not None:
                tracing.failed(span, exc)
            raise self._transport_error(exc) from exc
        except BaseException as e:
            if span is not None:
                tracing.failed(span, e)
            raise
        finally:
            if span is not None:
                span.end()
        if not finished:  # a server that omits [DONE] is tolerated once the answer has finished
            raise EngineError(502, "upstream LLM stream ended before the answer finished (no [DONE])")

    async def chat(self, messages: Sequence[Message], params: SamplingParams) -> GenerationResult:
        data = await self._post_json(self._chat_body(messages, params, stream=False))
        choices = data.get("choices") or []
        if not choices or not isinstance(choices[0], dict):
            raise EngineError(502, "upstream LLM returned no choices")
        message = choices[0].get("message") or {}
        text = message_text(message) if isinstance(message, dict) else ""
        usage: dict[str, Any] = data["usage"] if isinstance(data.get("usage"), dict) else {}
        prompt_tokens = _token_count(usage.get("prompt_tokens"))
        completion_tokens = _token_count(usage.get("completion_tokens"))
        if prompt_tokens is None:
            prompt_tokens = self.token_counter().count_messages(messages)
        if completion_tokens is None:
            completion_tokens = self.token_counter().count_text(text)
        return GenerationResult(
            text=text,
            finish_reason=choices[0].get("finish_reason") or "stop",
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            model=str(data.get("model") or body_model(params, self.model_id)),
        )

    async def chat_stream(
        self, messages: Sequence[Message], params: SamplingParams
    ) -> AsyncGenerator[GenerationDelta, None]:
        """Text deltas in arrival order; the last delta carries the finish reason and the usage
        (the upstream's, asked for with ``stream_options.include_usage``; counted here if it sends none)."""
        finish: str | None = None
        usage: dict[str, Any] | None = None
        parts: list[str] = []
        async for chunk in self._stream_chunks(self._chat_body(messages, params, stream=True)):
            if isinstance(chunk.get("usage"), dict):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                    continue
                delta = choice.get("delta") or {}
                text = delta.get("content") if isinstance(delta, dict) else None
                if text:
                    parts.append(text)
                    yield GenerationDelta(text=text, model=chunk.get("model") or body_model(params, self.model_id))
                if choice.get("finish_reason"):
                    finish = choice["finish_reason"]
        usage = usage or {}
        prompt_tokens = _token_count(usage.get("prompt_tokens"))
        completion_tokens = _token_count(usage.get("completion_tokens"))
        if prompt_tokens is None:
            prompt_tokens = self.token_counter().count_messages(messages)
        if completion_tokens is None:
            completion_tokens = self.token_counter().count_text("".join(parts))
        yield GenerationDelta(
            text="",
            finish_reason=finish or "stop",
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
        )

    async def passthrough(self, body: dict[str, Any], default_max_tokens: int) -> ChatCompletionResponse:
        """The body as the client sent it (RAG fields already removed), with ``model`` filled in if
        absent; the upstream's answer is relayed with every field it sent."""
        data = await self._post_json(self._with_model(body))
        data.setdefault("model", body.get("model") or self.model_id)
        return _validated(ChatCompletionResponse, data)

    async def passthrough_stream(
        self, body: dict[str, Any], default_max_tokens: int
    ) -> AsyncGenerator[ChatCompletionChunk, None]:
        """The upstream's chunks, relayed one by one as they arrive."""
        body = self._with_model(body)
        body["stream"] = True
        async with contextlib.aclosing(self._stream_chunks(body)) as chunks:
            async for chunk in chunks:
                yield _validated(ChatCompletionChunk, chunk)


def _chunk_attributes(span: Span, chunk: dict[str, Any]) -> None:
    """A streamed chunk's model and usage (the last chunk's, asked for with ``include_usage``)."""
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        tracing.set_attributes(
            span,
            {
                "gen_ai.usage.input_tokens": usage.get("prompt_tokens"),
                "gen_ai.usage.output_tokens": usage.get("completion_tokens"),
            },
        )
    if chunk.get("choices") and any(isinstance(c, dict) and c.get("finish_reason") for c in chunk["choices"]):
        tracing.set_attributes(span, {"gen_ai.response.model": tracing.bounded(str(chunk.get("model") or "")) or None})


def body_model(params: SamplingParams, served: str) -> str:
    """The model a request asks the upstream for: the client's, else the one this engine serves."""
    return params.model or served


def _validated(model: Any, data: dict[str, Any]) -> Any:
    """``data`` as ``model``; an upstream body of another shape is the upstream's fault (502)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise EngineError(
            502,
            f"upstream LLM returned a malformed {model.__name__}: "
            f"{exc.errors()[0].get('msg', 'invalid')} at "
            f"{'.'.join(str(x) for x in exc.errors()[0].get('loc', ()))}",
        ) from exc


def _parse_event(data: str) -> dict[str, Any]:
    """One SSE ``data`` payload as a chunk dict; an in-band error event becomes an ``EngineError``."""
    try:
        chunk = upstream_json(data)
    except ValueError as exc:
        raise EngineError(502, f"upstream LLM sent a malformed stream event: {data[:200]!r}") from exc
    if not isinstance(chunk, dict):
        raise EngineError(502, f"upstream LLM sent a stream event that is not an object: {data[:200]!r}")
    if chunk.get("error") and not chunk.get("choices"):
        _raise_error_object(chunk)
    return chunk


_EOL = re.compile(r"\r\n|\r|\n")


async def _lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """The lines of a byte stream as SSE splits them: at ``\r\n``, ``\n`` or ``\r`` only (not at
    the other breaks ``str.splitlines`` knows, which JSON strings may hold raw), decoded as UTF-8
    across chunk boundaries, with no limit on a line's length (one event may be large). Each chunk
    is scanned once."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending: list[str] = []  # the current line's pieces so far (no line break among them)
    held = ""  # a chunk's final "\r", which may be the first half of "\r\n"
    async for chunk in chunks:
        text = held + decoder.decode(chunk)
        held = ""
        if text.endswith("\r"):
            text, held = text[:-1], "\r"
        parts = _EOL.split(text)
        if len(parts) > 1:
            yield "".join(pending) + parts[0]
            for line in parts[1:-1]:
                yield line
            pending = []
        pending.append(parts[-1])
    lines = _EOL.split(held + decoder.decode(b"", final=True))
    lines[0] = "".join(pending) + lines[0]
    if lines[-1] == "":  # the stream ended at a line break (or held nothing at all)
        lines.pop()
    for line in lines:
        yield line


def _has_finish(chunk: dict[str, Any]) -> bool:
    return any(isinstance(c, dict) and c.get("finish_reason") for c in chunk.get("choices") or [])


def _raise_error_object(data: dict[str, Any]) -> None:
    """An error reported in a 200 body or in-band in a stream (vLLM does the latter): its own status
    if it carries one, else 502."""
    err = data["error"]
    message = err.get("message") if isinstance(err, dict) else str(err)
    code = err.get("code") if isinstance(err, dict) else None
    status = code if isinstance(code, int) and 400 <= code <= 599 else 502
    type_ = str(err["type"]) if isinstance(err, dict) and err.get("type") else "upstream_error"
    raise EngineError(status, str(message or "upstream LLM error"), type_=type_, body=data)


def _local_hf_tokenizer(model: str) -> Any | None:
    """The model's own tokenizer if it is on this machine (a local path or the HF cache), else None.

    Never downloads: the remote model's name often is no HF id at all, and start-up must not hang.
    Only names that can be one (a directory, or ``org/name``) are tried, so that a plain served-model
    name does not cost a transformers import.
    """
    if not (os.path.isdir(model) or model.count("/") == 1):
        return None
    try:
        from transformers import AutoTokenizer
    except ImportError:
        return None
    try:
        return AutoTokenizer.from_pretrained(model, local_files_only=True)
    except Exception:  # not a local path, not cached, or not a tokenizer at all
        return None
