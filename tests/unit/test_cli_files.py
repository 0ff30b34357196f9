"""Which files ``ragserve ingest`` picks: supported types, .gitignore files at every level (with
negation, and from the repository's top when a subfolder is given), include/exclude globs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from app.cli.files import FileSelector, discover, scope_prefix, sync_base


def names(root: Path, base: Path, **kw) -> list[str]:
    include, exclude = kw.pop("include", ()), kw.pop("exclude", ())
    return [f.rel for f in discover([root], base, FileSelector(include, exclude), **kw)]


def test_gitignore_at_every_level_and_globs(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / ".gitignore").write_text("*.log.md\ndist/\n")
    for rel in (
        "README.md",
        "a/keep.md",
        "a/drop.log.md",
        "a/b/notes.txt",
        "a/b/secret.md",
        "a/b/ok.md",
        "dist/out.md",
        "node_modules/x/readme.md",
        "a/image.png",
        "a/b/main.py",
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    (tmp_path / "a" / "b" / ".gitignore").write_text("*.md\n!ok.md\n")
    assert names(tmp_path, tmp_path) == ["README.md", "a/b/main.py", "a/b/notes.txt", "a/b/ok.md", "a/keep.md"]
    # a subfolder still honours the repository's .gitignore above it; ids stay relative to the base
    assert names(tmp_path / "a", tmp_path) == ["a/b/main.py", "a/b/notes.txt", "a/b/ok.md", "a/keep.md"]
    assert names(tmp_path / "a", tmp_path / "a") == ["b/main.py", "b/notes.txt", "b/ok.md", "keep.md"]
    assert "a/b/secret.md" in names(tmp_path, tmp_path, gitignore=False)
    assert names(tmp_path, tmp_path, include=["*.md"], exclude=["a/b/"]) == ["README.md", "a/keep.md"]
    skipped: list[tuple[str, str]] = []
    assert discover([tmp_path / "a" / "image.png"], tmp_path, FileSelector(), skipped=skipped) == []
    assert skipped == [("a/image.png", "unsupported file type or excluded")]


def test_links_leaving_the_root_are_skipped_and_links_inside_followed_once(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    (secret / "deep").mkdir(parents=True)
    (secret / "creds.md").write_text("password")
    (secret / "deep" / "key.md").write_text("key")
    root = tmp_path / "root"
    (root / "docs" / "sub").mkdir(parents=True)
    (root / "hidden").mkdir()
    (root / ".gitignore").write_text("hidden/\n")
    (root / "docs" / "guide.md").write_text("guide")
    (root / "hidden" / "h.md").write_text("hidden")
    (root / "creds.md").symlink_to(secret / "creds.md")  # a file link in the root itself
    (root / "docs" / "hop.md").symlink_to(root / "creds.md")  # a chain: hop -> creds -> outside
    (root / "docs" / "keys").symlink_to(secret)  # a folder link
    (root / "docs" / "sub" / "rel").symlink_to("../../../secret/deep")  # relative, from a subfolder
    (root / "docs" / "sub" / "up").symlink_to("..")  # a cycle inside the root
    (root / "loop").symlink_to(root)  # the root itself
    (root / "alias.md").symlink_to(root / "docs" / "guide.md")  # inside: the file is given once, by its path
    (root / "shown").symlink_to(root / "hidden")  # inside, to a folder the walk itself leaves out
    (root / "dangling.md").symlink_to(root / "nowhere.md")
    (root / "a.md").symlink_to("b.md")
    (root / "b.md").symlink_to("a.md")  # a loop of links
    outside: list[str] = []
    skipped: list[tuple[str, str]] = []
    found = discover([root], root, FileSelector(), links_outside=outside, skipped=skipped)
    assert [f.rel for f in found] == ["docs/guide.md", "shown/h.md"]
    assert sorted(outside) == ["creds.md", "docs/hop.md", "docs/keys", "docs/sub/rel"]
    assert [p for p, _ in skipped] == ["a.md", "b.md", "dangling.md"]
    assert all(reason.startswith("broken symbolic link") for _, reason in skipped)
    # a root given through a link is taken as it resolves; its own links are judged against it
    assert [f.rel for f in discover([tmp_path / "root" / "loop"], root, FileSelector())] == [
        "docs/guide.md",
        "shown/h.md",
    ]


def test_ids_are_relative_to_the_folder_given_from_any_working_directory(tmp_path: Path, monkeypatch) -> None:

    for sub in ("alpha", "beta"):
        (tmp_path / "docs" / sub).mkdir(parents=True)
        (tmp_path / "docs" / sub / "README.md").write_text(sub)
    (tmp_path / "elsewhere").mkdir()
    for cwd in (tmp_path / "elsewhere", tmp_path / "docs" / "alpha", tmp_path):
        monkeypatch.chdir(cwd)
        root = Path("..") / "docs" if cwd.name == "elsewhere" else tmp_path / "docs"
        base = sync_base([root])
        assert base == (tmp_path / "docs").resolve()
        assert names(root, base) == ["alpha/README.md", "beta/README.md"]
    assert sync_base([tmp_path / "docs" / "alpha" / "README.md"]) == (tmp_path / "docs" / "alpha").resolve()
    assert sync_base([tmp_path / "docs" / "alpha", tmp_path / "docs" / "beta"]) == (tmp_path / "docs").resolve()
    with pytest.raises(ValueError, match="not inside --base"):
        sync_base([tmp_path / "docs"], tmp_path / "elsewhere")


def test_a_link_named_as_a_file_is_judged_as_a_link(tmp_path: Path) -> None:
    """``ragserve ingest docs/*``: the shell names each entry, links included; one leaving its
    folder is still left out (and listed), one inside is read under the name given."""
    (tmp_path / "secret.md").write_text("password")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "guide.md").write_text("guide")
    (docs / "creds.md").symlink_to(tmp_path / "secret.md")
    (docs / "alias.md").symlink_to("guide.md")
    outside: list[str] = []
    roots = sorted(docs.iterdir())

    base = sync_base(roots)
    assert base == docs.resolve()
    found = discover(roots, base, FileSelector(), links_outside=outside)
    assert [(f.rel, f.path.read_text()) for f in found] == [("alias.md", "guide"), ("guide.md", "guide")]
    assert outside == ["creds.md"]
    assert [scope_prefix(r, base) for r in roots] == ["alias.md", "creds.md", "guide.md"]


def test_folder_links_inside_the_root_are_walked_once(tmp_path: Path) -> None:
    """Two links per level to the next level: 2**24 paths, each folder walked once (well under a
    second), every file given once under its own path."""
    levels = 24
    for i in range(levels):
        (tmp_path / f"l{i}").mkdir()
        (tmp_path / f"l{i}" / f"f{i}.md").write_text(str(i))
    for i in range(levels - 1):
        for name in ("x", "y"):
            (tmp_path / f"l{i}" / name).symlink_to(tmp_path / f"l{i + 1}")
        (tmp_path / f"l{i + 1}" / "back").symlink_to(tmp_path)  # and a cycle at every level
    t0 = time.monotonic()
    found = names(tmp_path, tmp_path)
    assert time.monotonic() - t0 < 2.0
    assert found == sorted(f"l{i}/f{i}.md" for i in range(levels))
