"""What every benchmark shares: deterministic text, percentiles, tables, plots, the machine's
description, and starting the real Serve application (or loading a storage_dir) in-process.

Absolute times on a shared 2-core machine are noise; every benchmark therefore reports its figure
beside a baseline measured in the same run, and the ratio is what to read.
"""

from __future__ import annotations

import json
import os
import platform
import random
import statistics
import textwrap
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from ragserve.serve_port import free_port

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("RAGSERVE_BENCH_CACHE", REPO / "data" / "bench-cache"))
MODEL_CACHE = REPO / "data" / "test-cache" / "models"

_SUBJECTS = [
    "The pump",
    "The operator",
    "A shard",
    "The embedding service",
    "The cluster autoscaler",
    "The ingress",
    "The vector index",
    "A replica",
    "The scheduler",
    "The storage volume",
    "The GPU node",
    "The tokenizer",
]
_VERBS = [
    "restarts",
    "reports",
    "indexes",
    "balances",
    "replicates",
    "throttles",
    "caches",
    "retries",
    "schedules",
    "compacts",
    "validates",
    "streams",
]
_OBJECTS = [
    "the request queue",
    "every acknowledged write",
    "the pressure readings",
    "the nightly backup",
    "the model weights",
    "the search results",
    "the retrieval context",
    "the failed batch",
    "the maintenance log",
    "the metadata filter",
    "the warm cache",
    "the chat history",
]
_TAILS = [
    "after a node failure",
    "within two seconds",
    "on line {n}",
    "when the load doubles",
    "at {n} kPa",
    "before the deadline",
    "for tenant {n}",
    "during the rolling upgrade",
    "every {n} minutes",
    "without losing data",
]


def sentence(rng: random.Random) -> str:
    tail = rng.choice(_TAILS).format(n=rng.randint(1, 500))
    return f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {tail}."


def make_texts(n: int, sentences: int = 3, seed: int = 0) -> list[str]:
    """``n`` deterministic, varied, sentence-like texts (the same on every run)."""
    rng = random.Random(seed)
    return [f"Record {i}. " + " ".join(sentence(rng) for _ in range(sentences)) for i in range(n)]


def make_queries(n: int, seed: int = 99) -> list[str]:
    rng = random.Random(seed)
    return [
        f"Which {rng.choice(_OBJECTS).split()[-1]} {rng.choice(_VERBS)[:-1]}s {rng.choice(_TAILS).split()[0]} "
        f"{rng.randint(1, 500)}?"
        for _ in range(n)
    ]


def pct(xs: Sequence[float], p: float) -> float:
    """The p-th percentile (0-100), nearest rank."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p / 100 * len(s) + 0.5) - 1))] if s else float("nan")


def summary_ms(seconds: Sequence[float]) -> dict[str, float]:
    ms = [x * 1000 for x in seconds]
    return {"p50": pct(ms, 50), "p90": pct(ms, 90), "p99": pct(ms, 99), "mean": statistics.fmean(ms) if ms else 0.0}


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:,.2f}" if abs(v) < 100 else f"{v:,.0f}"
        return str(v)

    rule = "|" + "|".join("---" if i == 0 else "---:" for i in range(len(headers))) + "|"
    lines = ["| " + " | ".join(headers) + " |", rule]
    lines += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 2**20:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return (
        f"{os.cpu_count()} cores ({cpu}){mem}, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def bar_plot(
    path: str | None,
    title: str,
    labels: Sequence[str],
    series: dict[str, Sequence[float]],
    ylabel: str,
    log: bool = False,
) -> None:
    """Grouped bars, one group per label; written only when ``path`` is given."""
    if not path:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = ["\n".join(textwrap.fill(part, 16) for part in str(label).split("\n")) for label in labels]
    fig, ax = plt.subplots(figsize=(max(7.0, 1.3 * len(labels)), 4.2), dpi=110)
    width = 0.8 / max(1, len(series))
    x = np.arange(len(labels))
    for i, (name, values) in enumerate(series.items()):
        bars = ax.bar(x + i * width - 0.4 + width / 2, values, width, label=name)
        ax.bar_label(bars, fmt="%.3g", fontsize=7)
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if log:
        ax.set_yscale("log")
    ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def write_json(path: str | None, payload: dict[str, Any]) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(payload, indent=2))


def wait_healthy(base: str, timeout_s: float = 600, failed: Callable[[], str | None] | None = None) -> None:
    """Until ``base``/health answers 200; ``failed``, asked between tries, gives a reason to stop waiting."""
    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        reason = failed() if failed is not None else None
        if reason:
            raise RuntimeError(f"{base} will not become healthy: {reason}")
        try:
            r = httpx.get(f"{base}/health", timeout=5)
            if r.status_code == 200:
                return
            last = r.text
        except httpx.HTTPError as e:
            last = repr(e)
        time.sleep(0.5)
    raise RuntimeError(f"{base} did not become healthy: {last}")


MODES = {"default": False, "high-throughput": True}  # Serve's request path (ragserve.deployments.platform)


def parse_mode(spec: str, query_embedding: str = "auto") -> tuple[bool, str]:
    """A benchmark's ``--modes`` entry, ``MODE[:QUERY_EMBEDDING]`` (``default:deployment``,
    ``high-throughput``): whether Serve runs high-throughput, and the ``query_embedding`` setting
    (``query_embedding`` when the entry names none)."""
    mode, _, where = spec.partition(":")
    if mode not in MODES or where not in ("", "auto", "ingress", "deployment"):
        raise ValueError(
            f"bad mode {spec!r}: MODE[:QUERY_EMBEDDING] with MODE in {sorted(MODES)}, "
            "QUERY_EMBEDDING in auto, ingress, deployment"
        )
    return MODES[mode], where or query_embedding


@contextmanager
def ray_serve(num_cpus: int = 4, high_throughput: bool | None = None) -> Iterator[int]:
    """A private local Ray with Serve's ingress on a free loopback port; yields the port.
    ``high_throughput``: Serve's HAProxy/gRPC mode on or off (None: as ``make run`` starts it)."""
    import ray
    from ray import serve

    from ragserve.deployments.platform import init_local_ray

    port = free_port()
    init_local_ray(num_cpus=num_cpus, high_throughput=high_throughput, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        yield port
    finally:
        serve.shutdown()
        ray.shutdown()


def serve_failure(name: str) -> str | None:
    """Why Serve gave up deploying application ``name`` (a replica's constructor kept failing), else None."""
    from ray import serve

    app = serve.status().applications.get(name)
    if app is None or app.status != "DEPLOY_FAILED":  # a str enum: str() of it is "ApplicationStatus.…"
        return None
    reasons = [app.message] + [f"{d}: {s.message}" for d, s in app.deployments.items() if s.message]
    return "; ".join(r for r in reasons if r) or "DEPLOY_FAILED"


def deploy_ragserve(
    port: int,
    name: str,
    settings: dict[str, Any],
    timeout_s: float = 600,
    options: dict[str, dict[str, Any]] | None = None,
) -> str:
    """Run the real application (``ragserve.deployments.builder:build_app``) under ``/name``; its base
    URL once healthy (a deployment Serve gave up on raises at once, with Serve's reason).
    ``options``: deployment options by name, as a serve config's ``deployments:`` sets them."""
    from ray import serve

    from ragserve.deployments import builder

    args = {"model_cache_dir": str(MODEL_CACHE), "shard_num_cpus": 0.1, **settings}
    serve.run(
        builder.build_app_with(args, options) if options else builder.build_app(args),
        name=name,
        route_prefix=f"/{name}",
        blocking=False,
    )
    base = f"http://127.0.0.1:{port}/{name}"
    wait_healthy(base, timeout_s, failed=lambda: serve_failure(name))
    return base


def raw_query_encode(model: Any, queries: list[str]) -> dict[str, Any]:
    """Encoding each query alone with ``model`` in this process (the embedding a request cannot
    avoid), with one torch thread and with every usable core: on a busy machine either can be the
    faster by far. ``best`` is the lower p50's summary, the baseline the goals are checked against."""
    import torch

    from ragserve.hardware import usable_cores

    before = torch.get_num_threads()
    out: dict[str, Any] = {}
    for threads in sorted({1, usable_cores()}):
        torch.set_num_threads(threads)
        lat = []
        for q in queries:
            t0 = time.perf_counter()
            model.encode([q], batch_size=1)
            lat.append(time.perf_counter() - t0)
        out[f"threads_{threads}"] = summary_ms(lat)
    torch.set_num_threads(before)
    out["best"] = min((v for v in out.values()), key=lambda v: v["p50"])
    return out


def paced_query_encode(model: Any, queries: list[str], pause_s: float, threads: int = 1) -> dict[str, float]:
    """Encoding each query alone after ``pause_s`` of idleness, as a server encodes the query of
    each request (summary, ms). On this kind of machine an encode that follows a pause takes
    longer than one in a tight loop (the model's memory is no longer in the caches it was just
    in): 4.5 against 7-8 ms for MiniLM with 5-20 ms between encodes, in one process, no Ray."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    lat = []
    for q in queries:
        time.sleep(pause_s)
        t0 = time.perf_counter()
        model.encode([q], batch_size=1)
        lat.append(time.perf_counter() - t0)
    torch.set_num_threads(before)
    return summary_ms(lat)


def actor_call_floor(n: int, pause_s: float, actors: int = 2) -> dict[str, float]:
    """Ray's floor for the search stage: a call to each of ``actors`` trivial actors at once,
    awaited as the ingress awaits its shards, after ``pause_s`` (summary, ms). Run inside a Ray."""
    import asyncio

    import ray

    class Trivial:
        def ping(self) -> int:
            return 1

    # the shards' actor options that matter here: threaded, a sliver of a CPU
    cls: Any = ray.remote(Trivial)
    handles = [cls.options(num_cpus=0.01, max_concurrency=16).remote() for _ in range(actors)]

    async def measure() -> list[float]:
        await asyncio.gather(*(h.ping.remote() for h in handles))
        lat = []
        for _ in range(n):
            await asyncio.sleep(pause_s)
            t0 = time.perf_counter()
            await asyncio.gather(*(h.ping.remote() for h in handles))
            lat.append(time.perf_counter() - t0)
        return lat

    try:
        return summary_ms(asyncio.run(measure()))
    finally:
        for h in handles:
            ray.kill(h)


def cached_embeddings(texts: list[str], tag: str, device: str = "cpu", batch_size: int = 64) -> np.ndarray:
    """MiniLM embeddings of ``texts``, computed once (on ``device``) and kept under ``CACHE``. ``tag``
    must name the text generator's parameters: a cache of more texts with the same tag is a
    prefix-compatible superset (the generator is sequential), so it is sliced instead of recomputed."""
    CACHE.mkdir(parents=True, exist_ok=True)
    for path in sorted(CACHE.glob(f"{tag}-*.npy"), key=lambda p: int(p.stem.rsplit("-", 1)[1])):
        if int(path.stem.rsplit("-", 1)[1]) >= len(texts):
            return np.load(path, mmap_mode="r")[: len(texts)].copy()
    from ragserve.models.embeddings import LocalEmbeddingModel

    vecs = LocalEmbeddingModel(None, device=device).encode(texts, batch_size=batch_size)
    np.save(CACHE / f"{tag}-{len(texts)}.npy", vecs)
    return vecs


class PrecomputedEmbedder:
    """An embedder for ``DocumentService`` that returns vectors computed earlier, so a large
    storage_dir can be built through the service's own chunking, routing and storage code."""

    def __init__(self, texts: list[str], vectors: np.ndarray, model: Any):
        self._by_text = {t: v for t, v in zip(texts, vectors, strict=True)}
        self.model = model

    async def embed_documents(self, texts: list[str], *, bulk: bool = False) -> np.ndarray:
        return np.stack([self._by_text[t] for t in texts])

    async def embed_query(self, text: str) -> np.ndarray:
        return self._by_text[text]

    async def count_tokens(
        self, texts: list[str], *, over: int | None = None, total_over: int | None = None
    ) -> list[int]:
        return [len(t.split()) for t in texts]


def build_storage(
    storage_dir: Path, num_shards: int, index: str, texts: list[str], vectors: np.ndarray, batch: int = 1000
) -> None:
    """Write ``texts`` (one chunk each) into ``storage_dir`` exactly as the application lays it out."""
    import asyncio

    from ragserve.api.documents import Document
    from ragserve.ingest import DocumentChunker, hf_token_counter
    from ragserve.models.embeddings import LocalEmbeddingModel
    from ragserve.service.documents import DocumentService
    from ragserve.service.pool import LocalShardPool
    from ragserve.service.shard_service import ShardService, check_layout

    check_layout(storage_dir, num_shards)
    tokenizer = LocalEmbeddingModel(None, device="cpu").tokenizer
    pool = LocalShardPool([ShardService(storage_dir, i, num_shards) for i in range(num_shards)])
    chunker = DocumentChunker(hf_token_counter(tokenizer), 256, 32)
    svc = DocumentService(
        pool,
        PrecomputedEmbedder(texts, vectors, None),
        chunker,
        storage_dir=storage_dir,
        embedding_model="all-MiniLM-L6-v2",
    )

    async def load() -> None:
        for i in range(0, len(texts), batch):
            await svc.add_documents(
                index, [Document(text=t, doc_id=f"doc-{i + j}") for j, t in enumerate(texts[i : i + batch])]
            )

    asyncio.run(load())
    pool.close()


_ROLES = [
    ("Embedder", "embedder replica"),
    ("Ingress", "ingress replica"),
    ("ShardActor", "shard actors"),
    ("ServeController", "Serve controller"),
    ("ProxyActor", "Serve HTTP proxy"),
    ("Generator", "generator replica"),
    ("EngineCore", "vLLM engine core (the generator's)"),  # its process title: VLLM::EngineCore
    ("raylet", "Ray system (raylet, GCS, agents)"),
    ("gcs_server", "Ray system (raylet, GCS, agents)"),
    ("ray/", "Ray system (raylet, GCS, agents)"),
]


def role_of(cmdline: str) -> str | None:
    """Which part of the running application a process is, by its command line (None: not one)."""
    return next((role for key, role in _ROLES if key in cmdline), None)


@dataclass(frozen=True)
class CpuSnapshot:
    """Every process's CPU seconds so far (user + system), by (pid, start time), with its role in
    the application (None: none, or its command line could not be read this time)."""

    taken_at: float
    procs: dict[tuple[int, float], tuple[str | None, float]]


def cpu_snapshot() -> CpuSnapshot:
    """CPU seconds used so far by every process, with the part of the running application each is
    (and this process): taken before and after a phase, ``cpu_delta`` says where its cores went."""
    import psutil

    me = os.getpid()
    taken_at = time.time()
    procs: dict[tuple[int, float], tuple[str | None, float]] = {}
    for p in psutil.process_iter(["pid", "cmdline", "name", "cpu_times", "create_time"]):
        times, created = p.info["cpu_times"], p.info["create_time"]
        if times is None or created is None:
            continue
        cmd = " ".join(p.info["cmdline"] or []) or (p.info["name"] or "")
        role = "benchmark process (client, fake upstream)" if p.info["pid"] == me else role_of(cmd)
        procs[(p.info["pid"], created)] = (role, times.user + times.system)
    return CpuSnapshot(taken_at, procs)


def cpu_delta(before: CpuSnapshot, after: CpuSnapshot) -> dict[str, float]:
    """CPU seconds each role spent between two snapshots. A process is counted by its own pid and
    start time, so one that started meanwhile counts all its CPU, one that ended meanwhile is
    missed, and one whose command line could not be read in one snapshot keeps the role the other
    gave it (a role total over whatever processes one snapshot happened to name would charge a
    phase with a process's whole life)."""
    out: dict[str, float] = {}
    for key, (role, cpu) in after.procs.items():
        was = before.procs.get(key)
        if was is None and key[1] < before.taken_at - 1.0:
            continue  # it ran before the phase but was not read then: its share is unknown
        role = role or (was[0] if was else None)
        if role is None:
            continue
        out[role] = out.get(role, 0.0) + cpu - (was[1] if was else 0.0)
    return {k: v for k, v in out.items() if v > 0.05}
