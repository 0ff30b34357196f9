"""docs/architecture.md §2: the package's floors, in reading order, and the rule that holds them.

A module may import from its own part and from parts on lower floors, never from a higher floor and
never from a sibling on its own floor. Every import counts, wherever it is written (a function body,
an ``if TYPE_CHECKING`` block): an import that runs up the floors is a loop waiting to happen.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "ragserve"

#: Lowest floor first: each part of ``ragserve`` (a sub-package or a top-level module) on one floor.
FLOORS: list[set[str]] = [
    # leaves: import nothing of ragserve
    {"errors", "telemetry", "tracing", "hardware", "serve_port", "aio", "memo", "heap"},
    {"api"},  # every shape that crosses a boundary
    {"ports"},  # every seam (protocols over api shapes)
    {"ingest", "store"},  # documents to chunks; one shard's storage
    # the pure steps of one RAG request; what loads weights (engines, encoders); durable ingestion jobs;
    # the MCP tools over a KnowledgeBase
    {"rag", "models", "jobs", "agent"},
    {"config"},  # Settings, built into narrow options by the services
    {"service"},  # the logic behind each route, wiring (docs/architecture.md §12)
    {"http"},  # FastAPI routers over the services
    {"deployments", "cli"},  # the Ray Serve shells; the command line (an HTTP client)
    {"testing"},  # what tests and benchmarks share
]
FLOOR = {part: n for n, parts in enumerate(FLOORS) for part in parts}


def module_name(path: Path) -> str:
    parts = ("ragserve", *path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def part_of(module: str) -> str | None:
    """``ragserve.rag.fit`` → ``rag``; the package itself (``ragserve``) → None."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 and pieces[0] == "ragserve" else None


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, name) for every ``ragserve`` import in the file: ``import a.b``, ``from a import b``
    as ``a.b`` (``b`` may be a module), relative ones resolved, and ``importlib.import_module`` or
    ``__import__`` of a literal name."""
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            found += [(node.lineno, f"{module}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Call) and _imports_by_name(node):
            found.append((node.lineno, node.args[0].value))  # type: ignore[attr-defined]
    return [(line, m) for line, m in found if m == "ragserve" or m.startswith("ragserve.")]


def _imports_by_name(call: ast.Call) -> bool:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    first = call.args[0] if call.args else None
    return name in {"import_module", "__import__"} and isinstance(first, ast.Constant) and isinstance(first.value, str)


def modules() -> dict[str, Path]:
    return {module_name(f): f for f in sorted(PACKAGE.rglob("*.py"))}


def violations(files: dict[str, Path]) -> list[str]:
    bad = []
    for name, path in files.items():
        mine = part_of(name)
        where = path.relative_to(PACKAGE.parent)
        for line, target in imports_of(path):
            theirs = part_of(target)
            if mine is None:  # ragserve/__init__.py runs before every import of any part
                bad.append(f"{where}:{line} imports {target}: the package root imports nothing of ragserve")
            elif theirs is None:
                bad.append(f"{where}:{line} imports the package root ({target})")
            elif theirs not in FLOOR:
                bad.append(f"{where}:{line} imports {target}: {theirs} is on no floor")
            elif theirs != mine and FLOOR[theirs] >= FLOOR[mine]:
                way = "across to a sibling" if FLOOR[theirs] == FLOOR[mine] else "up"
                bad.append(f"{where}:{line} imports {target}: {way} from {mine} to {theirs}")
    return bad


def test_every_part_of_the_package_is_on_a_floor() -> None:
    parts = {part_of(m) for m in modules()} - {None}
    assert parts - FLOOR.keys() == set(), "add the new part to FLOORS and to docs/architecture.md §2"
    assert FLOOR.keys() - parts == set(), "a floor names a part that no longer exists"


def test_no_import_runs_up_the_floors_or_across_to_a_sibling() -> None:
    assert violations(modules()) == []


def test_no_import_cycle_between_modules() -> None:
    files = modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in files.items():
        for _, target in imports_of(path):
            while target not in files and "." in target:  # from ragserve.api.openai import X
                target = target.rsplit(".", 1)[0]
            if target != name:
                graph[name].add(target)
    cycles = strongly_connected(graph, list(files))
    assert [c for c in cycles if len(c) > 1] == []


def strongly_connected(graph: dict[str, set[str]], nodes: list[str]) -> list[list[str]]:
    """Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                out.append(sorted(component))
    return out


@pytest.mark.parametrize(
    ("planted", "source", "expected"),
    [
        ("store/_x.py", "from ragserve.service.documents import DocumentService\n", "up from store to service"),
        ("ingest/_x.py", "def f():\n    import ragserve.store.shard\n", "across to a sibling from ingest to store"),
        ("api/_x.py", "from ragserve import config\n", "up from api to config"),
        ("api/_x.py", "from .. import service\n", "up from api to service"),
        ("rag/_x.py", "import ragserve.models.engine as engine\n", "across to a sibling from rag to models"),
        ("store/_x.py", "import importlib\nimportlib.import_module('ragserve.http.app')\n", "up from store to http"),
        ("api/_x.py", "import ragserve\n", "imports the package root"),
        ("__init__.py", "from ragserve.errors import ServiceError\n", "the package root imports nothing"),
    ],
)
def test_the_rule_catches_an_upward_import(planted: str, source: str, expected: str) -> None:
    """The check itself: a module planted on a floor with a forbidden import is reported."""
    path = PACKAGE / planted
    with reading(path, source):
        found = violations({module_name(path): path})
    assert len(found) == 1 and expected in found[0], found


def test_a_from_import_of_a_module_is_an_edge_to_that_module() -> None:
    """``from ragserve.rag import fit`` is an edge to the module ``ragserve.rag.fit``, so the cycle
    check sees loops between the modules of one package."""
    path = PACKAGE / "rag" / "_x.py"
    with reading(path, "from ragserve.rag import fit\n"):
        assert imports_of(path) == [(1, "ragserve.rag.fit")]


@contextmanager
def reading(path: Path, source: str) -> Iterator[None]:
    """``path`` reads as ``source`` (a module planted for the check, never written)."""
    real_read = Path.read_text

    def read(self: Path, *args: object, **kwargs: object) -> str:
        return source if self == path else real_read(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Path, "read_text", read)
        yield


def test_a_cycle_is_found() -> None:
    graph = defaultdict(set, {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert [sorted(c) for c in strongly_connected(graph, ["a", "b", "c", "d"]) if len(c) > 1] == [["a", "b", "c"]]


def test_unit_tests_mirror_the_package() -> None:
    """``tests/unit/<part>/`` holds the tests of ``ragserve/<part>/``; tests of the top-level modules
    and of the repository as a whole stay in ``tests/unit/``."""
    unit = Path(__file__).resolve().parent
    folders = {p.name for p in unit.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders and folders <= FLOOR.keys(), folders - FLOOR.keys()
    assert all((unit / name / "__init__.py").exists() for name in folders)


CITATION = re.compile(r"docs/architecture\.md §(\d+)((?:, §\d+)*)")


def test_code_cites_the_architecture_page_in_one_style() -> None:
    """``docs/architecture.md §N`` (a list: ``§N, §M``), and every section cited exists."""
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    sections = {int(n) for n in re.findall(r"^## (\d+)\. ", page, flags=re.MULTILINE)}
    roots = [PACKAGE, PACKAGE.parent / "tests", PACKAGE.parent / "benchmarks", PACKAGE.parent / "load_tests"]
    bad = []
    for path in sorted(f for root in roots for f in root.rglob("*.py")):
        text = path.read_text()
        cited = [int(n) for m in CITATION.finditer(text) for n in re.findall(r"\d+", m.group(0).split("§", 1)[1])]
        bad += [f"{path.name}: §{n} is not a section" for n in cited if n not in sections]
        rest = CITATION.sub("", text)
        if path.name != "test_layers.py" and ("§" in rest or 'architecture.md, "' in rest):
            bad.append(f"{path.name}: a citation in another style")
    assert sections and bad == []
