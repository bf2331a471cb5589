"""JSON logs: one object per line, with the node name and a machine-readable ``event``.

Operators ship these to Loki/Elastic; a stable ``event`` key is what alerts and searches key on.
A line written inside a traced span carries its ``trace_id`` and ``span_id``, so a log search
and the trace of the same request find each other; lines about one request, job or decision
also carry its id (``job``, ``decision``) as a correlation id where the code has one.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import IO, Any

from meshd.tracing import ids

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
        out.update(ids())
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in out:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, separators=(",", ":"))


LEVELS = ("debug", "info", "warning", "error")
LAYERS = {
    "agent": "the agent's start, stop and loops",
    "gossip": "SWIM membership and the gossip transport",
    "raft": "the Raft groups' transport and journal",
    "control": "policy reads, writes and node flags",
    "security": "certificates, enrollment, revocation",
    "signals": "runtime and GPU telemetry, peers' signals",
    "adapters": "the Triton and NVML adapters",
    "score": "the scoring API and its decisions",
    "router": "the router's requests, hedges and failovers",
    "health": "automatic quarantine",
    "train": "the training scheduler and trainer",
}
"""The layers whose level can be set on their own (logger ``meshd.<layer>``)."""


def levels() -> tuple[str, list[tuple[str, str, bool]]]:
    """The overall level and, per layer, (layer, effective level, inherited)."""
    root = logging.getLogger("meshd")
    out = []
    for layer in LAYERS:
        logger = logging.getLogger(f"meshd.{layer}")
        out.append((layer, logging.getLevelName(logger.getEffectiveLevel()).lower(),
                    logger.level == logging.NOTSET))
    return logging.getLevelName(root.getEffectiveLevel()).lower(), out


def set_level(layer: str, level: str) -> None:
    """Set ``layer``'s level ("" = the overall one); ``level`` "" gives a layer back to the
    overall level.  Raises ``ValueError("<field>: ...")`` naming what is wrong."""
    if layer and layer not in LAYERS:
        raise ValueError(f"layer: unknown layer {layer!r} (one of {', '.join(LAYERS)}, or "
                         "'' for the overall level)")
    if level not in LEVELS and not (layer and level == ""):
        raise ValueError(f"level: must be one of {', '.join(LEVELS)}"
                         + (" or '' to follow the overall level" if layer else "")
                         + f", got {level!r}")
    logger = logging.getLogger(f"meshd.{layer}" if layer else "meshd")
    logger.setLevel(level.upper() if level else logging.NOTSET)


def setup(node: str, level: str = "info", stream: IO[str] | None = None) -> None:
    """Route the ``meshd`` loggers to ``stream`` (stderr) as JSON lines."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(node))
    root = logging.getLogger("meshd")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
