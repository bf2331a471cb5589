"""JSON logs: one object per line, with the node name and a machine-readable ``event``.

Operators ship these to Loki/Elastic; a stable ``event`` key is what alerts and searches key on.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import IO, Any

# Attributes every LogRecord has; anything else passed via ``extra=`` becomes a JSON field.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def __init__(self, node: str) -> None:
        super().__init__()
        self.node = node

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "node": self.node,
            "logger": record.name,
            "event": getattr(record, "event", "log"),
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in out:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, separators=(",", ":"))


def setup(node: str, level: str = "info", stream: IO[str] | None = None) -> None:
    """Route the ``meshd`` loggers to ``stream`` (stderr) as JSON lines."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(node))
    root = logging.getLogger("meshd")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
