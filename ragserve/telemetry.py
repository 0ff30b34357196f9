"""What the application reports (docs/architecture.md §7): a protocol, so that the pure
layers report without knowing Ray. The Ray Serve shell implements it with ``ray.serve.metrics``
(``ragserve.deployments.telemetry``); tests record or ignore what they are told."""

from __future__ import annotations

from typing import Protocol


class Telemetry(Protocol):
    def request(self, route: str, status: int, mode: str = "", reason: str = "") -> None: ...

    def latency(self, stage: str, seconds: float) -> None: ...

    def chat_tokens(self, context_tokens: int, history_tokens: int, history_dropped: int) -> None: ...

    def indexed(self, documents: int) -> None: ...

    def upstream_error(self, kind: str) -> None: ...

    def usage(self, key: str, index: str, metric: str, value: int) -> None:
        """``value`` more of ``metric`` (requests, prompt_tokens, completion_tokens, embedding_tokens,
        documents, bytes) used by the key named ``key`` on ``index`` ("" for none)."""
        ...

    def rate_limited(self, key: str, limit: str) -> None:
        """A request of ``key`` refused (429) by its ``limit``: requests or tokens."""
        ...

    def answer_cache(self, event: str) -> None:
        """One event of the answer cache: ``hit``, ``miss``, ``bypass`` (a RAG request that neither
        read nor kept an answer), ``eviction`` (the bounds or the TTL), ``invalidation`` (a write)."""
        ...


class NullTelemetry:
    """Reports nowhere: the default of an application built outside Ray."""

    def request(self, route: str, status: int, mode: str = "", reason: str = "") -> None:
        pass

    def latency(self, stage: str, seconds: float) -> None:
        pass

    def chat_tokens(self, context_tokens: int, history_tokens: int, history_dropped: int) -> None:
        pass

    def indexed(self, documents: int) -> None:
        pass

    def upstream_error(self, kind: str) -> None:
        pass

    def usage(self, key: str, index: str, metric: str, value: int) -> None:
        pass

    def rate_limited(self, key: str, limit: str) -> None:
        pass

    def answer_cache(self, event: str) -> None:
        pass
