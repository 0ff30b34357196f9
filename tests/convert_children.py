"""Conversion process targets for tests (``ragserve.ingest.convert._convert_child`` replaced): a child
imports its target by name, so these live in a small module of their own."""

from __future__ import annotations

import time
from typing import Any

from ragserve.ingest.convert import _convert_child


def slow_unless_quick(send: Any, data: bytes, filename: str, *args: Any) -> None:
    """A file named ``slow*`` converts for a minute (sleeping: no CPU); others convert as usual."""
    if filename.startswith("slow"):
        time.sleep(60)
    _convert_child(send, data, filename, *args)
