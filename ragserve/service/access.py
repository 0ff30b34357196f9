"""Who may do what: API keys scoped to indexes and roles (docs/architecture.md §8).

A key is either a bare string (full access) or ``{key, indexes: [glob, ...], role}``, where the
role is ``read`` (retrieve, query, chat, list), ``write`` (also index, update and delete documents)
or ``admin`` (also delete an index, persist, load). The HTTP layer authenticates (constant time,
``ragserve.http.security``) and attaches the key's :class:`Principal` to the request; each route then
asks :meth:`Principal.require` for what it is about to do. Pure, so every rule is a unit test.
"""

from __future__ import annotations

import fnmatch
import hashlib
import ipaddress
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

from ragserve.api.documents import index_names
from ragserve.errors import ServiceError

log = logging.getLogger(__name__)


class Role(IntEnum):
    READ = 1
    WRITE = 2
    ADMIN = 3


class ForbiddenError(ServiceError):
    """The key is valid but does not reach this index or this operation (403)."""

    status = 403
    type = "permission_error"


#: The usage label of requests where no keys are configured, and of a key without a ``name``.
ANONYMOUS_NAME = "anonymous"
UNNAMED = "unnamed"


@dataclass(frozen=True)
class Principal:
    """What one key may do, and what its usage is metered under (``name``, never the key) with its
    limits (``ragserve.service.usage``)."""

    role: Role
    indexes: tuple[str, ...] = ("*",)
    name: str = ANONYMOUS_NAME
    requests_per_minute: int | None = None
    tokens_per_day: int | None = None
    #: Who the key's background work belongs to, for the job runner's turns: its ``name``, or for a
    #: key without one a digest of the key (every unnamed key is "unnamed" in usage, yet its own tenant).
    owner: str = ANONYMOUS_NAME

    @property
    def limited(self) -> bool:
        return self.requests_per_minute is not None or self.tokens_per_day is not None

    def sees(self, index: str) -> bool:
        return any(fnmatch.fnmatchcase(index, pattern) for pattern in self.indexes)

    @property
    def sees_all(self) -> bool:
        """Whether the key reaches every index, including one whose name is not known."""
        return "*" in self.indexes

    def require(self, role: Role, index: str | Sequence[str] | None = None) -> None:
        """Raise :class:`ForbiddenError` unless this key may act as ``role`` (on ``index``, or on
        every one of several: the error names the first it does not reach)."""
        if self.role < role:
            raise ForbiddenError(
                f"this API key has the {self.role.name.lower()} role; the operation needs {role.name.lower()}",
                code="insufficient_role",
            )
        for name in () if index is None else index_names(index):
            if not self.sees(name):
                raise ForbiddenError(
                    f"this API key does not grant access to index '{name}'",
                    param="index_name",
                    code="index_not_allowed",
                )

    def require_unscoped(self, role: Role, what: str) -> None:
        """Raise :class:`ForbiddenError` unless this key may act as ``role`` on every index: for data
        that belongs to no index (``what``, e.g. "uploaded files", are one namespace for the whole
        server), which a key scoped to some indexes could otherwise use to read or remove what a key
        for other indexes stored."""
        self.require(role)
        if not self.sees_all:
            raise ForbiddenError(
                f"{what} belong to no index, and this API key reaches only the indexes {list(self.indexes)}: "
                "only a key for every index may use them",
                code="unscoped_key_required",
            )

    def require_source(self, source: object, what: str) -> None:
        """Raise :class:`ForbiddenError` unless this key may read the data ``what`` (e.g. "the
        snapshot at 'P'") that was taken from index ``source``: data copied out of an index is that
        index's, so a key scoped to some indexes cannot bring another's into one it owns. Data
        whose source index is not recorded (``source`` not a name) reaches only an unscoped key."""
        if self.sees_all or (isinstance(source, str) and source and self.sees(source)):
            return
        if not isinstance(source, str) or not source:
            raise ForbiddenError(
                f"{what} does not record the index it was taken from, and this API key reaches only the "
                f"indexes {list(self.indexes)}: only a key for every index may use it",
                param="path",
                code="source_not_allowed",
            )
        raise ForbiddenError(
            f"{what} was taken from an index this API key does not grant access to (it reaches only "
            f"{list(self.indexes)}); use a snapshot persisted from one of those indexes",
            param="path",
            code="source_not_allowed",
        )


#: No authentication configured (a laptop), or a bare key: everything.
FULL_ACCESS = Principal(Role.ADMIN, ("*",))


def key_owner(name: str | None, secret: str) -> str:
    """``Principal.owner`` of a key: its name, else ``key:`` and 12 hex digits of its SHA-256 (never
    the key itself)."""
    return name or "key:" + hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or name the proxy listens on) is reachable from this machine only."""
    if host in {"localhost", "localhost.localdomain"}:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name other than localhost: assume it is reachable from elsewhere


def check_exposure(host: str, has_keys: bool, allow_unauthenticated: bool) -> None:
    """Refuse to serve an open index beyond the loopback: listening on ``host`` without API keys is a
    configuration mistake unless ``allow_unauthenticated`` says it is meant (then it is logged)."""
    if has_keys or is_loopback(host):
        return
    if allow_unauthenticated:
        log.warning(
            "serving WITHOUT authentication on %s: anyone who can reach it can read, change and drop "
            "every index (allow_unauthenticated is set)",
            host,
        )
        return
    raise ValueError(
        f"ragserve listens on {host}, beyond the loopback, but has no api_keys: set api_keys "
        "(RAGSERVE_API_KEYS) or, to serve openly on purpose, allow_unauthenticated: true"
    )
