"""Snapshot paths a client may send but the filesystem or SQLite cannot hold (hostile review,
2026-11-29): each is a 400 saying what to change, nothing is created for it, a failed persist
leaves no folder behind, and the walk of what lies below a target runs off the event loop."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from ragserve.errors import BadRequestError
from ragserve.service.documents import DocumentService
from ragserve.service.shard_service import ShardService
from ragserve.service.snapshots import MAX_FOLDER_BYTES, MAX_NAME_BYTES, MAX_PATH_DEPTH, Snapshots
from tests.unit.service.test_service_documents import docs, make_service


@pytest.fixture
def service(tmp_path, embedder):
    svc, pool = make_service(tmp_path, embedder, num_shards=2)
    yield svc
    pool.close()


def tree(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) if root.exists() else []


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("a/" * MAX_PATH_DEPTH + "a", "folders deep"),
        ("a/" * 2000, "characters"),  # refused before it is resolved
        ("b" * (MAX_NAME_BYTES + 1), "a name of"),
        ("é" * 128, "a name of"),  # 256 bytes in UTF-8
        ("/".join(["c" * 200] * 3), "full path"),
        ("%2F".join(["d" * 200] * 3), "full path"),  # URL-encoded separators are decoded first
    ],
)
async def test_a_path_out_of_bounds_is_a_400_and_creates_nothing(
    service: DocumentService, path: str, says: str
) -> None:
    await service.add_documents("kb", docs("kaito"))
    snapshots = service.storage_dir / "snapshots"
    before = tree(snapshots)
    with pytest.raises(BadRequestError, match=says) as err:
        await service.persist("kb", path)
    assert err.value.param == "path"
    with pytest.raises(BadRequestError, match=says):
        await service.load("copy", path)
    assert tree(snapshots) == before


async def test_the_longest_path_in_bounds_persists_and_loads(service: DocumentService) -> None:
    """The bounds refuse only what cannot work: a folder at the byte bound holds a snapshot."""
    await service.add_documents("kb", docs("kaito", "rag"))
    snapshots = (service.storage_dir / "snapshots").resolve()
    room = MAX_FOLDER_BYTES - len(str(snapshots)) - len("/") - len("/kb")  # the path's own bytes
    full, rest = divmod(room + 1, 200)  # folders of 199 bytes, each but the last with its "/"
    path = "/".join(["n" * 199] * full + (["n" * (rest - 1)] if rest > 1 else []))
    assert MAX_FOLDER_BYTES - 1 <= len(str(snapshots / path / "kb")) <= MAX_FOLDER_BYTES
    await service.persist("kb", path)
    await service.load("copy", f"{path}/kb")
    assert (await service.list_documents("copy")).total_items == 2


async def test_a_failed_persist_leaves_no_folder_behind(service: DocumentService, monkeypatch) -> None:
    await service.add_documents("kb", docs("kaito"))
    await service.persist("kb", "kept")
    snapshots = service.storage_dir / "snapshots"
    before = tree(snapshots)

    exported: list[str] = []

    async def failing(method, *args, **kwargs):  # type: ignore[no-untyped-def]
        if method is not ShardService.export_part:
            return await real(method, *args, **kwargs)
        exported.append(kwargs["dest_dir"])
        assert Path(kwargs["dest_dir"]).is_dir()  # the folders were made: the export is what fails
        raise OSError("disk full while exporting")

    real = service.snapshots.pool.call_all
    monkeypatch.setattr(service.snapshots.pool, "call_all", failing)
    for path in ("new/deep/er", "kept/new"):
        with pytest.raises(OSError, match="disk full"):
            await service.persist("kb", path)
    assert len(exported) == 2
    assert tree(snapshots) == before  # "kept" and its snapshot stay; nothing new does
    monkeypatch.undo()
    assert (await service.persist("kb", "new/deep/er")).startswith("Successfully persisted")


async def test_a_folder_created_by_another_persist_meanwhile_is_not_removed(
    service: DocumentService, monkeypatch
) -> None:
    """A failed persist removes only the folders it created, and only while they are empty."""
    await service.add_documents("kb", docs("kaito"))
    snapshots = service.storage_dir / "snapshots"

    async def failing(method, *args, **kwargs):  # type: ignore[no-untyped-def]
        if method is not ShardService.export_part:
            return await real(method, *args, **kwargs)
        (snapshots / "shared" / "kb" / "someone-elses-file").write_text("x")  # written while this persist ran
        raise RuntimeError("export failed")

    real = service.snapshots.pool.call_all
    monkeypatch.setattr(service.snapshots.pool, "call_all", failing)
    with pytest.raises(RuntimeError, match="export failed"):
        await service.persist("kb", "shared")
    assert tree(snapshots) == ["shared", "shared/kb", "shared/kb/someone-elses-file"]


async def test_the_target_is_checked_and_created_off_the_event_loop(service: DocumentService, monkeypatch) -> None:
    """What lies below a target is walked (another snapshot inside it is refused): a tree of any
    size must not hold the event loop, so the check runs on a worker thread."""
    await service.add_documents("kb", docs("kaito"))
    threads: list[bool] = []
    real = Snapshots._check_snapshot_target

    def spy(self, root, dest):  # type: ignore[no-untyped-def]
        threads.append(threading.current_thread() is threading.main_thread())
        return real(self, root, dest)

    monkeypatch.setattr(Snapshots, "_check_snapshot_target", spy)
    await service.persist("kb", "elsewhere")
    assert threads == [False]


async def test_load_from_a_path_the_filesystem_cannot_name_is_a_400(service: DocumentService) -> None:
    for path in ("b" * 300, "a/" * 7000):
        with pytest.raises(BadRequestError):
            await service.load("copy", path)
