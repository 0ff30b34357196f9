"""Stable routing of documents to shards.

A document lives on exactly one shard, chosen by a hash of its ``doc_id`` that is the same in
every process and every Python run (``hash()`` is salted per process, so it cannot be used).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def shard_for(doc_id: str, num_shards: int) -> int:
    """The shard that owns ``doc_id`` among ``num_shards``."""
    if num_shards < 1:
        raise ValueError("num_shards must be at least 1")
    digest = hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % num_shards


def group_by_shard(items: Iterable[T], doc_id: Callable[[T], str], num_shards: int) -> dict[int, list[T]]:
    """Items grouped by the shard of their document, preserving order within each group."""
    groups: dict[int, list[T]] = defaultdict(list)
    for item in items:
        groups[shard_for(doc_id(item), num_shards)].append(item)
    return dict(groups)
