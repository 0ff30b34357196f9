"""A job runner in its own process, for the crash test to SIGKILL: ``python crash_worker.py STORE SINK``.

Its handler stands in for document indexing: it upserts the item's key into a "sink" SQLite table
(an add with an existing id replaces it, as ragserve's deterministic document ids do), counting how
many times each key was written, then does a little more work before the item is recorded.
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from ragserve.jobs.runner import JobRunner
from ragserve.jobs.store import Job, JobItem, JobStore

SINK_DDL = "CREATE TABLE IF NOT EXISTS sink (key TEXT PRIMARY KEY, payload TEXT NOT NULL, runs INTEGER NOT NULL)"


def sink_handler(sink: Path, work_s: float = 0.02) -> Callable[[Job, JobItem], Awaitable[Mapping[str, Any]]]:
    def write(key: str, payload: str) -> None:
        with sqlite3.connect(sink, timeout=30) as db:
            db.execute(SINK_DDL)
            db.execute(
                "INSERT INTO sink (key, payload, runs) VALUES (?, ?, 1) "
                "ON CONFLICT (key) DO UPDATE SET payload = excluded.payload, runs = runs + 1",
                (key, payload),
            )

    async def handler(job: Job, item: JobItem) -> Mapping[str, Any]:
        await asyncio.to_thread(write, item.key, str(item.payload["n"]))
        await asyncio.sleep(work_s)  # what follows the write (a FAISS update, say): a kill lands here too
        return {"stored": item.key}

    return handler


async def main(store_path: Path, sink: Path) -> None:
    with JobStore(store_path) as store:
        runner = JobRunner(store, sink_handler(sink), concurrency=2, poll_s=0.05)
        await runner.start()
        await asyncio.sleep(3600)  # until killed


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2])))
