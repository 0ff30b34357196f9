"""The port ragserve listens on and its CLI calls: ``make run PORT=8100`` sets ``RAGSERVE_PORT``,
which wins over the serve config's ``http_options.port`` (``ragserve/deployments/platform.py``) and is the
CLI's default (``RAGSERVE_URL`` still wins there). No imports beyond the standard library: the
``make run`` launcher reads it and stays small."""

from __future__ import annotations

import os
from collections.abc import Mapping

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
