"""Sync folders into an index: the engine behind ``ragserve ingest``.

Document ids come from the file's path relative to the folder synced (``guide.md``; a PDF page is
``report.pdf#p3``; a file too large for one document is ``big.txt#part2``; see
``ragserve.cli.files.sync_base``), and every document the sync writes is marked as its own: metadata
``source: ragserve-cli`` and ``sync_root``, a stable id of the synced folder (by default a hash of
the folder's resolved absolute path: the same path on two machines is the same sync). A run only
ever updates or deletes documents carrying its own mark under the id it gives their ``path``
(:func:`expected_doc_id`: a document of another client copying the mark is foreign): a UI upload,
another client's document, another folder's sync, or a document indexed before the mark existed is
never touched, and a file whose id such a document holds is reported as failed instead of
overwriting it. Beside the mark, a document records its file's ``size`` and how many
``documents`` the file became. A second run knows which documents are whose:

- a new file is added (``POST /index``);
- a changed file is updated (``POST /indexes/{name}/documents``), its vanished pages deleted;
- a file is read only when it is still the regular file discovery found (a file swapped for a link
  leaving the folder is not followed) and is within the server's ``max_file_bytes``; its text must
  be within ``max_file_text_chars``;
- an unchanged file is skipped without being read when its recorded ``mtime`` and ``size`` match
  and all its documents are in the index (:func:`stored_whole`), and otherwise when its text and
  metadata hash to the stored ``hash_value`` (``ragserve.ingest.ids``: the
  server computes the same sha256, so nothing is sent to find out). A file that was only touched
  keeps its old ``mtime`` and costs no re-embedding;
- with ``delete``, documents of this sync whose ``path`` lies under the synced folders but names
  no file there any more are deleted.

Requests stay within the server's limits (documents per request, bytes per request, characters
per document), and all documents of one file travel in the same request, so stopping (Ctrl-C sets
``stop``) between two batches never leaves a file half-indexed: the batch in flight completes. A
file too large for one request takes several: when one of them fails, the file's documents the
earlier ones stored are deleted again and the file fails; a run killed between two of them leaves
a file whose documents are not all there, which the next run sees and sends again.

New files can instead go to the server's ingestion jobs (``POST /jobs``, ``use_jobs``): one job
carries up to ``max_documents_per_job`` documents in one request of at most ``max_request_bytes``,
is stored whole by the server (it survives a restart of the server) and indexed at the server's
pace, while the sync polls it (``GET /jobs/{id}``) and moves the progress bar by the documents it
has processed. A job holds exactly the documents ``POST /index`` would have been sent (same ids,
same marks), and a file still counts as added only when all its documents are in: a document the
job refuses fails its file, and the file's other documents are deleted again, so a file is never
left half-indexed and the next run tries it again. Stopping cancels the job in flight (the batch the
server is indexing finishes); its files not indexed whole are left for the next run. Automatic mode
(``use_jobs=None``) uses jobs when more files are new to the index than ``jobs_threshold`` (by
default the server's ``max_documents_per_request``: more than one ``POST /index`` could carry;
files, not documents, are counted, because documents are known only once a file is converted, and a
file is at least one document). Changed files and deletions always take the synchronous requests. A
server without ``/jobs`` (404) gets ``POST /index`` in automatic mode, with a notice in the report.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import stat
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ragserve.api.documents import DOCUMENT_FEATURES
from ragserve.cli.client import ApiError, RagClient
from ragserve.cli.files import FileSelector, LocalFile, discover, given_roots, scope_prefix, shown, sync_base
from ragserve.config import Settings
from ragserve.ingest.convert import ConversionError, Converted, convert, doc_id_for, file_documents, iso_mtime
from ragserve.ingest.ids import content_hash

JSON_OVERHEAD = 512  # request envelope and per-document keys, on top of text and metadata
_LOOKAHEAD = 4  # files converted ahead of the batch being sent
SOURCE = "ragserve-cli"  # metadata ``source`` of every document a sync writes
#: Metadata a sync adds to a file's documents beside the mark: the file's size in bytes, and how many
#: documents the file became (so a run can tell that all of them are stored). An older CLI wrote
#: neither: its documents are judged by their content hash instead (see ``Syncer._plan_file``).
SIZE, DOCUMENTS = "size", "documents"


def sync_id_for(base: Path) -> str:
    """The mark of the sync of the folder ``base``: the same from every working directory (the
    folder's resolved path), different for different folders; no machine path stored in the index."""
    return hashlib.sha256(os.fsencode(Path(base).resolve())).hexdigest()[:16]  # any bytes a name may hold


@dataclass(frozen=True)
class Limits:
    """What one request may carry; the server's values by default (``GET /ui/config`` tells them)."""

    max_documents_per_request: int = 1000
    max_request_bytes: int = 32 * 1024 * 1024
    max_document_chars: int = 1_000_000
    max_list_limit: int = 100
    max_unpacked_bytes: int = Settings.model_fields["max_unpacked_bytes"].default  # defined once, in Settings
    max_documents_per_job: int = Settings.model_fields["max_documents_per_job"].default
    max_file_bytes: int = Settings.model_fields["max_file_bytes"].default  # a file larger is not read
    max_file_text_chars: int = Settings.model_fields["max_file_text_chars"].default  # text of one file

    @classmethod
    def from_config(cls, config: dict[str, Any] | None) -> Limits:
        """The request limits of ``GET /ui/config``, and those it shows among its settings (a server
        that shows neither keeps the defaults; a job it then refuses as too large is sent by
        ``POST /index`` instead, see ``Syncer._run_job``)."""
        config = config or {}
        given = {**(config.get("settings") or {}), **(config.get("limits") or {})}
        return cls(**{k: int(v) for k, v in given.items() if k in cls.__dataclass_fields__ and v is not None})


def _count(value: Any) -> int | None:
    """A count or a number from 1 up as metadata holds it, else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def expected_doc_id(metadata: Mapping[str, Any]) -> str | None:
    """The id a sync gives the document with this metadata: its ``path`` in the forms of
    ``ragserve.ingest.convert.file_documents`` (``a.md``, ``a.pdf#p3``, ``a.txt#part2``,
    ``a.pdf#p3.part2``, through ``doc_id_for``); None when the metadata names no such document."""
    path = metadata.get("path")
    if not isinstance(path, str):
        return None
    suffix = ""
    if "page" in metadata:
        page = _count(metadata["page"])
        if page is None:
            return None
        suffix = f"#p{page}"
    if "part" in metadata or "parts" in metadata:
        part, parts = _count(metadata.get("part")), _count(metadata.get("parts"))
        if part is None or parts is None or parts < 2 or part > parts:
            return None
        suffix = f"{suffix}.part{part}" if suffix else f"#part{part}"
    return doc_id_for(path, suffix)


def stored_whole(stored: Mapping[str, Mapping[str, Any]]) -> bool:
    """Whether one file's documents in the index (metadata by id, each id in the sync's form) are
    all the documents the file became: as many as their ``documents`` count says, and every part
    ``1..parts`` of each page (or of the whole file) that was split. Documents of an older CLI carry
    no count: their parts are checked. A run that stopped between two requests of one file (killed,
    or the undo of a failed request that failed too) leaves a set that is not whole."""
    declared = {m.get(DOCUMENTS) for m in stored.values()} - {None}
    if len(declared) > 1 or (declared and declared != {len(stored)}):
        return False
    pages: dict[Any, list[Mapping[str, Any]]] = {}
    for m in stored.values():
        pages.setdefault(m.get("page"), []).append(m)
    for group in pages.values():
        split = [m for m in group if m.get("parts") is not None]
        if not split:
            continue
        if len(split) != len(group) or {m.get("parts") for m in split} != {len(split)}:
            return False
        if sorted(_count(m.get("part")) or 0 for m in split) != list(range(1, len(split) + 1)):
            return False
    return True


class FileRefused(Exception):
    """A file that is not read, with the reason in words."""


def read_file(file: LocalFile, max_bytes: int) -> bytes:
    """The bytes of ``file``, read only when it is still the regular file discovery found (the same
    device and inode: a file swapped for a link leaving the folder, or a link put into its path, is
    not followed) and holds at most ``max_bytes`` (the server's ``max_file_bytes``), which is checked
    before reading. Raises FileNotFoundError when it is gone, FileRefused, or OSError."""
    if file.size > max_bytes:
        raise FileRefused(_too_large(file.size, max_bytes))
    fd = os.open(file.path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (file.key is not None and (st.st_dev, st.st_ino) != file.key):
            raise FileRefused("it was replaced while the sync ran (by another file or a link); run the sync again")
        if st.st_size > max_bytes:
            raise FileRefused(_too_large(st.st_size, max_bytes))
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise FileRefused(_too_large(len(data), max_bytes))
    return data


def _too_large(size: int, max_bytes: int) -> str:
    return f"the file is {size} bytes; the server takes files of at most {max_bytes} bytes (max_file_bytes)"


@dataclass
class RemoteDoc:
    hash_value: str
    metadata: dict[str, Any]


@dataclass
class SyncReport:
    """What one sync did, file by file (paths), for the summary and ``--json``."""

    index: str
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)  # files gone from disk, kept because delete was off
    links_outside: list[str] = field(default_factory=list)  # links whose target is outside the folder
    not_processed: list[str] = field(default_factory=list)  # left when stopped
    warnings: list[tuple[str, str]] = field(default_factory=list)
    documents_sent: int = 0
    documents_deleted: int = 0
    seconds: float = 0.0
    interrupted: bool = False
    fatal: str = ""
    jobs: list[dict[str, Any]] = field(default_factory=list)  # ingestion jobs submitted: id, status, documents
    notices: list[str] = field(default_factory=list)  # about the run, not one file: a fallback, a job ended badly

    @property
    def ok(self) -> bool:
        return not self.failed and not self.interrupted and not self.fatal

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "added": self.added,
            "updated": self.updated,
            "unchanged": len(self.unchanged),
            "deleted": self.deleted,
            "failed": [{"path": p, "reason": r} for p, r in self.failed],
            "skipped": [{"path": p, "reason": r} for p, r in self.skipped],
            "stale": self.stale,
            "links_outside": self.links_outside,
            "not_processed": self.not_processed,
            "warnings": [{"path": p, "warning": w} for p, w in self.warnings],
            "documents_sent": self.documents_sent,
            "documents_deleted": self.documents_deleted,
            "seconds": round(self.seconds, 3),
            "interrupted": self.interrupted,
            "fatal": self.fatal or None,
            "jobs": self.jobs,
            "notices": self.notices,
            "ok": self.ok,
        }


class ProgressSink(Protocol):
    """Where the sync reports its progress (a rich progress bar, or nothing)."""

    def start(self, files: int, total_bytes: int) -> None: ...

    def advance(self, files: int, nbytes: int, documents: int) -> None: ...

    def chunks(self, total: int) -> None: ...

    def finish(self) -> None: ...


class NoProgress:
    def start(self, files: int, total_bytes: int) -> None:
        pass

    def advance(self, files: int, nbytes: int, documents: int) -> None:
        pass

    def chunks(self, total: int) -> None:
        pass

    def finish(self) -> None:
        pass


def _doc_bytes(doc: dict[str, Any]) -> int:
    return len(json.dumps(doc, ensure_ascii=False).encode("utf-8")) + 8


@dataclass
class FilePlan:
    """What to send for one file."""

    file: LocalFile
    status: str  # added | updated | unchanged | failed | skipped | vanished (gone since discovery)
    adds: list[dict[str, Any]] = field(default_factory=list)
    updates: list[dict[str, Any]] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
    reason: str = ""
    warnings: list[str] = field(default_factory=list)

    @property
    def writes(self) -> int:
        return len(self.adds) + len(self.updates) + len(self.deletes)

    @functools.cached_property
    def size(self) -> int:
        return sum(_doc_bytes(d) for d in (*self.adds, *self.updates)) + sum(len(i) + 4 for i in self.deletes)


class Syncer:
    """Keeps an index in sync with files. Each run reads what the index holds first, so a document
    another client wrote meanwhile (``--watch`` runs for hours) is seen as not this sync's."""

    def __init__(
        self,
        client: RagClient,
        index: str,
        roots: Sequence[Path],
        *,
        base: Path | None = None,
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
        gitignore: bool = True,
        delete: bool = False,
        limits: Limits | None = None,
        batch_documents: int = 16,
        batch_bytes: int = 64 * 1024,
        progress: ProgressSink | None = None,
        convert_file: Callable[[bytes, str], Converted] | None = None,
        checksum: bool = False,
        sync_id: str | None = None,
        use_jobs: bool | None = None,
        jobs_threshold: int | None = None,
        job_poll_s: float = 0.5,
        features: Collection[str] | None = None,
    ):
        self.client = client
        self.index = index
        self.roots = given_roots(roots, base)
        self.base = sync_base(self.roots, base)  # ValueError: a root outside ``base``
        self.sync_id = sync_id or sync_id_for(self.base)
        self.selector = FileSelector(include, exclude)
        self.gitignore = gitignore
        self.delete = delete
        self.limits = limits or Limits()
        self.batch_documents = max(1, min(batch_documents, self.limits.max_documents_per_request))
        self.max_bytes = int(self.limits.max_request_bytes * 0.9) - JSON_OVERHEAD
        # A soft target: small requests keep the progress bar moving (the server embeds while we wait);
        # a single file larger than it still travels whole, up to max_bytes.
        self.batch_bytes = max(1, min(batch_bytes, self.max_bytes))
        self.progress = progress or NoProgress()
        # ragserve.ingest.convert's, shared with the upload route: Office files bounded by the server's
        # limit before they are unpacked, as an upload is.
        bounded = functools.partial(convert, max_unpacked_bytes=self.limits.max_unpacked_bytes)
        self.convert_file = convert_file or bounded
        self.checksum = checksum  # read every file and compare hashes, even when its mtime is unchanged
        self.remote: dict[str, RemoteDoc] | None = None  # this sync's documents under the roots
        self.foreign: dict[str, str] = {}  # doc_id -> whose, for ids this sync must not write
        self._last_chunks = 0.0
        self.use_jobs = use_jobs  # True: new files in ingestion jobs; False: POST /index; None: automatic
        self.jobs_threshold = self.limits.max_documents_per_request if jobs_threshold is None else jobs_threshold
        self.job_poll_s = job_poll_s
        self._jobs_available = True  # False once the server answered POST /jobs with 404 (kept for --watch)
        # What the server's document API takes beyond KAITO's (GET /ui/config "features"; None: asked
        # at the first run): new documents go with if_exists "keep", and updates and deletes of this
        # sync's documents name the hash read (if_hash_value, if_hash_values), so a document another
        # client writes or changes meanwhile is never overwritten or deleted. A server that does not
        # list them gets neither (it would refuse or ignore them), with a notice in each report.
        self._features = None if features is None else frozenset(features)
        self._notices: list[str] = []

    def _feature(self, name: str) -> bool:
        if self._features is None:
            config = self.client.config()
            self._features = frozenset((config or {}).get("features") or ())
        return name in self._features

    # --- what the index holds ------------------------------------------------------------------
    def _prefixes(self) -> list[str]:
        return [p for p in (scope_prefix(r, self.base) for r in self.roots) if p is not None]

    def _in_scope(self, path: str) -> bool:
        return any(p == "" or path == p or path.startswith(p + "/") for p in self._prefixes())

    def mark(self) -> dict[str, str]:
        """The metadata that says a document is this sync's own."""
        return {"source": SOURCE, "sync_root": self.sync_id}

    def owns(self, doc_id: str, metadata: dict[str, Any]) -> bool:
        """Whether a document is this sync's own: it carries the mark, and its id is the one the
        sync gives its ``path`` (:func:`expected_doc_id`). Another client can copy the mark, not
        the id of a file it did not write: a marked document under any other id is foreign."""
        marked = metadata.get("source") == SOURCE and metadata.get("sync_root") == self.sync_id
        return marked and expected_doc_id(metadata) == doc_id

    def load_remote(self) -> dict[str, RemoteDoc]:
        """This sync's documents with a ``path`` under the synced roots, and the ids of the index's
        other documents, which the sync must neither overwrite nor delete (paged listing)."""
        remote: dict[str, RemoteDoc] = {}
        foreign: dict[str, str] = {}
        for d in self.client.iter_documents(self.index, page_size=self.limits.max_list_limit, max_text_length=1):
            meta = d.get("metadata") or {}
            path = meta.get("path")
            if not self.owns(d["doc_id"], meta):
                foreign[d["doc_id"]] = _whose(meta, self.sync_id)
            elif isinstance(path, str) and self._in_scope(path):
                remote[d["doc_id"]] = RemoteDoc(d["hash_value"], meta)
        self.remote, self.foreign = remote, foreign
        return remote

    def _by_path(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for doc_id, doc in (self.remote or {}).items():
            out.setdefault(str(doc.metadata.get("path")), set()).add(doc_id)
        return out

    # --- planning ------------------------------------------------------------------------------
    def plan_file(self, file: LocalFile, existing_ids: set[str]) -> FilePlan:
        """What to send for one file. Every step of it (the name, the modification time, reading,
        converting, sizing the request) fails this file alone: a file is never a reason to stop
        the run, only a real Ctrl-C is."""
        try:
            plan = self._plan_file(file, existing_ids)
            _ = plan.size  # every document encodes (a name or text that is not UTF-8 fails here)
            return plan
        except KeyboardInterrupt:
            raise
        except FileNotFoundError:  # gone since discovery: as if it had not been found (see run)
            return FilePlan(file, "vanished")
        except BaseException as e:  # a converter's SystemExit or bug spares the rest
            return FilePlan(file, "failed", reason=f"cannot index the file: {_what(e)}")

    def _plan_file(self, file: LocalFile, existing_ids: set[str]) -> FilePlan:
        remote = self.remote or {}
        try:
            file.rel.encode("utf-8")
        except UnicodeEncodeError:
            return FilePlan(file, "failed", reason="the file name is not valid UTF-8 (rename the file to index it)")
        try:
            mtime = iso_mtime(file.mtime)
        except (ValueError, OverflowError, OSError) as e:
            return FilePlan(
                file, "failed", reason=f"its modification time cannot be recorded ({e}); set it with `touch`"
            )
        stored = {i: remote[i].metadata for i in existing_ids}
        if not self.checksum and existing_ids and _same_file(stored, mtime, file.size):
            return FilePlan(file, "unchanged")
        try:
            data = read_file(file, self.limits.max_file_bytes)
        except FileNotFoundError:
            raise
        except FileRefused as e:
            return FilePlan(file, "failed", reason=str(e))
        except OSError as e:
            return FilePlan(file, "failed", reason=f"cannot read the file: {e.strerror or e}")
        try:
            converted = self.convert_file(data, file.path.name)
            if converted.text_chars > self.limits.max_file_text_chars:
                return FilePlan(
                    file,
                    "failed",
                    reason=f"the file converts to {converted.text_chars} characters of text; the server takes at "
                    f"most {self.limits.max_file_text_chars} (max_file_text_chars)",
                )
            docs = file_documents(file.rel, file.mtime, converted, self.limits.max_document_chars)
        except ConversionError as e:
            return FilePlan(file, "failed", reason=str(e) or type(e).__name__)
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # deep HTML's RecursionError, a converter's sys.exit()
            return FilePlan(file, "failed", reason=f"cannot convert the file: {_what(e)}")
        taken = [(d["doc_id"], self.foreign[d["doc_id"]]) for d in docs if d["doc_id"] in self.foreign]
        if taken:
            doc_id, whose = taken[0]
            return FilePlan(
                file,
                "failed",
                reason=f"document id {doc_id!r} is already in the index, from {whose}; it is left as it is "
                "(sync into another index, or delete that document first)",
            )
        for doc in docs:
            doc["metadata"].update(self.mark(), **{SIZE: len(data), DOCUMENTS: len(docs)})
        plan = FilePlan(file, "added" if not existing_ids else "unchanged", warnings=list(converted.warnings))
        if not docs:  # empty: nothing to index, and what an earlier version indexed goes
            plan.deletes = sorted(existing_ids)
            plan.status = "updated" if plan.deletes else "skipped"
            plan.reason = "empty file"
            return plan
        for doc in docs:
            old = remote.get(doc["doc_id"])
            if old is None:
                plan.adds.append(doc)
                continue
            # Only touched: the stored mtime and size stand, so the hash compares text and the rest
            # (a document of an older CLI, without size or count, compares as it was stored).
            same = dict(doc["metadata"], mtime=old.metadata.get("mtime", mtime), size=old.metadata.get(SIZE))
            for key in (SIZE, DOCUMENTS):
                if key not in old.metadata:
                    del same[key]
            if content_hash(doc["text"], same) == old.hash_value:
                continue
            plan.updates.append(doc)
        plan.deletes = sorted(existing_ids - {d["doc_id"] for d in docs})
        if existing_ids and plan.writes:
            plan.status = "updated"
        return plan

    def _plans(self, files: Sequence[LocalFile], stop: threading.Event) -> Iterator[FilePlan]:
        """Plans in file order, converted a few files ahead in a worker thread, so reading and
        converting overlap with the server's embedding of the batch before."""
        by_path = self._by_path()
        with ThreadPoolExecutor(1, thread_name_prefix="ragserve-convert") as pool:
            pending: list[Future[FilePlan]] = []
            it = iter(files)
            exhausted = False
            while True:
                while not exhausted and len(pending) < _LOOKAHEAD:
                    f = next(it, None)
                    if f is None:
                        exhausted = True
                        break
                    pending.append(pool.submit(self.plan_file, f, by_path.get(f.rel, set())))
                if not pending:
                    return
                yield pending.pop(0).result()
                if stop.is_set():
                    for p in pending:
                        p.cancel()
                    return

    # --- sending -------------------------------------------------------------------------------
    def _fits(self, batch: list[FilePlan], plan: FilePlan) -> bool:
        if not batch:
            return True
        adds = sum(len(p.adds) for p in batch) + len(plan.adds)
        updates = sum(len(p.updates) for p in batch) + len(plan.updates)
        deletes = sum(len(p.deletes) for p in batch) + len(plan.deletes)
        size = sum(p.size for p in batch) + plan.size
        return max(adds + updates, deletes) <= self.batch_documents and size <= self.batch_bytes

    def _split(self, docs: list[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
        """Requests within the document-count and byte limits (a single file larger than one request)."""
        part: list[dict[str, Any]] = []
        size = 0
        for d in docs:
            n = _doc_bytes(d)
            if part and (len(part) >= self.limits.max_documents_per_request or size + n > self.max_bytes):
                yield part
                part, size = [], 0
            part.append(d)
            size += n
        if part:
            yield part

    def _send(self, batch: list[FilePlan]) -> None:
        """Adds, then updates, then deletions of stale pages; raises ApiError. A batch larger than
        one request (a single large file) takes several: when one fails, the documents that the earlier
        ones stored of a file it cut in two are deleted again (best effort), so no file stays half in
        the index; one whose undo fails too is not whole, which the next run sees (:func:`stored_whole`)."""
        adds = [d for p in batch for d in p.adds]
        updates = [d for p in batch for d in p.updates]
        deletes = [i for p in batch for i in p.deletes]
        stored: list[str] = []
        try:
            for part in self._split(adds):
                stored += self._add(part)
            for part in self._split(updates):
                stored += self._update(part)
        except ApiError as e:
            if isinstance(e, _Taken):
                stored += e.stored
            # only the files the failure cut in two: one whose documents all went is whole
            sent_docs = {d["doc_id"]: d for d in [*adds, *updates]}
            sent = set(stored)
            cut = {d["metadata"].get("path") for i, d in sent_docs.items() if i not in sent}
            # what went of whole files is in the index as sent (a retry of the batch conditions on it)
            self._remember([sent_docs[i] for i in stored if sent_docs[i]["metadata"].get("path") not in cut])
            self._undo([sent_docs[i] for i in stored if sent_docs[i]["metadata"].get("path") in cut])
            raise
        self._delete(deletes, self._read_hashes(deletes), "stale pages")
        self._remember([*adds, *updates])
        for doc_id in deletes:
            (self.remote or {}).pop(doc_id, None)

    def _writer(self, doc_id: str, metadata: dict[str, Any]) -> str:
        """Who wrote a document this run did not expect, in words."""
        return (
            "another run of this sync (or a client copying its mark)"
            if self.owns(doc_id, metadata)
            else _whose(metadata, self.sync_id)
        )

    def _read_hashes(self, doc_ids: Sequence[str]) -> dict[str, str]:
        """The hashes this run read (or wrote) for ``doc_ids``: the condition of a write to them."""
        remote = self.remote or {}
        return {i: remote[i].hash_value for i in doc_ids if i in remote}

    def _update(self, docs: list[dict[str, Any]]) -> list[str]:
        """Update this sync's documents, each only if it is still the one this run read
        (``if_hash_value``); returns their ids, all stored. One deleted meanwhile is added back; one
        another client changed meanwhile is left and raises :class:`_Taken` (a 409 naming it)."""
        conditions = self._feature("if_hash_value")
        read = self._read_hashes([d["doc_id"] for d in docs])
        # with conditions, one whose hash this run does not know is never updated blindly: added if absent
        unknown = {d["doc_id"] for d in docs if d["doc_id"] not in read} if conditions else set()
        sent = [
            {**d, "if_hash_value": read[d["doc_id"]]} if conditions else d for d in docs if d["doc_id"] not in unknown
        ]
        answer = self.client.update_documents(self.index, sent) if sent else {}
        gone = {d["doc_id"] for d in answer.get("not_found_documents") or []} | unknown
        changed = {str(d.get("doc_id")): d for d in answer.get("conflicting_documents") or []}
        stored = [d["doc_id"] for d in docs if d["doc_id"] not in gone and d["doc_id"] not in changed]
        if gone:  # deleted by someone else meanwhile: add them back
            try:
                stored += self._add([d for d in docs if d["doc_id"] in gone])
            except ApiError as e:  # what this request stored goes with the error (see _send)
                raise _Taken(stored + getattr(e, "stored", []), e.status, e.message) from None
        if changed:
            doc_id, rec = next(iter(changed.items()))
            raise _Taken(
                stored,
                409,
                f"document id {doc_id!r} was changed by {self._writer(doc_id, rec.get('metadata') or {})} since "
                "this run read the index; it is left as it is (run the sync again to update it)",
            )
        return stored

    def _delete(self, doc_ids: Sequence[str], hashes: Mapping[str, str], what: str) -> list[str]:
        """Delete documents of this sync, each only if it is still the one ``hashes`` says
        (``if_hash_values``): one another client changed meanwhile is left, with a notice.
        Returns the ids left."""
        step = self.limits.max_documents_per_request
        conditions = self._feature("if_hash_value")
        left: list[str] = []
        for i in range(0, len(doc_ids), step):
            ids = list(doc_ids[i : i + step])
            want = {d: hashes[d] for d in ids if d in hashes} if conditions else {}
            answer = self.client.delete_documents(self.index, ids, want or None)
            left += [str(d) for d in answer.get("conflicting_doc_ids") or []]
        if left:
            shown_ids = ", ".join(repr(d) for d in left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
            self._notices.append(
                f"left {len(left)} document(s) of {what} that another client changed since this run read the "
                f"index: {shown_ids}"
            )
        return left

    def _delete_written(self, docs: Sequence[dict[str, Any]]) -> list[str]:
        """Delete documents this run wrote of files that failed, each only if it is still as written."""
        hashes = {d["doc_id"]: content_hash(d["text"], d["metadata"]) for d in docs}
        return self._delete(list(hashes), hashes, "files that failed")

    def _add(self, docs: list[dict[str, Any]]) -> list[str]:
        """``POST /index`` of new documents with ``if_exists: keep``: returns their ids, all stored.
        A document another client wrote under one of the ids after this run read the index is left
        as it is and raises :class:`_Taken` (a 409 naming it), which carries the ids that were
        stored, so ``_send`` deletes those of the files it cut in two and never the other client's."""
        ids = [d["doc_id"] for d in docs]
        if self._feature("if_exists"):
            answer = self.client.add_documents(self.index, docs, if_exists="keep")
            # Another hash is another writer's document, another run of this sync's included:
            # never counted as this run's (its undo would delete it).
            taken = [
                (d, rec)
                for d, rec in zip(docs, answer, strict=True)
                if rec.get("hash_value") != content_hash(d["text"], d["metadata"])
            ]
            if taken:
                kept = {d["doc_id"] for d, _ in taken}
                raise _Taken(
                    [i for i in ids if i not in kept],
                    409,
                    f"document id {taken[0][0]['doc_id']!r} was written by "
                    f"{self._writer(str(taken[0][1].get('doc_id')), taken[0][1].get('metadata') or {})} while "
                    "this run was sending it; it is left as it is (sync into another index, or delete that "
                    "document first)",
                )
            return ids
        self.client.add_documents(self.index, docs)
        return ids

    def _undo(self, docs: list[dict[str, Any]]) -> None:
        """Delete documents this run stored of files that failed, each only if it is still what
        this run wrote (best effort: the error that failed them is what is reported). One left
        (another client changed it since) or not deleted (the delete failed) is remembered as this
        run wrote it, so a later update of it names that hash and cannot overwrite the other's."""
        left = {d["doc_id"] for d in docs}
        with contextlib.suppress(ApiError):
            left = set(self._delete_written(docs))
        self._remember([d for d in docs if d["doc_id"] in left])
        for d in docs:
            if d["doc_id"] not in left:
                (self.remote or {}).pop(d["doc_id"], None)

    def _remember(self, docs: Sequence[dict[str, Any]]) -> None:
        """Documents now in the index as this sync's, for the rest of the run (and the next, with --watch)."""
        if self.remote is None:
            self.remote = {}
        for d in docs:
            self.remote[d["doc_id"]] = RemoteDoc(content_hash(d["text"], d["metadata"]), d["metadata"])

    def _flush(self, batch: list[FilePlan], report: SyncReport, done: set[str]) -> None:
        """Send a batch; on a client error, send its files one by one so the error is pinned on the
        file that caused it. Connection failures, 401/403 and server errors stop the run (raised).
        The files of the batch are added to ``done`` (recorded in the report) either way."""
        done.update(p.file.rel for p in batch)
        try:
            self._send(batch)
            sent = batch
        except ApiError as e:
            if _fatal(e) or len(batch) == 1:
                self._failed(batch[0] if len(batch) == 1 else None, batch, e, report)
                return
            sent = []
            for p in batch:
                try:
                    self._send([p])
                    sent.append(p)
                except ApiError as e1:
                    self._failed(p, [p], e1, report)
        for p in sent:
            (report.added if p.status == "added" else report.updated).append(p.file.rel)
            report.documents_sent += len(p.adds) + len(p.updates)
            self.progress.advance(1, p.file.size, len(p.adds) + len(p.updates))
        self._report_chunks()

    def _flush_all(self, plans: Sequence[FilePlan], report: SyncReport, done: set[str], stop: threading.Event) -> None:
        """Send files in batches (``_fits``) through ``_flush``, stopping between two batches on ``stop``."""
        batch: list[FilePlan] = []
        for p in plans:
            if not self._fits(batch, p):
                self._flush(batch, report, done)
                batch = []
                if stop.is_set():
                    return
            batch.append(p)
        if batch:
            self._flush(batch, report, done)

    # --- ingestion jobs ------------------------------------------------------------------------
    def _wants_jobs(self, files: Sequence[LocalFile]) -> bool:
        """Whether this run sends its new files as ingestion jobs: as ``use_jobs`` says, else when
        more files are new to the index (none of this sync's documents has their path) than
        ``jobs_threshold`` (see the module's docstring for why files are counted)."""
        if self.use_jobs is not None:
            return self.use_jobs
        if not self._jobs_available:
            return False
        by_path = self._by_path()
        return sum(f.rel not in by_path for f in files) > self.jobs_threshold

    def _job_fits(self, job: list[FilePlan], plan: FilePlan) -> bool:
        """Whether ``plan``'s documents join ``job`` within one job's limits: the server's documents
        per job, and the bytes of one request (a job is one request)."""
        docs = sum(len(p.adds) for p in job) + len(plan.adds)
        size = sum(p.size for p in job) + plan.size
        return docs <= self.limits.max_documents_per_job and size <= self.max_bytes

    def _run_job(self, plans: list[FilePlan], report: SyncReport, done: set[str], stop: threading.Event) -> None:
        """Index new files as one ingestion job and wait for it, the progress bar moving meanwhile.
        A job the server refuses as a whole (a 4xx: too many documents for its own limit, a
        document too long) is sent by ``POST /index`` instead, which pins the refusal on its file;
        a server without ``/jobs`` too, unless jobs were asked for (``use_jobs=True``): then the run
        stops with an error. Raises ApiError as ``_flush`` does."""
        if not self._jobs_available:
            self._flush_all(plans, report, done, stop)
            return
        docs = [d for p in plans for d in p.adds]
        try:
            info = self.client.submit_job(self.index, docs, if_exists="keep" if self._feature("if_exists") else None)
        except ApiError as e:
            if e.status in (404, 405):
                if self.use_jobs:
                    raise ApiError(
                        e.status,
                        f"the server at {self.client.url} has no ingestion jobs (POST /jobs answered "
                        f"{e.status}: {e.message}); run without --jobs",
                    ) from None
                self._jobs_available = False
                report.notices.append(
                    f"the server has no ingestion jobs (POST /jobs answered {e.status}: an older ragserve); "
                    "new files were sent with POST /index"
                )
            elif _fatal(e):
                done.update(p.file.rel for p in plans)
                self._failed(None, plans, e, report)  # raises
            self._flush_all(plans, report, done, stop)
            return
        job_id = str(info["id"])
        record: dict[str, Any] = {"id": job_id, "status": info.get("status"), "documents": info.get("documents")}
        report.jobs.append(record)
        total_bytes = sum(p.file.size for p in plans)
        try:
            info, cancelled, shown_bytes = self._follow_job(info, len(docs), total_bytes, stop)
        except ApiError:
            record["status"] = "unknown"
            report.notices.append(
                f"lost track of ingestion job {job_id}; it may still be running (GET /jobs/{job_id} tells)"
            )
            raise
        except KeyboardInterrupt:  # a second Ctrl-C: do not leave the job running unseen
            with contextlib.suppress(ApiError):
                self.client.cancel_job(job_id)
            raise
        record.update(status=info.get("status"), documents=info.get("documents"))
        self._settle_job(info, plans, report, done, cancelled)
        self.progress.advance(len(plans), max(0, total_bytes - shown_bytes), 0)
        self._report_chunks()

    def _follow_job(
        self, info: dict[str, Any], total_docs: int, total_bytes: int, stop: threading.Event
    ) -> tuple[dict[str, Any], bool, int]:
        """Poll a job every ``job_poll_s`` until it has ended (``finished_at``), advancing the
        progress by the documents it has processed (indexed or failed) and the share of bytes they
        stand for. ``stop`` cancels the job, once; the batch the server is indexing then finishes
        and the job ends after it. Returns the last answer, whether this run cancelled the job, and
        the bytes shown as done."""
        shown_docs = shown_bytes = 0
        cancelled = False
        while True:
            counts = info.get("documents") or {}
            processed = int(counts.get("indexed") or 0) + int(counts.get("failed") or 0)
            if processed > shown_docs:
                nbytes = total_bytes * min(processed, total_docs) // max(total_docs, 1)
                self.progress.advance(0, nbytes - shown_bytes, processed - shown_docs)
                shown_docs, shown_bytes = processed, nbytes
                self._report_chunks()
            if info.get("finished_at") is not None:
                return info, cancelled, shown_bytes
            if stop.is_set() and not cancelled:
                info, cancelled = self.client.cancel_job(str(info["id"])), True
                continue
            if cancelled:
                time.sleep(self.job_poll_s)  # stop is set: waiting on it would return at once
            else:
                stop.wait(self.job_poll_s)
            info = self.client.job(str(info["id"]))

    def _settle_job(
        self, info: dict[str, Any], plans: list[FilePlan], report: SyncReport, done: set[str], cancelled: bool
    ) -> None:
        """Record what an ended job did, file by file. A document's position in the job maps back
        to its file. When the job's answer tells every document's fate (it completed and lists
        every failed document), it is taken as it is; otherwise (cancelled, failed, more errors
        than it lists) this sync's documents are listed to see which are in, with the hash sent.
        A file is added when all its documents are in; one whose document was refused fails with
        the server's reason; its documents that did get in are deleted, so it is never half there."""
        counts = info.get("documents") or {}
        errors: dict[int, dict[str, Any]] = {int(e["index"]): e for e in info.get("errors") or []}
        status = str(info.get("status"))
        told = (
            status == "completed"
            and int(counts.get("failed") or 0) == len(errors)
            and not counts.get("cancelled")
            and not counts.get("pending")
        )
        present: dict[str, str] = {}
        if not told:
            listed = self.client.iter_documents(
                self.index, page_size=self.limits.max_list_limit, max_text_length=1, metadata_filter=self.mark()
            )
            present = {d["doc_id"]: d["hash_value"] for d in listed}

        def stored(i: int, doc: dict[str, Any]) -> bool:
            if i in errors:
                return False
            return told or present.get(doc["doc_id"]) == content_hash(doc["text"], doc["metadata"])

        partial: list[dict[str, Any]] = []  # documents in the index of files that are not whole
        why = f"ingestion job {info.get('id')} ended {status} before this file was indexed"
        if info.get("error"):
            why += f": {info['error']}"
        first = 0
        for p in plans:
            positions = range(first, first + len(p.adds))
            first += len(p.adds)
            ok = [stored(i, d) for i, d in zip(positions, p.adds, strict=True)]
            if all(ok):
                report.added.append(p.file.rel)
                report.documents_sent += len(p.adds)
                self._remember(p.adds)
                done.add(p.file.rel)
                continue
            partial += [d for d, got in zip(p.adds, ok, strict=True) if got]
            refused = [errors[i] for i in positions if i in errors]
            if refused:
                report.failed.append((p.file.rel, str(refused[0].get("message") or refused[0].get("code"))))
            elif not cancelled:
                report.failed.append((p.file.rel, why))
            else:
                continue  # stopped before it was indexed: not processed, for the next run
            done.add(p.file.rel)
        self._delete_written(partial)
        if status in ("failed", "cancelled") and not cancelled:
            report.notices.append(
                f"ingestion job {info.get('id')} ended {status}" + (f": {info['error']}" if info.get("error") else "")
            )

    def _failed(self, plan: FilePlan | None, batch: list[FilePlan], e: ApiError, report: SyncReport) -> None:
        if _fatal(e):
            report.fatal = e.message
            report.failed += [(p.file.rel, e.message) for p in batch]
            raise e
        assert plan is not None
        report.failed.append((plan.file.rel, e.message))
        self.progress.advance(1, plan.file.size, 0)

    def _report_chunks(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_chunks < 1.0:
            return
        self._last_chunks = now
        with contextlib.suppress(ApiError, KeyError, TypeError, ValueError):  # a server without /stats
            self.progress.chunks(int(self.client.stats(self.index)["chunks"]))

    # --- one run -------------------------------------------------------------------------------
    def run(self, stop: threading.Event | None = None) -> SyncReport:
        """One pass over the roots; ``stop`` ends it after the batch in flight."""
        stop = stop or threading.Event()
        t0 = time.monotonic()
        report = SyncReport(self.index)
        unreadable: list[tuple[str, str]] = []
        left_out: list[str] = []  # paths named that the rules leave out: what they hold is not gone
        files = discover(
            self.roots,
            self.base,
            self.selector,
            gitignore=self.gitignore,
            skipped=report.skipped,
            links_outside=report.links_outside,
            unreadable=unreadable,
            left_out=left_out,
        )
        # A folder that could not be read is a failure, and what the index holds under it stays:
        # its files are not known to be gone.
        report.failed += [(shown(rel or "."), reason) for rel, reason in unreadable]
        kept = [rel for rel, _ in unreadable] + left_out
        done: set[str] = set()  # files recorded in the report, by their own names
        vanished: set[str] = set()  # gone between discovery and reading: as if never found
        batch: list[FilePlan] = []
        job: list[FilePlan] = []  # new files for the next ingestion job
        try:
            self.load_remote()
            jobs = self._wants_jobs(files)
            self.progress.start(len(files), sum(f.size for f in files))
            for plan in self._plans(files, stop):
                report.warnings += [(shown(plan.file.rel), w) for w in plan.warnings]
                if plan.status == "vanished":
                    vanished.add(plan.file.rel)
                    self.progress.advance(1, plan.file.size, 0)
                elif plan.status in ("failed", "skipped"):
                    entry = (shown(plan.file.rel), plan.reason)
                    (report.failed if plan.status == "failed" else report.skipped).append(entry)
                    self.progress.advance(1, plan.file.size, 0)
                elif not plan.writes:
                    report.unchanged.append(plan.file.rel)
                    self.progress.advance(1, plan.file.size, 0)
                elif jobs and plan.status == "added" and self._job_fits([], plan):
                    if not self._job_fits(job, plan):
                        self._run_job(job, report, done, stop)
                        job = []
                        if stop.is_set():
                            break
                    job.append(plan)
                    continue
                else:
                    if not self._fits(batch, plan):
                        self._flush(batch, report, done)
                        batch = []
                        if stop.is_set():
                            break
                    batch.append(plan)
                    continue
                done.add(plan.file.rel)
            else:  # every planned file is sent, even when stop came meanwhile: nothing is left half done
                if batch:
                    self._flush(batch, report, done)
                if job and not stop.is_set():  # a job is large: after Ctrl-C it is left for the next run
                    self._run_job(job, report, done, stop)
            if not stop.is_set():
                self._delete_gone({f.rel for f in files} - vanished, kept, report)
            self._report_chunks(force=True)
        except ApiError as e:  # the listing, a deletion, or a fatal error of a batch (already recorded)
            report.fatal = report.fatal or e.message
        finally:
            self.progress.finish()
        if self._features is not None and not self._features.issuperset(DOCUMENT_FEATURES):
            self._notices.insert(0, NO_CONDITIONS_NOTICE)
        report.notices += self._notices
        self._notices = []
        left = [shown(f.rel) for f in files if f.rel not in done and f.rel not in vanished]
        report.interrupted = stop.is_set() and bool(left)
        report.not_processed = left if (report.interrupted or report.fatal) else []
        report.seconds = time.monotonic() - t0
        return report

    def _delete_gone(self, present: set[str], kept: Sequence[str], report: SyncReport) -> None:
        """This sync's documents whose files are gone: deleted with ``delete``, else listed as stale.
        Nothing under ``kept`` (folders that could not be read) counts as gone."""
        gone: dict[str, list[str]] = {}
        for doc_id, doc in (self.remote or {}).items():
            path = str(doc.metadata.get("path"))
            if path in present or not self._in_scope(path) or _under(path, kept):
                continue
            gone.setdefault(path, []).append(doc_id)
        if not gone:
            return
        if not self.delete:
            report.stale = sorted(gone)
            return
        ids = sorted(i for v in gone.values() for i in v)
        left = set(self._delete(ids, self._read_hashes(ids), "deleted files"))
        for doc_id in ids:
            if doc_id not in left:  # one left keeps the hash read: it is not this sync's to delete now
                (self.remote or {}).pop(doc_id, None)
        report.deleted = sorted(path for path, doc_ids in gone.items() if not left.intersection(doc_ids))
        report.documents_deleted = len(ids) - len(left)


NO_CONDITIONS_NOTICE = (
    "the server does not list if_exists and if_hash_value among its features (an older ragserve, or another "
    "server): a document another client writes or changes under this sync's ids while a run sends can be "
    "overwritten or deleted"
)


class _Taken(ApiError):
    """Documents of which some were not stored: another client wrote their ids after this run read
    the index (a 409). ``stored``: the ids of the request that are in the index as sent."""

    def __init__(self, stored: list[str], status: int, message: str):
        super().__init__(status, message)
        self.stored = stored


def _under(path: str, folders: Sequence[str]) -> bool:
    return any(f == "" or path == f or path.startswith(f + "/") for f in folders)


def _what(e: BaseException) -> str:
    """An exception in words: its type, and its message when it has one."""
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def _same_file(stored: Mapping[str, Mapping[str, Any]], mtime: str, size: int) -> bool:
    """Whether a file's stored documents stand for it as it is, without reading it: all of them are
    there (:func:`stored_whole`) and each records the file's modification time and size. Documents
    of an older CLI record no size: the file is read and its content hash compared instead."""
    same = all(m.get("mtime") == mtime and m.get(SIZE) == size for m in stored.values())
    return same and stored_whole(stored)


def _whose(metadata: dict[str, Any], sync_id: str) -> str:
    """Who wrote a document that is not this sync's, in words."""
    if metadata.get("source") == SOURCE and metadata.get("sync_root") == sync_id:
        return "another client (it carries this sync's mark under an id the sync does not give that path)"
    if metadata.get("source") == SOURCE:
        return "the ragserve sync of another folder"
    return "another client (an upload, another program, or a ragserve version before sync marks)"


def _fatal(e: ApiError) -> bool:
    """Errors that would fail every file alike: unreachable server, wrong key, server fault."""
    return e.status in (0, 401, 403) or e.status >= 500


def watch(syncer: Syncer, stop: threading.Event, on_report: Callable[[SyncReport], None], poll_s: float = 1.0) -> None:
    """Sync again whenever a file under the roots changes, until ``stop`` is set. Uses watchfiles
    (inotify and friends) when installed, else polls the tree's (path, size, mtime) every ``poll_s``."""
    watchfiles: Any
    try:
        import watchfiles
    except ImportError:  # pragma: no cover - watchfiles is a dependency; polling is the fallback
        watchfiles = None
    if watchfiles is not None:
        for _changes in watchfiles.watch(
            *syncer.roots,
            stop_event=stop,
            debounce=400,
            rust_timeout=500,
            yield_on_timeout=False,
            raise_interrupt=False,
        ):
            if stop.is_set():
                return
            on_report(syncer.run(stop))
        return
    last = _fingerprint(syncer)
    while not stop.wait(poll_s):
        now = _fingerprint(syncer)
        if now != last:
            last = now
            on_report(syncer.run(stop))


def _fingerprint(syncer: Syncer) -> frozenset[tuple[str, int, float]]:
    files = discover(syncer.roots, syncer.base, syncer.selector, gitignore=syncer.gitignore)
    return frozenset((f.rel, f.size, f.mtime) for f in files)
