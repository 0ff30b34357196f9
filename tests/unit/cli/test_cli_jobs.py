"""``ragserve ingest`` through the server's ingestion jobs (``POST /jobs``), against the whole
application over real HTTP: the same documents as ``POST /index``, progress while a job runs,
per-document refusals as failed files, the automatic choice, an older server without ``/jobs``, and
Ctrl-C cancelling the job. The server's embedder is slowed a little and its jobs run two documents
a batch, so a job takes long enough to be watched and stopped."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ragserve.cli.client import RagClient
from ragserve.cli.main import main
from ragserve.cli.sync import Limits, Syncer
from ragserve.ingest.convert import Converted, Section, convert
from tests.filemakers import make_pdf
from tests.live_server import live_app
from tests.unit.cli.test_cli import docs_of, tree
from tests.unit.cli.test_cli_signals import SlowEmbedder


@pytest.fixture(scope="module")
def server(tmp_path_factory, embedding_model) -> Iterator[str]:
    from ragserve.testing.embedder import InProcessEmbedder

    with live_app(
        tmp_path_factory.mktemp("cli-jobs"),
        SlowEmbedder(InProcessEmbedder(embedding_model), 0.05),
        max_document_chars=3000,
        job_batch_documents=2,
    ) as (url, _):
        yield url


class Recording:
    """A progress sink that keeps every call, and can set ``stop`` once documents are processed."""

    def __init__(self, stop_after_docs: int | None = None, stop: threading.Event | None = None):
        self.calls: list[tuple[int, int, int]] = []
        self.stop_after_docs, self.stop = stop_after_docs, stop

    def start(self, files: int, total_bytes: int) -> None:
        self.calls.clear()

    def advance(self, files: int, nbytes: int, documents: int) -> None:
        self.calls.append((files, nbytes, documents))
        if self.stop is not None and self.stop_after_docs is not None and self.docs >= self.stop_after_docs:
            self.stop.set()

    @property
    def docs(self) -> int:
        return sum(c[2] for c in self.calls)

    def chunks(self, total: int) -> None:
        pass

    def finish(self) -> None:
        pass


def many(root: Path, n: int, prefix: str = "note") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (root / f"{prefix}{i:03d}.md").write_text(f"# Note {i}\n\nPump {i} is serviced on day {i % 7} of the week.")
    return root


def comparable(docs: dict[str, dict]) -> dict[str, tuple[Any, ...]]:
    return {k: (d["text"], d["hash_value"], d["metadata"]) for k, d in docs.items()}


def test_jobs_index_exactly_what_post_index_does(server: str, tmp_path: Path, capsys) -> None:
    root = tree(tmp_path / "proj")
    common = ("--url", server, "ingest", str(root), "--base", str(root), "--json")
    code, out, _ = (main([*common, "--index", "by-jobs", "--jobs"]), *capsys.readouterr())
    with_jobs = json.loads(out)
    assert code == 0 and with_jobs["ok"], with_jobs
    code, out, _ = (main([*common, "--index", "by-index", "--no-jobs"]), *capsys.readouterr())
    without = json.loads(out)
    assert code == 0 and without["ok"], without
    assert [j["status"] for j in with_jobs["jobs"]] == ["completed"] and without["jobs"] == []
    assert sorted(with_jobs["added"]) == sorted(without["added"]) and len(with_jobs["added"]) == 5
    assert with_jobs["documents_sent"] == without["documents_sent"] == with_jobs["jobs"][0]["documents"]["total"]
    by_jobs, by_index = docs_of(server, "by-jobs"), docs_of(server, "by-index")
    assert comparable(by_jobs) == comparable(by_index)  # same ids, text, marks (source, sync_root), hashes
    assert by_jobs["docs/manual.pdf#p2"]["metadata"]["source"] == "ragserve-cli"
    # a second run knows the documents a job wrote as its own: nothing to do
    code, out, _ = (main([*common, "--index", "by-jobs", "--jobs"]), *capsys.readouterr())
    again = json.loads(out)
    assert again["unchanged"] == 5 and again["documents_sent"] == 0 and again["jobs"] == []


def test_progress_moves_while_a_job_runs(server: str, tmp_path: Path) -> None:
    root = many(tmp_path / "notes", 16)
    sink = Recording()
    with RagClient(server) as client:
        report = Syncer(client, "progress", [root], base=root, use_jobs=True, progress=sink, job_poll_s=0.05).run()
    assert report.ok and len(report.added) == 16 and len(report.jobs) == 1
    during = [c for c in sink.calls if c[0] == 0]  # before the job ended: no file counted done yet
    assert len(during) >= 3, sink.calls  # 8 batches of 2 documents, each embedding ≥ 0.05 s, polled every 0.05 s
    assert all(docs > 0 and nbytes >= 0 for _, nbytes, docs in during)
    assert sink.docs == 16 and sum(c[0] for c in sink.calls) == 16
    assert sum(c[1] for c in sink.calls) == sum(p.stat().st_size for p in root.iterdir())


def test_a_document_the_job_refuses_fails_its_file_whole(server: str, tmp_path: Path) -> None:
    """A converter that keeps a blank page: the server finds no content in it (a per-document error
    of the job), the file fails with the server's reason, and its other page, which the job did
    store, is deleted again, so the file is not half there and the next run tries it again."""
    root = many(tmp_path / "mixed", 4)
    (root / "blank.md").write_text("placeholder")
    (root / "half.md").write_text("placeholder")

    def blank_pages(data: bytes, filename: str) -> Converted:
        if filename == "blank.md":
            return Converted([Section("   \n  ")], "blank", "text")
        if filename == "half.md":
            return Converted([Section("A page about valves.", 1), Section("  \n ", 2)], "half", "pdf", pages=2)
        return convert(data, filename)

    with RagClient(server) as client:
        report = Syncer(client, "refused", [root], base=root, use_jobs=True, convert_file=blank_pages).run()
    assert sorted(report.added) == [f"note{i:03d}.md" for i in range(4)] and not report.ok
    nothing = "text has no content to index (only whitespace, control or invisible characters)"
    assert dict(report.failed) == {"blank.md": nothing, "half.md": nothing}
    assert report.jobs[0]["status"] == "completed" and report.jobs[0]["documents"]["failed"] == 2
    assert set(docs_of(server, "refused")) == {f"note{i:03d}.md" for i in range(4)}  # nothing of half.md
    with RagClient(server) as client:  # a POST /index sync fails the same files with the same reason
        again = Syncer(client, "refused-sync", [root], base=root, use_jobs=False, convert_file=blank_pages).run()
    assert sorted(p for p, _ in again.failed) == ["blank.md", "half.md"]
    assert all("text has no content to index" in r for _, r in again.failed)


def _with_a_write_first(client: RagClient, method: str, index: str) -> None:
    """Make ``client.<method>`` (``submit_job`` or ``add_documents``) write another client's
    document under ``note002.md`` just before its first call goes out."""
    real = getattr(client, method)

    def other_client_first(*args: Any, **kw: Any) -> Any:
        setattr(client, method, real)  # once
        doc = {"text": "Another client's note.", "doc_id": "note002.md", "metadata": {"by": "x"}}
        client.add_documents(index, [doc])
        return real(*args, **kw)

    setattr(client, method, other_client_first)


@pytest.mark.parametrize("use_jobs", [True, False], ids=["job", "post-index"])
def test_a_document_another_client_writes_meanwhile_is_kept_and_its_file_fails(
    server: str, tmp_path: Path, use_jobs: bool
) -> None:
    """Another client writes under a new file's id after the run read the index and before the run
    stores it: the index keeps that document (if_exists: keep; in a job a ``document_exists``
    error), the file fails saying so, and the other files are added."""
    root = many(tmp_path / "raced", 4)
    index = f"raced-{use_jobs}".lower()
    with RagClient(server) as client:
        _with_a_write_first(client, "submit_job" if use_jobs else "add_documents", index)
        report = Syncer(client, index, [root], base=root, use_jobs=use_jobs).run()
    assert sorted(report.added) == ["note000.md", "note001.md", "note003.md"], report
    assert [p for p, _ in report.failed] == ["note002.md"]
    reason = report.failed[0][1]  # the job's error, or the CLI's own words for POST /index
    assert "'note002.md'" in reason and ("it was kept" in reason or "it is left as it is" in reason), reason
    held = docs_of(server, index)["note002.md"]
    assert (held["text"], held["metadata"]) == ("Another client's note.", {"by": "x"})


def test_automatic_mode_uses_jobs_above_the_threshold(server: str, tmp_path: Path) -> None:
    small, large = many(tmp_path / "small", 3, "small"), many(tmp_path / "large", 4, "large")
    with RagClient(server) as client:
        few = Syncer(client, "auto", [small], base=small, jobs_threshold=3).run()
        lots = Syncer(client, "auto", [large], base=large, jobs_threshold=3).run()
        # an update is never a job: only files new to the index count, and go in the job
        (large / "large000.md").write_text("# Large 0\n\nPump 0 is now serviced daily.")
        for i in range(4, 9):
            (large / f"large{i:03d}.md").write_text(f"# Large {i}\n\nValve {i}.")
        mixed = Syncer(client, "auto", [large], base=large, jobs_threshold=3).run()
    assert few.ok and few.jobs == [] and len(few.added) == 3
    assert lots.ok and len(lots.jobs) == 1 and lots.jobs[0]["documents"]["total"] == 4 and len(lots.added) == 4
    assert mixed.ok and mixed.updated == ["large000.md"] and len(mixed.added) == 5
    assert [j["documents"]["total"] for j in mixed.jobs] == [5]
    assert len(docs_of(server, "auto")) == 12


def test_jobs_are_split_within_the_servers_limits(server: str, tmp_path: Path) -> None:
    root = many(tmp_path / "split", 7)
    limits = Limits(max_documents_per_job=3)
    with RagClient(server) as client:
        report = Syncer(client, "split", [root], base=root, use_jobs=True, limits=limits).run()
    assert report.ok and [j["documents"]["total"] for j in report.jobs] == [3, 3, 1]
    assert len(docs_of(server, "split")) == 7


class NoJobs(httpx.BaseTransport):
    """An older server: the real one, except that ``/jobs`` is not a route (404 as FastAPI answers)."""

    def __init__(self) -> None:
        self.real = httpx.HTTPTransport()
        self.job_calls = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.startswith("/jobs"):
            self.job_calls += 1
            return httpx.Response(404, json={"detail": "Not Found"})
        return self.real.handle_request(request)

    def close(self) -> None:
        self.real.close()


def test_a_server_without_jobs(server: str, tmp_path: Path) -> None:
    root = many(tmp_path / "old", 4)
    transport = NoJobs()
    with RagClient(server, transport=transport) as client:
        forced = Syncer(client, "old-forced", [root], base=root, use_jobs=True).run()
        auto = Syncer(client, "old-auto", [root], base=root, jobs_threshold=1)
        fell_back = auto.run()
        for i in range(4, 8):
            (root / f"note{i:03d}.md").write_text(f"# Note {i}\n\nValve {i}.")
        later = auto.run()  # the same syncer (--watch) remembers: no second POST /jobs
    assert not forced.ok and "has no ingestion jobs" in forced.fatal and "run without --jobs" in forced.fatal
    assert forced.added == [] and len(forced.not_processed) == 4
    assert fell_back.ok and len(fell_back.added) == 4 and fell_back.jobs == []
    assert fell_back.notices == [
        "the server has no ingestion jobs (POST /jobs answered 404: an older ragserve); "
        "new files were sent with POST /index"
    ]
    assert later.ok and len(later.added) == 4 and later.notices == [] and transport.job_calls == 2
    assert len(docs_of(server, "old-auto")) == 8


def test_stop_during_a_job_cancels_it(server: str, tmp_path: Path) -> None:
    for i in range(40):
        (tmp_path / f"r{i:02d}.pdf").write_bytes(make_pdf([f"Report {i} first page.", f"Report {i} second page."]))
    stop = threading.Event()
    sink = Recording(stop_after_docs=1, stop=stop)
    with RagClient(server) as client:
        syncer = Syncer(client, "cancelled", [tmp_path], base=tmp_path, use_jobs=True, progress=sink, job_poll_s=0.05)
        report = syncer.run(stop)
        (job,) = report.jobs
        assert job["status"] == "cancelled" and job["documents"]["cancelled"] > 0, job
        assert client.job(job["id"])["status"] == "cancelled"
    assert report.interrupted and report.failed == [] and report.added
    assert len(report.added) + len(report.not_processed) == 40
    # what the report says was indexed is in the index, whole; nothing else is
    assert set(docs_of(server, "cancelled")) == {f"{f}#p{p}" for f in report.added for p in (1, 2)}
    with RagClient(server) as client:  # running again finishes the rest
        rest = Syncer(client, "cancelled", [tmp_path], base=tmp_path, use_jobs=True).run()
    assert rest.ok and sorted(rest.added) == sorted(report.not_processed)
    assert len(docs_of(server, "cancelled")) == 80
