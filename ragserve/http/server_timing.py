"""The ``Server-Timing`` header: how long each stage of a request took, written by the server and
read back by clients, benchmarks and load tests (one format, one parser)."""

from __future__ import annotations


def server_timing(timings: dict[str, float]) -> str:
    """The ``Server-Timing`` header of a request's stages (milliseconds, one decimal); parsed back by
    :func:`parse_server_timing`."""
    return ", ".join(f"{k};dur={v * 1000:.1f}" for k, v in timings.items())


def parse_server_timing(header: str) -> dict[str, float]:
    """Stage → milliseconds from a ``Server-Timing`` header (for clients and benchmarks)."""
    out: dict[str, float] = {}
    for part in header.split(","):
        name, _, params = part.strip().partition(";")
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if name and key == "dur":
                try:
                    out[name] = float(value)
                except ValueError:
                    continue
    return out
