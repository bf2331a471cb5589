"""The audit log: one JSON line per decision about who may do what on this node.

It lives in the security layer, below the admin API that writes most of its records, so that
every channel that refuses a caller can write there too: the TLS fronts of the admin and
router ports (:mod:`meshd.security.front`) record refused handshakes beside the admin API's
call decisions, and a router worker process appends to the same file.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from types import TracebackType
from typing import IO, Protocol


class Named(Protocol):
    """What the log keeps of a caller (:class:`meshd.admin.rbac.Principal` is one)."""

    @property
    def label(self) -> str: ...

    @property
    def roles(self) -> Iterable[str]: ...


def _rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


class AuditLog:
    """One JSON object per admin call or refused connection, appended to a file
    (``path=None``: disabled).

    There is deliberately no field for a token or key, so none can end up here.  Write errors
    propagate: an audit trail that silently stops is worse than a failed admin call.
    Records after :meth:`close` are dropped, so shutdown races don't turn into errors.  Each
    record is one ``write`` to a file opened ``O_APPEND``, so processes sharing the file (the
    agent and its router workers) never interleave within a line.
    """

    def __init__(self, path: str | os.PathLike[str] | None,
                 clock: Callable[[], float] = time.time) -> None:
        self.path = None if path is None else os.fspath(path)
        self._clock = clock
        self._lock = threading.Lock()
        self._fh: IO[str] | None = None
        if self.path is not None:
            # 0o600 at creation: the log names every caller and what they tried.
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            self._fh = os.fdopen(fd, "a", buffering=1, encoding="utf-8")

    @property
    def enabled(self) -> bool:
        return self._fh is not None

    def record(self, *, method: str, principal: Named | None, allowed: bool, code: str,
               peer: str, detail: str = "", channel: str = "", reason: str = "") -> None:
        """Append one decision; a no-op when disabled or closed.  ``channel`` and ``reason``
        (written only when given) say which port refused a connection and why, as
        ``meshd_security_refusals_total`` counts it."""
        if self._fh is None:
            return
        doc = {
            "ts": _rfc3339(self._clock()),
            "method": method,
            "principal": principal.label if principal is not None else None,
            "roles": sorted(principal.roles) if principal is not None else [],
            "allowed": allowed,
            "code": code,
            "peer": peer,
            "detail": detail,
        }
        if channel:
            doc["channel"] = channel
        if reason:
            doc["reason"] = reason
        line = json.dumps(doc)  # ensure_ascii keeps control characters escaped: one line
        with self._lock:
            if self._fh is None:
                return
            self._fh.write(line + "\n")
            self._fh.flush()

    def close(self) -> None:
        with self._lock:
            fh, self._fh = self._fh, None
        if fh is not None:
            fh.close()

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
