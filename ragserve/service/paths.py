"""Confinement of client-given paths to ``storage_dir`` (persist/load, docs/architecture.md §6).

KAITO RAGEngine accepts any filesystem path; ragserve resolves the path (following symlinks)
and refuses anything that lands outside the storage root.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote


class PathOutsideStorageError(ValueError):
    """The client asked for a path outside ``storage_dir``."""


def confine(storage_dir: str | Path, user_path: str | None, default: str) -> Path:
    """Resolve ``user_path`` (relative to ``storage_dir``; ``default`` when empty) and require it to
    stay inside ``storage_dir``. URL-encoded traversal and symlinks that escape are refused."""
    root = Path(storage_dir).resolve()
    raw = user_path if user_path else default
    decoded = raw
    for _ in range(3):  # %252e%252e → %2e%2e → ..
        nxt = unquote(decoded)
        if nxt == decoded:
            break
        decoded = nxt
    if "\x00" in decoded:
        raise PathOutsideStorageError("path must not contain NUL characters")
    if os.path.isabs(decoded):
        raise PathOutsideStorageError(f"path must be relative to the storage directory, got an absolute path: {raw!r}")
    candidate = (root / decoded).resolve()
    if candidate != root and root not in candidate.parents:
        raise PathOutsideStorageError(f"path {raw!r} resolves outside the storage directory")
    if candidate == root:
        raise PathOutsideStorageError("path must name a directory inside the storage directory, not its root")
    return candidate
