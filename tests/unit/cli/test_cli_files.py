"""Which files ``ragserve ingest`` picks: supported types, .gitignore files at every level (with
negation, and from the repository's top when a subfolder is given), include/exclude globs."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from ragserve.cli.files import FileSelector, discover, scope_prefix, sync_base


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
    (root / "shown").symlink_to(root / "hidden")  # inside, to a folder .gitignore leaves out: left out too
    (root / "dangling.md").symlink_to(root / "nowhere.md")
    (root / "a.md").symlink_to("b.md")
    (root / "b.md").symlink_to("a.md")  # a loop of links
    outside: list[str] = []
    skipped: list[tuple[str, str]] = []
    found = discover([root], root, FileSelector(), links_outside=outside, skipped=skipped)
    assert [f.rel for f in found] == ["docs/guide.md"]
    assert sorted(outside) == ["creds.md", "docs/hop.md", "docs/keys", "docs/sub/rel"]
    assert [p for p, _ in skipped] == ["a.md", "b.md", "dangling.md"]
    assert all(reason.startswith("broken symbolic link") for _, reason in skipped)
    # a root given through a link pointing inside its own folder is walked as it resolves
    assert [f.rel for f in discover([tmp_path / "root" / "loop"], root, FileSelector())] == ["docs/guide.md"]


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


def test_links_named_on_the_command_line_are_judged_where_they_lie(tmp_path: Path, monkeypatch) -> None:
    """``cd proj && ragserve ingest docs/*``: the shell names a folder link ``docs/ext`` pointing out
    of ``docs`` and a file link ``docs/s.md`` pointing out of it. Each is judged by the folder it
    lies in (``docs``), so both are left out and listed, and the base stays ``docs`` (computed from
    the paths as given): the same ids as ``ragserve ingest docs``."""
    proj, outside = tmp_path / "proj", tmp_path / "outside"
    (proj / "docs" / "sub").mkdir(parents=True)
    (outside / "deep").mkdir(parents=True)
    (proj / "docs" / "a.md").write_text("alpha")
    (proj / "docs" / "sub" / "b.md").write_text("beta")
    (outside / "secret.md").write_text("secret")
    (outside / "deep" / "s2.md").write_text("secret2")
    (proj / "docs" / "ext").symlink_to(outside)
    (proj / "docs" / "s.md").symlink_to("../../outside/secret.md")
    (proj / "docs" / "in").symlink_to("sub")  # a folder link inside docs: walked as docs/sub
    monkeypatch.chdir(proj)
    whole = discover([Path("docs")], sync_base([Path("docs")]), FileSelector())
    roots = [Path("docs") / name for name in sorted(os.listdir("docs"))]  # what docs/* expands to
    base = sync_base(roots)
    assert base == (proj / "docs").resolve()
    outside_links: list[str] = []
    found = discover(roots, base, FileSelector(), links_outside=outside_links)
    assert [f.rel for f in found] == [f.rel for f in whole] == ["a.md", "sub/b.md"]
    assert sorted(outside_links) == ["ext", "s.md"]
    assert [scope_prefix(r, base) for r in roots] == ["a.md", "ext", "sub", "s.md", "sub"]
    # docs/*/* names paths *through* the link: they lie outside the base, and are left out too
    roots = [Path("docs/ext/deep"), Path("docs/ext/secret.md"), Path("docs/sub/b.md")]
    base = sync_base(roots)
    assert base == (proj / "docs").resolve()
    outside_links = []
    found = discover(roots, base, FileSelector(), links_outside=outside_links)
    assert [f.rel for f in found] == ["sub/b.md"]
    assert outside_links == ["docs/ext/deep", "docs/ext/secret.md"]
    assert [scope_prefix(r, base) for r in roots] == [None, None, "sub/b.md"]


def test_links_inside_the_folder_obey_gitignore_and_the_skipped_folders(tmp_path: Path) -> None:
    """A link is judged by its own name and by its target where that lies: a link to an ignored file
    or folder, into .git or node_modules, or into a file an anchored rule or --exclude leaves out,
    brings nothing in, whether walked or named on the command line (``docs/*``)."""
    root = tmp_path / "root"
    for d in ("build", ".git", "node_modules", "notes", "docs"):
        (root / d).mkdir(parents=True)
    (root / ".gitignore").write_text("secret.md\nbuild/\n/docs/private.md\n")
    (root / "ok.md").write_text("ok")
    (root / "secret.md").write_text("password")
    (root / "build" / "out.md").write_text("built")
    (root / ".git" / "notes.md").write_text("git internals")
    (root / "node_modules" / "pkg.md").write_text("a package")
    (root / "notes" / "draft.md").write_text("draft")
    (root / "docs" / "private.md").write_text("private")
    (root / "pub.md").symlink_to("secret.md")
    (root / "bl").symlink_to("build")
    (root / "built.md").symlink_to("build/out.md")
    (root / "gitlink").symlink_to(".git")
    (root / "gitnote.md").symlink_to(".git/notes.md")
    (root / "nm").symlink_to("node_modules")
    (root / "view").symlink_to("docs")  # view/private.md is docs/private.md, which /docs/private.md leaves out
    (root / "draft.md").symlink_to("notes/draft.md")  # --exclude notes/ leaves it out
    selector = FileSelector(exclude=["notes/"])
    assert [f.rel for f in discover([root], root, selector)] == ["ok.md"]
    named = sorted(p for p in root.iterdir() if not p.name.startswith("."))  # the shell's root/*
    skipped: list[tuple[str, str]] = []
    assert [f.rel for f in discover(named, root, selector, skipped=skipped)] == ["ok.md"]
    assert sorted(p for p, _ in skipped) == [
        "bl",
        "build",
        "built.md",
        "draft.md",
        "gitlink",
        "gitnote.md",
        "nm",
        "node_modules",
        "pub.md",
        "secret.md",
    ]
    # --no-gitignore lifts .gitignore, never the always-skipped folders
    found = [f.rel for f in discover([root], root, FileSelector(), gitignore=False)]
    assert found == ["build/out.md", "docs/private.md", "notes/draft.md", "ok.md", "secret.md"]


def test_a_folder_that_cannot_be_read_is_reported_not_taken_as_empty(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / "a.md").write_text("a")
    (tmp_path / "sub" / "b.md").write_text("b")
    (tmp_path / "sub" / "deeper" / "c.md").write_text("c")
    (tmp_path / "locked").mkdir()
    (tmp_path / "locked" / ".gitignore").write_text("x.md\n")
    (tmp_path / "locked" / "d.md").write_text("d")
    real_scandir, real_read = os.scandir, Path.read_bytes

    def scandir(path):  # EACCES as a non-root user gets it from a mode-000 folder (root ignores modes)
        if Path(path).name == "sub":
            raise PermissionError(13, "Permission denied")
        return real_scandir(path)

    def read_bytes(self):
        if self.name == ".gitignore" and self.parent.name == "locked":
            raise OSError(5, "Input/output error")
        return real_read(self)

    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    unreadable: list[tuple[str, str]] = []
    found = discover([tmp_path], tmp_path, FileSelector(), unreadable=unreadable)
    assert [f.rel for f in found] == ["a.md"]
    assert unreadable == [
        ("locked", "cannot read the folder: Input/output error"),
        ("sub", "cannot read the folder: Permission denied"),
    ]


def test_many_links_into_a_deep_ignored_folder_are_judged_quickly(tmp_path: Path) -> None:
    """Each link's target is judged by the rules where it lies, but each folder on the way once:
    1,000 links to files 40 folders down, under a 300-pattern .gitignore that leaves only the
    deepest folder out, take well under a second (judging every link's way afresh took 12 s)."""
    (tmp_path / ".gitignore").write_text("".join(f"pattern{i}*.log\n" for i in range(300)) + "d39/\n")
    deep = tmp_path.joinpath(*(f"d{i}" for i in range(40)))
    deep.mkdir(parents=True)
    (tmp_path / "links").mkdir()
    for i in range(1000):
        (deep / f"t{i}.md").write_text(str(i))
        (tmp_path / "links" / f"l{i}.md").symlink_to(deep / f"t{i}.md")
    (tmp_path / "kept.md").write_text("kept")
    t0 = time.monotonic()
    found = names(tmp_path, tmp_path)
    assert time.monotonic() - t0 < 3.0
    assert found == ["kept.md"]
