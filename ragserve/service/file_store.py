"""The OpenAI Files API's storage (``/v1/files``): uploaded files kept durably under
``<storage_dir>/files/``, for whatever reads them later by id (a vector store's ingestion converts
a file's bytes with the converters of ``ragserve ingest``; docs/architecture.md §6).

Layout: ``files.sqlite3`` (WAL, ``synchronous=FULL``) holds one row per file: its wire fields and
the sha256 of its bytes; ``blobs/<id>`` holds the bytes. A file is written in this order: streamed
to a temporary file in ``blobs/`` with its size checked as it comes (past ``max_bytes`` it is a 413
and the temporary file is removed), fsynced, renamed to ``blobs/<id>``, the directory fsynced, and
only then the row inserted. So a row always has its blob; a crash between the rename and the row
leaves a blob without a row, which :meth:`FileStore.sweep` removes when a store opens. A delete
removes the row first, then the blob, for the same reason.

Every SQLite call and every read or write of a file runs on a thread (``asyncio.to_thread``): an
upload of hundreds of MiB never holds the event loop. One connection per store, used under a lock;
other processes (ingress replicas on the same ``storage_dir``) have their own, and SQLite's locking
orders their writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import secrets
import tempfile
import threading
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, TypeVar, cast

from ragserve.api.openai_files import (
    FILE_PURPOSES,
    MAX_FILE_PAGE,
    MAX_FILENAME_CHARS,
    FileDeleted,
    FileList,
    FileObject,
    FilePurpose,
)
from ragserve.errors import BadRequestError, NotFoundError, PayloadTooLargeError
from ragserve.service.files import clean_name
from ragserve.store.schema import connect

log = logging.getLogger(__name__)

#: The store's directory under ``storage_dir``.
FILES_DIR = "files"
DB_NAME = "files.sqlite3"
BLOBS_DIR = "blobs"
#: Files being written: in ``blobs/`` beside their final name, so the rename is atomic.
TMP_PREFIX = ".tmp-"
#: How old an orphan (a temporary file, a blob without a row) must be before a sweep removes it:
#: another process on the same directory may be writing it now (a temporary file's time is its last
#: write, a blob's the end of its upload, moments before its row).
SWEEP_GRACE_S = 3600.0
#: Bytes gathered from the request before one write on a thread; and the size of a read for content.
IO_CHUNK = 1024 * 1024

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY,
    bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    filename TEXT NOT NULL,
    purpose TEXT NOT NULL,
    sha256 TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS files_by_purpose ON files (purpose, id);
"""
_COLUMNS = "id, bytes, created_at, filename, purpose"

_T = TypeVar("_T")


def clean_filename(value: str) -> str:
    """The name a file is shown by: the base name of ``value``, cleaned as an upload's name is
    (``ragserve.service.files.clean_name``: no control or format characters, no absolute path, no
    ``..``), at most ``MAX_FILENAME_CHARS`` characters; else a 400 naming ``filename``."""
    name = clean_name(value, "filename").name
    if len(name) > MAX_FILENAME_CHARS:
        raise BadRequestError(
            f"filename must be at most {MAX_FILENAME_CHARS} characters, got {len(name)}", param="filename"
        )
    return name


def check_purpose(value: str) -> FilePurpose:
    """``value`` if it is a purpose OpenAI defines, else a 400 naming ``purpose`` and the allowed ones."""
    if value not in FILE_PURPOSES:
        raise BadRequestError(
            f"purpose must be one of {', '.join(FILE_PURPOSES)}; got {value!r}",
            param="purpose",
            code="invalid_value",
        )
    return cast(FilePurpose, value)


def new_file_id(now: float) -> str:
    """``file-`` + 12 hex digits of the time in milliseconds + 12 random ones: ids sort by age, so a
    listing pages by id and a cursor still works after its file is deleted."""
    return f"file-{int(now * 1000) & 0xFFFF_FFFF_FFFF:012x}{secrets.token_hex(6)}"


def _not_found(file_id: str) -> NotFoundError:
    return NotFoundError(f"No such File object: {file_id!r}", param="file_id", code="file_not_found")


@dataclass(frozen=True)
class Staged:
    """A file's bytes written to a temporary file in the store, not yet a file: :meth:`FileStore.commit`
    makes it one, :meth:`FileStore.discard` removes it."""

    path: Path
    size: int
    sha256: str


class FileStore:
    """Uploaded files under ``root`` (``<storage_dir>/files``), each at most ``max_bytes``."""

    def __init__(self, root: Path, max_bytes: int, *, sweep_grace_s: float = SWEEP_GRACE_S) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.blobs = self.root / BLOBS_DIR
        self.blobs.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = connect(self.root / DB_NAME)  # WAL, synchronous=FULL: a committed upload survives a crash
        self._db.executescript(_SCHEMA)
        removed = self.sweep(sweep_grace_s)
        if removed:
            log.info("file store %s: removed %d orphan file(s) left by an interrupted upload or delete", root, removed)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # --- writing ------------------------------------------------------------------------------

    async def put(self, filename: str, purpose: str, source: AsyncIterable[bytes] | IO[bytes]) -> FileObject:
        """Store the bytes of ``source`` (chunks, or a binary file read from where it is) as a new
        file named ``filename`` (cleaned: :func:`clean_filename`) for ``purpose``. Name and purpose
        are checked before a byte is read. 400 for an empty file, 413 past ``max_bytes``."""
        clean_filename(filename)
        check_purpose(purpose)
        return await self.commit(await self.stage(source), filename, purpose)

    async def stage(self, source: AsyncIterable[bytes] | IO[bytes]) -> Staged:
        """Write ``source`` to a temporary file in the store, fsynced, counting its size (413 past
        ``max_bytes``, with the temporary file removed) and hashing it. For a route that reads the
        file before it knows its name or purpose (a multipart form may send them after it)."""
        fd, name = await asyncio.to_thread(tempfile.mkstemp, dir=self.blobs, prefix=TMP_PREFIX)
        path = Path(name)
        out = os.fdopen(fd, "wb")
        digest = hashlib.sha256()
        try:
            if isinstance(source, AsyncIterable):
                size = await self._write_chunks(source, out, digest)
            else:
                size = await asyncio.to_thread(self._copy, source, out, digest)
            await asyncio.to_thread(_finish, out)
        except BaseException:
            await _on_thread_even_if_cancelled(lambda: _abandon(out, path))
            raise
        return Staged(path, size, digest.hexdigest())

    async def _write_chunks(self, source: AsyncIterable[bytes], out: IO[bytes], digest: Any) -> int:
        size = 0
        batch = bytearray()
        async for chunk in source:
            size += len(chunk)
            if size > self.max_bytes:
                raise self._too_large()
            batch += chunk
            if len(batch) >= IO_CHUNK:
                await asyncio.to_thread(_write, out, digest, bytes(batch))
                batch.clear()
        if batch:
            await asyncio.to_thread(_write, out, digest, bytes(batch))
        return size

    def _copy(self, source: IO[bytes], out: IO[bytes], digest: Any) -> int:
        size = 0
        while chunk := source.read(IO_CHUNK):
            size += len(chunk)
            if size > self.max_bytes:
                raise self._too_large()
            _write(out, digest, chunk)
        return size

    def _too_large(self) -> PayloadTooLargeError:
        return PayloadTooLargeError(
            f"file: larger than {self.max_bytes} bytes, the largest file accepted (max_file_bytes)",
            param="file",
            code="file_too_large",
        )

    async def commit(self, staged: Staged, filename: str, purpose: str) -> FileObject:
        """Make ``staged`` a file: 400 (and ``staged`` removed) for a bad name or purpose, or no bytes."""
        try:
            name, kind = clean_filename(filename), check_purpose(purpose)
            if staged.size == 0:
                raise BadRequestError("file: the file is empty; send its bytes", param="file", code="empty_file")
        except BadRequestError:
            await self.discard(staged)
            raise
        now = time.time()
        record = FileObject(id=new_file_id(now), bytes=staged.size, created_at=int(now), filename=name, purpose=kind)
        await asyncio.to_thread(self._commit, staged, record)
        return record

    def _commit(self, staged: Staged, record: FileObject) -> None:
        blob = self._blob(record.id)
        os.replace(staged.path, blob)
        _fsync_dir(self.blobs)
        try:
            with self._lock:
                self._db.execute(
                    f"INSERT INTO files ({_COLUMNS}, sha256) VALUES (?, ?, ?, ?, ?, ?)",
                    (record.id, record.bytes, record.created_at, record.filename, record.purpose, staged.sha256),
                )
        except BaseException:
            blob.unlink(missing_ok=True)
            raise

    async def discard(self, staged: Staged) -> None:
        """Remove a staged file that will not be committed (nothing if it already was)."""
        await asyncio.to_thread(staged.path.unlink, missing_ok=True)

    async def delete(self, file_id: str) -> FileDeleted:
        """Remove a file: its row, then its bytes (a reader that has it open keeps reading). 404 if unknown."""
        await asyncio.to_thread(self._delete, file_id)
        return FileDeleted(id=file_id)

    def _delete(self, file_id: str) -> None:
        with self._lock:
            gone = self._db.execute("DELETE FROM files WHERE id = ?", (file_id,)).rowcount
        if not gone:
            raise _not_found(file_id)
        self._blob(file_id).unlink(missing_ok=True)

    # --- reading ------------------------------------------------------------------------------

    async def get(self, file_id: str) -> FileObject:
        """The file ``file_id``; 404 naming it if there is none."""
        return await asyncio.to_thread(self._get, file_id)

    def _get(self, file_id: str) -> FileObject:
        with self._lock:
            row = self._db.execute(f"SELECT {_COLUMNS} FROM files WHERE id = ?", (file_id,)).fetchone()
        if row is None:
            raise _not_found(file_id)
        return _record(row)

    async def list(
        self,
        purpose: str | None = None,
        limit: int = MAX_FILE_PAGE,
        order: str = "desc",
        after: str | None = None,
    ) -> FileList:
        """A page of files, newest first (``order="desc"``, OpenAI's default) or oldest first, of one
        ``purpose`` or all; ``after`` is the last id of the previous page (it need not exist any more).
        ``limit`` 1 to ``MAX_FILE_PAGE``; anything else is a 400 naming the parameter."""
        if purpose is not None:
            check_purpose(purpose)
        if not 1 <= limit <= MAX_FILE_PAGE:
            raise BadRequestError(f"limit must be from 1 to {MAX_FILE_PAGE}, got {limit}", param="limit")
        if order not in ("asc", "desc"):
            raise BadRequestError(f"order must be 'asc' or 'desc', got {order!r}", param="order")
        return await asyncio.to_thread(self._list, purpose, limit, cast(Literal["asc", "desc"], order), after)

    def _list(self, purpose: str | None, limit: int, order: Literal["asc", "desc"], after: str | None) -> FileList:
        where: list[str] = []
        args: list[Any] = []
        if purpose is not None:
            where.append("purpose = ?")
            args.append(purpose)
        if after:
            where.append("id > ?" if order == "asc" else "id < ?")
            args.append(after)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        direction = "ASC" if order == "asc" else "DESC"
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_COLUMNS} FROM files {clause} ORDER BY id {direction} LIMIT ?", (*args, limit + 1)
            ).fetchall()
        data = [_record(r) for r in rows[:limit]]
        return FileList(
            data=data,
            first_id=data[0].id if data else None,
            last_id=data[-1].id if data else None,
            has_more=len(rows) > limit,
        )

    async def open(self, file_id: str) -> tuple[FileObject, IO[bytes]]:
        """The file and its bytes opened for reading (the caller closes them); 404 if unknown or
        deleted meanwhile. What is open stays readable even if the file is deleted after."""
        return await asyncio.to_thread(self._open, file_id)

    def _open(self, file_id: str) -> tuple[FileObject, IO[bytes]]:
        record = self._get(file_id)
        try:
            return record, self._blob(record.id).open("rb")
        except FileNotFoundError:  # deleted between the row and the open
            raise _not_found(file_id) from None

    async def stream(self, file_id: str) -> tuple[FileObject, AsyncIterator[bytes]]:
        """The file and its bytes as chunks read on a thread: opened now, so an unknown id is a 404
        before a response starts; closed when the chunks end or are abandoned."""
        record, f = await self.open(file_id)

        async def chunks() -> AsyncIterator[bytes]:
            try:
                while chunk := await asyncio.to_thread(f.read, IO_CHUNK):
                    yield chunk
            finally:
                f.close()

        return record, chunks()

    async def read(self, file_id: str) -> bytes:
        """All of a file's bytes (at most ``max_bytes`` of them, when it was stored); 404 if unknown."""

        def read_all() -> bytes:
            _, f = self._open(file_id)
            with f:
                return f.read()

        return await asyncio.to_thread(read_all)

    async def path(self, file_id: str) -> Path:
        """Where a file's bytes lie, once the file is known to exist (404 if not). The path is gone
        once the file is deleted: a reader that must not race a delete uses :meth:`open`."""
        record = await self.get(file_id)
        return self._blob(record.id)

    def _blob(self, file_id: str) -> Path:
        # Only ever called with an id this store made or found in its table: never a path from a request.
        return self.blobs / file_id

    # --- upkeep -------------------------------------------------------------------------------

    def sweep(self, grace_s: float = SWEEP_GRACE_S) -> int:
        """Remove what an interrupted upload or delete left in ``blobs/`` (temporary files, blobs
        without a row) once older than ``grace_s``; how many. Runs when a store opens."""
        cutoff = time.time() - grace_s
        removed = 0
        for entry in os.scandir(self.blobs):
            try:
                if not entry.is_file(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_mtime > cutoff:
                    continue
            except FileNotFoundError:
                continue
            if not entry.name.startswith(TMP_PREFIX):
                with self._lock:
                    known = self._db.execute("SELECT 1 FROM files WHERE id = ?", (entry.name,)).fetchone()
                if known:
                    continue
            Path(entry.path).unlink(missing_ok=True)
            removed += 1
        return removed


def _record(row: tuple[Any, ...]) -> FileObject:
    file_id, size, created_at, filename, purpose = row
    return FileObject(id=file_id, bytes=size, created_at=created_at, filename=filename, purpose=purpose)


def _write(out: IO[bytes], digest: Any, data: bytes) -> None:
    digest.update(data)
    out.write(data)


def _finish(out: IO[bytes]) -> None:
    out.flush()
    os.fsync(out.fileno())
    out.close()


def _abandon(out: IO[bytes], path: Path) -> None:
    # On a thread: a write still running on another (its request was cancelled) finishes first.
    with contextlib.suppress(OSError, ValueError):
        out.close()
    path.unlink(missing_ok=True)


def _fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


async def _on_thread_even_if_cancelled(fn: Callable[[], _T]) -> None:
    """Run ``fn`` on a thread and wait for it; if this task is cancelled meanwhile, ``fn`` still runs
    to its end (clean-up that must happen whatever becomes of the request)."""
    job = asyncio.get_running_loop().run_in_executor(None, fn)
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.shield(job)


#: How a process that does not own the file catalog reaches it: ``call("get", file_id)`` runs the
#: owner's ``FileStore.get(file_id)`` (``ragserve.deployments.ingestion``).
RecordCall = Callable[..., Awaitable[Any]]


class SharedFileStore(FileStore):
    """:class:`FileStore`'s surface in a process that shares the owner's ``storage_dir`` but not its
    catalog (an ingress replica under Ray): the bytes are written and read here, on the shared
    volume, so an upload streams to disk where it arrives and a download streams from it; every
    record (commit, get, list, delete) is the owner's, through ``call``, so one process writes the
    SQLite file."""

    def __init__(self, root: Path, max_bytes: int, call: RecordCall) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.blobs = self.root / BLOBS_DIR
        self.blobs.mkdir(parents=True, exist_ok=True)
        self._call = call

    def close(self) -> None:
        pass

    def sweep(self, grace_s: float = SWEEP_GRACE_S) -> int:
        return 0  # the owner sweeps

    async def commit(self, staged: Staged, filename: str, purpose: str) -> FileObject:
        record: FileObject = await self._call("commit", staged, filename, purpose)
        return record

    async def delete(self, file_id: str) -> FileDeleted:
        gone: FileDeleted = await self._call("delete", file_id)
        return gone

    async def get(self, file_id: str) -> FileObject:
        record: FileObject = await self._call("get", file_id)
        return record

    async def list(
        self,
        purpose: str | None = None,
        limit: int = MAX_FILE_PAGE,
        order: str = "desc",
        after: str | None = None,
    ) -> FileList:
        page: FileList = await self._call("list", purpose, limit, order, after)
        return page

    async def open(self, file_id: str) -> tuple[FileObject, IO[bytes]]:
        record = await self.get(file_id)
        try:
            return record, await asyncio.to_thread(self._blob(record.id).open, "rb")
        except FileNotFoundError:  # deleted between the record and the open
            raise _not_found(file_id) from None

    async def read(self, file_id: str) -> bytes:
        _, f = await self.open(file_id)

        def read_all() -> bytes:
            with f:
                return f.read()

        return await asyncio.to_thread(read_all)
