"""A real crash: a runner process is SIGKILLed mid-job, and a new runner over the same files finishes
the job with every item recorded once and every key stored exactly once."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from ragserve.jobs.runner import JobRunner
from ragserve.jobs.store import JobCounts, JobStore
from tests.unit.jobs.crash_worker import sink_handler

REPO = Path(__file__).resolve().parents[3]
WORKER = Path(__file__).with_name("crash_worker.py")
N = 60


async def test_a_job_interrupted_by_sigkill_finishes_after_a_restart_with_nothing_lost_or_doubled(
    tmp_path: Path,
) -> None:
    store_path, sink = tmp_path / "jobs.sqlite", tmp_path / "sink.sqlite"
    with JobStore(store_path) as store:
        job = store.create("index_documents", "docs", [(f"doc-{n}", {"n": n}) for n in range(N)], webhook=True)

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    worker = subprocess.Popen([sys.executable, str(WORKER), str(store_path), str(sink)], env=env, cwd=REPO)
    try:
        with JobStore(store_path) as watcher:
            deadline = time.monotonic() + 15
            while watcher.get(job.id).counts.completed < N // 4:
                assert worker.poll() is None, "the worker exited before it was killed"
                assert time.monotonic() < deadline, "the worker made no progress"
                time.sleep(0.01)
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
    assert worker.returncode == -signal.SIGKILL

    with JobStore(store_path) as store:
        at_crash = store.get(job.id)
        assert 0 < at_crash.counts.completed < N and not at_crash.done  # killed mid-job
        running_at_crash = {i.key for i in store.list_items(job.id, status="in_progress").data}

        runner = JobRunner(store, sink_handler(sink, work_s=0.0), concurrency=2, poll_s=0.05)
        await runner.start()
        try:
            ended = await runner.wait(job.id, timeout_s=15)
        finally:
            await runner.stop()

        assert ended.status == "completed" and ended.counts == JobCounts(0, 0, N, 0, 0, N)
        assert store.check_counts() == []
        items = store.list_items(job.id, limit=N).data
        assert [i.key for i in items] == [f"doc-{n}" for n in range(N)]
        assert all(i.status == "completed" and i.result == {"stored": i.key} for i in items)
        # only what was running when the process died ran a second time
        assert {i.key for i in items if i.attempts == 2} == running_at_crash
        assert all(i.attempts == 1 for i in items if i.key not in running_at_crash)
        assert [d.type for d in store.list_deliveries(job.id)] == ["job.completed"]

    with sqlite3.connect(sink) as db:
        rows = db.execute("SELECT key, payload, runs FROM sink ORDER BY key").fetchall()
    assert sorted(k for k, _, _ in rows) == sorted(f"doc-{n}" for n in range(N))  # each key exactly once
    assert all(payload == key.removeprefix("doc-") for key, payload, _ in rows)  # nothing half-stored
    assert {k for k, _, runs in rows if runs > 1} <= running_at_crash  # re-run only what was interrupted
