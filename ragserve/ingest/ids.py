"""Document ids, node ids and content hashes.

``hash_value`` makes re-indexing idempotent and updates cheap: a document whose text and metadata
hash the same is unchanged and is not embedded again.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

# Fixed namespace so node ids are the same in every process and on every run.
_NODE_NAMESPACE = uuid.UUID("5d1f6c9e-2b1a-4f0e-9a57-3c1e8b7d2a10")


def new_doc_id() -> str:
    return uuid.uuid4().hex


def canonical_json(metadata: dict[str, Any]) -> str:
    """Key order and spacing do not change what metadata means."""
    return json.dumps(metadata or {}, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def content_hash(text: str, metadata: dict[str, Any] | None) -> str:
    """sha256 over the text and the canonical metadata. The text's length is hashed first, so no
    (text, metadata) pair can collide with another by moving characters across the boundary."""
    h = hashlib.sha256()
    raw = text.encode("utf-8")
    h.update(str(len(raw)).encode("ascii") + b":")
    h.update(raw)
    h.update(b"\x00")
    h.update(canonical_json(metadata or {}).encode("utf-8"))
    return h.hexdigest()


def node_id_for(doc_id: str, chunk_index: int) -> str:
    """Deterministic: re-indexing a document gives its chunks the same node ids."""
    return str(uuid.uuid5(_NODE_NAMESPACE, f"{doc_id}\x00{chunk_index}"))
