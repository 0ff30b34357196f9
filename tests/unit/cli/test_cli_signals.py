"""``ragserve ingest`` as a person runs it: a real process, a real Ctrl-C (SIGINT) in the middle,
and ``--watch`` following edits. The server's embedder is slowed down so that the signal lands
while batches are still being sent."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ragserve.cli.client import RagClient
from ragserve.cli.sync import Syncer, SyncReport, watch
from tests.filemakers import make_pdf
from tests.live_server import live_app

REPO = Path(__file__).resolve().parents[3]


class SlowEmbedder:
    def __init__(self, inner, delay_s: float):
        self.inner, self.delay_s = inner, delay_s

    async def embed_documents(self, texts, *, bulk=False):
        await asyncio.sleep(self.delay_s)
        return await self.inner.embed_documents(texts, bulk=bulk)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.fixture(scope="module")
def server(tmp_path_factory, embedding_model) -> Iterator[str]:
    from ragserve.testing.embedder import InProcessEmbedder

    with live_app(tmp_path_factory.mktemp("sig"), SlowEmbedder(InProcessEmbedder(embedding_model), 0.25)) as (url, _):
        yield url


def test_ctrl_c_finishes_the_batch_in_flight_and_leaves_no_file_half_indexed(server: str, tmp_path: Path) -> None:
    for i in range(20):
        (tmp_path / f"r{i:02d}.pdf").write_bytes(make_pdf([f"Report {i} first page.", f"Report {i} second page."]))
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAGSERVE_URL": server}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ragserve.cli.main",
            "ingest",
            str(tmp_path),
            "--index",
            "sig",
            "--base",
            str(tmp_path),
            "--batch-size",
            "2",
            "--json",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait for the first documents, then press Ctrl-C
        r = httpx.get(f"{server}/indexes/sig/stats")
        if r.status_code == 200 and r.json()["documents"] >= 2:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    report = json.loads(out)
    assert report["interrupted"] and report["not_processed"] and report["added"]
    assert "Stopping after the batch in flight" in err
    with RagClient(server) as c:
        ids = {d["doc_id"] for d in c.iter_documents("sig")}
    files = {i.split("#")[0] for i in ids}
    assert files == set(report["added"])
    assert ids == {f"{f}#p{p}" for f in files for p in (1, 2)}  # every file whole: both pages or none
    done = subprocess.run(proc.args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    again = json.loads(done.stdout)
    assert done.returncode == 0 and sorted(again["added"]) == sorted(report["not_processed"])


def test_watch_follows_edits_and_deletions(server: str, tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# A\n\nThe first version.")
    reports: list[SyncReport] = []
    stop = threading.Event()
    with RagClient(server) as client:
        syncer = Syncer(client, "watched", [tmp_path], base=tmp_path, delete=True)
        reports.append(syncer.run(stop))
        thread = threading.Thread(target=watch, args=(syncer, stop, reports.append), daemon=True)
        thread.start()
        time.sleep(1.0)
        (tmp_path / "a.md").write_text("# A\n\nThe second version.")
        (tmp_path / "b.md").write_text("# B\n\nA new file.")

        def texts() -> dict[str, str]:
            return {d["doc_id"]: d["text"] for d in client.iter_documents("watched", max_text_length=None)}

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not ("second" in texts().get("a.md", "") and "b.md" in texts()):
            time.sleep(0.2)
        assert "The second version." in texts()["a.md"] and "b.md" in texts()
        (tmp_path / "b.md").unlink()
        while time.monotonic() < deadline and "b.md" in texts():
            time.sleep(0.2)
        assert set(texts()) == {"a.md"}
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()
    assert reports[0].added == ["a.md"] and any(r.deleted == ["b.md"] for r in reports)
