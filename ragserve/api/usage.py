"""``GET /usage``: what each API key used, per index (docs/architecture.md §7)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

#: What is metered, in the order rows show it.
USAGE_METRICS: tuple[str, ...] = (
    "requests",
    "prompt_tokens",
    "completion_tokens",
    "embedding_tokens",
    "documents",
    "bytes",
)


class UsageCounts(BaseModel):
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    embedding_tokens: int = 0
    documents: int = 0
    bytes: int = 0


class UsageRow(UsageCounts):
    """What one key (by its ``name``; ``unnamed`` for a key without one, ``anonymous`` without keys)
    used on one index (``""``: requests that named no index, or that failed). A request over several
    indexes is counted in full on the row of each."""

    key: str
    index: str


class UsageTotal(UsageCounts):
    """What one key used in the period, each request counted once (a request over several indexes
    too). For a key scoped to some indexes, the sum of the rows it may see."""

    key: str


class UsageReport(BaseModel):
    object: Literal["usage.report"] = "usage.report"
    since: int = Field(description="Unix seconds: the start of the first hour counted.")
    until: int = Field(description="Unix seconds: the end of the last hour counted (exclusive).")
    data: list[UsageRow]
    totals: list[UsageTotal]
