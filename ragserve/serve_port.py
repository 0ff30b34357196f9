"""The port ragserve listens on and its CLI calls: ``make run PORT=8100`` sets ``RAGSERVE_PORT``,
which wins over the serve config's ``http_options.port`` (``ragserve/deployments/platform.py``) and is the
CLI's default (``RAGSERVE_URL`` still wins there). No imports beyond the standard library: the
``make run`` launcher reads it and stays small."""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Mapping
from pathlib import Path

PORT_ENV = "RAGSERVE_PORT"
DEFAULT_PORT = 8000


def port_from_env(environ: Mapping[str, str] | None = None) -> int | None:
    """``RAGSERVE_PORT`` as a port number, ``None`` when unset or empty; ValueError saying what to
    fix otherwise."""
    value = (os.environ if environ is None else environ).get(PORT_ENV, "").strip()
    if not value:
        return None
    if not value.isdigit() or not 1 <= int(value) <= 65535:
        raise ValueError(f"{PORT_ENV}={value!r} is not a port: give a number from 1 to 65535")
    return int(value)


#: The lowest port ``free_port`` picks below the kernel's ephemeral range (above the fixed ports of
#: Ray, Serve and HAProxy: 6379, 8000, 8265, 8404, 8500, 9101, 9500, 10001).
FREE_PORT_FLOOR = 20_000
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


def ephemeral_range(path: str = EPHEMERAL_RANGE_FILE) -> tuple[int, int] | None:
    """The ports the kernel hands out to ``bind(0)`` and outgoing connections (Linux), else None."""
    try:
        lo, hi = (int(x) for x in Path(path).read_text().split())
    except (OSError, ValueError):
        return None
    return lo, hi


def free_ports(count: int, host: str = "127.0.0.1", *, ephemeral: tuple[int, int] | None = None) -> list[int]:
    """``count`` different ports free on ``host`` now, for servers that bind them later: HAProxy's
    side ports chosen before Ray starts, a test's or a benchmark's server. Picked at random below the
    kernel's ephemeral range (``ephemeral``; None: read it) where there is room: a port from
    ``bind(0)`` lies inside that range, where until the server binds it the kernel may hand it to any
    other socket (Ray starts dozens; a HAProxy then failed with "Address already in use"); below it
    only another explicit bind can take it. Without such a range, the kernel's picks. Each port stays
    bound here until all are chosen, so no two are the same."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    address = host.strip("[]")
    span = ephemeral or ephemeral_range()
    top = span[0] if span is not None and span[0] - FREE_PORT_FLOOR >= 1_000 else None
    tries = 64 * count if top is not None else 0
    pick = random.SystemRandom()
    held: list[socket.socket] = []
    try:
        while len(held) < count:
            below = top is not None and tries > 0
            tries -= 1
            s = socket.socket(family)
            try:
                s.bind((address, pick.randrange(FREE_PORT_FLOOR, top) if below and top is not None else 0))
            except OSError:  # in use (or a connection of it lingers): try another below the range
                s.close()
                if below:
                    continue
                raise
            held.append(s)
        return [int(s.getsockname()[1]) for s in held]
    finally:
        for s in held:
            s.close()


def free_port(host: str = "127.0.0.1", *, ephemeral: tuple[int, int] | None = None) -> int:
    """One port free on ``host`` now (``free_ports``)."""
    return free_ports(1, host, ephemeral=ephemeral)[0]
