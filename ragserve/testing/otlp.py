"""An OTLP/HTTP trace receiver for tests and benchmarks: what a collector at ``/v1/traces`` is
told, parsed with the ``opentelemetry-proto`` messages, and a renderer of one trace as a tree.
``python -m ragserve.testing.otlp PORT`` runs one in a process of its own.

Point ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` at :attr:`OTLPReceiver.endpoint`; every export the
processes send lands in :attr:`OTLPReceiver.spans` (one :class:`ReceivedSpan` per span, with its
resource's attributes, so which process made it is known).
"""

from __future__ import annotations

import gzip
import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(x) for x in v.array_value.values)
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


def _attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs if isinstance(kv, KeyValue)}


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    status_code: int = 0

    @property
    def process(self) -> str:
        return str(self.resource.get("ragserve.process", "?"))

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


def spans_of(request: ExportTraceServiceRequest) -> list[ReceivedSpan]:
    out = []
    for rs in request.resource_spans:
        resource = _attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(
                    ReceivedSpan(
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_id=s.parent_span_id.hex(),
                        name=s.name,
                        kind=s.kind,
                        start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano,
                        attributes=_attributes(s.attributes),
                        resource=resource,
                        status_code=s.status.code,
                    )
                )
    return out


@dataclass
class OTLPReceiver:
    """A collector's ``POST /v1/traces`` (``application/x-protobuf``, gzip or not) on a free
    loopback port, in a thread; use as a context manager."""

    host: str = "127.0.0.1"
    port: int = 0
    spans: list[ReceivedSpan] = field(default_factory=list)
    requests: int = 0
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        return f"http://{self.host}:{self._server.server_address[1]}/v1/traces"

    def __enter__(self) -> OTLPReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # the http.server API
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                with receiver._lock:
                    receiver.spans.extend(spans_of(request))
                    receiver.requests += 1
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def do_GET(self) -> None:  # the count of spans received, for a receiver in another process
                with receiver._lock:
                    body = json.dumps({"spans": len(receiver.spans), "requests": receiver.requests}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((self.host, self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def clear(self) -> None:
        with self._lock:
            self.spans.clear()

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait_for(
        self, trace_id: str, done: Callable[[list[ReceivedSpan]], bool], timeout_s: float = 30.0
    ) -> list[ReceivedSpan]:
        """The spans of ``trace_id`` once ``done`` says they are all here (or the timeout passes)."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.trace(trace_id)
            if done(spans) or time.monotonic() > deadline:
                return spans
            time.sleep(0.1)


def render_tree(spans: list[ReceivedSpan]) -> str:
    """One trace as an indented tree: span name, the process that made it, its duration (ms);
    children in start order. Spans whose parent is not in ``spans`` are shown as roots."""
    ids = {s.span_id for s in spans}
    children: dict[str, list[ReceivedSpan]] = {}
    for s in spans:
        children.setdefault(s.parent_id if s.parent_id in ids else "", []).append(s)
    lines: list[str] = []

    def walk(parent: str, depth: int) -> None:
        for s in sorted(children.get(parent, []), key=lambda x: x.start_ns):
            label = f"{'  ' * depth}{s.name}"
            lines.append(f"{label:<52} {s.process:<10} {s.duration_ms:8.2f} ms")
            walk(s.span_id, depth + 1)

    walk("", 0)
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    """``python -m ragserve.testing.otlp PORT``: a receiver in a process of its own (as a collector
    would be), serving until killed; ``GET /`` answers how many spans it has received."""
    with OTLPReceiver(port=int(argv[0])):
        print("ready", flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1:])
