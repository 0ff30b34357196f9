"""Snapshots: an index's portable copy on the filesystem (``persist``) and back (``load``),
docs/architecture.md §6. Snapshots are copies to move or keep, not the durability of the index
(every acknowledged write is already in the shards' SQLite files).

Layout (KAITO RAGEngine's): ``persist?path=P`` writes ``<storage_dir>/snapshots/P/<index>``, one
part file per shard and a ``manifest.json`` naming them; ``load?path=P/<index>`` reads it back.

Paths: KAITO accepts any filesystem path; ragserve resolves a client's path (following symlinks,
URL-decoding it) and refuses anything that lands outside the snapshots directory, which lies apart
from the live data, so a path can never name a shard or model folder (``confine``).

Scopes: a key for every index names paths in the whole snapshots directory. A key scoped to some
indexes names them in a folder of its scope's own, ``<snapshots>/.scopes/<digest of its index
patterns>`` (``scope_folder``), so nothing another scope keeps there can be seen by what persist or
load answer it: a persist refused because another snapshot is in the way, against one that succeeds,
told a scoped key which paths another tenant's snapshots have. Keys with the same patterns share a
folder; an unscoped admin hands a snapshot over by persisting or copying it into that folder.

Crash safety: a persist writes part files of its own beside the current ones, then replaces the
manifest atomically (the commit point) and only then removes the parts the old manifest named,
under a file lock shared by every process on the host, so a crash leaves the old snapshot or the
new one whole. A load imports into a private staging index on every shard and swaps it in only once
all have imported, so a failed load changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import unquote

from ragserve.errors import BadRequestError, ConflictError, NotFoundError
from ragserve.ports import ShardPool
from ragserve.service.access import FULL_ACCESS, ForbiddenError, Principal
from ragserve.service.shard_service import HOME_SHARD, STAGING_PREFIX, ShardService

MANIFEST = "manifest.json"
SNAPSHOTS = "snapshots"  # persist/load paths are relative to <storage_dir>/snapshots
SNAPSHOT_FORMAT = 1
LOCK_FILE = ".persist.lock"
SCOPES = ".scopes"  # scoped keys' folders; no index name starts with "."
#: Bounds on a snapshot folder, checked before the filesystem is touched (each a 400 saying so):
#: folders below the snapshots folder (a deeper path only costs: each level is created and checked),
#: bytes a name (the filesystem's NAME_MAX), and bytes of the folder's absolute path (SQLite opens a
#: part file by a path of at most 512 bytes, and the longest name put in the folder is ~40 bytes).
MAX_PATH_DEPTH = 32
MAX_NAME_BYTES = 255
MAX_FOLDER_BYTES = 460


def scope_folder(principal: Principal) -> str:
    """The folder, relative to the snapshots directory, that a key scoped to some indexes names its
    snapshot paths in: the same for every key with the same index patterns (in any order), and never
    one that another scope's key can name. "" for a key that reaches every index."""
    if principal.sees_all:
        return ""
    patterns = json.dumps(sorted(set(principal.indexes)))
    return f"{SCOPES}/{hashlib.sha256(patterns.encode()).hexdigest()[:24]}"


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


class Snapshots:
    """Persists indexes to, and loads them from, ``<storage_dir>/snapshots`` over a pool of shards.
    ``index_exists`` is the document service's own check (persist needs the index, load must not
    replace one unless asked to)."""

    def __init__(
        self,
        pool: ShardPool[ShardService],
        storage_dir: str | Path,
        *,
        index_exists: Callable[[str], Awaitable[bool]],
        embedding_model: str = "",
    ):
        self.pool = pool
        self.storage_dir = Path(storage_dir)
        self.embedding_model = embedding_model
        self._index_exists = index_exists

    @property
    def snapshots_dir(self) -> Path:
        return (Path(self.storage_dir) / SNAPSHOTS).resolve()

    def root_of(self, principal: Principal) -> Path:
        """The folder ``principal``'s paths are relative to (``scope_folder``)."""
        return (self.snapshots_dir / scope_folder(principal)).resolve()

    def _confine(self, root: Path, path: str | None, default: str) -> Path:
        """``path`` (``default`` when empty) resolved inside ``root`` and within the folder bounds
        (``MAX_PATH_DEPTH``, ``MAX_NAME_BYTES``, ``MAX_FOLDER_BYTES``); a 400 otherwise."""
        raw = path or default
        if len(raw) > 3 * MAX_FOLDER_BYTES:  # even URL-encoded, too long to resolve to a folder in bounds
            raise BadRequestError(
                f"path is {len(raw)} characters; a snapshot folder's path is at most {MAX_FOLDER_BYTES} bytes",
                param="path",
            )
        try:
            # Snapshots live apart from the live data: a path can never name a shard or model folder.
            folder = confine(root, path, default=default)
        except PathOutsideStorageError as e:
            raise BadRequestError(str(e), param="path") from e
        names = folder.relative_to(root).parts
        if len(names) > MAX_PATH_DEPTH:
            raise BadRequestError(
                f"path is {len(names)} folders deep; at most {MAX_PATH_DEPTH} are accepted", param="path"
            )
        for name in names:
            if (size := len(_utf8(name))) > MAX_NAME_BYTES:
                raise BadRequestError(
                    f"path holds a name of {size} bytes ({name[:40]!r}…); a folder's name is "
                    f"at most {MAX_NAME_BYTES} bytes",
                    param="path",
                )
        if (size := len(_utf8(str(folder)))) > MAX_FOLDER_BYTES:
            raise BadRequestError(
                f"the snapshot folder's full path would be {size} bytes on this server; "
                f"at most {MAX_FOLDER_BYTES} are accepted (SQLite opens files by paths of up to 512 bytes): "
                "choose a shorter path",
                param="path",
            )
        return folder

    @staticmethod
    def _shown(root: Path, path: Path) -> str:
        """``path`` as the client names it: relative to its snapshots folder ``root``."""
        return path.relative_to(root).as_posix()

    def _check_snapshot_target(self, root: Path, dest: Path) -> None:
        """``dest`` may hold a snapshot: no file on the way to it from ``root``, not inside another
        snapshot (its files would mix with that one's), and no other snapshot inside it. Each is a
        400 saying which path is in the way."""
        rel = dest.relative_to(root)
        folders = [root / f for f in [*list(reversed(rel.parents))[1:], rel]]  # shallowest first, root left out
        for here in folders:
            if here.exists() and not here.is_dir():
                raise BadRequestError(
                    f"path names a file, not a directory: {self._shown(root, here)!r}; "
                    "pass a directory to persist into",
                    param="path",
                )
        for here in folders[:-1]:
            if (here / MANIFEST).is_file():
                raise BadRequestError(
                    f"{self._shown(root, dest)!r} is inside the snapshot at {self._shown(root, here)!r}; "
                    "persist to a path outside it",
                    param="path",
                )
        if dest.is_dir():
            for manifest in dest.rglob(MANIFEST):
                if manifest.parent != dest:
                    raise BadRequestError(
                        f"{self._shown(root, dest)!r} contains the snapshot at {self._shown(root, manifest.parent)!r}; "
                        "persist to a path that holds no other snapshot",
                        param="path",
                    )

    async def persist(self, index: str, path: str | None = None, principal: Principal = FULL_ACCESS) -> str:
        """Write a portable snapshot of ``index`` (one part per shard + a manifest), KAITO's layout:
        ``path=P`` writes ``<snapshots>/P/<index>``, no path writes ``<snapshots>/<index>``; a
        KAITO client then loads it with ``path=P/<index>``. Paths are relative to
        ``<storage_dir>/snapshots`` and confined to it.

        Crash-safe: each persist writes part files of its own (``part-NNN-<tag>.sqlite``) next to the
        current ones, then replaces ``manifest.json`` atomically (the commit point), then removes the
        parts the old manifest named. At every instant the manifest names a complete snapshot, old or
        new. Persisting into or around another snapshot is refused (400), so one can never remove
        another's files. A scoped ``principal``'s paths are relative to its scope's folder
        (``scope_folder``), so what is in the way is only ever its own scope's."""
        if not await self._index_exists(index):
            raise NotFoundError(f"No such index: '{index}' exists.")
        if "/" in index or index in {".", ".."}:
            raise BadRequestError(f"invalid index name {index!r}")
        root = self.root_of(principal)
        if path:
            self._confine(root, path, index)  # the path itself must be a folder inside the snapshots folder
        dest = self._confine(root, f"{path}/{index}" if path else index, index)
        # off the event loop: the check walks what lies below ``dest`` (rglob), however much that is
        created = await asyncio.to_thread(self._prepare_target, root, dest)
        try:
            await self._write_snapshot(index, dest)
        except BaseException:
            await asyncio.to_thread(_remove_empty, created)  # nothing of a failed persist stays behind
            raise
        return f"Successfully persisted index {index} to {self._shown(root, dest)}."

    def _prepare_target(self, root: Path, dest: Path) -> list[Path]:
        """Check ``dest`` (``_check_snapshot_target``) and create it; the folders this call created,
        shallowest first."""
        self._check_snapshot_target(root, dest)
        created: list[Path] = []
        try:
            root.mkdir(parents=True, exist_ok=True)  # the snapshots folder (or a scope's): the server's
            names = dest.relative_to(root).parts
            for depth in range(1, len(names) + 1):  # shallowest first
                here = root.joinpath(*names[:depth])
                try:
                    here.mkdir()
                except FileExistsError:
                    if not here.is_dir():
                        raise NotADirectoryError(f"{self._shown(root, here)!r} is a file") from None
                else:
                    created.append(here)
        except NotADirectoryError as e:
            _remove_empty(created)
            raise BadRequestError(f"path names a file, not a directory: {e}", param="path") from e
        except OSError as e:  # the filesystem refuses it (read-only, full): the client's path, not the server
            _remove_empty(created)
            raise BadRequestError(
                f"path {self._shown(root, dest)!r} cannot be a directory here: {e.strerror}", param="path"
            ) from e
        return created

    async def _write_snapshot(self, index: str, dest: Path) -> None:
        """Export every shard's part into ``dest`` and commit its manifest (``persist``)."""
        tag = uuid.uuid4().hex[:12]
        manifest_tmp = dest / f".{MANIFEST}.{tag}.tmp"
        try:
            parts = await self.pool.call_all(ShardService.export_part, index=index, dest_dir=str(dest), tag=tag)
            written = [p["file"] for p in parts if p["file"]]
            dims = {p["dim"] for p in parts if p["dim"]}
            manifest = {
                "format": SNAPSHOT_FORMAT,
                "index_name": index,
                "embedding_model": self.embedding_model,
                "dim": dims.pop() if len(dims) == 1 else None,
                "created_at": time.time(),
                "parts": written,
                "documents": sum(p["documents"] for p in parts),
            }
            with open(manifest_tmp, "w") as f:
                json.dump(manifest, f, indent=2)
                f.flush()
                os.fsync(f.fileno())
            await asyncio.to_thread(self._commit_snapshot, dest, manifest_tmp, set(written))
        except BaseException:
            manifest_tmp.unlink(missing_ok=True)
            kept = self._manifest_parts(dest)
            for part in dest.glob(f"part-*-{tag}.sqlite*"):  # this persist's parts, also half-written ones
                if part.name not in kept:
                    part.unlink(missing_ok=True)
            raise

    @staticmethod
    def _manifest_parts(snapshot: Path) -> set[str]:
        try:
            return {str(p) for p in json.loads((snapshot / MANIFEST).read_text())["parts"]}
        except (OSError, ValueError, KeyError, TypeError):
            return set()

    def _commit_snapshot(self, dest: Path, manifest_tmp: Path, parts: set[str]) -> None:
        """Swap the new manifest in and remove the parts only the old one named, under a file lock
        so two persists of the same snapshot (from any process on this host) cannot remove each
        other's parts."""
        with open(dest / LOCK_FILE, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                old = self._manifest_parts(dest)
                os.replace(manifest_tmp, dest / MANIFEST)
                fd = os.open(dest, os.O_RDONLY)
                try:
                    os.fsync(fd)  # the rename itself is durable before the old parts go
                finally:
                    os.close(fd)
                for name in old - parts:
                    if Path(name).name == name:
                        (dest / name).unlink(missing_ok=True)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    async def load(
        self, index: str, path: str | None = None, overwrite: bool = False, principal: Principal = FULL_ACCESS
    ) -> str:
        """Load a snapshot as ``index``: ``path`` names the snapshot directory relative to
        ``<storage_dir>/snapshots`` (``P/<name>`` after ``persist?path=P``); no path reads
        ``<snapshots>/<index>``. 409 when ``index`` exists and ``overwrite`` is false.

        Nothing changes unless the whole load succeeds: every shard imports its documents into a
        private staging index first; an unreadable or incomplete snapshot is a 400 and the staging
        copies are dropped. Only then is the staging index swapped in, on the home shard first (which
        checks ``overwrite`` again, atomically) and then on the others.

        ``principal`` must also reach the index the snapshot was persisted from (its manifest's
        ``index_name``): a 403 otherwise, and for a scoped key when the manifest does not say. A
        scoped key hears that one 403 for every path it may not load, a snapshot of another index's
        or none at all: a 404 for one and a 403 for the other told it which paths exist. Its paths are
        relative to its scope's folder (``scope_folder``)."""
        root = self.root_of(principal)
        src = self._confine(root, path, index)
        shown = self._shown(root, src)
        if not principal.sees_all:
            source = _recorded_source(src / MANIFEST)
            if not (isinstance(source, str) and source and principal.sees(source)):
                raise ForbiddenError(
                    f"there is no snapshot at {shown!r} this API key may load: a snapshot is loaded by a key "
                    f"that reaches the index it was persisted from, and this key reaches only "
                    f"{list(principal.indexes)}",
                    param="path",
                    code="source_not_allowed",
                )
        if src.exists() and not src.is_dir():
            raise BadRequestError(
                f"path names a file, not a snapshot directory: {shown!r}; pass the directory that holds manifest.json",
                param="path",
            )
        manifest_file = src / MANIFEST
        if not manifest_file.is_file():
            raise NotFoundError(f"No snapshot at {shown!r}: {MANIFEST} not found")
        try:
            manifest = json.loads(manifest_file.read_text())
            names = [str(p) for p in manifest["parts"]]
            expected = int(manifest.get("documents", -1))
        except (ValueError, KeyError, TypeError) as e:
            raise BadRequestError(f"snapshot manifest is unreadable: {e}") from e
        source = manifest.get("index_name") if isinstance(manifest, dict) else None
        principal.require_source(source, f"the snapshot at {shown!r}")
        for name in names:  # part names are plain file names inside the snapshot directory
            if Path(name).name != name or not (src / name).is_file():
                raise BadRequestError(f"snapshot part missing or invalid: {name!r}")
        parts = [str(src / name) for name in names]
        if (
            self.embedding_model
            and manifest.get("embedding_model")
            and manifest["embedding_model"] != self.embedding_model
        ):
            raise BadRequestError(
                f"snapshot was embedded with {manifest['embedding_model']!r}, this server uses "
                f"{self.embedding_model!r}; vectors would not be comparable"
            )
        if not overwrite and await self._index_exists(index):
            raise ConflictError(f"Index {index} already exists; pass overwrite=true to replace it.")
        staging = f"{STAGING_PREFIX}{uuid.uuid4().hex[:12]}~{index}"
        try:
            imported = await self.pool.call_all(ShardService.import_parts, index=staging, part_files=parts)
            if expected >= 0 and sum(imported) != expected:
                raise BadRequestError(
                    f"snapshot at {shown!r} is incomplete: its manifest counts {expected} "
                    f"documents, its parts hold {sum(imported)}; nothing was loaded"
                )
            dim = manifest.get("dim") if isinstance(manifest.get("dim"), int) else None
            generation = await self.pool.call(
                HOME_SHARD,
                ShardService.replace_index,
                staging=staging,
                index=index,
                generation=None,
                overwrite=overwrite,
                dim=dim,
                expect_staged=imported[HOME_SHARD] > 0,
            )
        except BaseException:
            await asyncio.gather(
                *(self.pool.call(s, ShardService.drop_index, staging) for s in range(self.pool.num_shards)),
                return_exceptions=True,
            )
            raise
        await asyncio.gather(
            *(
                self.pool.call(
                    s,
                    ShardService.replace_index,
                    staging=staging,
                    index=index,
                    generation=generation,
                    overwrite=True,
                    dim=dim,
                    expect_staged=imported[s] > 0,
                )
                for s in range(self.pool.num_shards)
                if s != HOME_SHARD
            )
        )
        return f"Successfully loaded index {index} from {shown}."


def _utf8(name: str) -> bytes:
    return name.encode("utf-8", "surrogatepass")


def _remove_empty(folders: list[Path]) -> None:
    """Remove ``folders`` (shallowest first) that are still empty, deepest first: what a failed
    persist created, unless another persist has put something there meanwhile."""
    for folder in reversed(folders):
        with contextlib.suppress(OSError):
            folder.rmdir()


def _recorded_source(manifest_file: Path) -> object:
    """The index a snapshot's manifest says it was persisted from; None when there is no readable
    manifest there (for a scoped key, that is the same answer as a snapshot it may not read)."""
    try:
        manifest = json.loads(manifest_file.read_text())
    except (OSError, ValueError):
        return None
    return manifest.get("index_name") if isinstance(manifest, dict) else None
