"""The Grafana dashboard asks only for metrics the application exports, under the names Prometheus
sees: Ray prefixes ``ray_``, counters gain ``_total``, histograms are read as ``_bucket``/``_sum``/
``_count``, gauges as they are. ragserve's own metrics are read from the code that defines them
(``ragserve/deployments/*.py``); Ray Serve's from the installed Ray Serve source."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from ragserve.deployments.shard_metrics import publish_sizes

REPO = Path(__file__).resolve().parents[3]
DASHBOARD = REPO / "dashboards" / "ragserve.json"
KINDS = {"Counter": "counter", "Histogram": "histogram", "Gauge": "gauge"}
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def ragserve_metrics() -> dict[str, str]:
    """name -> kind for every ``metrics.Counter/Histogram/Gauge("ragserve_...", ...)`` in ragserve/deployments/."""
    found: dict[str, str] = {}
    for path in (REPO / "ragserve" / "deployments").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in KINDS
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and str(node.args[0].value).startswith("ragserve_")
            ):
                found[node.args[0].value] = KINDS[node.func.attr]
    return found


def serve_metric_names() -> set[str]:
    import ray.serve

    names: set[str] = set()
    for path in Path(ray.serve.__file__).parent.rglob("*.py"):
        names |= set(re.findall(r'"(serve_[a-z0-9_]+)"', path.read_text(errors="replace")))
    return names


def queries(dash: dict) -> list[str]:
    out = [v["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    stack = list(dash["panels"])
    while stack:
        p = stack.pop()
        stack += p.get("panels", [])
        out += [t["expr"] for t in p.get("targets", [])]
    return out


def test_every_query_names_an_exported_metric() -> None:
    dash = json.loads(DASHBOARD.read_text())
    exported = ragserve_metrics()
    assert {"ragserve_requests", "ragserve_stage_latency_ms", "ragserve_shard_documents"} <= exported.keys()
    serve = serve_metric_names()
    used: set[str] = set()
    exprs = queries(dash)
    assert len(exprs) >= 20
    for expr in exprs:
        names = re.findall(r"\b(ray_[a-z0-9_]+)", expr)
        assert names, expr
        for name in names:
            bare = name[len("ray_") :]
            if bare.startswith("serve_"):
                assert re.sub(r"_(bucket|sum|count|total)$", "", bare) in serve, f"not a Ray Serve metric: {name}"
                continue
            matches = [(m, k) for m, k in exported.items() for s in SUFFIXES[k] if bare == m + s]
            assert matches, f"{name} in {expr!r} is not exported (as Prometheus names it) by ragserve/deployments/"
            used.add(matches[0][0])
    # the dashboard covers what the issue asks for
    assert {
        "ragserve_requests",
        "ragserve_stage_latency_ms",
        "ragserve_embedding_cache_hits",
        "ragserve_documents_indexed",
        "ragserve_shard_documents",
        "ragserve_upstream_errors",
        "ragserve_usage_requests",
        "ragserve_usage_tokens",
        "ragserve_usage_documents",
        "ragserve_usage_bytes",
        "ragserve_rate_limited",
    } <= used


def test_usage_panels_are_per_key_and_index() -> None:
    dash = json.loads(DASHBOARD.read_text())
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"key", "index"} <= variables
    usage = [e for e in queries(dash) if "ragserve_usage_" in e and not e.startswith("label_values")]
    assert usage and all('key=~"$key"' in e for e in usage)
    assert any("by (key, index)" in e for e in usage) and any("kind" in e for e in usage)


def test_dashboard_is_importable() -> None:
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and dash["uid"] == "ragserve"
    assert any(v["type"] == "datasource" and v["name"] == "datasource" for v in dash["templating"]["list"])
    for p in dash["panels"]:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]


class FakeGauge:
    def __init__(self) -> None:
        self.values: dict[tuple[str, str], float] = {}

    def set(self, value: float, tags: dict[str, str] | None = None) -> None:
        assert tags is not None
        self.values[(tags["shard"], tags["index"])] = value


def test_shard_size_gauges_follow_the_shard_and_zero_a_dropped_index() -> None:
    docs, chunks = FakeGauge(), FakeGauge()
    seen = publish_sizes(
        {"shard": 1, "indexes": {"a": {"documents": 3, "chunks": 9}, "b": {"documents": 1, "chunks": 2}}},
        docs,
        chunks,
        set(),
    )
    assert seen == {"a", "b"} and docs.values == {("1", "a"): 3, ("1", "b"): 1} and chunks.values[("1", "a")] == 9
    publish_sizes({"shard": 1, "indexes": {"a": {"documents": 4, "chunks": 10}}}, docs, chunks, seen)
    assert docs.values == {("1", "a"): 4, ("1", "b"): 0} and chunks.values[("1", "b")] == 0


@pytest.mark.parametrize("name", ["ragserve_requests", "ragserve_shard_chunks"])
def test_metric_kinds_are_read_from_the_code(name: str) -> None:
    assert ragserve_metrics()[name] == ("counter" if name == "ragserve_requests" else "gauge")
